"""The simulation's clock and each node's event loop, deterministic.

Theory of operation. One `SimClock` is the time of the whole world; it
stands in for the `time` module of the shells the simulation runs
(broker/node/cluster.py, broker/queues/queue.py, broker/queues/queue_client.py: `patch_time`), so
their resend and liveness timers run on simulated seconds. A `SimLoop` is a
node's event loop as the runtime uses it (`call_soon`, `call_later`): the
world runs its due callbacks in order, or none while the node is paused.
"""
from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import warren.broker.node.cluster
import warren.broker.queues.queue
import warren.broker.queues.queue_client

CALLBACKS_PER_RUN_MAX = 200_000


class SimClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def monotonic(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now

    def time_ns(self) -> int:
        return int(self.now * 1e9)

    def time(self) -> float:
        return self.now


@contextmanager
def patch_time(clock: SimClock) -> Iterator[None]:
    """The shells read `clock` instead of the real time while the world runs."""
    modules = (warren.broker.node.cluster, warren.broker.queues.queue, warren.broker.queues.queue_client)
    saved = [module.time for module in modules]
    for module in modules:
        module.time = clock   # type: ignore[assignment]
    try:
        yield
    finally:
        for module, original in zip(modules, saved):
            module.time = original


class SimHandle:
    __slots__ = ("callback", "args", "cancelled")

    def __init__(self, callback: Callable[..., Any], args: tuple) -> None:
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class SimLoop:
    """What the runtime and its turn scheduler use of an asyncio loop."""

    def __init__(self, clock: SimClock) -> None:
        self.clock = clock
        self.ready: deque[SimHandle] = deque()
        self.timers: list[tuple[float, int, SimHandle]] = []
        self.order = itertools.count()

    def time(self) -> float:
        return self.clock.now

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> SimHandle:
        handle = SimHandle(callback, args)
        self.ready.append(handle)
        return handle

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> SimHandle:
        handle = SimHandle(callback, args)
        heapq.heappush(self.timers, (self.clock.now + delay, next(self.order), handle))
        return handle

    def run_due(self) -> int:
        """Run the callbacks due now, and those they schedule with call_soon; how many ran."""
        while self.timers and self.timers[0][0] <= self.clock.now:
            self.ready.append(heapq.heappop(self.timers)[2])
        ran = 0
        while self.ready:
            handle = self.ready.popleft()
            if handle.cancelled:
                continue
            ran += 1
            assert ran < CALLBACKS_PER_RUN_MAX, "a node's loop does not settle (callbacks schedule callbacks)"
            handle.callback(*handle.args)
        return ran
