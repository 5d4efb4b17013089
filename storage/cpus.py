"""The CPUs the threads storage starts run on.

A node process binds its event loop's thread to a CPU of its own (broker/node/loop_cpu.py).
Linux gives a new thread its creator's binding, and storage's threads are started by the
loop's: the WAL writer and the rollovers' workers would share the loop's one CPU. Each
calls `run_anywhere` first: it may run on any CPU the process may use, the loop's too.
"""
from __future__ import annotations

import os

# The CPUs the process may run on as it started (`taskset`, a container's cpuset): taken
# at import, before the loop's thread is bound.
PROCESS_CPUS: frozenset[int] = (frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                else frozenset())


def run_anywhere() -> None:
    """Let the calling thread run on any of the process's CPUs."""
    if len(PROCESS_CPUS) > 1:
        try:
            os.sched_setaffinity(0, PROCESS_CPUS)
        except OSError:   # a cpuset changed under the process: the kernel's placement stands
            pass
