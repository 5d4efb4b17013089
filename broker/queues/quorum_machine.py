"""The replicated state machine of one quorum queue (after RabbitMQ's rabbit_fifo).

Theory of operation. Every replica of the queue's Raft group feeds the same
committed commands, in log order, to its own ``QuorumMachine.apply`` and so
reaches the same state; only the leader performs the effects it returns. The
machine is pure: no I/O, no clock. A command is a msgpack list
``[opcode, ..., now_ms, ...]`` (``encode_*`` build them); ``now_ms`` is the
proposer's clock, stamped when it proposed, so replicas agree on time. Time in
the machine never goes back: a command stamped earlier than the last one (a
proposer with a slower clock) runs at the last one's time.

It wraps the queue machine of broker/queues/fifo.py and adds what replication needs:

* Enqueuer sessions. A publisher (enqueuer) numbers its ENQUEUEs 1, 2, 3...
  and resends the unconfirmed ones after a leader change, so the log holds
  duplicates and, when a resend overtakes, gaps. Per enqueuer the machine
  keeps the next expected seq, from 1: a lower seq is a duplicate (confirmed again,
  not enqueued again), a higher one is held (at most ``HOLD_MAX``) until the
  gap is filled. Every applied or duplicate ENQUEUE yields ``Applied``, the
  publisher's confirm.
* Message ids. The machine counts its own ids (``next_msg_id``) rather than
  using the log index, so that held enqueues released by one command get
  distinct ids; ids are never reused.
* Delivery seqs. Each consumer's deliveries are numbered 1, 2, 3... and the
  seq of every message still checked out is remembered, so that a new leader
  can resend them all (``checked_out_deliveries``) and a consumer that saw a
  gap can ask for the rest (``deliveries_since``); the consuming node drops
  seqs it already saw. SETTLE/RETURN/DISCARD may name a delivery as
  ``[msg_id, seq]`` instead of a bare msg_id: a stale resend of a RETURN then
  cannot return a later delivery of the same message.
* Node failures. Owners (channels) are named ``node/incarnation/rest``.
  NODE_DOWN suspects a node: its consumers keep what they hold but get
  nothing new. NODE_UP with the node's incarnation resumes them; owners of an
  older incarnation died with it and are Down (their messages return), its
  publishers' sessions are forgotten, and its late commands (ENQUEUE,
  CHECKOUT, DEQUEUE still in flight) are refused from then on. NODE_GONE
  Downs the owners of the incarnations the node had when suspected, not those
  of a newer one that spoke since.

Snapshots (``snapshot``/``restore``) hold the whole state, payloads included,
in a form that is canonical: two machines that behave the same produce the
same bytes, so replicas can be compared by their snapshots.
"""
from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import msgpack

from warren.broker.queues import fifo
from warren.protocol import codec


# -- opcodes (the first element of every command) ------------------------------------
class Op(IntEnum):
    ENQUEUE = 1      # [op, enqueuer, seq, now_ms, exchange, routing_key, properties, body, ttl_ms, priority]
    CHECKOUT = 2     # [op, owner, tag, now_ms, prefetch, priority, no_ack, active]
    CANCEL = 3       # [op, owner, tag, now_ms]
    SETTLE = 4       # [op, owner, tag, now_ms, [msg_id | [msg_id, seq], ...]]
    RETURN = 5       # same as SETTLE
    DISCARD = 6      # same as SETTLE
    SUSPEND = 7      # [op, owner, tag, now_ms, active]
    DEQUEUE = 8      # [op, owner, request_id, now_ms, no_ack]
    PURGE = 9        # [op, owner, request_id, now_ms]
    DOWN = 10        # [op, owner, now_ms]
    NODE_DOWN = 11   # [op, node, now_ms]
    NODE_UP = 12     # [op, node, incarnation, now_ms]
    NODE_GONE = 13   # [op, node, now_ms]
    TICK = 14        # [op, now_ms]
    # One channel's publishes of one event-loop turn: seqs first_seq, first_seq + 1, ...
    # [op, enqueuer, first_seq, now_ms, [[exchange, routing_key, properties, body, ttl_ms, priority], ...]]
    ENQUEUE_BATCH = 15
    # A classic queue's node restarted: its ready transient messages go (RabbitMQ's classic queues).
    # Written by earlier versions only (it raced the first publishes after it); applied as it was.
    DROP_TRANSIENT = 16  # [op, now_ms]
    # The same, only for messages of entries below `before_index` (the restarted leader's first
    # entry of its term): what was enqueued in this incarnation stays, whenever this is applied.
    DROP_TRANSIENT_BEFORE = 17  # [op, before_index, now_ms]


