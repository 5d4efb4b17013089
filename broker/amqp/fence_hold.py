"""A connection's input, held while its node's metadata fence is up.

A node the others counted down must catch up with the metadata group before it
acts on its clients' frames (broker/node/metadata_fence.py): the events parsed
meanwhile wait here, in order, with the socket unread, and are dispatched once
the fence is lowered, through the connection's own read path.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any


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
        """The events to dispatch now: none while the fence holds them (they wait behind
        what it holds already), else what it held and then `events`. A connection still
        `watched` for a move to another process (connection_move.py) is not held: its
        bytes go with it."""
        parked = self._parked
        if parked is not None:
            if not self._released:
                parked.extend(events)
                return []
            self._parked, self._released = None, False
            return [*parked, *events]
        if not events or watched or not self._cluster.holds_clients(now):
            return events
        self._parked = deque(events)
        self._cluster.when_fence_lowered(self._release)
        self._update_reading()
        return []

    def _release(self) -> None:
        self._released = True
        self._read_on()
        self._update_reading()
