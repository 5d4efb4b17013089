"""What the simulated clients saw, and the user's promises checked against it.

Checked as it happens: a declaration answered on a node is known on that node
and on every node it counted running (those that applied it; a node the
bounded wait gave up on is excused, as production logs it), and a publish
to such a queue, on such a node, routes. Checked at the end, after healing
and draining (`final_failures`): no confirmed message lost, none delivered
that was never published, no second delivery without the redelivered flag,
each publisher session's first deliveries in its order (per consumer), no
delivery of a message after its settle was applied, nor on the channel that acked it.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any


class SimulationFailure(AssertionError):
    pass


class History:
    def __init__(self, world: Any) -> None:
        self.world = world
        self.published: dict[bytes, tuple[str, int, int]] = {}   # body -> (publisher, session, seq)
        self.confirmed: set[bytes] = set()
        self.nacked: set[bytes] = set()
        self.deliveries: dict[bytes, list[tuple[str, bool]]] = defaultdict(list)   # body -> [(consumer, redelivered)]
        self.last_first_seq: dict[tuple[str, str, int], int] = {}   # (consumer, publisher, session) -> seq
        self.known_on: dict[str, set[str]] = {}   # queue -> nodes that must route to it (declared-ok)
        self.deleted: set[str] = set()
        self.received: dict[str, int] = {}   # consumer -> deliveries
        self.settled: set[bytes] = set()   # bodies whose settle the queue applied
        self.settle_sent_by: dict[bytes, tuple] = {}   # body -> the channel and tag that acked it
        self.settle_sent_at: dict[bytes, float] = {}
        self.cut_off_past_gone: dict[str, list[float]] = defaultdict(list)   # node -> when such a fault ends
        self.declared = 0
        self.counts: dict[str, int] = defaultdict(int)

    def fail(self, why: str) -> None:
        self.world.fail(why)

    def confirm(self, body: bytes, ok: bool) -> None:
        (self.confirmed if ok else self.nacked).add(body)
        self.counts["confirms" if ok else "nacks"] += 1

    def unroutable(self, publisher: Any, body: bytes) -> None:
        name = publisher.queue_name
        self.counts["unroutable"] += 1
        if name in self.known_on and name not in self.deleted and publisher.node.name in self.known_on[name]:
            self.fail(f"{publisher.name} on {publisher.node.name}: queue {name} declared-ok there, "
                      f"yet the publish of {body!r} was unroutable")

    def declared_ok(self, node: Any, name: str) -> None:
        self.declared += 1
        if name in self.deleted:
            return   # deleted meanwhile: the deletion may have been applied before the answer came
        core = node.cluster.core
        excused = {peer for _, lagging in core.answers.late for peer in lagging}
        must_know = {node.name, *core.running_peers()} - excused
        for other in sorted(must_know):
            other_node = self.world.nodes[other]
            if other_node.up and name not in other_node.vhost.queues:
                self.fail(f"queue {name} declared-ok on {node.name}, but {other} (running) does not know it")
        self.known_on.setdefault(name, set()).update(must_know)

    def deleting(self, name: str) -> None:
        self.deleted.add(name)

    def delivered(self, consumer: Any, body: bytes, redelivered: bool) -> None:
        if body not in self.published:
            self.fail(f"{consumer.name} got {body!r}, never published")
        if body in self.settled:
            self.fail(f"{consumer.name} got {body!r} again after settling it")
        if self.settle_sent_by.get(body) == (consumer.owner, consumer.tag):
            if not self.cut_off_since(consumer.node.name, self.settle_sent_at[body]):
                self.fail(f"{consumer.name} got {body!r} again on the channel that acked it")
            # An ack not applied yet when its node was cut off past the gone timeout: the
            # leader took the message back (as RabbitMQ's on noconnection) and the ack,
            # applied later, settles nothing; the message comes again, redelivered.
            self.counts["redelivered after an ack lost to a cut-off"] += 1
        earlier = self.deliveries[body]
        if earlier and not redelivered:
            self.fail(f"{consumer.name} got {body!r} again without the redelivered flag (before: {earlier})")
        earlier.append((consumer.name, redelivered))
        self.received[consumer.name] = self.received.get(consumer.name, 0) + 1
        self.counts["redeliveries" if redelivered else "deliveries"] += 1
        if not redelivered:
            publisher, session, seq = self.published[body]
            key = (consumer.name, publisher, session)
            before = self.last_first_seq.get(key, 0)
            if seq < before:
                self.fail(f"{consumer.name} got {body!r} (first delivery) after seq {before} of the same session")
            self.last_first_seq[key] = seq

    def settle_sent(self, consumer: Any, body: bytes) -> None:
        self.settle_sent_by[body] = (consumer.owner, consumer.tag)
        self.settle_sent_at[body] = self.world.clock.now

    def cut_off(self, node: str, until: float) -> None:
        """`node` is paused or cut off, from now `until`, for longer than the gone timeout."""
        self.cut_off_past_gone[node].append(until)

    def cut_off_since(self, node: str, since: float) -> bool:
        """Whether `node` was cut off past the gone timeout at `since` or later."""
        return any(until >= since for until in self.cut_off_past_gone.get(node, ()))

    def settle_applied(self, body: bytes) -> None:
        self.settled.add(body)

    def lost(self, queues: set[str]) -> list[bytes]:
        """Confirmed messages to `queues` (never deleted) that nobody got."""
        return sorted(body for body in self.confirmed
                      if body not in self.deliveries and self.queue_of(body) in queues)

    def queue_of(self, body: bytes) -> str:
        return self.world.publisher_queue[self.published[body][0]]