(ENQUEUE, CHECKOUT, CANCEL, SETTLE, RETURN, DISCARD, SUSPEND, DEQUEUE, PURGE, DOWN, NODE_DOWN, NODE_UP,
 NODE_GONE, TICK, ENQUEUE_BATCH, DROP_TRANSIENT, DROP_TRANSIENT_BEFORE) = (int(op) for op in Op)

ARITY = {ENQUEUE: 10, CHECKOUT: 8, CANCEL: 4, SETTLE: 5, RETURN: 5, DISCARD: 5, SUSPEND: 5,
         DEQUEUE: 5, PURGE: 4, DOWN: 3, NODE_DOWN: 3, NODE_UP: 4, NODE_GONE: 3, TICK: 2, ENQUEUE_BATCH: 5,
         DROP_TRANSIENT: 2, DROP_TRANSIENT_BEFORE: 3}
# Where each command carries now_ms.
TIME_FIELD = {ENQUEUE: 3, ENQUEUE_BATCH: 3, NODE_UP: 3, DOWN: 2, NODE_DOWN: 2, NODE_GONE: 2, TICK: 1,
              DROP_TRANSIENT: 1, DROP_TRANSIENT_BEFORE: 2}
TIME_FIELD_DEFAULT = 3

# What one node states about others (a leader's own view, broker/queues/quorum.py `_state_own_view`):
# proposed only by the leader into its own log, never forwarded, so a peer that sends one is refused.
LIVENESS_OPS = frozenset({NODE_DOWN, NODE_UP, NODE_GONE})

# Out-of-order enqueues held per enqueuer; beyond it they are dropped (the sender resends).
HOLD_MAX = 4096
# Dead incarnations remembered per node, so that their late commands are refused.
RETIRED_MAX = 16
SNAPSHOT_VERSION = 2
# A message reference: index * REF_SLOTS + its position in the entry (an
# ENQUEUE_BATCH carries at most REF_SLOTS messages), negated minus one for a
# transient message (delivery_mode != 2): see `ref_location`.
REF_SLOTS = 1 << 16


# -- effects ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Delivery:
    consumer: tuple
    seq: int               # the consumer's delivery number: 1, 2, 3...
    msg_id: int
    payload: tuple         # (exchange, routing_key, properties, body)
    redelivered: bool
    delivery_count: int


@dataclass(frozen=True, slots=True)
class Applied:
    """An ENQUEUE was applied (or was a duplicate of one): the publisher's confirm."""
    enqueuer: str
    seq: int
    accepted: bool         # False: the queue refused it (reject-publish overflow)
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class Got:
    """The answer to a DEQUEUE (basic.get), for the requester."""
    owner: str
    request_id: int
    dequeued: fifo.Dequeued | None


@dataclass(frozen=True, slots=True)
class Purged:
    owner: str
    request_id: int
    count: int


# -- encoding ---------------------------------------------------------------------------
def _pack(command: list) -> bytes:
    return msgpack.packb(command, use_bin_type=True)


def decode(data: bytes) -> list:
    command = msgpack.unpackb(data, raw=False)
    assert isinstance(command, list) and command, "a command is a non-empty list"
    return command


def ref_location(ref: int) -> tuple[int, int]:
    """(log index, position in the entry) of a message reference."""
    return divmod(ref if ref >= 0 else -ref - 1, REF_SLOTS)


def is_transient(payload: Any) -> bool:
    """A message kept as a reference or inline: not delivery_mode 2?"""
    if type(payload) is int:
        return payload < 0
    return not _persistent(payload[2])


def enqueued_before(payload: Any, index: int) -> bool:
    """Was the message enqueued by an entry below `index`? A message kept
    inline (a machine applied without indexes: unit tests) has no index and
    counts as earlier."""
    return type(payload) is not int or ref_location(payload)[0] < index


def _persistent(properties: bytes) -> bool:
    # the channel checked the properties at publish; fewer than 2 bytes: no flags (tests)
    return len(properties) >= 2 and codec.is_persistent(properties)


def message_payload(command: list, slot: int) -> tuple:
    """(exchange, routing_key, properties, body) of the message at `slot` of
    an ENQUEUE or ENQUEUE_BATCH command: what a message reference names."""
    if command[0] == ENQUEUE:
        assert slot == 0, f"an ENQUEUE has one message, not slot {slot}"
        return tuple(command[4:8])
    assert command[0] == ENQUEUE_BATCH, f"a message reference into a command of opcode {command[0]}"
    return tuple(command[4][slot][:4])


def encode_enqueue(enqueuer: str, seq: int, now_ms: int, exchange: str, routing_key: str, properties: bytes,
                   body: bytes, ttl_ms: int | None = None, priority: int = 0) -> bytes:
    return _pack([ENQUEUE, enqueuer, seq, now_ms, exchange, routing_key, properties, body, ttl_ms, priority])


