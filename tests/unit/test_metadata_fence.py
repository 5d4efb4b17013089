"""The metadata fence (broker/node/metadata_fence.py): when a node must catch up
with the metadata group before it acts on its clients' frames."""
from __future__ import annotations

from warren.broker.node.metadata_fence import GAP_SECONDS, MetadataFence


def test_a_loop_that_runs_steadily_never_raises_it():
    fence = MetadataFence()
    for step in range(100):
        fence.saw_time(step * 0.05)
    assert not fence.up and not fence.barrier_to_start()


def test_a_gap_in_the_loop_raises_it_until_a_barrier_started_after_it_is_applied():
    fence = MetadataFence()
    fence.saw_time(10.0)
    fence.saw_time(10.0 + GAP_SECONDS * 2)   # the node was paused: it learns so when it runs again
    assert fence.up
    assert fence.barrier_to_start()
    assert not fence.barrier_to_start(), "one barrier in flight at a time"
    assert fence.barrier_applied() and not fence.up


def test_a_raise_while_a_barrier_is_in_flight_needs_another_barrier():
    fence = MetadataFence()
    fence.raise_fence()   # a peer's link went down
    assert fence.barrier_to_start()
    fence.raise_fence()   # another, before the barrier came back: it may have missed what came since
    assert not fence.barrier_applied() and fence.up
    assert fence.barrier_to_start()
    assert fence.barrier_applied() and not fence.up


def test_a_barrier_applied_when_none_was_asked_for_changes_nothing():
    fence = MetadataFence()
    assert not fence.barrier_applied() and not fence.up
    fence.raise_fence()
    assert not fence.barrier_applied() and fence.up
