"""CI runs the README's test command, nothing weaker: .ci/run's command is the README's line."""
from __future__ import annotations

from tests.tidy.imports import REPO


def test_ci_runs_the_readmes_test_command():
    readme_lines = [line for line in (REPO / "README.md").read_text().splitlines() if "'.[test]'" in line]
    assert len(readme_lines) == 1, f"the README should give one test command, found {readme_lines}"
    ci_command = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci_command == readme_lines[0], f".ci/run runs {ci_command!r}, the README says {readme_lines[0]!r}"
