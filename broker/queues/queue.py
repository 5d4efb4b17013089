"""A queue: the pure fifo machine plus the thin shell that performs its effects.

The shell numbers commands (the future Raft log index), stamps the time into
each, applies it to ``fifo`` and interprets the effects: deliveries go to the
consuming channel, dead-letters back into the vhost's routing. Until the
storage and Raft issues land, commands are applied in memory on this node.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Protocol

from warren.broker.queues import fifo
from warren.protocol import codec

if TYPE_CHECKING:
    from warren.broker.routing.vhost import VirtualHost


class ConsumerSink(Protocol):
    """What a queue needs from a consuming channel."""

    def deliver(self, queue: "Queue", consumer_tag: str, msg_id: int, payload: Any, redelivered: bool) -> None: ...

    def on_queue_deleted(self, queue: "Queue", consumer_tag: str) -> None: ...


def _with_delivery_count(payload: tuple, count: int) -> tuple:
    """A quorum queue's redelivery carries x-delivery-count, as RabbitMQ's does."""
    exchange, routing_key, properties, body = payload
    decoded = codec.decode_properties(properties)
    decoded.headers = {**(decoded.headers or {}), "x-delivery-count": count}
    return exchange, routing_key, codec.encode_properties(decoded), body


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class Queue:
    replicated = False  # a quorum queue (broker/queues/quorum.py): changed through Raft

    def __init__(
        self,
        vhost: "VirtualHost",
        name: str,
        durable: bool,
        exclusive_owner: Hashable | None,
        auto_delete: bool,
        arguments: dict,
        clock_ms: Callable[[], int] = _wall_clock_ms,
    ):
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments
        self.queue_type = arguments.get("x-queue-type", "classic")
        self._clock_ms = clock_ms
        self.index = 0
        self.state = fifo.FifoState(limits=fifo.QueueLimits(
            max_length=arguments.get("x-max-length"),
            max_length_bytes=arguments.get("x-max-length-bytes"),
            overflow=arguments.get("x-overflow", fifo.DROP_HEAD),
            message_ttl_ms=arguments.get("x-message-ttl"),
            single_active_consumer=arguments.get("x-single-active-consumer") is True,
            max_priority=arguments.get("x-max-priority"),
            delivery_limit=arguments.get("x-delivery-limit"),
        ))
        self.expires_ms: int | None = arguments.get("x-expires")
        self.last_used_ms = clock_ms()
        # consumer id (owner, consumer_tag) -> the channel that consumes
        self.consumers: dict[Hashable, ConsumerSink] = {}
        self.exclusive_consumer: Hashable | None = None
        self.had_consumers = False
        self.deleted = False
        # Set for a durable queue by the durability layer: its log in the node's WAL.
        self.log_id: int | None = None
        self.journal: Any = None
        # bytes of queued bodies that live only on disk (not in memory)
        self.stored_bytes = 0

    # -- applying commands ------------------------------------------------
    def apply(self, command: Any) -> Any:
        self.index += 1
        reply, effects = fifo.apply(fifo.Meta(self.index, self._clock_ms()), command, self.state)
        if self.state.removed:
            self._log_removals()
        if effects:
            self._perform(effects)
        return reply

    def _log_removals(self) -> None:
        self.stored_bytes -= sum(size for _, payload, size in self.state.removed if type(payload) is not tuple)
        self.index += 1
        self.journal.log_removals(self.log_id, self.index, self.state.removed)
        self.state.removed.clear()

    def enqueue(self, payload: Any, size: int, ttl_ms: int | None = None, priority: int = 0) -> int | None:
        """Apply one enqueue. None: refused; 0: taken; N > 0: taken, durable once
        WAL batch N is on disk (a persistent message in a durable queue)."""
        msg_id = self.index + 1
        if self.apply(fifo.Enqueue(payload, size, ttl_ms, priority)) is not fifo.ACCEPTED:
            return None
        if self.log_id is None or not codec.is_persistent(payload[2]):
            return 0
        return self.journal.log_enqueue(self, msg_id, payload)

    def release_cursor(self) -> int:
        """The oldest message still held: log entries below it are dead."""
        return next(iter(self.state.messages), self.index + 1)

    # -- bodies on disk ---------------------------------------------------
    # A persistent message's payload is replaced by the location of its WAL record
    # once that is durable, and read back when it is delivered.
    def store_body(self, msg_id: int, location: Any) -> None:
        entry = self.state.messages.get(msg_id)
        if entry is not None and type(entry[0]) is tuple:
            self.state.messages[msg_id] = (location, entry[1])
            self.stored_bytes += entry[1]

    def relocate_body(self, msg_id: int, location: Any) -> None:
        entry = self.state.messages.get(msg_id)
        if entry is not None and type(entry[0]) is not tuple:
            self.state.messages[msg_id] = (location, entry[1])

    def delivery_payload(self, payload: Any, delivery_count: int) -> tuple:
        """The payload as delivered: from disk if stored; a quorum queue's
        redelivery carries x-delivery-count, as RabbitMQ's does."""
        payload = self.hydrate(payload)
        if delivery_count and self.queue_type == "quorum":
            payload = _with_delivery_count(payload, delivery_count)
        return payload

    def hydrate(self, payload: Any) -> tuple:
        """The (exchange, routing_key, properties, body) of a payload, from disk if stored."""
        return payload if type(payload) is tuple else self.journal.load(payload)

    def restore(self, live: list[tuple[int, Any, int]], last_index: int,
                priorities: dict[int, int] | None = None, ttls: dict[int, int] | None = None) -> None:
        """Recovery: re-enqueue the live messages under their original ids.
        TTLs start over from now (the enqueue times are not stored)."""
        self.stored_bytes += sum(size for _, payload, size in live if type(payload) is not tuple)
        limits = self.state.limits
        if limits.max_length is None and limits.max_length_bytes is None:
            fifo.restore(self.state, live, priorities)
            now = self._clock_ms()
            for msg_id, _, _ in live:
                ttl = fifo.effective_ttl(limits.message_ttl_ms, (ttls or {}).get(msg_id))
                if ttl is not None:
                    self.state.expiries[msg_id] = now + ttl
        else:  # a length limit may drop some on the way back: replay each enqueue
            now = self._clock_ms()
            for msg_id, payload, size in live:
                priority = (priorities or {}).get(msg_id, 0)
                ttl = (ttls or {}).get(msg_id)
                fifo.apply(fifo.Meta(msg_id, now), fifo.Enqueue(payload, size, ttl, priority), self.state)
        self.index = max(self.index, last_index)
        if self.state.removed:  # a length limit dropped some on the way back
            self._log_removals()

    def _perform(self, effects: list) -> None:
        for effect in effects:
            match effect:
                case fifo.Deliver(consumer=consumer_id):
                    sink = self.consumers.get(consumer_id)
                    assert sink is not None, f"delivery to unknown consumer {consumer_id!r}"
                    sink.deliver(self, consumer_id[1], effect.msg_id,
                                 self.delivery_payload(effect.payload, effect.delivery_count), effect.redelivered)
                case fifo.DeadLetter():
                    self.vhost.dead_letter(self, effect.reason, tuple(self.hydrate(p) for p in effect.payloads),
                                           self._clock_ms())
                case _:
                    raise AssertionError(f"unknown effect {effect!r}")

    # -- consumers --------------------------------------------------------
    def add_consumer(self, consumer_id: Hashable, sink: ConsumerSink, prefetch: int,
                     priority: int, no_ack: bool, exclusive: bool, active: bool = True) -> None:
        self.touch()
        self.consumers[consumer_id] = sink
        self.had_consumers = True
        if exclusive:
            self.exclusive_consumer = consumer_id
        self.apply(fifo.Checkout(consumer_id, prefetch, priority, no_ack, active))

    def remove_consumer(self, consumer_id: Hashable) -> None:
        """basic.cancel: no more deliveries; what it holds stays unacked."""
        self.touch()
        self.apply(fifo.Cancel(consumer_id))
        self._forget_consumer(consumer_id)

    def _forget_consumer(self, consumer_id: Hashable) -> None:
        self.consumers.pop(consumer_id, None)
        if self.exclusive_consumer == consumer_id:
            self.exclusive_consumer = None
        if self.auto_delete and self.had_consumers and not self.consumers and not self.deleted:
            self.vhost.delete_queue_now(self)

    def owner_down(self, owner: Hashable) -> None:
        """The channel ``owner`` closed: return all it held, drop its consumers."""
        self.apply(fifo.Down(owner))
        for consumer_id in [c for c in self.consumers if c[0] == owner]:
            self._forget_consumer(consumer_id)

    # -- time: message TTL and x-expires -------------------------------------
    def touch(self) -> None:
        """The queue was used (declare, consume, cancel, get): x-expires starts over."""
        self.last_used_ms = self._clock_ms()

    def tick(self) -> None:
        """Called periodically: expire messages, delete the queue if unused too long."""
        if self.state.expiries:
            self.apply(fifo.Tick())
        if (self.expires_ms is not None and not self.consumers and not self.deleted
                and self._clock_ms() - self.last_used_ms >= self.expires_ms):
            self.vhost.delete_queue_now(self)

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    @property
    def bytes_in_memory(self) -> int:
        """Bytes of queued bodies held in memory (those stored on disk excluded)."""
        return self.state.message_bytes - self.stored_bytes

    @property
    def message_count(self) -> int:
        return self.state.ready_count

    def notify_deleted(self) -> None:
        self.deleted = True
        for consumer_id, sink in list(self.consumers.items()):
            sink.on_queue_deleted(self, consumer_id[1])
        self.consumers.clear()
