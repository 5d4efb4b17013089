"""mypy over the pure cores (tests/tidy/rules.py MYPY_SCOPE), options in pyproject.toml [tool.mypy].

The errors mypy reports today are counted per file in tests/tidy/known_violations.py MYPY_ERRORS:
a file with more errors than recorded fails (with mypy's output), one with fewer asks for its count
to be lowered.
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from tests.tidy.imports import INSTALLED_NAME, PROJECT_PACKAGES, REPO, module_path
from tests.tidy.known_violations import MYPY_ERRORS
from tests.tidy.ratchet import size_ratchet
from tests.tidy.rules import MYPY_SCOPE
from tests.tidy.tools import run, tool

ERROR_LINE = re.compile(rf"^(?:{INSTALLED_NAME}/)?(?P<path>[^:\s]+\.py):\d+: error:")


def installed_view(root: Path) -> Path:
    """root/warren/<package> -> the repository's folders: the tree as installed, which mypy reads.

    The code imports `warren.raft.core` (pyproject's package-dir maps it to raft/); mypy follows no import
    hooks, so it is given that tree as links.
    """
    (root / INSTALLED_NAME).mkdir()
    for package in PROJECT_PACKAGES:
        (root / INSTALLED_NAME / package).symlink_to(REPO / package, target_is_directory=True)
    return root


def test_mypy_finds_no_new_errors_in_the_pure_cores(tmp_path):
    view = installed_view(tmp_path)
    result = run([tool("mypy"), "--no-incremental", "--config-file", str(REPO / "pyproject.toml"),
                  "--explicit-package-bases", "--cache-dir", str(tmp_path / "cache"),
                  *[f"{INSTALLED_NAME}/{module_path(name)}" for name in MYPY_SCOPE]], cwd=view)
    errors = [line for line in result.stdout.splitlines() if ERROR_LINE.match(line)]
    if result.returncode and not errors:
        pytest.fail(f"mypy did not run:\n{result.stdout}{result.stderr}", pytrace=False)
    counts = Counter(ERROR_LINE.match(line)["path"] for line in errors)
    problems = size_ratchet(MYPY_ERRORS, dict(counts), 0, "MYPY_ERRORS", unit="errors")
    if problems:
        pytest.fail("\n".join(problems) + "\n\nmypy says:\n" + "\n".join(errors), pytrace=False)
