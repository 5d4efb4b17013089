"""A shard stops when its supervisor is stopped (docs/multi-process.md section 12).

`kill -STOP <pid>` of a node pauses the node's process: for a node over several
processes that is the supervisor, which serves nothing, while its shards would
go on serving and voting. SIGSTOP cannot be caught, so each shard looks at its
supervisor's state (`/proc/<pid>/stat`) every `LOOK_SECONDS` and stops itself
when it finds it stopped; the supervisor forwards the SIGCONT that resumes it
(broker/node/supervisor.py), so the node resumes as a whole. A pause of the
process group (as `warren-chaos` does) stops the shards at once, as before.
"""
from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

LOOK_SECONDS = 0.1
# Stopped by a signal, which only a SIGCONT ends; not "t", a debugger's stop (py-spy, strace),
# which ends without one.
STOPPED_STATES = frozenset("T")


def process_state(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The state letter of `/proc/<pid>/stat` (after the parenthesised command, which
    may hold spaces), None if it cannot be read."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 1:].split()
    return fields[0] if fields else None


class SupervisorPauses:
    """Stops this process whenever the supervisor `supervisor_pid` is found stopped."""

    def __init__(self, supervisor_pid: int) -> None:
        self.supervisor_pid = supervisor_pid

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """For the shard's life (it ends with the process)."""
        loop.call_later(LOOK_SECONDS, self._look, loop)

    def _look(self, loop: asyncio.AbstractEventLoop) -> None:
        if process_state(self.supervisor_pid) in STOPPED_STATES:
            os.kill(os.getpid(), signal.SIGSTOP)   # returns once the supervisor forwards its SIGCONT
        loop.call_later(LOOK_SECONDS, self._look, loop)
