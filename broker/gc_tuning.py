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
rare full collections the rest.
"""
from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000
MIDDLE_THRESHOLD = 20
OLD_THRESHOLD = 100


def tune_after_start() -> None:
    """Freeze what start-up built and space the collections out (call once, after start)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_THRESHOLD, OLD_THRESHOLD)
