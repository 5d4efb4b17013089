"""The malloc heap's free memory given back to the system once the node goes quiet.

A burst of work (a backlog published, a drain) leaves glibc's heap holding
memory it freed but does not return: socket reads and message bodies freed
out of order leave free pages under live ones, and glibc returns only the
free space at the heap's top. Measured after a backlog of 200k 1 KiB
messages on three nodes: 12-20 MiB free in each node's heap, a quarter of
its RSS (docs/performance.md). RabbitMQ's idle queues hibernate for the
same reason. `malloc_trim(0)` returns every free page, but it walks the
heap holding the arena's lock, so it runs only once the node has done no
work for a while, and once per quiet spell: a busy node reuses its free
memory and is never trimmed.
"""
from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable


class QuietTrim:
    """When to trim: `due(now, work)` is called periodically with a count that
    grows with the node's work; it is true once the count has stood still for
    `quiet_seconds`, then not again until it has moved (the first spell after
    start counts: recovery leaves free memory too)."""

    def __init__(self, quiet_seconds: float) -> None:
        self.quiet_seconds = quiet_seconds
        self._work: int | None = None
        self._still_since = 0.0
        self._armed = False

    def due(self, now: float, work: int) -> bool:
        if work != self._work:
            self._work, self._still_since, self._armed = work, now, True
            return False
        if self._armed and now - self._still_since >= self.quiet_seconds:
            self._armed = False
            return True
        return False


def malloc_trim() -> Callable[[], int] | None:
    """glibc's `malloc_trim(0)`, or None where there is none (another libc, another OS)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)
