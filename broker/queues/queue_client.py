"""A node's sessions with one queue: its channels' publishes and consumers.

Theory of operation. Every node has a `QueueClient` for every queue it knows,
member of its group or not; nothing is applied here, every command goes to
the queue's replica through a `QueueRoute` (broker/queues/queue_routes.py: to the
group's leader, or straight into a replica without a log):

* publishing: each channel is an enqueuer with its own sequence numbers; its
  unconfirmed enqueues stay here and are resent, in order, when the leader
  changes or nothing was confirmed for `RESEND_SECONDS`; the machine drops
  duplicates and re-orders, the leader answers APPLIED per run of seqs and the
  channel confirms. A turn's publishes of one channel go as one EnqueueBatch;
* consuming: deliveries carry a per-consumer sequence; this node hands them
  to the channel in order, drops what it has seen, holds what comes after a
  gap and asks the leader to send again what it has checked out after the
  last one seen (RESEND). The answer ends with the highest seq the leader
  assigned (RESENT): a seq below it that did not come is checked out no more;
* closed channels: a channel's DOWN can reach the leader before its CHECKOUT
  (forwarded through a third node that knew an older leader), leaving a
  consumer nobody closes holding a prefetch of messages. The owners this node
  closed are remembered for `DOWNED_OWNERS_SECONDS`; a delivery to one of them
  sends its DOWN again (at most once per `RESEND_SECONDS`), and the queue takes
  back what it checked out to it.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from warren.broker.node.node_core import RESEND, RESEND_SECONDS
from warren.broker.queues import queue_commands as qc
from warren.broker.weak_callbacks import WeakAttribute

if TYPE_CHECKING:
    from warren.broker.queues.queue_routes import QueueRoute

HELD_DELIVERIES_MAX = 10_000
DOWNED_OWNERS_SECONDS = 60.0   # far longer than a forwarded CHECKOUT can be on its way
ENQUEUE_BATCH_MAX = 1024
# An EnqueueBatch ends once its bodies reach this (one Raft entry; Raft's own AppendEntries
# bound): 300 KB publishes read in one turn made 30 MB entries, each a WAL write and a
# follower's AppendEntries that a disk near its limit had to take whole or not at all.
ENQUEUE_BATCH_MAX_BYTES = 1024 * 1024


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class DeliveringQueue(Protocol):
    """The queue the client's consumers consume from, as they are handed it."""

    def delivery_payload(self, payload: tuple, delivery_count: int) -> tuple: ...


@dataclass(slots=True)
class LocalConsumer:
    sink: Any
    consumer_id: tuple        # (channel owner, tag) as the channel knows it
    last_seq: int = 0
    held: dict[int, tuple] = field(default_factory=dict)
    gap_asked_at: float = 0.0


@dataclass(slots=True)
class EnqueuerSession:
    key: str
    next_seq: int = 1
    pending: dict[int, tuple[list, Callable[[bool], None] | None]] = field(default_factory=dict)
    progress_at: float = 0.0
    sent_to: str | None = None    # the leader the newest enqueue went to
    unsent_from: int | None = None  # seqs from here on wait for the end of the turn
    unsent_bytes: int = 0           # their bodies' bytes


