"""ruff over the whole repository, configured in pyproject.toml ([tool.ruff])."""
from __future__ import annotations

import pytest

from tests.tidy.tools import run, tool


def test_ruff_finds_nothing():
    result = run([tool("ruff"), "check", "--no-cache", "--output-format", "concise", "."])
    if result.returncode:
        pytest.fail(f"ruff check found problems (`ruff check --fix .` mends the safe ones):\n"
                    f"{result.stdout}{result.stderr}", pytrace=False)