def encode_enqueue_batch(enqueuer: str, first_seq: int, now_ms: int, messages: list) -> bytes:
    """`messages`: [exchange, routing_key, properties, body, ttl_ms, priority] each, seqs from `first_seq`."""
    return _pack([ENQUEUE_BATCH, enqueuer, first_seq, now_ms, messages])


def encode_checkout(owner: str, tag: str, now_ms: int, prefetch: int, priority: int = 0,
                    no_ack: bool = False, active: bool = True) -> bytes:
    return _pack([CHECKOUT, owner, tag, now_ms, prefetch, priority, no_ack, active])


def encode_cancel(owner: str, tag: str, now_ms: int) -> bytes:
    return _pack([CANCEL, owner, tag, now_ms])


def _ids(msg_ids) -> list:
    return [list(item) if isinstance(item, tuple) else item for item in msg_ids]


def encode_settle(owner: str, tag: str | None, now_ms: int, msg_ids) -> bytes:
    """msg_ids: bare msg ids, or (msg_id, seq) pairs naming one delivery."""
    return _pack([SETTLE, owner, tag, now_ms, _ids(msg_ids)])


def encode_return(owner: str, tag: str | None, now_ms: int, msg_ids) -> bytes:
    return _pack([RETURN, owner, tag, now_ms, _ids(msg_ids)])


def encode_discard(owner: str, tag: str | None, now_ms: int, msg_ids) -> bytes:
    return _pack([DISCARD, owner, tag, now_ms, _ids(msg_ids)])


def encode_suspend(owner: str, tag: str, now_ms: int, active: bool) -> bytes:
    return _pack([SUSPEND, owner, tag, now_ms, active])


def encode_dequeue(owner: str, request_id: int, now_ms: int, no_ack: bool) -> bytes:
    return _pack([DEQUEUE, owner, request_id, now_ms, no_ack])


def encode_purge(owner: str, request_id: int, now_ms: int) -> bytes:
    return _pack([PURGE, owner, request_id, now_ms])


def encode_down(owner: str, now_ms: int) -> bytes:
    return _pack([DOWN, owner, now_ms])


def encode_node_down(node: str, now_ms: int) -> bytes:
    return _pack([NODE_DOWN, node, now_ms])


def encode_node_up(node: str, incarnation: str, now_ms: int) -> bytes:
    return _pack([NODE_UP, node, incarnation, now_ms])


def encode_node_gone(node: str, now_ms: int) -> bytes:
    return _pack([NODE_GONE, node, now_ms])


def encode_drop_transient(now_ms: int) -> bytes:
    return _pack([DROP_TRANSIENT, now_ms])


def encode_drop_transient_before(before_index: int, now_ms: int) -> bytes:
    return _pack([DROP_TRANSIENT_BEFORE, before_index, now_ms])


def encode_tick(now_ms: int) -> bytes:
    return _pack([TICK, now_ms])


# -- owners ----------------------------------------------------------------------------
def owner_node(owner: Any) -> str | None:
    """The node of an owner named f"{node}/{incarnation}/{rest}"; None if not so named."""
    parts = owner.split("/", 2) if isinstance(owner, str) else ()
    return parts[0] if len(parts) == 3 else None


def owner_incarnation(owner: Any) -> str | None:
    parts = owner.split("/", 2) if isinstance(owner, str) else ()
    return parts[1] if len(parts) == 3 else None


# -- the machine -------------------------------------------------------------------------
@dataclass(slots=True)
class EnqueuerSession:
    next_seq: int
    held: dict[int, list] = field(default_factory=dict)   # seq -> [now_ms, payload, size, ttl_ms, priority]


@dataclass(slots=True)
class ConsumerSeqs:
    last_seq: int = 0
    # msg_id -> the seq it was delivered with; insertion order is seq order
    checked_out: dict[int, int] = field(default_factory=dict)


