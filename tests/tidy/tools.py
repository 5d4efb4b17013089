"""Running the lint and type tools of the test extra from a test, with their output in the failure."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tidy.imports import REPO


def tool(name: str) -> str:
    """The tool installed beside this interpreter (the venv's), else the one on PATH; skip if neither."""
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed: pip install -e '.[test]'")
    return found


def run(command: list[str], cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """Run from the repository root (so pyproject.toml's configuration applies) unless told otherwise."""
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)
