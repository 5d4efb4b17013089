"""Shared fixtures: real broker processes on free loopback ports."""
from __future__ import annotations

import tempfile
import uuid

import pytest

from tests.serverproc import ServerProcess, make_server


@pytest.fixture(scope="session", autouse=True)
def bytecode_cache_for_child_processes(tmp_path_factory):
    """Compiled modules for the processes the tests start (brokers, command-line tools) in
    a folder of the run's own: where PYTHONDONTWRITEBYTECODE is set, as on our machines,
    every broker start compiled Warren's modules again (about 0.3 s, hundreds of starts)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
        patch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path_factory.mktemp("pycache")))
        yield


@pytest.fixture(scope="session", autouse=True)
def temporary_files_in_the_runs_folder(tmp_path_factory):
    """tempfile's directory, here and in every process the tests start (brokers, warren-verify
    and its Java wrapper, multiprocessing), inside the run's own folder: the suite leaves
    nothing in the machine's /tmp."""
    folder = str(tmp_path_factory.mktemp("tmp"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", folder)
        patch.setattr(tempfile, "tempdir", folder)
        yield


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> ServerProcess:
    """One broker shared by the tests that only need a broker; use unique names."""
    process = make_server(tmp_path_factory.mktemp("shared-server")).start()
    yield process
    process.stop()


@pytest.fixture
def fresh_server(tmp_path) -> ServerProcess:
    """A broker of this test's own, for tests that stop it or change its config."""
    process = make_server(tmp_path).start()
    yield process
    process.stop()


@pytest.fixture
def name() -> str:
    """A unique queue/exchange name for this test."""
    return f"t-{uuid.uuid4().hex[:12]}"