class QuorumMachine:
    def __init__(self, limits: fifo.QueueLimits | None = None) -> None:
        self._fifo = fifo.FifoState(limits=limits if limits is not None else fifo.QueueLimits())
        self.next_msg_id = 1
        self._sessions: dict[str, EnqueuerSession] = {}
        self._seqs: dict[tuple, ConsumerSeqs] = {}
        # suspected consumer -> whether its owner wants it active (resumed so on NODE_UP)
        self._suspected: dict[tuple, bool] = {}
        # suspected node -> the incarnations it had when suspected (what NODE_GONE declares dead)
        self._suspected_nodes: dict[str, list[str]] = {}
        # node -> incarnations a NODE_UP declared dead, oldest first (at most RETIRED_MAX)
        self._retired: dict[str, list[str]] = {}
        self._index: int | None = None   # the log index of the command being applied
        # owner -> (its latest basic.get request id, the answer), so a resent one is answered again
        self._gets: dict[str, tuple[int, fifo.Dequeued | None]] = {}

    # --- reading -------------------------------------------------------------------
    @property
    def state(self) -> fifo.FifoState:
        return self._fifo

    @property
    def ready_count(self) -> int:
        return self._fifo.ready_count

    @property
    def unacked_count(self) -> int:
        return self._fifo.unacked_count

    @property
    def message_bytes(self) -> int:
        return self._fifo.message_bytes

    @property
    def consumer_count(self) -> int:
        """Live consumers (not cancelled; basic.get's pseudo-consumers are cancelled)."""
        return sum(1 for consumer in self._fifo.consumers.values() if not consumer.cancelled)

    @property
    def suspected_nodes(self) -> frozenset[str]:
        return frozenset(self._suspected_nodes)

    @property
    def suspected_consumers(self) -> frozenset[tuple]:
        return frozenset(self._suspected)

    def next_seq(self, enqueuer: str) -> int | None:
        session = self._sessions.get(enqueuer)
        return None if session is None else session.next_seq

    def held_count(self, enqueuer: str) -> int:
        session = self._sessions.get(enqueuer)
        return 0 if session is None else len(session.held)

    def oldest_ref_index(self) -> int | None:
        """The lowest log index a message still kept here (ready, checked out
        or held out of order) refers to; None when there is none. O(messages):
        for the shell's occasional snapshot decisions."""
        refs = [payload for payload, _ in self._fifo.messages.values() if type(payload) is int]
        refs += [m[1] for session in self._sessions.values() for m in session.held.values() if type(m[1]) is int]
        return min(ref_location(ref)[0] for ref in refs) if refs else None

    def checked_out_deliveries(self) -> list[Delivery]:
        """Every delivery not settled or returned yet, with its original seq:
        what a new leader resends (consumers drop the seqs they saw)."""
        return [delivery for consumer in self._seqs for delivery in self.deliveries_since(consumer, 0)]

    def checked_out_deliveries_on(self, node: str) -> list[Delivery]:
        """`checked_out_deliveries` of the consumers on `node` only."""
        return [delivery for consumer in self._seqs if owner_node(consumer[0]) == node
                for delivery in self.deliveries_since(consumer, 0)]

    def deliveries_since(self, consumer, seq: int) -> list[Delivery]:
        """The consumer's deliveries still checked out with a seq above `seq`, in seq order."""
        consumer = tuple(consumer)
        record = self._seqs.get(consumer)
        if record is None:
            return []
        return [self._delivery(consumer, msg_id, s) for msg_id, s in record.checked_out.items() if s > seq]

    def _delivery(self, consumer: tuple, msg_id: int, seq: int) -> Delivery:
        payload = self._fifo.messages[msg_id][0]
        count = self._fifo.delivery_counts.get(msg_id, 0)
        return Delivery(consumer, seq, msg_id, payload, count > 0, count)

    # --- applying --------------------------------------------------------------------
    def apply(self, command: list, index: int | None = None) -> tuple[Any, list]:
        """Apply one committed command; `index` is its Raft log index. With
        an index, messages are kept as references into the log (see
        `ref_location`), without one (unit tests) with their payloads."""
        self._index = index
        op = command[0]
        assert len(command) == ARITY.get(op, -1), f"malformed command {command!r}"
        effects: list = []
        if op in (Op.ENQUEUE, Op.CHECKOUT, Op.DEQUEUE, Op.ENQUEUE_BATCH) and self._is_retired(command[1]):
            return _REFUSED[op], effects
        match op:
            case Op.ENQUEUE:
                _, enqueuer, seq, now_ms, *fields = command
                reply = self._on_enqueue(enqueuer, seq, self._held_form(now_ms, fields, 0), effects)
            case Op.ENQUEUE_BATCH:
                # Exactly as the ENQUEUEs it stands for, one after the other.
                _, enqueuer, first_seq, now_ms, messages = command
                reply = []
                for slot, fields in enumerate(messages):
                    reply += self._on_enqueue(enqueuer, first_seq + slot, self._held_form(now_ms, fields, slot),
                                              effects)
            case Op.CHECKOUT:
                reply = self._on_checkout(command, effects)
            case Op.CANCEL:
                consumer = _consumer(command)
                reply = self._fifo_apply(_time(command), fifo.Cancel(consumer), effects, [consumer])
            case Op.SETTLE | Op.RETURN | Op.DISCARD:
                reply = self._on_release(command, effects)
            case Op.SUSPEND:
                reply = self._on_suspend(command, effects)
            case Op.DEQUEUE:
                reply = self._on_dequeue(command, effects)
            case Op.PURGE:
                reply = self._fifo_apply(_time(command), fifo.Purge(), effects)
                effects.append(Purged(command[1], command[2], reply))
            case Op.DOWN:
                # The channel closed: what it held returns, and as a publisher it is done.
                reply = self._down_owners(command, [command[1]], effects)
                self._sessions.pop(command[1], None)
            case Op.NODE_DOWN:
                reply = self._on_node_down(command, effects)
            case Op.NODE_UP:
                reply = self._on_node_up(command, effects)
            case Op.NODE_GONE:
                reply = self._on_node_gone(command, effects)
            case Op.TICK:
                reply = self._fifo_apply(_time(command), fifo.Tick(), effects)
            case Op.DROP_TRANSIENT:
                reply = fifo.drop_ready(self._fifo, is_transient)
            case Op.DROP_TRANSIENT_BEFORE:
                before = command[1]
                reply = fifo.drop_ready(self._fifo, lambda payload: is_transient(payload)
                                        and enqueued_before(payload, before))
            case _:
                raise AssertionError(f"unknown opcode {op!r}")
        return reply, effects

    def _fifo_apply(self, command_ms: int, fifo_command: Any, effects: list, touched=()) -> Any:
        """Apply to the fifo at the command's time, translate its effects, then
        forget the seqs of what the touched consumers no longer hold."""
        now_ms = max(command_ms, self._fifo.now_ms)
        reply, fifo_effects = fifo.apply(fifo.Meta(self.next_msg_id, now_ms), fifo_command, self._fifo)
        for effect in fifo_effects:
            if isinstance(effect, fifo.Deliver):
                effects.append(self._number(effect))
            else:
                effects.append(effect)
        for consumer in touched:
            self._forget_released(consumer)
        return reply

    def _number(self, deliver: fifo.Deliver) -> Delivery:
        consumer = deliver.consumer
        record = self._seqs.get(consumer)
        if record is None:
            record = self._seqs[consumer] = ConsumerSeqs()
        record.last_seq += 1
        # Re-inserted, not updated, so that the dict stays in seq order (a returned
        # message can come back to the same consumer in the same command).
        record.checked_out.pop(deliver.msg_id, None)
        state = self._fifo.consumers.get(consumer)
        if state is not None and deliver.msg_id in state.checked_out:   # not no-ack
            record.checked_out[deliver.msg_id] = record.last_seq
        return Delivery(consumer, record.last_seq, deliver.msg_id, deliver.payload, deliver.redelivered,
                        deliver.delivery_count)

    def _forget_released(self, consumer: tuple) -> None:
        """Bounded memory: drop the seqs of messages the consumer no longer holds,
        and everything about a consumer the fifo removed."""
        state = self._fifo.consumers.get(consumer)
        if state is None:
            self._seqs.pop(consumer, None)
            self._suspected.pop(consumer, None)
            return
        record = self._seqs.get(consumer)
        if record is not None and len(record.checked_out) != len(state.checked_out):
            held = state.checked_out
            record.checked_out = {m: s for m, s in record.checked_out.items() if m in held}

    # --- enqueue and its sessions ---------------------------------------------------------
    def _held_form(self, now_ms: int, fields: list, slot: int) -> list:
        """One enqueue as the machine keeps it until applied: [now_ms, payload,
        size, ttl_ms, priority], the payload a reference into the log when
        the command's index is known."""
        exchange, routing_key, properties, body, ttl_ms, priority = fields
        if self._index is None:
            payload: Any = (exchange, routing_key, properties, body)
        else:
            assert slot < REF_SLOTS, f"an entry names at most {REF_SLOTS} messages"
            payload = self._index * REF_SLOTS + slot
            if not _persistent(properties):
                payload = -payload - 1
        return [now_ms, payload, len(body), ttl_ms, priority]

    def _on_enqueue(self, enqueuer: str, seq: int, message: list, effects: list) -> list[Applied]:
        session = self._sessions.get(enqueuer)
        if session is None:
            # A publisher's session starts at seq 1 (broker/queues/quorum.py), as rabbit_fifo's
            # enqueuer: a first command with a later seq overtook earlier ones still on
            # their way, which must not be taken for duplicates (confirmed, never enqueued).
            # The machine forgets a session only when its channel is gone for good (DOWN,
            # or NODE_UP of a later incarnation), so a live publisher never restarts mid-way.
            session = self._sessions[enqueuer] = EnqueuerSession(next_seq=1)
        if seq < session.next_seq:
            applied = [Applied(enqueuer, seq, accepted=True, duplicate=True)]
            effects.extend(applied)
            return applied
        if seq > session.next_seq:
            if seq not in session.held and len(session.held) < HOLD_MAX:
                session.held[seq] = message
            return []
        applied = []
        while message is not None:
            applied.append(self._enqueue_one(enqueuer, session.next_seq, message, effects))
            session.next_seq += 1
            message = session.held.pop(session.next_seq, None)
        return applied

    def _enqueue_one(self, enqueuer: str, seq: int, message: list, effects: list) -> Applied:
        now_ms, payload, size, ttl_ms, priority = message
        reply = self._fifo_apply(now_ms, fifo.Enqueue(payload, size, ttl_ms, priority), effects)
        self.next_msg_id += 1
        applied = Applied(enqueuer, seq, accepted=reply == fifo.ACCEPTED)
        effects.append(applied)
        return applied

    # --- consumers ---------------------------------------------------------------------
    def _on_checkout(self, command: list, effects: list) -> str:
        _, owner, tag, _, prefetch, priority, no_ack, active = command
        consumer = (owner, tag)
        # A new checkout is a live channel speaking: it starts unsuspected (the
        # failure detector suspects it again if its node is still unreachable).
        self._suspected.pop(consumer, None)
        checkout = fifo.Checkout(consumer, prefetch, priority, no_ack, active)
        return self._fifo_apply(_time(command), checkout, effects, [consumer])

    def _on_suspend(self, command: list, effects: list) -> str:
        consumer, active = _consumer(command), command[4]
        if consumer in self._suspected:
            # Stays suspended until its node is back; then it takes this state.
            self._suspected[consumer] = active
            return fifo.ACCEPTED
        return self._fifo_apply(_time(command), fifo.Suspend(consumer, active), effects, [consumer])

    def _on_release(self, command: list, effects: list) -> int:
        consumer = _consumer(command)
        msg_ids = self._select(consumer, command[4])
        kind = {SETTLE: fifo.Settle, RETURN: fifo.Return, DISCARD: fifo.Discard}[command[0]]
        return self._fifo_apply(_time(command), kind(consumer, msg_ids), effects, [consumer])

    def _select(self, consumer: tuple, items: list) -> tuple[int, ...]:
        """Bare msg ids pass; [msg_id, seq] only while that delivery is checked out."""
        record = self._seqs.get(consumer)
        selected = []
        for item in items:
            if isinstance(item, int):
                selected.append(item)
            elif record is not None and record.checked_out.get(item[0]) == item[1]:
                selected.append(item[0])
        return tuple(dict.fromkeys(selected))   # an id named twice is released once

    def _on_dequeue(self, command: list, effects: list) -> fifo.Dequeued | None:
        _, owner, request_id, _, no_ack = command
        last = self._gets.get(owner)
        if last is not None and request_id <= last[0]:
            # A resent basic.get (its answer was lost with a leader): the same answer,
            # not a second message. A node numbers its requests upwards.
            effects.append(Got(owner, request_id, last[1]))
            return last[1]
        # basic.get's pseudo-consumer (owner, None), as broker/queues/queue.py has it
        dequeued = self._fifo_apply(_time(command), fifo.Dequeue((owner, None), no_ack), effects)
        self._gets[owner] = (request_id, dequeued)
        effects.append(Got(owner, request_id, dequeued))
        return dequeued

    def _down_owners(self, command: list, owners: list, effects: list) -> int:
        returned = 0
        for owner in owners:
            self._gets.pop(owner, None)
            touched = [c for c in self._fifo.consumers if c[0] == owner]
            returned += self._fifo_apply(_time(command), fifo.Down(owner), effects, touched)
        return returned

    # --- nodes -----------------------------------------------------------------------------
    def _consumers_on(self, node: str) -> list[tuple]:
        return [c for c in self._fifo.consumers if owner_node(c[0]) == node]

    def _owners_on(self, node: str, keep=lambda incarnation: True) -> list[str]:
        owners = [c[0] for c in self._consumers_on(node) if keep(owner_incarnation(c[0]))]
        return list(dict.fromkeys(owners))

    def _on_node_down(self, command: list, effects: list) -> list[tuple]:
        """Suspect the node: its consumers keep what they hold and get nothing new."""
        node = command[1]
        suspected = []
        for consumer in self._consumers_on(node):
            if consumer in self._suspected:
                continue
            self._suspected[consumer] = not self._fifo.consumers[consumer].suspended
            self._fifo_apply(_time(command), fifo.Suspend(consumer, active=False), effects)
            suspected.append(consumer)
        incarnations = set(self._suspected_nodes.get(node, ()))
        incarnations.update(owner_incarnation(c[0]) for c in self._consumers_on(node))
        self._suspected_nodes[node] = sorted(incarnations)
        return suspected

    def _on_node_up(self, command: list, effects: list) -> list[str]:
        """The node answers as `incarnation`: older incarnations died, so their
        owners are Down (messages return, redelivered); the suspected consumers
        of this incarnation resume."""
        _, node, incarnation, _ = command
        self._suspected_nodes.pop(node, None)
        self._retire(node, incarnation)
        dead = self._owners_on(node, lambda inc: inc != incarnation)
        self._down_owners(command, dead, effects)
        self._forget_gets(node, lambda inc: inc != incarnation)
        for enqueuer in [e for e in self._sessions if owner_node(e) == node and owner_incarnation(e) != incarnation]:
            del self._sessions[enqueuer]
        for consumer in [c for c in self._suspected if owner_node(c[0]) == node]:
            active = self._suspected.pop(consumer)
            self._fifo_apply(_time(command), fifo.Suspend(consumer, active), effects, [consumer])
        return dead

    def _forget_gets(self, node: str, dead) -> None:
        """The basic.get answers kept for channels of the node's dead incarnations."""
        for owner in [o for o in self._gets if owner_node(o) == node and dead(owner_incarnation(o))]:
            del self._gets[owner]

    def _retire(self, node: str, incarnation: str) -> None:
        """Every other incarnation of the node that this queue knows of is dead.
        Their commands still in flight (a publisher's resend, say) are refused
        from now on: a forgotten session would take a resent seq for new."""
        known = [owner_incarnation(c[0]) for c in self._consumers_on(node)]
        known += [owner_incarnation(e) for e in self._sessions if owner_node(e) == node]
        retired = self._retired.get(node, [])
        retired = [inc for inc in retired if inc != incarnation]
        retired += [inc for inc in dict.fromkeys(known) if inc != incarnation and inc not in retired]
        if retired:
            self._retired[node] = retired[-RETIRED_MAX:]
        else:
            self._retired.pop(node, None)

    def _is_retired(self, owner: str) -> bool:
        node = owner_node(owner)
        return node is not None and owner_incarnation(owner) in self._retired.get(node, ())

    def _on_node_gone(self, command: list, effects: list) -> list[str]:
        """The node did not come back in time: Down its owners of the incarnations
        it had when suspected (all of them if it never was). A newer incarnation
        that spoke since is left alone: this command may have been proposed
        before the node restarted."""
        node = command[1]
        incarnations = self._suspected_nodes.pop(node, None)
        if incarnations is None:
            owners = self._owners_on(node)
            self._forget_gets(node, lambda inc: True)
        else:
            owners = self._owners_on(node, lambda inc: inc in incarnations)
            self._forget_gets(node, lambda inc: inc in incarnations)
        self._down_owners(command, owners, effects)
        return owners

    # --- snapshots -----------------------------------------------------------------------
    def snapshot(self) -> bytes:
        sessions = [[e, s.next_seq, list(s.held.items())] for e, s in self._sessions.items()]
        seqs = [[list(c), r.last_seq, list(r.checked_out.items())] for c, r in self._seqs.items()]
        suspected = [[list(c), active] for c, active in self._suspected.items()]
        nodes = list(self._suspected_nodes.items())
        retired = list(self._retired.items())
        gets = [[owner, request_id, None if got is None else [got.msg_id, got.payload if type(got.payload) is int
                                                              else list(got.payload), got.redelivered,
                                                              got.message_count, got.delivery_count]]
                for owner, (request_id, got) in self._gets.items()]
        return _pack([SNAPSHOT_VERSION, self.next_msg_id, _fifo_to_wire(self._fifo), sessions, seqs,
                      suspected, nodes, retired, gets])

    @classmethod
    def restore(cls, data: bytes) -> QuorumMachine:
        version, next_msg_id, state, sessions, seqs, suspected, nodes, retired, gets = msgpack.unpackb(data, raw=False)
        assert version == SNAPSHOT_VERSION, f"unknown snapshot version {version}"
        machine = cls()
        machine._fifo = _fifo_from_wire(state)
        machine.next_msg_id = next_msg_id
        for enqueuer, next_seq, held in sessions:
            machine._sessions[enqueuer] = EnqueuerSession(next_seq, {seq: _payload_from_wire(message)
                                                                     for seq, message in held})
        for consumer, last_seq, checked_out in seqs:
            machine._seqs[tuple(consumer)] = ConsumerSeqs(last_seq, {m: s for m, s in checked_out})
        machine._suspected = {tuple(consumer): active for consumer, active in suspected}
        machine._suspected_nodes = {node: incarnations for node, incarnations in nodes}
        machine._retired = {node: incarnations for node, incarnations in retired}
        for owner, request_id, got in gets:
            if got is not None:
                msg_id, payload, redelivered, count, delivery_count = got
                got = fifo.Dequeued(msg_id, payload if type(payload) is int else tuple(payload), redelivered,
                                    count, delivery_count)
            machine._gets[owner] = (request_id, got)
        return machine


