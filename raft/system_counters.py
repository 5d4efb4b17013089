"""The Raft system's counters (raft/system.py), for metrics and for tests."""
from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(slots=True)
class SystemCounters:
    """Monotonic counters for metrics (and for tests: idle costs nothing)."""
    ticks: int = 0                  # tick() calls
    group_ticks: int = 0            # RaftNode.tick() calls, over all groups
    persist_calls: int = 0
    persist_items: int = 0
    frames_sent: int = 0
    messages_sent: int = 0
    messages_received: int = 0
    messages_dropped: int = 0       # unknown group, misaddressed, or to a down peer
    messages_refused: int = 0       # replicated entries or a snapshot the disk had no room for
    readies: int = 0
    quiesced: int = 0               # a group fell quiet
    woken: int = 0                  # a quiet group woke

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
