"""A quorum queue as one node sees it: the Raft group's replica (if this node
is a member) and the sessions of this node's channels with it.

Theory of operation. Every node has a `QuorumQueue` in its vhost for every
quorum queue, member or not, so any node routes to it and any channel can
consume from it. Channels use it as they use a classic `Queue`, but nothing
is applied here directly: every command goes to the group's leader
(`Cluster.submit`), and every replica applies the committed commands to its
`QuorumMachine` (broker/queues/quorum_machine.py); only the leader performs the
effects:

* publishing: each channel is an enqueuer with its own sequence numbers; its
  unconfirmed enqueues stay here and are resent, in order, when the leader
  changes or nothing was confirmed for `RESEND_SECONDS`; the machine drops
  duplicates and re-orders, the leader answers APPLIED per sequence and the
  channel confirms (a publish routed to several queues when all have);
* consuming: deliveries carry a per-consumer sequence; this node hands them
  to the channel in order, drops what it has seen, holds what comes after a
  gap and asks the leader to send again what it has checked out after the
  last one seen (RESEND). A new leader sends every checked-out message again,
  a leader sends a peer's consumers theirs again when the peer's link comes
  up, and a consumers' node asks a new leader as soon as it learns of it;
* sessions of lost nodes: the leader proposes NODE_DOWN when a node's link
  drops (its consumers keep their messages but get no more), NODE_UP with the
  node's incarnation when it is back (consumers of an earlier incarnation,
  i.e. of channels that died with a restart, are removed and their messages
  returned), NODE_GONE when it stayed away `cluster_node_gone_seconds`;
  only locally and in its own term (`_state_own_view`).
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Hashable

import structlog

from warren.broker.queues import fifo
from warren.broker.node import metadata_commands as mc
from warren.broker.queues import quorum_machine as qm
from warren.broker.queues.queue import Queue
from warren.broker.node.cluster import APPLIED, DELIVER, RESEND, RESEND_SECONDS

if TYPE_CHECKING:
    from warren.broker.node.cluster import Cluster
    from warren.broker.routing.vhost import VirtualHost
    from warren.raft.messages import Entry, Snapshot

log = structlog.get_logger("warren.quorum")
HELD_DELIVERIES_MAX = 10_000
ENQUEUE_BATCH_MAX = 1024
# Commands that count as using the queue for x-expires (as RabbitMQ: consumers, basic.get)
USE_OPS = frozenset({qm.CHECKOUT, qm.CANCEL, qm.DEQUEUE})
# Entries, or bytes of entries, between snapshots at least (more when the queue
# holds many messages).
SNAPSHOT_ENTRIES_MIN = 4096
SNAPSHOT_BYTES_MIN = 512 * 1024
SNAPSHOT_BYTES_PER_MESSAGE = 64


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


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
    pending: dict[int, tuple[bytes, Callable[[bool], None] | None]] = field(default_factory=dict)
    progress_at: float = 0.0
    sent_to: str | None = None    # the leader the newest enqueue went to
    unsent_from: int | None = None  # seqs from here on wait for the end of the turn


class QuorumQueue(Queue):
    replicated = True

    def __init__(self, vhost: "VirtualHost", name: str, arguments: dict, cluster: "Cluster",
                 group: str, members: list[str]):
        super().__init__(vhost, name, True, None, False, arguments)
        # "classic": a durable classic queue in a cluster, the same machine on a group of one
        self.queue_type = arguments.get("x-queue-type", "classic")
        self.cluster = cluster
        self.group = group
        self.members = list(members)
        self.leader_hint: str | None = members[0] if members else None
        self.machine = qm.QuorumMachine(self.state.limits) if cluster.node in members else None
        if self.machine is not None:
            self.state = self.machine.state
        self.local_consumers: dict[tuple[str, str], LocalConsumer] = {}
        self.enqueuers: dict[Hashable, EnqueuerSession] = {}
        self.enqueuers_by_key: dict[str, EnqueuerSession] = {}
        self.unsent: list[EnqueuerSession] = []
        self.requests = itertools.count(1)
        self.gone_handled: set[str] = set()
        self.applied_since_snapshot = 0
        self.bytes_since_snapshot = 0
        self.truncation = qm.ReleaseCursor()
        self._recent_enqueue: tuple[int, list] | None = None   # (index, command): payload_of's cache
        self.expiring = False   # its x-expires deletion was submitted
        self.transient_dropped = False   # DROP_TRANSIENT proposed in this incarnation

    # -- the replica ---------------------------------------------------------------
    def apply_entry(self, entry: "Entry", leading: bool) -> Any:
        if self.machine is None:
            return None
        try:
            command = qm.decode(entry.data)
            if command[0] in USE_OPS:
                self.last_used_ms = _now_ms()   # x-expires counts from the last use
            reply, effects = self.machine.apply(command, entry.index)
        except Exception:  # noqa: BLE001 -- the same on every replica: skip it, keep the group alive
            log.exception("quorum.bad_command", queue=self.name, index=entry.index)
            return None
        if command[0] in (qm.ENQUEUE, qm.ENQUEUE_BATCH):
            self._recent_enqueue = (entry.index, command)   # the next delivery is likely from it
        if leading and effects:
            self.perform(effects)
        self.applied_since_snapshot += 1
        self.bytes_since_snapshot += len(entry.data)
        held = len(self.state.messages)
        if (self.applied_since_snapshot >= max(SNAPSHOT_ENTRIES_MIN, 2 * held)
                or self.bytes_since_snapshot >= max(SNAPSHOT_BYTES_MIN, SNAPSHOT_BYTES_PER_MESSAGE * held)
                or (self.truncation.candidates and not self.state.messages)):
            # Amortised: a snapshot costs O(messages held) (a few tens of bytes each) and comes
            # after at least twice as many entries or many times its size in log bytes, so the
            # log in memory and on disk stays within a constant of the state (once the release
            # cursor can move: the oldest message kept holds the log after it). A queue that
            # drained while a candidate waits is offered at once (it is cheap then).
            self.applied_since_snapshot = 0
            self.bytes_since_snapshot = 0
            compactable = self.truncation.offer(entry.index, self.machine)
            if compactable is not None:
                self.cluster.runtime.compact(self.group, *compactable)
        return self._wire_reply(reply) if leading else None

    def install_snapshot(self, snapshot: "Snapshot") -> None:
        self.machine = qm.QuorumMachine.restore(snapshot.data)
        self.state = self.machine.state
        self.applied_since_snapshot = 0
        self.bytes_since_snapshot = 0
        self.truncation.reset()

    def payload_of(self, payload: Any) -> tuple | None:
        """A message's (exchange, routing_key, properties, body): the machine
        keeps a reference into the Raft log (`qm.ref_location`), read back from
        the log in memory or on disk. None when the entry is gone: only for a
        message that a later committed entry settles (`qm.ReleaseCursor`)."""
        if type(payload) is not int:
            return payload
        index, slot = qm.ref_location(payload)
        recent = self._recent_enqueue
        if recent is not None and recent[0] == index:
            command = recent[1]
        else:
            data = self.cluster.runtime.entry_data(self.group, index)
            if data is None:
                log.warning("quorum.message_gone", queue=self.name, index=index)
                return None
            command = qm.decode(data)
            self._recent_enqueue = (index, command)
        return qm.message_payload(command, slot)

    def perform(self, effects: list) -> None:
        node = self.cluster.node
        applied: list = []
        for effect in effects:
            if isinstance(effect, qm.Delivery):
                owner, tag = effect.consumer
                target = qm.owner_node(owner)
                if target == node:
                    if (owner, tag) not in self.local_consumers:
                        continue   # gone: its messages return with its cancel or channel close
                    payload = self.payload_of(effect.payload)
                    if payload is not None:
                        self.on_delivery(owner, tag, effect.seq, effect.msg_id, payload,
                                         effect.redelivered, effect.delivery_count)
                    continue
                payload = self.payload_of(effect.payload)
                if payload is not None:
                    exchange, routing_key, properties, body = payload
                    self.cluster.app_send(target, [DELIVER, self.group, owner, tag, effect.seq, effect.msg_id,
                                                   exchange, routing_key, properties, body, effect.redelivered,
                                                   effect.delivery_count])
            elif isinstance(effect, qm.Applied):
                applied.append(effect)
            elif isinstance(effect, fifo.DeadLetter):
                payloads = [self.payload_of(p) for p in effect.payloads]
                self.vhost.dead_letter(self, effect.reason, tuple(tuple(p) for p in payloads if p is not None),
                                       _now_ms())
        if applied:
            self._answer_enqueuers(applied)

    def _wire_reply(self, reply: Any) -> Any:
        """A reply the leader can send back in a DONE message (msgpack)."""
        if isinstance(reply, fifo.Dequeued):
            payload = self.payload_of(reply.payload)
            if payload is None:
                return None
            return [reply.msg_id, list(payload), reply.redelivered, reply.message_count, reply.delivery_count]
        if reply is None or isinstance(reply, (int, str, bool)):
            return reply
        return None

    def _answer_enqueuers(self, applied: list) -> None:
        """One APPLIED per run of consecutive seqs of one enqueuer."""
        node = self.cluster.node
        run: list = []
        for effect in applied + [None]:
            if run and (effect is None or effect.enqueuer != run[0].enqueuer or effect.seq != run[-1].seq + 1):
                enqueuer = run[0].enqueuer
                refused = [a.seq for a in run if not a.accepted]
                if qm.owner_node(enqueuer) == node:
                    self.on_applied(enqueuer, run[0].seq, run[-1].seq, refused)
                else:
                    self.cluster.app_send(qm.owner_node(enqueuer),
                                          [APPLIED, self.group, enqueuer, run[0].seq, run[-1].seq, refused])
                run = []
            if effect is not None:
                run.append(effect)

    def on_leader_change(self, leader_id: str | None, leading: bool) -> None:
        if leader_id is not None and leader_id != self.leader_hint:
            self.leader_hint = leader_id
            if not leading:
                self._ask_for_checked_out(leader_id)
        if not leading or self.machine is None:
            return
        # What the old leader delivered may not have arrived: send it all again
        # (consumers drop sequences they have seen).
        self.perform(self.machine.checked_out_deliveries())
        # This node is up as its current incarnation: what its channels of an earlier
        # one (before a kill -9) held goes back; no other node says so for a group it
        # is alone in.
        self._state_own_view(qm.encode_node_up(self.cluster.node, self.cluster.incarnation, _now_ms()))
        if self.queue_type == "classic" and not self.transient_dropped:
            self.transient_dropped = True
            self._drop_earlier_transients()
        for peer in list(self.cluster.down_since):
            self._state_own_view(qm.encode_node_down(peer, _now_ms()))
        for peer, incarnation in self.cluster.peer_incarnations.items():
            if peer not in self.cluster.down_since:
                self._state_own_view(qm.encode_node_up(peer, incarnation, _now_ms()))

    def _ask_for_checked_out(self, leader: str) -> None:
        """A new leader's resend of what its predecessor had checked out to this
        node's consumers may have been lost (sent while the link was down): ask
        it for everything after the last seq each consumer saw."""
        for (owner, tag), consumer in self.local_consumers.items():
            self.cluster.app_send(leader, [RESEND, self.group, owner, tag, consumer.last_seq])

    def _drop_earlier_transients(self) -> None:
        """A durable classic queue loses its transient messages when its node restarts
        (RabbitMQ). It is a group of one, led by its node only, so its first leadership in
        this incarnation starts at a term no earlier incarnation had, and its first entry
        of that term (the no-op, Raft §8) splits the log: every entry below it was written
        before the restart, every entry of this incarnation (only a leader appends) is at
        or above it. The command names that index rather than "now", so it drops exactly
        the earlier incarnations' messages however it interleaves with the first publishes
        (proposed at once by a client or a peer as soon as the group leads), and a resent
        copy changes nothing. A new group's first term starts at index 1: nothing before it."""
        log_ = self.cluster.runtime.system.groups[self.group].raft.log
        term_start = log_.first_index_of_term(log_.last_index())
        if term_start > 1:
            self.cluster.submit(self.group, qm.encode_drop_transient_before(term_start, _now_ms()))

    def resend_deliveries(self, owner: str, tag: str, after_seq: int) -> None:
        if self.machine is not None:
            self.perform(self.machine.deliveries_since((owner, tag), after_seq))

    # -- nodes -----------------------------------------------------------------------
    def _leading(self) -> bool:
        return self.machine is not None and self.cluster.is_leader(self.group)

    def _state_own_view(self, data: bytes) -> None:
        """NODE_DOWN, NODE_UP and NODE_GONE state this node's view of its peers, which
        counts only while it leads: proposed here in its own term, never submitted
        (so never forwarded to another leader, nor resent after a leader change). A
        leader deposed without knowing it yet (paused, partitioned) proposes from a
        stale view; Raft commits an entry of its term only if it still has a majority
        in that term, so a stale one stays in its own log (and on followers still in
        its term) until the real leader's log replaces it. Should a later leader's log
        hold it and commit it, that leader's own view follows it: stated on its
        election (on_leader_change), at later indexes."""
        if self._leading():
            self.cluster.runtime.propose(self.group, data)

    def on_node_down(self, peer: str) -> None:
        self._state_own_view(qm.encode_node_down(peer, _now_ms()))

    def on_node_up(self, peer: str, incarnation: str) -> None:
        self.gone_handled.discard(peer)
        self._state_own_view(qm.encode_node_up(peer, incarnation, _now_ms()))

    def on_node_gone(self, peer: str) -> None:
        if peer not in self.gone_handled and self._leading():
            self.gone_handled.add(peer)
            self._state_own_view(qm.encode_node_gone(peer, _now_ms()))

    def on_link_up(self, peer: str) -> None:
        """Deliveries between this node and `peer` may have been lost while the link
        was down: as leader, send the peer's consumers everything checked out to them
        again; as a consumers' node whose leader is `peer`, ask for it."""
        if self._leading():
            self.perform(self.machine.checked_out_deliveries_on(peer))
        elif self.leader_hint == peer:
            self._ask_for_checked_out(peer)

    # -- publishing --------------------------------------------------------------------
    def enqueue(self, payload: Any, size: int, ttl_ms: int | None = None, priority: int = 0) -> int | None:
        """Dead-lettering into this queue (no confirm): this node's own enqueuer."""
        self.enqueue_from(("dlx", self.group), payload, ttl_ms, priority, None)
        return 0

    def enqueue_from(self, owner: Hashable, payload: tuple, ttl_ms: int | None, priority: int,
                     on_applied: Callable[[bool], None] | None) -> None:
        """Queue one publish of `owner`'s; the publishes of a turn go out as one
        ENQUEUE_BATCH command (one Raft entry) at its end."""
        session = self.enqueuers.get(owner)
        if session is None:
            key = self.cluster.owner_key(owner)
            session = self.enqueuers[owner] = self.enqueuers_by_key[key] = EnqueuerSession(key)
        seq = session.next_seq
        session.next_seq = seq + 1
        if not session.pending:
            session.progress_at = time.monotonic()
        exchange, routing_key, properties, body = payload
        session.pending[seq] = ([exchange, routing_key, properties, body, ttl_ms, priority], on_applied)
        if session.unsent_from is None:
            session.unsent_from = seq
            self.unsent.append(session)
            if len(self.unsent) == 1:
                # at the start of the Raft turn that persists it (not a call_soon before it)
                self.cluster.runtime.before_turn(self._send_unsent)

    def _send_unsent(self) -> None:
        """The turn's publishes go out; also called before any other command of
        this node's, so that a basic.get after a publish finds it queued."""
        if not self.unsent:
            return
        sessions, self.unsent = self.unsent, []
        for session in sessions:
            first, session.unsent_from = session.unsent_from, None
            if first is not None:
                if session.sent_to is None and session.pending:
                    # the previous send went nowhere (no leader known yet): send those first,
                    # else the queue holds the new ones until a resend fills the gap
                    first = min(first, next(iter(session.pending)))
                self._send_run(session, first, session.next_seq)

    def _send_run(self, session: EnqueuerSession, first: int, end: int) -> None:
        for start in range(first, end, ENQUEUE_BATCH_MAX):
            messages = [session.pending[seq][0] for seq in range(start, min(end, start + ENQUEUE_BATCH_MAX))]
            data = qm.encode_enqueue_batch(session.key, start, _now_ms(), messages)
            session.sent_to = self.cluster.send_command(self.group, data)

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
        leader = self.cluster.leader_hint(self.group)
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
                self._send_run(session, first, end)

    def notify_deleted(self) -> None:
        """Deleted through the metadata group: its unconfirmed publishes are confirmed,
        as RabbitMQ's channel confirms what was routed to a queue that is deleted
        (rabbit_channel handle_eol: deleted is not rejected), so the channel's
        publishes in flight come back under `commands_soft_limit` instead of holding it."""
        super().notify_deleted()
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

    # -- commands from channels -----------------------------------------------------------
    def apply(self, command: Any, on_done: Callable[[Any], None] | None = None) -> Any:
        """The channel's settle, return, discard and suspend, sent to the leader
        (`on_done(reply)` once the leader applied it: a transaction's acks)."""
        now = _now_ms()
        match command:
            case fifo.Settle(consumer=(owner, tag), msg_ids=ids):
                data = qm.encode_settle(self.cluster.owner_key(owner), tag, now, list(ids))
            case fifo.Return(consumer=(owner, tag), msg_ids=ids):
                data = qm.encode_return(self.cluster.owner_key(owner), tag, now, list(ids))
            case fifo.Discard(consumer=(owner, tag), msg_ids=ids):
                data = qm.encode_discard(self.cluster.owner_key(owner), tag, now, list(ids))
            case fifo.Suspend(consumer=(owner, tag), active=active):
                data = qm.encode_suspend(self.cluster.owner_key(owner), tag, now, active)
            case _:
                raise AssertionError(f"a quorum queue is not given {command!r} this way")
        self._send_unsent()
        self.cluster.submit(self.group, data, on_done)
        return 0

    def purge(self, on_done: Callable[[int], None]) -> None:
        self._send_unsent()
        data = qm.encode_purge(f"{self.cluster.node}", next(self.requests), _now_ms())
        self.cluster.submit(self.group, data, lambda count: on_done(count or 0))

    def get(self, owner: Hashable, no_ack: bool, on_done: Callable[[Any], None]) -> None:
        self._send_unsent()
        data = qm.encode_dequeue(self.cluster.owner_key(owner), next(self.requests), _now_ms(), no_ack)
        self.cluster.submit(self.group, data, on_done)

    def add_consumer(self, consumer_id: Hashable, sink: Any, prefetch: int,
                     priority: int, no_ack: bool, exclusive: bool, active: bool = True) -> None:
        owner, tag = consumer_id
        key = self.cluster.owner_key(owner)
        self.consumers[consumer_id] = sink
        self.local_consumers[(key, tag)] = LocalConsumer(sink, consumer_id)
        self.had_consumers = True
        if exclusive:
            self.exclusive_consumer = consumer_id
        self.cluster.submit(self.group, qm.encode_checkout(key, tag, _now_ms(), prefetch, priority, no_ack, active))

    def remove_consumer(self, consumer_id: Hashable) -> None:
        owner, tag = consumer_id
        key = self.cluster.owner_key(owner)
        self.local_consumers.pop((key, tag), None)
        self.cluster.submit(self.group, qm.encode_cancel(key, tag, _now_ms()))
        self._forget_consumer(consumer_id)

    def owner_down(self, owner: Hashable) -> None:
        key = self.cluster.owner_key(owner)
        for local_key in [k for k in self.local_consumers if k[0] == key]:
            del self.local_consumers[local_key]
        for consumer_id in [c for c in self.consumers if c[0] == owner]:
            self._forget_consumer(consumer_id)
        self.forget_enqueuer(owner)
        self._send_unsent()
        self.cluster.submit_down(self.group, key, qm.encode_down(key, _now_ms()))

    # -- deliveries to this node's channels ---------------------------------------------------
    def on_remote_delivery(self, message: list) -> None:
        _, _, owner, tag, seq, msg_id, exchange, routing_key, properties, body, redelivered, count = message
        self.on_delivery(owner, tag, seq, msg_id, (exchange, routing_key, properties, body), redelivered, count)

    def on_delivery(self, owner: str, tag: str, seq: int, msg_id: int, payload: tuple,
                    redelivered: bool, count: int) -> None:
        consumer = self.local_consumers.get((owner, tag))
        if consumer is None or seq <= consumer.last_seq:
            return  # gone (its messages go back with its cancel or channel close), or seen
        if seq > consumer.last_seq + 1:
            if len(consumer.held) < HELD_DELIVERIES_MAX:
                consumer.held[seq] = (msg_id, payload, redelivered, count)
            self._ask_for_gap(owner, tag, consumer)
            return
        self._hand_over(consumer, tag, seq, msg_id, payload, redelivered, count)
        while consumer.held and consumer.last_seq + 1 in consumer.held:
            seq = consumer.last_seq + 1
            self._hand_over(consumer, tag, seq, *consumer.held.pop(seq))

    def _hand_over(self, consumer: LocalConsumer, tag: str, seq: int, msg_id: int, payload: tuple,
                   redelivered: bool, count: int) -> None:
        consumer.last_seq = seq
        # (msg_id, seq) names this delivery: a settle or return sent twice (after a
        # leader change) cannot touch a later delivery of the same message.
        consumer.sink.deliver(self, consumer.consumer_id[1], (msg_id, seq), self.delivery_payload(payload, count),
                              redelivered)

    def _ask_for_gap(self, owner: str, tag: str, consumer: LocalConsumer) -> None:
        now = time.monotonic()
        if now - consumer.gap_asked_at < RESEND_SECONDS or self.leader_hint is None:
            return
        consumer.gap_asked_at = now
        if self.leader_hint == self.cluster.node:
            self.resend_deliveries(owner, tag, consumer.last_seq)
        else:
            self.cluster.app_send(self.leader_hint, [RESEND, self.group, owner, tag, consumer.last_seq])

    # -- time and numbers ------------------------------------------------------------------------
    def tick(self) -> None:
        """Periodic, on every node; only the leader acts: message TTL, and x-expires
        (unused: no consumers, no basic.get, no redeclare here, for that long)."""
        if self.machine is None or not self._leading():
            return
        if self.state.expiries:
            self.cluster.submit(self.group, qm.encode_tick(_now_ms()))
        if (self.expires_ms is not None and not self.expiring and self.machine.consumer_count == 0
                and _now_ms() - self.last_used_ms >= self.expires_ms):
            self.expiring = True   # one deletion through the metadata group
            self.cluster.broker.metadata.submit(mc.DeleteQueue(self.vhost.name, self.name), lambda _: None)

    @property
    def consumer_count(self) -> int:
        return self.machine.consumer_count if self.machine is not None else len(self.consumers)

    @property
    def message_count(self) -> int:
        return self.machine.ready_count if self.machine is not None else 0

    @property
    def bytes_in_memory(self) -> int:
        """Bodies held in memory, for the memory alarm: none here. The machine
        keeps references into the Raft log, whose entries keep their data in
        memory only until applied (and KEEP_RECENT_ENTRIES more, raft/entry_locations.py);
        what is not yet applied is bounded by `commands_soft_limit` per channel."""
        return 0

    def release_cursor(self) -> int:
        return 0


def _runs(seqs: list[int]) -> list[tuple[int, int]]:
    """Ascending seqs as [first, end) runs of consecutive numbers."""
    runs: list[tuple[int, int]] = []
    for seq in seqs:
        if runs and runs[-1][1] == seq:
            runs[-1] = (runs[-1][0], seq + 1)
        else:
            runs.append((seq, seq + 1))
    return runs
