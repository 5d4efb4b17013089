"""Simulated AMQP clients: they use a node's queues as its channels do.

Theory of operation. A client is connected to one node (a connection and
one channel, named `owner` as a channel names itself); it dies with its
node, and then, or now and then by choice, reconnects to another node.

* `Publisher` publishes with confirms through the node's routing read model
  (`VirtualHost.route` on the default exchange) and `QuorumQueue.enqueue_from`,
  as a channel does; the confirm is the callback's `ok`. Its bodies name it,
  its session (one per connection) and a sequence number, so the history
  knows every publish. Unroutable publishes are confirmed, as RabbitMQ does
  without `mandatory`.
* `Consumer` consumes with manual acks (`add_consumer`, a prefetch) and
  acks what it got (`release(qc.Settle, ...)`) a little later, or now and then
  rejects it with requeue (`qc.Return`), as a channel does;
  closing its channel returns what it held (`owner_down`).
* `Admin` declares and deletes queues through the metadata group, as
  broker/channel_topology.py does, and notes when the answer came; and adds
  a node to or removes one from a queue's members as warrenctl's
  add_member / delete_member do (broker/admin/management.py).
"""
from __future__ import annotations

from typing import Any

from tests.sim.node import VHOST, SimNode
from warren.broker.node import metadata_commands as mc
from warren.broker.node.metadata import MembershipError
from warren.broker.queues import queue_commands as qc
from warren.broker.queues.queue import ConsumerSink
from warren.protocol.codec import EMPTY_PROPERTIES

PREFETCH = 8
RETURN_RATE = 0.1   # share of deliveries rejected with requeue


class Client:
    def __init__(self, world: Any, name: str) -> None:
        self.world = world
        self.name = name
        self.node: SimNode | None = None
        self.owner: tuple[int, int] | None = None
        self.incarnation = 0   # the node's incarnation it is connected to

    @property
    def connected(self) -> bool:
        node = self.node
        return node is not None and node.up and node.incarnations == self.incarnation

    def connect(self, node: SimNode) -> None:
        self.node = node
        self.incarnation = node.incarnations
        self.owner = (self.world.next_connection_id(), 1)

    def queue(self, name: str) -> Any:
        return self.node.vhost.queues.get(name) if self.connected else None


class Publisher(Client):
    def __init__(self, world: Any, name: str, queue: str) -> None:
        super().__init__(world, name)
        self.queue_name = queue
        self.session = 0
        self.seq = 0
        self.unconfirmed = 0

    def connect(self, node: SimNode) -> None:
        super().connect(node)
        self.session += 1
        self.unconfirmed = 0

    def publish(self) -> None:
        if not self.connected or self.unconfirmed >= 16:
            return
        vhost = self.node.vhost
        self.seq += 1
        body = f"{self.name}/{self.session}/{self.seq}".encode()
        history = self.world.history
        history.published[body] = (self.name, self.session, self.seq)
        queues = vhost.route(vhost.exchanges[""], self.queue_name, EMPTY_PROPERTIES)
        if not queues:
            history.unroutable(self, body)
            return
        self.unconfirmed += 1
        incarnation, session = self.incarnation, self.session

        def on_applied(ok: bool) -> None:
            if self.incarnation == incarnation and self.session == session:
                self.unconfirmed -= 1
                if self.connected:   # a dead connection hears no confirm
                    history.confirm(body, ok)
        for queue in queues:
            queue.enqueue_from(self.owner, ("", self.queue_name, EMPTY_PROPERTIES, body), None, 0, on_applied)


class Consumer(Client, ConsumerSink):
    """A consumer sink (`broker.queue.ConsumerSink`) with manual acks."""

    def __init__(self, world: Any, name: str, queue: str) -> None:
        super().__init__(world, name)
        self.queue_name = queue
        self.tag = f"ctag-{name}"
        self.consuming: Any = None
        self.unacked: list[tuple[Any, Any]] = []

    def connect(self, node: SimNode) -> None:
        super().connect(node)
        self.consuming = None
        self.unacked = []

    def close(self) -> None:
        """The channel closes: the queue gets back what it holds."""
        if self.connected and self.consuming is not None and not self.consuming.deleted:
            self.consuming.owner_down(self.owner)
        self.consuming = None
        self.unacked = []

    def act(self) -> None:
        if not self.connected:
            return
        if self.consuming is None:
            queue = self.queue(self.queue_name)
            if queue is not None:
                self.consuming = queue
                queue.add_consumer((self.owner, self.tag), self, PREFETCH, 0, False, False)
            return
        rng = self.world.rng
        if self.unacked and rng.random() < 0.5:
            count = rng.randint(1, len(self.unacked))
            released, self.unacked = self.unacked[:count], self.unacked[count:]
            for queue, msg_id, body in released:
                if not queue.deleted:
                    self.release(queue, msg_id, body, returned=rng.random() < RETURN_RATE)

    def release(self, queue: Any, msg_id: Any, body: bytes, returned: bool) -> None:
        """An ack, or a reject with requeue (the message goes back to the queue)."""
        history = self.world.history
        if returned:
            queue.release(qc.Return, self.owner, self.tag, [msg_id])
            history.counts["returns"] += 1
            return
        history.settle_sent(self, body)
        queue.release(qc.Settle, self.owner, self.tag, [msg_id],
                      lambda count: history.settle_applied(body) if count else None)

    def deliver(self, queue: Any, consumer_tag: str, msg_id: Any, payload: Any, redelivered: bool) -> None:
        assert self.connected, f"{self.name}: a delivery to a dead connection"
        self.world.history.delivered(self, payload[3], redelivered)
        self.unacked.append((queue, msg_id, payload[3]))

    def on_queue_deleted(self, queue: Any, consumer_tag: str) -> None:
        self.consuming = None
        self.unacked = []


class Admin(Client):
    """Declares and deletes queues; the history notes each answer."""

    def declare(self, name: str) -> None:
        if not self.connected:
            return
        node = self.node
        cluster = node.cluster
        members = tuple(cluster.place_members({"x-queue-type": "quorum"}))
        incarnation = self.incarnation

        def declared(_: Any) -> None:
            if self.connected and self.incarnation == incarnation:
                self.world.history.declared_ok(node, name)
        node.cluster.broker.metadata.submit(
            mc.DeclareQueue(VHOST, name, {"x-queue-type": "quorum"}, members, cluster.node), declared)

    def delete(self, name: str) -> None:
        if not self.connected:
            return
        self.world.history.deleting(name)
        self.node.cluster.broker.metadata.submit(mc.DeleteQueue(VHOST, name), lambda _: None)

    def change_member(self, name: str, rng: Any) -> str | None:
        """Add a node to the queue's members or remove one (not the last), as warrenctl does:
        checked against this node's metadata state, then submitted; the change made, or None."""
        if not self.connected:
            return None
        metadata = self.node.cluster.broker.metadata
        record = metadata.state.queue(VHOST, name)
        if record is None:
            return None
        members = list(record.members)
        choices = [("add", node) for node in self.world.names if node not in members]
        if len(members) > 1:
            choices += [("remove", node) for node in members]
        op, node = rng.choice(choices)
        try:
            members = metadata.check_membership(VHOST, name, op, node)
        except MembershipError:
            return None
        metadata.submit(mc.SetMembers(VHOST, name, tuple(members), op, node), lambda _: None)
        return op
