"""Reading a process's state from /proc (broker/node/supervisor_pause.py)."""
from __future__ import annotations

import os

from warren.broker.node.supervisor_pause import STOPPED_STATES, process_state


def test_the_state_is_read_after_a_command_name_with_spaces_and_parentheses(tmp_path):
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "stat").write_text("42 (warren) (x) y) T 1 42 42 0 -1 4194560\n")
    assert process_state(42, tmp_path) == "T"
    assert process_state(43, tmp_path) is None   # gone


def test_a_running_process_is_not_stopped_and_a_debuggers_stop_does_not_count():
    assert process_state(os.getpid()) in {"R", "S"}
    assert STOPPED_STATES == {"T"}   # "t" (ptrace) ends without the SIGCONT the shards wait for