class ReleaseCursor:
    """Which snapshot the log may be truncated to (rabbit_fifo's release
    cursor). Messages are references into the log, so a snapshot at index X
    can only replace the log up to X once no message kept refers to an entry
    at or below X. The shell offers the machine every so often; each offer
    takes the state then as a candidate and promotes the newest candidate
    whose index is below every reference still kept. Between a candidate's
    capture and its promotion every message it holds was settled by a
    committed entry after it, so a replica that restores it and re-applies
    the log meets no reference it cannot read except those of messages
    settled further on (whose deliveries the consumers saw already).
    At most `keep` candidates: the oldest (the next to promote) and the
    newest. A message that is never consumed keeps the whole log after it,
    as in RabbitMQ."""

    def __init__(self, keep: int = 2) -> None:
        assert keep >= 2
        self.keep = keep
        self.candidates: deque[tuple[int, bytes]] = deque()

    def offer(self, index: int, machine: QuorumMachine) -> tuple[int, bytes] | None:
        """`machine` has applied through `index`: the (index, snapshot) to
        compact to now, if any."""
        oldest = machine.oldest_ref_index()
        if oldest is None:   # nothing refers to the log: the state now is the snapshot
            self.candidates.clear()
            return index, machine.snapshot()
        promoted = None
        while self.candidates and self.candidates[0][0] < oldest:
            promoted = self.candidates.popleft()
        self.candidates.append((index, machine.snapshot()))
        if len(self.candidates) > self.keep:
            del self.candidates[-2]
        return promoted

    def reset(self) -> None:
        """The machine was replaced (a snapshot installed): its candidates are void."""
        self.candidates.clear()


