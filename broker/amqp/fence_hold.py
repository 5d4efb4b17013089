"""A connection's publishes, held while its node's metadata fence is up.

A node the others counted down must catch up with the metadata group before it
routes its clients' publishes (broker/node/metadata_fence.py): a publish parsed
meanwhile, and every event after it on the connection, wait here in order with
the socket unread, and are dispatched once the fence is lowered, through the
connection's own read path. What comes before the first publish goes on (a
handshake, a declare, a consume, an ack: a node in a minority still answers
those from its own view, as it did, and none of them can lose a message).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from warren.protocol.connection import EV_PUBLISH


class FenceHold:
    def __init__(self, cluster: Any, read_on: Callable[[], None], update_reading: Callable[[], None]) -> None:
        self._cluster = cluster
        self._read_on = read_on                 # the connection's read path, with nothing new read
        self._update_reading = update_reading   # pause or resume reading the socket
        self._parked: deque[tuple] | None = None
        self._released = False

    @property
    def holding(self) -> bool:
        return self._parked is not None

    def take(self, events: list, now: float, watched: bool) -> list:
        """The events to dispatch now: those before the first publish while the fence is
        up (the rest wait, behind what waits already), else what waited and then `events`.
        A connection still `watched` for a move to another process (connection_move.py)
        is not held: its bytes go with it."""
        parked = self._parked
        if parked is not None:
            if not self._released:
                parked.extend(events)
                return []
            self._parked, self._released = None, False
            return [*parked, *events]
        if watched or self._cluster.fence is None:   # a single node (no fence) pays nothing more
            return events
        first = next((at for at, event in enumerate(events) if event[0] == EV_PUBLISH), None)
        if first is None or not self._cluster.holds_clients(now):
            return events
        self._parked = deque(events[first:])
        self._cluster.when_fence_lowered(self._release)
        self._update_reading()
        return events[:first]

    def _release(self) -> None:
        self._released = True
        self._read_on()
        self._update_reading()
