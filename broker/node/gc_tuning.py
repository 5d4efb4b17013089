"""The cyclic garbage collector, tuned for a broker (issue 12, "Tail latency").

CPython's defaults (700, 10, 10) run a young collection every 700 container
allocations: a broker allocates a few containers per message (events,
commands, replies), so at 50k msg/s that is hundreds of collections a
second, and whatever is alive at that moment (a batch in flight, a snapshot
being built) is promoted until a full collection walks the whole heap. A
full collection stops the loop for as long as it takes to traverse every
tracked object and every element of the big containers (a queue's message
index): measured on a queue of 700k messages, 55 full collections in 16 s,
up to 120-370 ms each, 40 % of the node's CPU; they were the confirm p99.

So, once the node has started:
* everything built at start (modules, classes, settings, the recovered
  state) is moved to the permanent generation (`gc.freeze`): no collection
  looks at it again;
* a young collection comes every `YOUNG_THRESHOLD` allocations (short-lived
  objects die by reference counting long before), and a full one only
  after `OLD_THRESHOLD` middle ones, beside CPython's own rule that the
  old generation must have grown by a quarter since the last.
Reference cycles are still collected (asyncio's exceptions make a few):
the young and middle generations collect those of recent objects, the
rare full collections the rest. A collection that stops the node for
`LONG_PAUSE_SECONDS` or more is logged (`gc.long_pause`), so a latency
tail that comes from the collector shows in the log.
"""
from __future__ import annotations

import gc
import time

import structlog

log = structlog.get_logger("warren.gc")

YOUNG_THRESHOLD = 50_000
MIDDLE_THRESHOLD = 20
OLD_THRESHOLD = 100
LONG_PAUSE_SECONDS = 0.05


class PauseWatch:
    """A `gc.callbacks` hook: times each collection, logs the long ones."""

    def __init__(self) -> None:
        self.started = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.started = time.perf_counter()
            return
        seconds = time.perf_counter() - self.started
        if seconds >= LONG_PAUSE_SECONDS:
            log.warning("gc.long_pause", generation=info["generation"], ms=round(seconds * 1000, 1),
                        collected=info["collected"])


def tune_after_start() -> None:
    """Freeze what start-up built, space the collections out and watch their
    pauses (call once, after start)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_THRESHOLD, OLD_THRESHOLD)
    if not any(isinstance(callback, PauseWatch) for callback in gc.callbacks):
        gc.callbacks.append(PauseWatch())