# The reply to a command from a dead incarnation (nobody is listening for it).
_REFUSED = {ENQUEUE: [], ENQUEUE_BATCH: [], CHECKOUT: fifo.REJECTED, DEQUEUE: None}


def _payload_from_wire(message: list) -> list:
    if type(message[1]) is list:
        message[1] = tuple(message[1])
    return message


def _time(command: list) -> int:
    return command[TIME_FIELD.get(command[0], TIME_FIELD_DEFAULT)]


def _consumer(command: list) -> tuple:
    return (command[1], command[2])


# -- the fifo state on the wire ---------------------------------------------------------
def _fifo_to_wire(state: fifo.FifoState) -> list:
    assert not state.track_removals, "a replicated queue keeps no removal log"
    limits = {f.name: getattr(state.limits, f.name) for f in dataclasses.fields(fifo.QueueLimits)}
    messages = [[msg_id, payload if type(payload) is int else list(payload), size]
                for msg_id, (payload, size) in state.messages.items()]
    consumers = [[list(cid), c.prefetch, c.priority, c.no_ack, list(c.checked_out), c.cancelled, c.suspended,
                  c.in_service, c.ticket] for cid, c in state.consumers.items()]
    return [limits, messages, list(state.delivery_counts.items()), list(state.ready), list(state.returns),
            state.ready_bytes, state.message_bytes, list(state.expiries.items()),
            list(state.message_priorities.items()), state.now_ms, consumers, _service_to_wire(state)]


