"""A channel's consumers: basic.consume and basic.cancel (AMQP 0-9-1 §1.8.3.3-5).

Mixed into ``broker.channel.Channel``. Who may consume is the queue's to say:
an exclusive consumer only on a queue without consumers, no consumer beside
an exclusive one. The channel sees only its own node's and shard's consumers,
so a classic queue's machine judges (``fifo.IN_EXCLUSIVE_USE``), as
RabbitMQ's classic queue process does: consume-ok waits for its verdict
(the connection holds the channel's later frames meanwhile, as for a durable
declare), and deliveries that come first wait in the consumer until
consume-ok has gone. A quorum queue's consume is answered at once, as
RabbitMQ's (rabbit_quorum_queue:consume sends consume-ok before its
checkout), exclusivity checked against what this node knows.
"""
from __future__ import annotations

import secrets
from collections import deque
from dataclasses import dataclass, field
from functools import partial

from pamqp import commands as spec

from warren.broker.amqp.channel_topology import REPLY_TO_QUEUE
from warren.broker.queues.queue import Queue
from warren.protocol import codec
from warren.protocol.constants import ACCESS_REFUSED, NOT_ALLOWED, NOT_IMPLEMENTED, PRECONDITION_FAILED
from warren.protocol.errors import AMQPConnectionError, ChannelError


@dataclass(slots=True)
class Consumer:
    tag: str
    tag_bytes: bytes  # pre-encoded shortstr for basic.deliver
    queue: Queue | None  # None for the direct reply-to pseudo consumer
    no_ack: bool
    # (exchange, routing_key) -> the `codec.DeliverFrames` of its deliveries
    deliver_frames: dict[tuple[str, str], codec.DeliverFrames] = field(default_factory=dict)
    # deliveries made before consume-ok went (the queue's verdict pending); None once it went
    early: deque | None = None
    consume_ok_wanted: bool = False   # not nowait: consume-ok goes with the verdict


class ConsumerMethods:
    def on_basic_consume(self, method: spec.Basic.Consume) -> None:
        tag = method.consumer_tag or "amq.ctag-" + secrets.token_urlsafe(16)
        if tag in self.consumers:
            raise AMQPConnectionError(NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'", 60, 20)
        if method.queue == REPLY_TO_QUEUE:
            self._consume_reply_to(method, tag)
            return
        queue = self._readable_queue(method.queue, 60, 20)
        arguments = method.arguments or {}
        priority = arguments.get("x-priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ChannelError(PRECONDITION_FAILED, f"invalid arg 'x-priority' for consumer '{tag}'", 60, 20)
        if queue.exclusive_consumer is not None or (method.exclusive and queue.consumer_count):
            raise self._in_exclusive_use(queue)
        if queue.queue_type == "quorum" and self.global_prefetch_count:
            raise AMQPConnectionError(NOT_IMPLEMENTED, f"queue '{queue.name}' in vhost '{self.vhost.name}' "
                                      "does not support global qos", 60, 20)
        judged = queue.queue_type != "quorum"   # by the queue's machine: it waits for its verdict
        consumer = self.consumers[tag] = Consumer(tag, codec.shortstr(tag), queue, method.no_ack,
                                                  early=deque() if judged else None,
                                                  consume_ok_wanted=not method.nowait)
        self.queues_used.add(queue)
        prefetch = self.prefetch_count
        if self.global_prefetch_count:
            prefetch = min(prefetch or self.global_prefetch_count, self.global_prefetch_count)
        if judged:
            self.await_reply()   # consume-ok with the verdict (_on_checked_out)
        else:
            self._consume_ok(consumer)
        queue.add_consumer((self.owner, tag), self, 0 if method.no_ack else prefetch, priority,
                           method.no_ack, method.exclusive, active=not self.suspended,
                           on_checked_out=partial(self._on_checked_out, consumer) if judged else None)

    def _on_checked_out(self, consumer: Consumer, accepted: bool) -> None:
        """The queue's verdict on a consumer: consume-ok and what it was handed meanwhile, or 403."""
        try:
            if self.closed or self.consumers.get(consumer.tag) is not consumer:
                return
            if not accepted:
                del self.consumers[consumer.tag]
                self.fail(self._in_exclusive_use(consumer.queue))
                return
            early = self._consume_ok(consumer)
            for delivery in early:
                self.deliver(*delivery)
        finally:
            self.reply_arrived()

    def _consume_ok(self, consumer: Consumer) -> deque:
        """consume-ok, if it is still owed; the deliveries that waited for it."""
        early, consumer.early = consumer.early, None
        if consumer.consume_ok_wanted:
            consumer.consume_ok_wanted = False
            self.send(spec.Basic.ConsumeOk(consumer.tag))
        return early or deque()

    def _in_exclusive_use(self, queue: Queue) -> ChannelError:
        return ChannelError(ACCESS_REFUSED, f"queue '{queue.name}' in vhost '{self.vhost.name}' in exclusive use",
                            60, 20)

    def _consume_reply_to(self, method: spec.Basic.Consume, tag: str) -> None:
        if not method.no_ack:
            raise ChannelError(PRECONDITION_FAILED, "reply consumer cannot acknowledge", 60, 20)
        if self.reply_to_token is not None:
            raise ChannelError(PRECONDITION_FAILED, "reply consumer already set", 60, 20)
        self.reply_to_token = self.broker.register_reply_channel(self)
        self.consumers[tag] = Consumer(tag, codec.shortstr(tag), None, True)
        if not method.nowait:
            self.send(spec.Basic.ConsumeOk(tag))

    def on_basic_cancel(self, method: spec.Basic.Cancel) -> None:
        consumer = self.consumers.pop(method.consumer_tag, None)
        if consumer is not None:
            if consumer.queue is None:
                self.broker.unregister_reply_channel(self.reply_to_token)
                self.reply_to_token = None
            elif not consumer.queue.deleted:
                consumer.queue.remove_consumer((self.owner, consumer.tag))
        if not method.nowait:
            self.send(spec.Basic.CancelOk(method.consumer_tag))

    def on_queue_deleted(self, queue: Queue, consumer_tag: str) -> None:
        """The queue went away under a consumer: consumer cancel notify (after its
        consume-ok, if the queue's verdict had not come yet)."""
        consumer = self.consumers.pop(consumer_tag, None)
        if consumer is None or self.closed:
            return
        self._consume_ok(consumer)
        if self.connection.client_capabilities.get("consumer_cancel_notify"):
            cancel = spec.Basic.Cancel(consumer_tag, nowait=True)
            if self.held_cancels is not None:   # the channel's own queue.delete: after its delete-ok
                self.held_cancels.append(cancel)
            else:
                self.send(cancel)
        self.connection.want_flush(self)
