"""The suite writes nothing outside the run's own temporary folder: broker logs, and
whatever a test or a process it starts puts in the temporary directory."""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from tests.serverproc import make_server


def test_a_brokers_log_is_kept_in_the_tests_own_folder(tmp_path):
    first, second = make_server(tmp_path / "n1"), make_server(tmp_path / "n1")
    assert first.log_path.is_relative_to(tmp_path), f"broker log outside the test's folder: {first.log_path}"
    assert first.log_path != second.log_path, "two brokers of one data directory share a log"


def test_temporary_files_of_the_run_and_its_processes_land_in_its_folder(tmp_path_factory):
    run_folder = tmp_path_factory.getbasetemp()
    assert Path(tempfile.gettempdir()).is_relative_to(run_folder), (
        f"temporary files of the tests go to {tempfile.gettempdir()}, not under {run_folder}")
    child = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
                           capture_output=True, text=True, timeout=30, check=True)
    assert Path(child.stdout.strip()).is_relative_to(run_folder), (
        f"a process the tests start puts temporary files in {child.stdout.strip()}, not under {run_folder}")
