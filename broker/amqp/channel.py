"""A channel session: consumers, delivery tags, prefetch, confirms, transactions.

Theory of operation. The connection shell hands each channel its methods
(``on_method``) and the hot events (``on_publish``, ``on_ack``, ``on_nack``,
``on_reject``). The channel talks to queues only through their commands
(enqueue, checkout, settle, return, discard, down) so that the same session
works when a queue's machine lives behind Raft. Everything the channel sends
is appended to the connection's output, which is written once per turn.

Soft errors raise ``ChannelError`` (only this channel closes), hard ones ``AMQPConnectionError``.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from pamqp import commands as spec

from warren.broker.amqp.channel_consumers import Consumer, ConsumerMethods
from warren.broker.amqp.channel_topology import REPLY_TO_QUEUE, TopologyMethods
from warren.broker.amqp.confirms import ConfirmTracker, PendingPublish
from warren.broker.amqp.publish_credit import PublishCredit
from warren.broker.queues import queue_commands as qc
from warren.broker.queues.queue import Queue
from warren.broker.weak_callbacks import WeakIdentitySet
from warren.protocol import codec
from warren.protocol.constants import (
    ACCESS_REFUSED,
    NO_ROUTE,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    PROP_EXPIRATION,
    PROP_PRIORITY,
    PROP_REPLY_TO,
    PROP_USER_ID,
)
from warren.protocol.errors import AMQPConnectionError, ChannelError

if TYPE_CHECKING:
    from warren.broker.amqp.connection import AMQPConnection

DELIVERY_TIME_RESOLUTION_SECONDS = 0.1
DELIVER_FRAMES_MAX = 64   # per consumer (Consumer.deliver_frames), for queues bound under many keys
WRITE_PARTS_BYTES = 64 * 1024   # a run's deliveries go to the connection in parts of about this size
REPLY_TO_PREFIX = REPLY_TO_QUEUE + "."


class Channel(TopologyMethods, ConsumerMethods):
    def __init__(self, connection: "AMQPConnection", number: int):
        self.connection = connection
        self.broker = connection.broker
        self.vhost = connection.vhost
        self.number = number
        self.owner = (connection.id, number)
        self.consumers: dict[str, Consumer] = {}
        self.next_delivery_tag = 1
        # delivery_tag -> (queue, consumer_tag or None for basic.get, msg_id); tags ascend
        self.unacked: dict[int, tuple[Queue, str | None, int]] = {}
        # queues to tell when this channel closes; a queue deleted meanwhile is not kept
        self.queues_used = WeakIdentitySet()
        self.prefetch_count = 0
        self.global_prefetch_count = 0
        self.confirms: ConfirmTracker | None = None
        self.tx: list[tuple] | None = None
        # commits waiting for their queues and the disk, answered in order
        self.tx_commits: deque[PendingPublish] = deque()
        self.last_queue_name: str | None = None
        self.reply_to_token: str | None = None
        self.suspended = False
        self.qos_blocked = False
        # deliveries a queue made past the global prefetch, sent as acks make room
        self.held: deque[tuple] = deque()
        self.delivery_times: deque[tuple[int, float]] = deque()
        # enqueues not yet answered: past the soft limit and the reader's credit, the socket pauses
        settings = self.broker.settings
        self.publish_credit = PublishCredit(settings.commands_soft_limit, *settings.credit_flow_default_credit)
        self._last_time_mark = 0.0
        self.awaiting_replies = 0   # durable topology changes not yet applied (channel_topology.py)
        # while the channel deletes a queue: its own consumers' cancels, sent after the delete-ok
        self.held_cancels: list[spec.Basic.Cancel] | None = None
        self.closed = False
        # the user's permissions on the vhost as this channel opened, and what they allowed
        self.permission = self.broker.access.permission(connection.user_name, self.vhost.name)
        self.access_granted: set[tuple[str, str, str]] = set()
        self.publish_permitted: set[str] = set()

    # -- output -----------------------------------------------------------
    def send(self, method: Any) -> None:
        self.connection.write(codec.encode_method(self.number, method))

    # -- hot path: publishing ---------------------------------------------
    def on_publish(self, exchange_name: str, routing_key: str, mandatory: bool, immediate: bool,
                   properties: bytes, body: bytes) -> None:
        if immediate:
            raise AMQPConnectionError(NOT_IMPLEMENTED, "immediate=true", 60, 40)
        if exchange_name not in self.publish_permitted:
            self.check_publish(exchange_name)
        exchange = self.vhost.exchanges.get(exchange_name)
        if exchange is None:
            raise ChannelError(NOT_FOUND, f"no exchange '{exchange_name}' in vhost '{self.vhost.name}'", 60, 40)
        if exchange.internal:
            raise ChannelError(ACCESS_REFUSED, f"cannot publish to internal exchange '{exchange_name}' in vhost "
                               f"'{self.vhost.name}'", 60, 40)
        flags = (properties[0] << 8) | properties[1] if len(properties) >= 2 else 0
        ttl_ms = None
        priority = 0
        if flags & (PROP_REPLY_TO | PROP_USER_ID | PROP_EXPIRATION | PROP_PRIORITY):
            properties, ttl_ms, priority = self._check_special_properties(properties, flags)
        self.broker.counters.published += 1
        if self.tx is not None:
            self.tx.append((exchange, routing_key, mandatory, properties, body, ttl_ms, priority))
            return
        self._route_and_enqueue(exchange, routing_key, mandatory, properties, body, ttl_ms, priority)

    def _route_and_enqueue(self, exchange, routing_key: str, mandatory: bool, properties: bytes, body: bytes,
                           ttl_ms: int | None = None, priority: int = 0,
                           tx_wait: "PendingPublish | None" = None) -> None:
        """Route and enqueue one message; confirmed once every queue it reached has it
        (a replicated one: applied by its leader; a journaled one: on disk).

        In a transaction's commit, ``tx_wait`` is the commit's own PendingPublish: every
        queue's enqueue of this message counts toward it (the confirm machinery, with
        commit-ok in place of basic.ack), a refusal fails it."""
        seq = self.confirms.next_publish() if self.confirms is not None else 0
        if exchange.name == "" and routing_key.startswith(REPLY_TO_PREFIX):
            delivered = self.broker.deliver_reply(routing_key, properties, body)
            self._after_route(seq, delivered, True, mandatory, exchange.name, routing_key, properties, body)
            return
        queues = self.vhost.route(exchange, routing_key, properties)
        if not queues:
            self._after_route(0 if tx_wait is not None else seq, False, True, mandatory, exchange.name, routing_key,
                              properties, body)
            return
        payload = (exchange.name, routing_key, properties, body)
        if tx_wait is None and len(queues) == 1:
            # the common case: one queue, its answer is the confirm (no PendingPublish)
            self._enqueue(queues[0], payload, ttl_ms, priority, partial(self._on_sole_enqueue_applied, seq))
            return
        waiting = tx_wait if tx_wait is not None else PendingPublish(seq)
        waiting.remaining += len(queues)   # all counted first: a queue without a log answers at once
        for queue in queues:
            self._enqueue(queue, payload, ttl_ms, priority, partial(self._on_enqueue_applied, waiting))

    def _enqueue(self, queue: Queue, payload: tuple, ttl_ms: int | None, priority: int,
                 on_applied: Callable[[bool], None]) -> None:
        if self.publish_credit.took():
            # stop reading this client until the queues catch up
            self.connection.set_channel_paused(self, True)
        self.queues_used.add(queue)
        queue.enqueue_from(self.owner, payload, ttl_ms, priority, on_applied)

    def _enqueue_done(self) -> None:
        if self.publish_credit.done():
            self.connection.set_channel_paused(self, False)

    def _on_sole_enqueue_applied(self, seq: int, accepted: bool) -> None:
        """The one queue a publish reached has it (or refused it): its confirm."""
        self._enqueue_done()
        if seq and not self.closed and self.confirms is not None:
            self.confirms.settle(seq, accepted)
            self.connection.want_flush(self)

    def _on_enqueue_applied(self, waiting: "PendingPublish", accepted: bool) -> None:
        self._enqueue_done()
        self._publish_part_done(waiting, accepted)

    def _publish_part_done(self, waiting: "PendingPublish", ok: bool) -> None:
        waiting.remaining -= 1
        waiting.ok = waiting.ok and ok
        if waiting.remaining or self.closed:
            return
        if waiting.on_done is not None:
            waiting.on_done(waiting.ok)
            return
        if not waiting.seq or self.confirms is None:
            return
        self.confirms.settle(waiting.seq, waiting.ok)
        self.connection.want_flush(self)

    def _after_route(self, seq: int, routed: bool, accepted: bool, mandatory: bool,
                     exchange: str, routing_key: str, properties: bytes, body: bytes) -> None:
        if not routed:
            self.broker.counters.unroutable += 1
            if mandatory:
                self.connection.write(codec.encode_return(
                    self.number, NO_ROUTE, "NO_ROUTE", exchange, routing_key, properties, body,
                    self.connection.frame_max))
        if seq:
            self.confirms.settle(seq, accepted)
            self.connection.want_flush(self)

    def _check_special_properties(self, properties: bytes, flags: int) -> tuple[bytes, int | None, int]:
        """user_id must be the login, a direct reply-to gets its channel's address,
        expiration is the per-message TTL in ms, priority orders priority queues;
        returns (properties, ttl_ms, priority)."""
        decoded = codec.decode_properties(properties)
        ttl_ms = codec.expiration_ms(decoded.expiration) if flags & PROP_EXPIRATION else None
        priority = decoded.priority or 0
        if flags & PROP_USER_ID and decoded.user_id != self.connection.user_name:
            raise ChannelError(PRECONDITION_FAILED, f"user_id property set to '{decoded.user_id}' but "
                               f"authenticated user was '{self.connection.user_name}'", 60, 40)
        if flags & PROP_REPLY_TO and decoded.reply_to == REPLY_TO_QUEUE:
            if self.reply_to_token is None:
                raise ChannelError(PRECONDITION_FAILED, "fast reply consumer does not exist", 60, 40)
            decoded.reply_to = REPLY_TO_PREFIX + self.reply_to_token
            return codec.encode_properties(decoded), ttl_ms, priority
        return properties, ttl_ms, priority

    def flush_confirms(self) -> None:
        """Called once per turn by the connection: coalesced basic.ack/nack."""
        if self.confirms is None:
            return
        for tag, multiple, ok in self.confirms.take_replies():
            encode = codec.encode_ack if ok else codec.encode_nack
            self.connection.write(encode(self.number, tag, multiple))

    # -- hot path: deliveries and acks ------------------------------------
    def deliver(self, queue: Queue, consumer_tag: str, msg_id: int, payload: Any, redelivered: bool) -> None:
        consumer = self.consumers[consumer_tag]
        if consumer.early is not None:   # before consume-ok (channel_consumers.py)
            consumer.early.append((queue, consumer_tag, msg_id, payload, redelivered))
            return
        if not consumer.no_ack and self.global_prefetch_count:
            if len(self.unacked) >= self.global_prefetch_count:
                # A queue may hand over a burst larger than the channel-wide (global)
                # prefetch has room for; the rest waits here, checked out, until acks.
                self.held.append((queue, consumer_tag, msg_id, payload, redelivered))
                self._set_suspended(qos=True)
                return
            if len(self.unacked) + 1 >= self.global_prefetch_count:
                self._set_suspended(qos=True)
        self._send_delivery(consumer, queue, msg_id, payload, redelivered)

    def deliver_many(self, queue: Queue, consumer_tag: str, deliveries: list) -> None:
        """`deliver` for each (msg_id, payload, redelivered) of a queue's turn, with
        the lookups done once."""
        consumer = self.consumers[consumer_tag]
        if consumer.early is not None or (self.global_prefetch_count and not consumer.no_ack):
            for msg_id, payload, redelivered in deliveries:
                self.deliver(queue, consumer_tag, msg_id, payload, redelivered)
            return
        self._send_deliveries(consumer, queue, deliveries)

    def _send_delivery(self, consumer: Consumer, queue: Queue | None, msg_id: int, payload: Any,
                       redelivered: bool) -> None:
        self._send_deliveries(consumer, queue, ((msg_id, payload, redelivered),))

    def _send_deliveries(self, consumer: Consumer, queue: Queue | None, deliveries: Any) -> None:
        """basic.deliver for each (msg_id, payload, redelivered), the next delivery tags
        in order, recorded as unacked unless no-ack."""
        tag = self.next_delivery_tag
        self.next_delivery_tag = tag + len(deliveries)
        self.broker.counters.delivered += len(deliveries)
        unacked = None if consumer.no_ack else self.unacked
        if unacked is not None:
            self._note_delivery_time(tag)
        frames, frame_max, connection = consumer.deliver_frames, self.connection.frame_max, self.connection
        consumer_tag, out, pending = consumer.tag, [], 0
        last_exchange = last_key = encoder = None   # a run's deliveries mostly share both
        for msg_id, (exchange, routing_key, properties, body), redelivered in deliveries:
            if unacked is not None:
                unacked[tag] = (queue, consumer_tag, msg_id)
            if routing_key != last_key or exchange != last_exchange:
                last_exchange, last_key = exchange, routing_key
                encoder = frames.get((exchange, routing_key)) or self._deliver_frames(consumer, exchange, routing_key)
            pending += encoder.add(out, tag, redelivered, properties, body, frame_max)
            tag += 1
            if pending >= WRITE_PARTS_BYTES:   # a run of large bodies goes out as it is made
                connection.write_parts(out, pending)
                out, pending = [], 0
        if out:
            connection.write_parts(out, pending)

    def _deliver_frames(self, consumer: Consumer, exchange: str, routing_key: str) -> codec.DeliverFrames:
        """basic.deliver's frames for one exchange and key, made once per consumer."""
        frames = consumer.deliver_frames
        if len(frames) >= DELIVER_FRAMES_MAX:
            frames.clear()
        encoder = frames[exchange, routing_key] = codec.DeliverFrames(
            self.number, consumer.tag_bytes, codec.shortstr(exchange) + codec.shortstr(routing_key))
        return encoder

    def deliver_reply(self, properties: bytes, body: bytes, routing_key: str) -> None:
        """Direct reply-to: a message straight to this channel's reply consumer."""
        consumer = self.consumers.get(self._reply_consumer_tag())
        if consumer is not None:  # a no-ack consumer: nothing is recorded as unacked
            self._send_delivery(consumer, None, 0, ("", routing_key, properties, body), False)

    def _reply_consumer_tag(self) -> str | None:
        for consumer in self.consumers.values():
            if consumer.queue is None:
                return consumer.tag
        return None

    # -- consumer timeout (RabbitMQ's consumer_timeout) ----------------------
    # Delivery times are kept coarsely, (first delivery tag, time) once per 0.1 s, so
    # the check knows the oldest unacknowledged delivery's age to within 0.1 s.
    def _note_delivery_time(self, tag: int) -> None:
        now = time.monotonic()
        if now - self._last_time_mark >= DELIVERY_TIME_RESOLUTION_SECONDS:
            self._last_time_mark = now
            self.delivery_times.append((tag, now))

    def timed_out(self, now: float, timeout_seconds: float) -> bool:
        """Is the oldest unacknowledged delivery older than the timeout?"""
        if not self.unacked:
            self.delivery_times.clear()
            self._last_time_mark = 0.0
            return False
        oldest = next(iter(self.unacked))
        times = self.delivery_times
        while len(times) > 1 and times[1][0] <= oldest:
            times.popleft()
        return bool(times) and now - times[0][1] > timeout_seconds

    def on_ack(self, delivery_tag: int, multiple: bool) -> None:
        if self.tx is not None:
            # Validated now, settled at commit (AMQP 0-9-1 §1.9.2: acks are transactional).
            if delivery_tag not in self.unacked and not (multiple and delivery_tag == 0):
                raise ChannelError(PRECONDITION_FAILED, f"unknown delivery tag {delivery_tag}", 60, 80)
            self.tx.append(("ack", delivery_tag, multiple))
            return
        self._settle(self._take_unacked(delivery_tag, multiple, 60, 80), qc.Settle)

    def on_nack(self, delivery_tag: int, multiple: bool, requeue: bool) -> None:
        taken = self._take_unacked(delivery_tag, multiple, 60, 120)
        self._settle(taken, qc.Return if requeue else qc.Discard)

    def on_reject(self, delivery_tag: int, requeue: bool) -> None:
        taken = self._take_unacked(delivery_tag, False, 60, 90)
        self._settle(taken, qc.Return if requeue else qc.Discard)

    def _take_unacked(self, delivery_tag: int, multiple: bool, class_id: int, method_id: int) -> list:
        unacked = self.unacked
        if multiple:
            if delivery_tag == 0:
                tags = list(unacked)
            else:
                tags = []
                for tag in unacked:
                    if tag > delivery_tag:
                        break
                    tags.append(tag)
                if delivery_tag not in unacked:
                    raise ChannelError(PRECONDITION_FAILED, f"unknown delivery tag {delivery_tag}", class_id, method_id)
            return [unacked.pop(tag) for tag in tags]
        entry = unacked.pop(delivery_tag, None)
        if entry is None:
            raise ChannelError(PRECONDITION_FAILED, f"unknown delivery tag {delivery_tag}", class_id, method_id)
        return [entry]

    def _settle(self, taken: list, command_type: type, tx_wait: "PendingPublish | None" = None) -> None:
        """One command per (queue, consumer) for all the taken deliveries; in a
        commit (``tx_wait``), a quorum queue's settle counts toward the commit-ok."""
        if not taken:
            return
        if len(taken) == 1:
            queue, consumer_tag, msg_id = taken[0]
            if not queue.deleted:
                self._release(queue, command_type, consumer_tag, (msg_id,), tx_wait)
        else:
            groups: dict[tuple, list] = {}
            for queue, consumer_tag, msg_id in taken:
                groups.setdefault((queue, consumer_tag), []).append(msg_id)
            for (queue, consumer_tag), msg_ids in groups.items():
                if not queue.deleted:
                    self._release(queue, command_type, consumer_tag, msg_ids, tx_wait)
        if command_type is qc.Settle:
            self.broker.counters.acknowledged += len(taken)
        if self.held:
            self._send_held()
        if self.suspended and self.global_prefetch_count:
            self._set_suspended(qos=len(self.unacked) >= self.global_prefetch_count)

    def _release(self, queue: Queue, kind: type, consumer_tag: str | None, msg_ids: Any,
                 tx_wait: "PendingPublish | None") -> None:
        if tx_wait is None:
            queue.release(kind, self.owner, consumer_tag, msg_ids)
            return
        tx_wait.remaining += 1
        queue.release(kind, self.owner, consumer_tag, msg_ids, lambda _reply: self._publish_part_done(tx_wait, True))

    def _send_held(self) -> None:
        while self.held and (not self.global_prefetch_count or len(self.unacked) < self.global_prefetch_count):
            queue, consumer_tag, msg_id, payload, redelivered = self.held.popleft()
            consumer = self.consumers.get(consumer_tag)
            if consumer is None:  # cancelled meanwhile: the message goes back, undelivered
                if not queue.deleted:
                    queue.release(qc.Return, self.owner, consumer_tag, (msg_id,))
                continue
            self._send_delivery(consumer, queue, msg_id, payload, redelivered)

    # -- flow: pause consumers when the channel may not take more ---------
    def _set_suspended(self, qos: bool | None = None) -> None:
        if qos is not None:
            self.qos_blocked = qos
        want = self.qos_blocked or self.connection.writes_paused
        if want == self.suspended:
            return
        self.suspended = want
        # Global prefetch is enforced per consumer credit plus this switch, so one
        # queue's burst can overshoot the channel limit by at most its consumer's credit.
        for consumer in list(self.consumers.values()):
            if self.suspended != want:
                break  # deliveries made while resuming filled the channel again
            if consumer.queue is not None and not consumer.queue.deleted:
                consumer.queue.suspend((self.owner, consumer.tag), active=not want)

    def on_writes_paused_changed(self) -> None:
        self._set_suspended()

    # -- methods ----------------------------------------------------------
    def on_method(self, method: Any) -> None:
        handler = _HANDLERS.get(type(method))
        if handler is None:
            raise AMQPConnectionError(
                NOT_IMPLEMENTED, f"method {method.name} is not implemented", *_ids(method))
        handler(self, method)

    def on_basic_qos(self, method: spec.Basic.Qos) -> None:
        if method.prefetch_size != 0:
            raise AMQPConnectionError(NOT_IMPLEMENTED, f"prefetch_size!=0 ({method.prefetch_size})", 60, 10)
        if method.global_:
            self.global_prefetch_count = method.prefetch_count
            if self.held:
                self._send_held()
            self._set_suspended(qos=bool(method.prefetch_count) and len(self.unacked) >= method.prefetch_count)
        else:
            self.prefetch_count = method.prefetch_count
        self.send(spec.Basic.QosOk())

    def on_basic_get(self, method: spec.Basic.Get) -> None:
        queue = self._readable_queue(method.queue, 60, 70)
        self.queues_used.add(queue)
        queue.touch()
        queue.get(self.owner, method.no_ack, partial(self._send_get_reply, queue, method.no_ack))

    def _send_get_reply(self, queue: Queue, no_ack: bool, reply: Any) -> None:
        if self.closed:
            return  # what it took is returned by the channel's Down
        if reply is None:
            self.send(spec.Basic.GetEmpty())
            return
        tag = self.next_delivery_tag
        self.next_delivery_tag = tag + 1
        if not no_ack:
            self.unacked[tag] = (queue, None, reply.msg_id)
            self._note_delivery_time(tag)
        exchange, routing_key, properties, body = queue.delivery_payload(reply.payload, reply.delivery_count)
        self.broker.counters.delivered += 1
        self.connection.write(codec.encode_get_ok(
            self.number, tag, reply.redelivered, codec.shortstr(exchange) + codec.shortstr(routing_key),
            reply.message_count, properties, body, self.connection.frame_max))

    def on_basic_recover(self, method: spec.Basic.Recover) -> None:
        if not method.requeue:
            raise AMQPConnectionError(NOT_IMPLEMENTED, "requeue=false", 60, 110)
        self._settle(self._take_unacked(0, True, 60, 110), qc.Return)
        self.send(spec.Basic.RecoverOk())

    def on_basic_recover_async(self, method: spec.Basic.RecoverAsync) -> None:
        if not method.requeue:
            raise AMQPConnectionError(NOT_IMPLEMENTED, "requeue=false", 60, 100)
        self._settle(self._take_unacked(0, True, 60, 100), qc.Return)

    def on_confirm_select(self, method: spec.Confirm.Select) -> None:
        if self.tx is not None:
            raise ChannelError(PRECONDITION_FAILED, "cannot switch from tx to confirm mode", 85, 10)
        if self.confirms is None:
            self.confirms = ConfirmTracker()
        if not method.nowait:
            self.send(spec.Confirm.SelectOk())

    def on_tx_select(self, method: spec.Tx.Select) -> None:
        if self.confirms is not None:
            raise ChannelError(PRECONDITION_FAILED, "cannot switch from confirm to tx mode", 90, 10)
        if self.tx is None:
            self.tx = []
        self.send(spec.Tx.SelectOk())

    def on_tx_commit(self, method: spec.Tx.Commit) -> None:
        """Publish and settle the transaction's work; commit-ok once every quorum queue
        it reached has applied its publishes and acks (committed on a majority, as a
        confirm) and its persistent messages are on disk (AMQP 0-9-1 §1.9.2). As in
        RabbitMQ, a publish a queue refused (reject-publish) fails the commit with
        406 "partial tx completion" (the rest stays done). Commits answer in order."""
        if self.tx is None:
            raise ChannelError(PRECONDITION_FAILED, "channel is not transactional", 90, 20)
        pending, self.tx = self.tx, []
        commit = PendingPublish(0)
        commit.on_done = partial(self._on_commit_done, commit)
        commit.remaining = 1  # held until everything below is submitted
        self.tx_commits.append(commit)
        for entry in pending:
            if entry[0] == "ack":
                _, delivery_tag, multiple = entry
                if delivery_tag in self.unacked or (multiple and delivery_tag == 0):
                    self._settle(self._take_unacked(delivery_tag, multiple, 90, 20), qc.Settle, commit)
                continue
            self._route_and_enqueue(*entry, tx_wait=commit)
        self._publish_part_done(commit, True)

    def _on_commit_done(self, commit: "PendingPublish", ok: bool) -> None:
        commit.finished = True
        commits = self.tx_commits
        while commits and commits[0].finished:
            done = commits.popleft()
            if not done.ok:
                commits.clear()
                self.fail(ChannelError(PRECONDITION_FAILED, "partial tx completion", 90, 20))
                return
            self.send(spec.Tx.CommitOk())

    def on_tx_rollback(self, method: spec.Tx.Rollback) -> None:
        if self.tx is None:
            raise ChannelError(PRECONDITION_FAILED, "channel is not transactional", 90, 30)
        self.tx = []
        self.send(spec.Tx.RollbackOk())

    def on_channel_flow(self, method: spec.Channel.Flow) -> None:
        if not method.active:
            raise AMQPConnectionError(NOT_IMPLEMENTED, "active=false", 20, 20)
        self.send(spec.Channel.FlowOk(active=True))

    def fail(self, error: ChannelError) -> None:
        """An asynchronous reply met an error: close the channel with it."""
        if not self.closed:
            self.connection._channel_error(self.number, error)

    # -- closing ----------------------------------------------------------
    def close(self) -> None:
        """The channel is gone: return everything it held to its queues."""
        if self.closed:
            return
        self.closed = True
        if self.reply_to_token is not None:
            self.broker.unregister_reply_channel(self.reply_to_token)
            self.reply_to_token = None
        self.consumers.clear()
        self.unacked.clear()
        self.held.clear()  # still checked out to this channel: owner_down returns them
        self.tx_commits.clear()
        for queue in self.queues_used.alive():
            if not queue.deleted:
                queue.owner_down(self.owner)
        self.queues_used.clear()
        if self.publish_credit.release():
            self.connection.set_channel_paused(self, False)


