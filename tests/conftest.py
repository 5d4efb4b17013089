"""Shared fixtures: real broker processes on free loopback ports."""
from __future__ import annotations

import uuid

import pytest

from tests.serverproc import ServerProcess, make_server


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
