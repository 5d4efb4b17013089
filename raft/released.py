"""Entries and entry locations a compaction dropped, freed a piece per turn.

Why: a compaction drops every entry (and its location) since the last
snapshot at once, a couple of thousand for a busy queue. On a node after
heavy work those objects are cold: in the benchmark VM, touching one to
decrement its count cost 1-15 µs (no page fault shows in the process's
counters), so freeing a span at once held the event loop 20-60 ms, the
pubsub-16b-5k case's p99. Handed here instead, the host frees at least
`FREE_PER_TURN_MIN` objects a turn, and a 64th of what waits when more does:
what waits stays within 64 turns' worth of what compactions drop.
"""
from __future__ import annotations

from collections import deque

FREE_PER_TURN_MIN = 64
FREE_SHARE_PER_TURN = 64


class Released:
    def __init__(self) -> None:
        self._lists: deque[list] = deque()
        self._keys: deque[tuple[dict, range]] = deque()
        self.pending = 0   # objects waiting to be freed

    def add(self, objects: list | None) -> None:
        """`objects` (a list no one else uses) is freed in pieces from now on."""
        if objects:
            self._lists.append(objects)
            self.pending += len(objects)

    def drop_keys(self, mapping: dict, keys: range) -> None:
        """The `keys` of `mapping` go, in pieces from now on (absent ones are skipped)."""
        if keys:
            self._keys.append((mapping, keys))
            self.pending += len(keys)

    def free_some(self) -> None:
        """The end of a turn: free a piece of what waits."""
        budget = max(FREE_PER_TURN_MIN, self.pending // FREE_SHARE_PER_TURN)
        self.pending -= min(budget, self.pending)
        lists, keys = self._lists, self._keys
        while budget > 0 and lists:
            head = lists[0]
            if len(head) <= budget:
                lists.popleft()
                budget -= len(head)
            else:
                del head[:budget]
                budget = 0
        while budget > 0 and keys:
            mapping, indexes = keys[0]
            pop = mapping.pop
            for index in indexes[:budget]:
                pop(index, None)
            if len(indexes) <= budget:
                keys.popleft()
                budget -= len(indexes)
            else:
                keys[0] = (mapping, indexes[budget:])
                budget = 0
