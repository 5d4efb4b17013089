"""A queue as one node sees it: the one shell every vhost holds, for every
queue type.

Theory of operation. A queue is its `QueueReplica` (broker/queues/queue_replica.py:
the machine, the leader's interpreter of its effects, the snapshot policy),
present where the queue's state lives, and this node's `QueueClient`
(broker/queues/queue_client.py: enqueuer and delivery sequences, resends), present
on every node that knows the queue. The client reaches the replica through a
route (broker/queues/queue_routes.py). A transient or exclusive queue is a replica without a log on
its node: `LocalRoute` applies each command at once. A replicated queue
(broker/queues/quorum.py: quorum, and durable classic queues on a group of one) goes
through Raft: `ReplicatedRoute`; its replica exists on members only.

Channels speak to every queue alike: `enqueue_from` (publish), `release`
(settle, return, discard), `get`, `purge`, `add_consumer`/`remove_consumer`/
`owner_down`, `suspend`.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Protocol

from warren.broker.queues import fifo
from warren.broker.queues import queue_commands as qc
from warren.broker.queues import quorum_machine as qm
from warren.broker.queues.queue_client import QueueClient, now_ms
from warren.broker.queues.queue_replica import QueueReplica
from warren.broker.queues.queue_routes import LocalRoute, QueueRoute
from warren.broker.weak_callbacks import weak_method
from warren.protocol import codec

if TYPE_CHECKING:
    from warren.broker.routing.vhost import VirtualHost


class ConsumerSink(Protocol):
    """What a queue needs from a consuming channel."""

    def deliver(self, queue: "Queue", consumer_tag: str, msg_id: Any, payload: Any, redelivered: bool) -> None: ...

    def deliver_many(self, queue: "Queue", consumer_tag: str, deliveries: list) -> None:
        """`deliver` for each (msg_id, payload, redelivered), in order (a sink that
        subclasses this has it as is; a channel does it faster)."""
        for msg_id, payload, redelivered in deliveries:
            self.deliver(queue, consumer_tag, msg_id, payload, redelivered)

    def on_queue_deleted(self, queue: "Queue", consumer_tag: str) -> None: ...


def _with_delivery_count(payload: tuple, count: int) -> tuple:
    """A quorum queue's redelivery carries x-delivery-count, as RabbitMQ's does."""
    exchange, routing_key, properties, body = payload
    decoded = codec.decode_properties(properties)
    decoded.headers = {**(decoded.headers or {}), "x-delivery-count": count}
    return exchange, routing_key, codec.encode_properties(decoded), body


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def limits_of(arguments: dict) -> fifo.QueueLimits:
    return fifo.QueueLimits(
        max_length=arguments.get("x-max-length"),
        max_length_bytes=arguments.get("x-max-length-bytes"),
        overflow=arguments.get("x-overflow", fifo.DROP_HEAD),
        message_ttl_ms=arguments.get("x-message-ttl"),
        single_active_consumer=arguments.get("x-single-active-consumer") is True,
        max_priority=arguments.get("x-max-priority"),
        delivery_limit=arguments.get("x-delivery-limit"),
    )


class Queue:
    replicated = False  # a replicated queue (broker/queues/quorum.py): changed through Raft
    forwarded = False   # another shard's queue without a log (broker/node/shard_queues.py)
    group: str | None = None

    def __init__(
        self,
        vhost: "VirtualHost",
        name: str,
        durable: bool,
        exclusive_owner: Hashable | None,
        auto_delete: bool,
        arguments: dict,
        clock_ms: Callable[[], int] = _wall_clock_ms,
        route: Callable[["Queue"], QueueRoute] = LocalRoute,
    ):
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments
        self.queue_type = arguments.get("x-queue-type", "classic")
        self._clock_ms = clock_ms
        self.limits = limits_of(arguments)
        self.expires_ms: int | None = arguments.get("x-expires")
        self.last_used_ms = clock_ms()
        # consumer id (owner, consumer_tag) -> the channel that consumes
        self.consumers: dict[Hashable, ConsumerSink] = {}
        self.exclusive_consumer: Hashable | None = None
        self.had_consumers = False
        self.deleted = False
        self.expiring = False   # its x-expires deletion was asked for
        self.replica: QueueReplica | None = None
        self.route = route(self)
        self.client = QueueClient(self.group or name, self.route, self.route.owner_key, self)
        self._make_replica(self.route.replica_wanted())

    def _make_replica(self, wanted: bool, machine: qm.QuorumMachine | None = None) -> None:
        if not wanted:
            self.replica = None
            return
        self.replica = QueueReplica(machine or qm.QuorumMachine(self.limits), self.route.node, self.client.group,
                                    self.route.replica_log(), self.client, self.route.send_to,
                                    weak_method(self._dead_letter))

    # -- the machine, as broker/node/cluster.py and broker/node/metadata.py see it -----------------
    @property
    def machine(self) -> qm.QuorumMachine | None:
        return self.replica.machine if self.replica is not None else None

    @machine.setter
    def machine(self, machine: qm.QuorumMachine | None) -> None:
        self._make_replica(machine is not None, machine)

    @property
    def state(self) -> fifo.FifoState:
        return self.replica.machine.state if self.replica is not None else fifo.FifoState(limits=self.limits)

    @property
    def local_consumers(self) -> dict:
        return self.client.local_consumers

    @property
    def enqueuers(self) -> dict:
        return self.client.enqueuers

    # -- the effects that end here ----------------------------------------------------
    def _dead_letter(self, reason: str, payloads: tuple) -> None:
        self.vhost.dead_letter(self, reason, tuple(payloads), self._clock_ms())

    def delivery_payload(self, payload: Any, delivery_count: int) -> tuple:
        """The payload as delivered: a quorum queue's redelivery carries
        x-delivery-count, as RabbitMQ's does."""
        if delivery_count and self.queue_type == "quorum":
            payload = _with_delivery_count(payload, delivery_count)
        return payload

    # -- publishing ---------------------------------------------------------------------
    def enqueue_from(self, owner: Hashable, payload: tuple, ttl_ms: int | None, priority: int,
                     on_applied: Callable[[bool], None] | None) -> None:
        """One publish of `owner`'s; `on_applied(accepted)` once the queue has it."""
        self.client.enqueue_from(owner, payload, ttl_ms, priority, on_applied)

    def enqueue(self, payload: Any, size: int, ttl_ms: int | None = None, priority: int = 0) -> int | None:
        """Dead-lettering into this queue (no confirm): this node's own enqueuer."""
        self.enqueue_from(("dlx", self.client.group), payload, ttl_ms, priority, None)
        return 0

    # -- commands from channels -----------------------------------------------------------
    def release(self, kind: type, owner: Hashable, tag: str | None, msg_ids: Any,
                on_done: Callable[[Any], None] | None = None) -> None:
        """qc.Settle, qc.Return or qc.Discard of deliveries (msg_id, seq) or msg ids."""
        self.client.release(kind, owner, tag, msg_ids, on_done)

    def suspend(self, consumer_id: tuple, active: bool) -> None:
        owner, tag = consumer_id
        self.client.submit(qc.Suspend(self.route.owner_key(owner), tag, now_ms(), active))

    def get(self, owner: Hashable, no_ack: bool, on_done: Callable[[fifo.Dequeued | None], None]) -> None:
        """basic.get; `on_done(dequeued or None)` once the queue answered."""
        self.client.get(owner, no_ack, lambda reply: on_done(_dequeued(reply)))

    def purge(self, on_done: Callable[[int], None]) -> None:
        self.client.purge(lambda count: on_done(count or 0))

    def stat(self, on_done: Callable[[int, int], None]) -> None:
        """`on_done(ready, consumers)` as the queue's leader has them, after this node's
        commands so far (a node without the queue's replica has neither)."""
        self.client.stat(lambda counts: on_done(*(counts or (0, 0))))

    def add_consumer(self, consumer_id: Hashable, sink: ConsumerSink, prefetch: int,
                     priority: int, no_ack: bool, exclusive: bool, active: bool = True,
                     on_checked_out: Callable[[bool], None] | None = None) -> None:
        """basic.consume. With `on_checked_out`, the machine judges exclusivity (it sees
        every node's and shard's consumers) and `on_checked_out(accepted)` says how; a
        consumer it refuses was never here."""
        self.touch()
        self.consumers[consumer_id] = sink
        if exclusive:
            self.exclusive_consumer = consumer_id
        if on_checked_out is None:
            self.had_consumers = True
            self.client.checkout(consumer_id, sink, prefetch, priority, no_ack, active)
            return

        def verdict(reply: Any) -> None:
            accepted = reply != fifo.IN_EXCLUSIVE_USE
            if accepted:
                self.had_consumers = True
            else:   # not _forget_consumer: a consumer that never was does not auto-delete the queue
                self.consumers.pop(consumer_id, None)
                if self.exclusive_consumer == consumer_id:
                    self.exclusive_consumer = None
                self.client.forget_consumer(consumer_id)
            on_checked_out(accepted)
        self.client.checkout(consumer_id, sink, prefetch, priority, no_ack, active, exclusive, verdict)

    def remove_consumer(self, consumer_id: Hashable) -> None:
        """basic.cancel: no more deliveries; what it holds stays unacked."""
        self.touch()
        self.client.cancel(consumer_id)
        self._forget_consumer(consumer_id)

    def _forget_consumer(self, consumer_id: Hashable) -> None:
        self.consumers.pop(consumer_id, None)
        if self.exclusive_consumer == consumer_id:
            self.exclusive_consumer = None
        if self.auto_delete and self.had_consumers and not self.consumers and not self.deleted:
            self.vhost.delete_queue_now(self)

    def owner_down(self, owner: Hashable) -> None:
        """The channel ``owner`` closed: return all it held, drop its consumers."""
        for consumer_id in [c for c in self.consumers if c[0] == owner]:
            self._forget_consumer(consumer_id)
        self.client.owner_down(owner)

    # -- time: message TTL and x-expires -------------------------------------
    def touch(self) -> None:
        """The queue was used (declare, consume, cancel, get): x-expires starts over."""
        self.last_used_ms = self._clock_ms()

    def tick(self) -> None:
        """Called periodically on every node; only the leader acts: message TTL, and
        x-expires (unused: no consumers, no basic.get, no redeclare, for that long)."""
        if self.replica is None or not self.route.leading():
            return
        if self.replica.machine.state.expiries:
            self.client.submit(qc.Tick(now_ms()))
        if (self.expires_ms is not None and not self.expiring and not self.deleted
                and self.consumer_count == 0 and self._clock_ms() - self.last_used_ms >= self.expires_ms):
            self.route.expire()

    # -- numbers ------------------------------------------------------------------
    @property
    def consumer_count(self) -> int:
        return self.replica.machine.consumer_count if self.replica is not None else len(self.consumers)

    @property
    def message_count(self) -> int:
        return self.replica.machine.ready_count if self.replica is not None else 0

    @property
    def bytes_in_memory(self) -> int:
        """Bytes of queued bodies held in memory (those stored on disk excluded)."""
        return self.replica.bytes_in_memory if self.replica is not None else 0

    def notify_deleted(self) -> None:
        """Deleted: its consumers are told, its unconfirmed publishes confirmed (as
        RabbitMQ), so the channel's publishes in flight do not hold it."""
        self.deleted = True
        for consumer_id, sink in list(self.consumers.items()):
            sink.on_queue_deleted(self, consumer_id[1])
        self.consumers.clear()
        self.client.confirm_all()


def _dequeued(reply: Any) -> fifo.Dequeued | None:
    """basic.get's answer from its wire form (broker/queues/queue_replica.py `wire_reply`)."""
    if not reply or isinstance(reply, fifo.Dequeued):
        return reply or None
    msg_id, payload, redelivered, message_count, delivery_count = reply
    return fifo.Dequeued(msg_id, tuple(payload), redelivered, message_count, delivery_count)