class QueueClient:
    queue = WeakAttribute()   # the queue holds its client (broker/weak_callbacks.py)

    def __init__(self, group: str, route: "QueueRoute", owner_key: Callable[[Hashable], str],
                 queue: DeliveringQueue) -> None:
        self.group = group
        self.route = route
        self.owner_key = owner_key
        self.queue = queue
        self.local_consumers: dict[tuple[str, str], LocalConsumer] = {}
        self.enqueuers: dict[Hashable, EnqueuerSession] = {}
        self.enqueuers_by_key: dict[str, EnqueuerSession] = {}
        self.unsent: list[EnqueuerSession] = []
        self.requests = itertools.count(1)
        self.downed_owners: dict[str, tuple[float, float]] = {}   # owner key -> (DOWN sent at, again from)

    # -- publishing --------------------------------------------------------------------
    def enqueue_from(self, owner: Hashable, payload: tuple, ttl_ms: int | None, priority: int,
                     on_applied: Callable[[bool], None] | None) -> None:
        """Queue one publish of `owner`'s; the publishes of a turn go out as one
        EnqueueBatch at its end (at once to a replica without a log)."""
        session = self.enqueuers.get(owner)
        if session is None:
            key = self.owner_key(owner)
            session = self.enqueuers[owner] = self.enqueuers_by_key[key] = EnqueuerSession(key)
        seq = session.next_seq
        session.next_seq = seq + 1
        if not session.pending:
            session.progress_at = time.monotonic()
        exchange, routing_key, properties, body = payload
        session.pending[seq] = ([exchange, routing_key, properties, body, ttl_ms, priority], on_applied)
        session.unsent_bytes += len(body)
        if session.unsent_from is None:
            session.unsent_from = seq
            self.unsent.append(session)
            if len(self.unsent) == 1:
                self.route.at_end_of_turn(self.send_unsent)

    def send_unsent(self) -> None:
        """The turn's publishes go out; also called before any other command of
        this node's, so that a basic.get after a publish finds it queued."""
        if not self.unsent:
            return
        sessions, self.unsent = self.unsent, []
        for session in sessions:
            first, session.unsent_from = session.unsent_from, None
            small, session.unsent_bytes = session.unsent_bytes <= ENQUEUE_BATCH_MAX_BYTES, 0
            if first is None:
                continue
            if session.sent_to is None:
                # the previous send went nowhere (no leader known yet): send those first, else
                # the queue holds the new ones until a resend fills the gap; in runs, as some
                # between them may have been applied
                for start, end in _runs(list(session.pending)):
                    self._send_run(session, start, end, small=False)
            else:
                self._send_run(session, first, session.next_seq, small)

    def _send_run(self, session: EnqueuerSession, first: int, end: int, small: bool) -> None:
        """Seqs first..end-1 in EnqueueBatches of ENQUEUE_BATCH_MAX messages and, unless the
        caller knows them `small` together, ENQUEUE_BATCH_MAX_BYTES of bodies."""
        pending = session.pending
        start = first
        while start < end:
            stop = min(end, start + ENQUEUE_BATCH_MAX)
            if not small:
                size, last = 0, start
                while last < stop and (last == start or size < ENQUEUE_BATCH_MAX_BYTES):
                    size += len(pending[last][0][3])
                    last += 1
                stop = last
            messages = [pending[seq][0] for seq in range(start, stop)]
            session.sent_to = self.route.send(qc.EnqueueBatch(session.key, start, now_ms(), messages))
            start = stop

    def on_applied(self, enqueuer: str, first_seq: int, last_seq: int, refused: list[int]) -> None:
        """The leader applied (or refused, or had applied before) seqs first..last."""
        session = self.enqueuers_by_key.get(enqueuer)
        if session is None:
            return
        session.progress_at = time.monotonic()
        pending = session.pending
        for seq in range(first_seq, last_seq + 1):
            entry = pending.pop(seq, None)
            if entry is not None and entry[1] is not None:
                entry[1](seq not in refused)

    def resend_enqueues(self, now: float, leader_changed: bool) -> None:
        """All unconfirmed enqueues again, in order: to a new leader, or when
        nothing was confirmed for `RESEND_SECONDS` (the queue drops duplicates)."""
        leader = self.route.leader()
        for session in self.enqueuers.values():
            if not session.pending:
                continue
            if leader_changed and session.sent_to == leader:
                continue
            if not leader_changed and now - session.progress_at < RESEND_SECONDS:
                continue
            session.progress_at = now
            seqs = [seq for seq in session.pending if session.unsent_from is None or seq < session.unsent_from]
            for first, end in _runs(seqs):
                self._send_run(session, first, end, small=False)

    def confirm_all(self) -> None:
        """The queue was deleted: its unconfirmed publishes are confirmed, as RabbitMQ's
        channel confirms what was routed to a queue that is deleted (rabbit_channel
        handle_eol: deleted is not rejected)."""
        self.unsent = []
        for session in self.enqueuers.values():
            pending, session.pending, session.unsent_from = session.pending, {}, None
            for _, on_applied in pending.values():
                if on_applied is not None:
                    on_applied(True)

    def forget_enqueuer(self, owner: Hashable) -> None:
        session = self.enqueuers.pop(owner, None)
        if session is not None:
            self.enqueuers_by_key.pop(session.key, None)

    @property
    def enqueues_pending(self) -> int:
        return sum(len(session.pending) for session in self.enqueuers.values())

    # -- commands of this node's channels --------------------------------------------------
    def submit(self, command: Any, on_done: Callable[[Any], None] | None = None) -> None:
        """Any other command, after this node's publishes so far (`on_done(reply)` once applied)."""
        self.send_unsent()
        self.route.submit(command, on_done)

    def release(self, kind: type, owner: Hashable, tag: str | None, msg_ids: Any,
                on_done: Callable[[Any], None] | None = None) -> None:
        """qc.Settle, qc.Return or qc.Discard of what `owner`'s consumer `tag` holds."""
        self.submit(kind(self.owner_key(owner), tag, now_ms(), list(msg_ids)), on_done)

    def get(self, owner: Hashable, no_ack: bool, on_done: Callable[[Any], None]) -> None:
        self.submit(qc.Dequeue(self.owner_key(owner), next(self.requests), now_ms(), no_ack), on_done)

    def purge(self, on_done: Callable[[Any], None]) -> None:
        self.submit(qc.Purge(self.route.node, next(self.requests), now_ms()), on_done)

    def stat(self, on_done: Callable[[Any], None]) -> None:
        self.submit(qc.Stat(self.route.node, now_ms()), on_done)

    def checkout(self, consumer_id: tuple, sink: Any, prefetch: int, priority: int, no_ack: bool,
                 active: bool, exclusive: bool = False, on_done: Callable[[Any], None] | None = None) -> None:
        owner, tag = consumer_id
        key = self.owner_key(owner)
        self.local_consumers[(key, tag)] = LocalConsumer(sink, consumer_id)
        self.submit(qc.Checkout(key, tag, now_ms(), prefetch, priority, no_ack, active, exclusive), on_done)

    def forget_consumer(self, consumer_id: tuple) -> None:
        """A checkout the machine refused: nothing to cancel there."""
        owner, tag = consumer_id
        self.local_consumers.pop((self.owner_key(owner), tag), None)

    def cancel(self, consumer_id: tuple) -> None:
        owner, tag = consumer_id
        key = self.owner_key(owner)
        self.local_consumers.pop((key, tag), None)
        self.submit(qc.Cancel(key, tag, now_ms()))

    def owner_down(self, owner: Hashable) -> None:
        key = self.owner_key(owner)
        for local_key in [k for k in self.local_consumers if k[0] == key]:
            del self.local_consumers[local_key]
        self.forget_enqueuer(owner)
        self.send_unsent()
        self._forget_old_downs()
        self._send_down(key)

    def _send_down(self, key: str, again_after: float = 0.0) -> None:
        now = time.monotonic()
        self.downed_owners.pop(key, None)    # re-inserted last: the dict stays in order of sending
        self.downed_owners[key] = (now, now + again_after)
        self.route.submit_down(qc.Down(key, now_ms()))

    def _forget_old_downs(self) -> None:
        oldest = time.monotonic() - DOWNED_OWNERS_SECONDS
        while self.downed_owners:
            key, (sent_at, _) = next(iter(self.downed_owners.items()))
            if sent_at >= oldest:
                return
            del self.downed_owners[key]

    def _down_again(self, owner: str) -> None:
        """A delivery to a consumer of a channel closed here: its CHECKOUT may have
        reached the leader after its DOWN, so the DOWN goes again (it returns
        nothing if the delivery was only on its way before the first one)."""
        downed = self.downed_owners.get(owner)
        if downed is not None and time.monotonic() >= downed[1]:
            self._send_down(owner, again_after=RESEND_SECONDS)

    # -- deliveries to this node's channels ---------------------------------------------------
    def on_delivery(self, owner: str, tag: str, seq: int, msg_id: int, payload: tuple,
                    redelivered: bool, count: int) -> None:
        consumer = self.local_consumers.get((owner, tag))
        if consumer is None:
            self._down_again(owner)   # gone: its messages go back with its cancel or channel close
            return
        if seq <= consumer.last_seq:
            return  # seen
        if seq > consumer.last_seq + 1:
            if len(consumer.held) < HELD_DELIVERIES_MAX:
                consumer.held[seq] = (msg_id, payload, redelivered, count)
            self._ask_for_gap(owner, tag, consumer)
            return
        self._hand_over(consumer, seq, msg_id, payload, redelivered, count)
        self._hand_over_held(consumer)

    def on_deliveries(self, owner: str, tag: str, deliveries: list) -> None:
        """A consumer's deliveries of one turn, (seq, msg_id, payload, redelivered,
        count) each, in the order made: those that follow in sequence go to its
        channel in one call; any other takes `on_delivery`'s way, in its place."""
        consumer = self.local_consumers.get((owner, tag))
        if consumer is None:
            self._down_again(owner)   # gone: its messages go back with its cancel or channel close
            return
        run: list = []
        for seq, msg_id, payload, redelivered, count in deliveries:
            if seq == consumer.last_seq + 1 and not consumer.held:
                consumer.last_seq = seq
                if count:
                    payload = self.queue.delivery_payload(payload, count)
                run.append(((msg_id, seq), payload, redelivered))
                continue
            if run:
                consumer.sink.deliver_many(self.queue, consumer.consumer_id[1], run)
                run = []
            self.on_delivery(owner, tag, seq, msg_id, payload, redelivered, count)
        if run:
            consumer.sink.deliver_many(self.queue, consumer.consumer_id[1], run)

    def on_resent(self, owner: str, tag: str, horizon: int, checked_out: list[int]) -> None:
        """The leader resent what it has checked out to the consumer after the seq it
        was asked for (`checked_out`, just before this), and it gave seqs up to
        `horizon`: any other seq up to there is checked out no more (it went back to
        the queue while this node was cut off, say), and a held copy of one is stale.
        Waiting for such a gap, which no leader fills, left the window full for good."""
        consumer = self.local_consumers.get((owner, tag))
        if consumer is None or horizon <= consumer.last_seq:
            return
        live = set(checked_out)
        held = consumer.held
        for seq in [s for s in held if s <= horizon and s not in live]:
            del held[seq]
        for seq in sorted(s for s in live if s > consumer.last_seq):
            if seq not in held:   # not here (the held ones were too many): it may come again
                consumer.last_seq = seq - 1
                return
            self._hand_over(consumer, seq, *held.pop(seq))
        consumer.last_seq = horizon
        self._hand_over_held(consumer)

    def _hand_over_held(self, consumer: LocalConsumer) -> None:
        """The held deliveries that follow the last seq handed over, in order."""
        held = consumer.held
        while held and consumer.last_seq + 1 in held:
            seq = consumer.last_seq + 1
            self._hand_over(consumer, seq, *held.pop(seq))

    def _hand_over(self, consumer: LocalConsumer, seq: int, msg_id: int, payload: tuple, redelivered: bool,
                   count: int) -> None:
        consumer.last_seq = seq
        # (msg_id, seq) names this delivery: a settle or return sent twice (after a
        # leader change) cannot touch a later delivery of the same message.
        if count:
            payload = self.queue.delivery_payload(payload, count)
        consumer.sink.deliver(self.queue, consumer.consumer_id[1], (msg_id, seq), payload, redelivered)

    def _ask_for_gap(self, owner: str, tag: str, consumer: LocalConsumer) -> None:
        now = time.monotonic()
        if now - consumer.gap_asked_at < RESEND_SECONDS:
            return
        consumer.gap_asked_at = now
        self.route.ask_resend(owner, tag, consumer.last_seq)

    def ask_for_gaps(self) -> None:
        """Now and then: a consumer holding deliveries behind a gap asks again (its
        leader, on this node, answers at once); the first ask may have gone to an
        old leader."""
        for (owner, tag), consumer in self.local_consumers.items():
            if consumer.held:
                self._ask_for_gap(owner, tag, consumer)

    def ask_for_checked_out(self, leader: str) -> None:
        """A new leader's resend of what its predecessor had checked out to this
        node's consumers may have been lost (sent while the link was down): ask
        it for everything after the last seq each consumer saw."""
        for (owner, tag), consumer in self.local_consumers.items():
            self.route.send_to(leader, [RESEND, self.group, owner, tag, consumer.last_seq])


def _runs(seqs: list[int]) -> list[tuple[int, int]]:
    """Ascending seqs as [first, end) runs of consecutive numbers."""
    runs: list[tuple[int, int]] = []
    for seq in seqs:
        if runs and runs[-1][1] == seq:
            runs[-1] = (runs[-1][0], seq + 1)
        else:
            runs.append((seq, seq + 1))
    return runs