def _ids(method: Any) -> tuple[int, int]:
    return method.index >> 16, method.index & 0xFFFF


_HANDLERS = {
    spec.Basic.Qos: Channel.on_basic_qos,
    spec.Basic.Consume: Channel.on_basic_consume,
    spec.Basic.Cancel: Channel.on_basic_cancel,
    spec.Basic.Get: Channel.on_basic_get,
    spec.Basic.Recover: Channel.on_basic_recover,
    spec.Basic.RecoverAsync: Channel.on_basic_recover_async,
    spec.Confirm.Select: Channel.on_confirm_select,
    spec.Tx.Select: Channel.on_tx_select,
    spec.Tx.Commit: Channel.on_tx_commit,
    spec.Tx.Rollback: Channel.on_tx_rollback,
    spec.Channel.Flow: Channel.on_channel_flow,
    spec.Exchange.Declare: Channel.on_exchange_declare,
    spec.Exchange.Delete: Channel.on_exchange_delete,
    spec.Exchange.Bind: Channel.on_exchange_bind,
    spec.Exchange.Unbind: Channel.on_exchange_unbind,
    spec.Queue.Declare: Channel.on_queue_declare,
    spec.Queue.Bind: Channel.on_queue_bind,
    spec.Queue.Unbind: Channel.on_queue_unbind,
    spec.Queue.Purge: Channel.on_queue_purge,
    spec.Queue.Delete: Channel.on_queue_delete,
}