def _service_to_wire(state: fifo.FifoState) -> list:
    """The service deques without their stale entries (fifo removes entries
    lazily; a stale entry never becomes valid again, so dropping it changes nothing)."""
    service = []
    for priority, waiting in state.service.items():
        live = [list(cid) for cid, consumer, ticket in waiting
                if consumer.in_service and ticket == consumer.ticket and state.consumers.get(cid) is consumer]
        service.append([priority, live])
    in_service = sum(1 for c in state.consumers.values() if c.in_service)
    assert in_service == sum(len(live) for _, live in service), "one service turn per consumer in service"
    return service


def _fifo_from_wire(wire: list) -> fifo.FifoState:
    (limits, messages, counts, ready, returns, ready_bytes, message_bytes, expiries, priorities, now_ms,
     consumers, service) = wire
    state = fifo.FifoState(limits=fifo.QueueLimits(**limits))
    state.messages = {msg_id: (payload if type(payload) is int else tuple(payload), size)
                      for msg_id, payload, size in messages}
    state.delivery_counts = dict(counts)
    state.ready = deque(ready)
    state.returns = list(returns)   # already a heap: kept in the same order
    state.ready_bytes, state.message_bytes, state.now_ms = ready_bytes, message_bytes, now_ms
    state.expiries = dict(expiries)
    state.message_priorities = dict(priorities)
    for cid, prefetch, priority, no_ack, checked_out, cancelled, suspended, in_service, ticket in consumers:
        state.consumers[tuple(cid)] = fifo.ConsumerState(
            prefetch, priority, no_ack, dict.fromkeys(checked_out), cancelled, suspended, in_service, ticket)
    for priority, live in service:
        entries = [(tuple(cid), state.consumers[tuple(cid)]) for cid in live]
        state.service[priority] = deque((cid, consumer, consumer.ticket) for cid, consumer in entries)
    state.priorities = sorted(state.service, reverse=True)
    return state
