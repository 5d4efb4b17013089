"""The replicated state machine of one quorum queue (after RabbitMQ's rabbit_fifo).

Theory of operation. Every replica of the queue's Raft group feeds the same
committed commands, in log order, to its own ``QuorumMachine.apply`` and so
reaches the same state; only the leader performs the effects it returns. The
machine is pure: no I/O, no clock. A command is a record of
broker/queues/queue_commands.py (on the log and the wire in the form of
broker/queues/queue_codec.py); its ``now_ms`` is the proposer's clock, stamped when it
proposed, so replicas agree on time. A queue without a log (a transient one)
is the same machine applied on its node alone, with index None. Time in
the machine never goes back: a command stamped earlier than the last one (a
proposer with a slower clock) runs at the last one's time.

It wraps the queue machine of broker/queues/fifo.py, which applies the same
records (the consumer side) and takes each released message through
``fifo.enqueue``, and adds what replication needs:

* Enqueuer sessions. A publisher (enqueuer) numbers its enqueues 1, 2, 3...
  and resends the unconfirmed ones after a leader change, so the log holds
  duplicates and, when a resend overtakes, gaps. Per enqueuer the machine
  keeps the next expected seq, from 1: a lower seq is a duplicate (confirmed again,
  not enqueued again), a higher one is held (at most ``HOLD_MAX``) until the
  gap is filled. Every applied or duplicate enqueue yields ``Applied``, the
  publisher's confirm.
* Message ids. The machine counts its own ids (``next_msg_id``) rather than
  using the log index, so that held enqueues released by one command get
  distinct ids; ids are never reused.
* Delivery seqs. The fifo numbers each consumer's deliveries 1, 2, 3... and
  keeps the seq of every message still checked out, so that a new leader
  can resend them all (``checked_out_deliveries``) and a consumer that saw a
  gap can ask for the rest (``deliveries_since``); the consuming node drops
  seqs it already saw. Settle/Return/Discard may name a delivery as
  ``[msg_id, seq]`` instead of a bare msg_id (``_select`` resolves them for the
  fifo): a stale resend of a Return then cannot return a later delivery of
  the same message.
* Node failures. Owners (channels) are named ``node/incarnation/rest``.
  NodeDown suspects a node: its consumers keep what they hold but get
  nothing new. NodeUp with the node's incarnation resumes them; owners of an
  older incarnation died with it and are Down (their messages return), its
  publishers' sessions are forgotten, and its late commands (enqueues,
  Checkout, Dequeue still in flight) are refused from then on. A cluster's
  NodeGone returns what the consumers of the incarnations the node had when
  suspected hold, and keeps them suspended for the node's return (as RabbitMQ
  on `noconnection`); an older log's NodeGone, and a dead shard's, Down those
  owners; neither touches a newer incarnation that spoke since.

Snapshots (``snapshot``/``restore``) hold the whole state, payloads included, in a canonical
form: two machines that behave the same give the same bytes, so replicas compare by snapshots.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from warren.broker.queues import fifo, message_table, queue_codec, snapshot_codec
from warren.broker.queues import queue_commands as qc
from warren.broker.queues.queue_commands import Applied, Delivery, Got, Purged, owner_incarnation, owner_node
from warren.protocol import codec

# Out-of-order enqueues held per enqueuer; beyond it they are dropped (the sender resends).
HOLD_MAX = 4096
# Dead incarnations remembered per node, so that their late commands are refused.
RETIRED_MAX = 16
# 3: the message table and other per-message parts as columns of ints (broker/queues/snapshot_codec.py);
# 2 (a list per message) is still restored.
SNAPSHOT_VERSION = 3
# A message reference: index * REF_SLOTS + its position in the entry (an
# EnqueueBatch carries at most REF_SLOTS messages), negated minus one for a
# transient message (delivery_mode != 2): see `ref_location`.
REF_SLOTS = 1 << 16

# Names kept for broker/node/cluster.py (its check of a forwarded command): the positional
# form of an entry, the arity per tag, the tags of liveness statements.
decode = queue_codec.decode_positional
ARITY = queue_codec.ARITY
LIVENESS_OPS = queue_codec.LIVENESS_TAGS


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
    inline (a replica without a log) has no index and counts as earlier."""
    return type(payload) is not int or ref_location(payload)[0] < index


# Body sizes as shared int objects: the fifo keeps one per queued message, and a
# size above 256 would otherwise be an int object of its own (28 bytes) each time.
_SIZES: dict[int, int] = {}
_SIZES_MAX = 4096


def _shared_size(size: int) -> int:
    shared = _SIZES.get(size)
    if shared is not None:
        return shared
    if len(_SIZES) < _SIZES_MAX:
        _SIZES[size] = size
    return size


def _persistent(properties: bytes) -> bool:
    # the channel checked the properties at publish; fewer than 2 bytes: no flags (tests)
    return len(properties) >= 2 and codec.is_persistent(properties)


def entry_messages(command: Any) -> list:
    """The messages of an Enqueue or EnqueueBatch, [exchange, routing_key,
    properties, body, ...] each, by slot: what message references name."""
    if type(command) is qc.EnqueueBatch:
        return command.messages
    assert type(command) is qc.Enqueue, f"a message reference into {type(command).__name__}"
    return [(command.exchange, command.routing_key, command.properties, command.body)]


def message_payload(command: Any, slot: int) -> tuple:
    """(exchange, routing_key, properties, body) of the message at `slot` of an
    Enqueue or EnqueueBatch."""
    return tuple(entry_messages(command)[slot][:4])


# -- the machine -------------------------------------------------------------------------
@dataclass(slots=True)
class EnqueuerSession:
    next_seq: int
    held: dict[int, list] = field(default_factory=dict)   # seq -> [now_ms, payload, size, ttl_ms, priority]


class QuorumMachine:
    def __init__(self, limits: fifo.QueueLimits | None = None) -> None:
        self._fifo = fifo.FifoState(limits=limits if limits is not None else fifo.QueueLimits())
        self.next_msg_id = 1
        self._sessions: dict[str, EnqueuerSession] = {}
        # suspected consumer -> whether its owner wants it active (resumed so on NODE_UP)
        self._suspected: dict[tuple, bool] = {}
        # suspected node -> the incarnations it had when suspected (what NODE_GONE declares dead)
        self._suspected_nodes: dict[str, list[str]] = {}
        # node -> incarnations a NODE_UP declared dead, oldest first (at most RETIRED_MAX)
        self._retired: dict[str, list[str]] = {}
        self._index: int | None = None   # the log index of the command being applied
        # owner -> (its latest basic.get request id, the answer), so a resent one is answered again
        self._gets: dict[str, tuple[int, qc.Dequeued | None]] = {}
        # For `oldest_ref_index`, not state (no snapshot holds them): messages enter the
        # fifo in log order except those released from `held`; their ids are `_late`
        # (None: not known, found by a scan), `_max_ref_index` the highest index enqueued.
        self._late: set[int] | None = set()
        self._max_ref_index = 0

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
        or held out of order) refers to; None when there is none. The fifo's
        first message has the lowest index but for the late ones (`_late`):
        O(late + held), not O(messages), after a restore O(messages) once."""
        messages = self._fifo.messages
        late = self._late if self._late is not None else self._find_late()
        self._late = late = {msg_id for msg_id in late if msg_id in messages}
        first = next(iter(messages.values()), None)
        refs = [fifo.payload_of(self._fifo, msg_id) for msg_id in late]
        if first is not None:
            refs.append(message_table.unpacked(first)[0])
        refs += [m[1] for session in self._sessions.values() for m in session.held.values()]
        indexes = [ref_location(ref)[0] for ref in refs if type(ref) is int]
        return min(indexes) if indexes else None

    def _note_enqueued(self, msg_id: int, payload: Any) -> None:
        """Keep `_late` a superset of the messages with a lower index than one before them."""
        if self._late is None or type(payload) is not int:
            return
        index = ref_location(payload)[0]
        if index < self._max_ref_index:
            self._late.add(msg_id)
        else:
            self._max_ref_index = index

    def _find_late(self) -> set[int]:
        self._late, self._max_ref_index = set(), 0
        for msg_id, held in self._fifo.messages.items():
            self._note_enqueued(msg_id, message_table.unpacked(held)[0])
        return self._late

    def checked_out_deliveries(self) -> list[Delivery]:
        """Every delivery not settled or returned yet, with its original seq:
        what a new leader resends (consumers drop the seqs they saw)."""
        return [delivery for consumer in self._fifo.consumers for delivery in self.deliveries_since(consumer, 0)]

    def checked_out_deliveries_on(self, node: str) -> list[Delivery]:
        """`checked_out_deliveries` of the consumers on `node` only."""
        return [delivery for consumer in self._fifo.consumers if owner_node(consumer[0]) == node
                for delivery in self.deliveries_since(consumer, 0)]

    def deliveries_since(self, consumer, seq: int) -> list[Delivery]:
        """The consumer's deliveries still checked out with a seq above `seq`, in seq order."""
        consumer = tuple(consumer)
        state = self._fifo.consumers.get(consumer)
        if state is None:
            return []
        # seq 0: taken by basic.get, answered by its Got, never resent
        return [self._delivery(consumer, msg_id, s) for msg_id, s in state.checked_out.items() if s > seq]

    def last_seq_of(self, consumer: tuple | list) -> int | None:
        """The highest seq the consumer's deliveries were given (None: no such consumer)."""
        state = self._fifo.consumers.get(tuple(consumer))
        return None if state is None else state.last_seq

    def _delivery(self, consumer: tuple, msg_id: int, seq: int) -> Delivery:
        payload = fifo.payload_of(self._fifo, msg_id)
        count = self._fifo.delivery_counts.get(msg_id, 0)
        return Delivery(consumer, seq, msg_id, payload, count > 0, count)

    # --- applying --------------------------------------------------------------------
    def apply(self, command: Any, index: int | None = None) -> tuple[Any, list]:
        """Apply one committed command (a record of broker/queues/queue_commands.py);
        `index` is its Raft log index. With an index, messages are kept as
        references into the log (see `ref_location`); without one (a replica
        without a log: a transient queue, or unit tests) with their payloads."""
        self._index = index
        effects: list = []
        kind = type(command)
        handler = _APPLY.get(kind)
        if handler is None:
            raise AssertionError(f"malformed command {command!r}")
        if kind in qc.FROM_LIVE_OWNERS and self._is_retired(_owner_of(command)):
            return _REFUSED[kind], effects
        return handler(self, command, effects), effects

    def _on_enqueue_command(self, command: qc.Enqueue, effects: list) -> list[Applied]:
        fields = [command.exchange, command.routing_key, command.properties, command.body, command.ttl_ms,
                  command.priority]
        return self._on_enqueue(command.enqueuer, command.seq, self._held_form(command.now_ms, fields, 0), effects)

    def _on_enqueue_batch(self, command: qc.EnqueueBatch, effects: list) -> list[Applied]:
        """Exactly as the Enqueues it stands for, one after the other."""
        enqueuer, first_seq, now_ms = command.enqueuer, command.first_seq, command.now_ms
        reply: list[Applied] = []
        for slot, fields in enumerate(command.messages):
            reply += self._on_enqueue(enqueuer, first_seq + slot, self._held_form(now_ms, fields, slot), effects)
        return reply

    def _on_cancel(self, command: qc.Cancel, effects: list) -> Any:
        return self._fifo_apply(command, effects, [(command.owner, command.tag)])

    def _on_purge(self, command: qc.Purge, effects: list) -> int:
        count = self._fifo_apply(command, effects)
        effects.append(Purged(command.owner, command.request_id, count))
        return count

    def _on_down(self, command: qc.Down, effects: list) -> int:
        """The channel closed: what it held returns, and as a publisher it is done."""
        returned = self._down_owners(command.now_ms, [command.owner], effects)
        self._sessions.pop(command.owner, None)
        return returned

    def _on_tick(self, command: qc.Tick, effects: list) -> Any:
        return self._fifo_apply(command, effects)

    def _on_drop_transient(self, command: qc.DropTransient, effects: list) -> int:
        return fifo.drop_ready(self._fifo, is_transient)

    def _on_drop_transient_before(self, command: qc.DropTransientBefore, effects: list) -> int:
        before = command.before_index
        return fifo.drop_ready(self._fifo, lambda payload: is_transient(payload) and enqueued_before(payload, before))

    def _fifo_apply(self, command: Any, effects: list, touched=()) -> Any:
        """Apply a consumer-side record to the fifo, then forget the suspicion
        of each touched consumer the fifo removed."""
        reply, fifo_effects = fifo.apply(command, self._fifo)
        effects += fifo_effects
        for consumer in touched:
            if consumer not in self._fifo.consumers:
                self._suspected.pop(consumer, None)
        return reply

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
        return [now_ms, payload, _shared_size(len(body)), ttl_ms, priority]

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
        accepted = fifo.enqueue(self._fifo, self.next_msg_id, now_ms, payload, size, ttl_ms, priority, effects)
        self._note_enqueued(self.next_msg_id, payload)
        self.next_msg_id += 1
        applied = Applied(enqueuer, seq, accepted)
        effects.append(applied)
        return applied

    # --- consumers ---------------------------------------------------------------------
    def _on_checkout(self, command: qc.Checkout, effects: list) -> str:
        consumer = (command.owner, command.tag)
        # A new checkout is a live channel speaking: it starts unsuspected (the
        # failure detector suspects it again if its node is still unreachable).
        self._suspected.pop(consumer, None)
        return self._fifo_apply(command, effects, [consumer])

    def _on_suspend(self, command: qc.Suspend, effects: list) -> str:
        consumer, active = (command.owner, command.tag), command.active
        if consumer in self._suspected:
            # Stays suspended until its node is back; then it takes this state.
            self._suspected[consumer] = active
            return fifo.ACCEPTED
        return self._fifo_apply(command, effects, [consumer])

    def _on_release(self, command: qc.Settle | qc.Return | qc.Discard, effects: list) -> int:
        consumer = (command.owner, command.tag)
        msg_ids = self._select(consumer, list(command.msg_ids))
        bare = type(command)(command.owner, command.tag, command.now_ms, msg_ids)
        return self._fifo_apply(bare, effects, [consumer])

    def _select(self, consumer: tuple, items: list) -> tuple[int, ...]:
        """Bare msg ids pass; [msg_id, seq] only while that delivery is checked out."""
        state = self._fifo.consumers.get(consumer)
        selected = []
        for item in items:
            if isinstance(item, int):
                selected.append(item)
            elif state is not None and item[1] and state.checked_out.get(item[0]) == item[1]:
                selected.append(item[0])
        return tuple(dict.fromkeys(selected))   # an id named twice is released once

    def _on_dequeue(self, command: qc.Dequeue, effects: list) -> qc.Dequeued | None:
        owner, request_id = command.owner, command.request_id
        last = self._gets.get(owner)
        if last is not None and request_id <= last[0]:
            # A resent basic.get (its answer was lost with a leader): the same answer,
            # not a second message. A node numbers its requests upwards.
            effects.append(Got(owner, request_id, last[1]))
            return last[1]
        dequeued = self._fifo_apply(command, effects)
        self._gets[owner] = (request_id, dequeued)
        effects.append(Got(owner, request_id, dequeued))
        return dequeued

    def _down_owners(self, now_ms: int, owners: list, effects: list) -> int:
        returned = 0
        for owner in owners:
            self._gets.pop(owner, None)
            touched = [c for c in self._fifo.consumers if c[0] == owner]
            returned += self._fifo_apply(qc.Down(owner, now_ms), effects, touched)
        return returned

    # --- nodes -----------------------------------------------------------------------------
    def _consumers_on(self, node: str) -> list[tuple]:
        return [c for c in self._fifo.consumers if owner_node(c[0]) == node]

    def _owners_on(self, node: str, keep=lambda incarnation: True) -> list[str]:
        owners = [c[0] for c in self._consumers_on(node) if keep(owner_incarnation(c[0]))]
        return list(dict.fromkeys(owners))

    def _on_node_down(self, command: qc.NodeDown, effects: list) -> list[tuple]:
        """Suspect the node: its consumers keep what they hold and get nothing new."""
        node = command.node
        suspected = [c for c in self._consumers_on(node) if self._suspect(c, command.now_ms, effects)]
        incarnations = set(self._suspected_nodes.get(node, ()))
        incarnations.update(owner_incarnation(c[0]) for c in self._consumers_on(node))
        self._suspected_nodes[node] = sorted(incarnations)
        return suspected

    def _suspect(self, consumer: tuple, now_ms: int, effects: list) -> bool:
        """Suspend a suspected node's consumer, noting if it was active (for NodeUp); False if done already."""
        if consumer in self._suspected:
            return False
        self._suspected[consumer] = not self._fifo.consumers[consumer].suspended
        self._fifo_apply(qc.Suspend(consumer[0], consumer[1], now_ms, False), effects)
        return True

    def _on_node_up(self, command: qc.NodeUp, effects: list) -> list[str]:
        """The node answers as `incarnation`: older incarnations died, so their
        owners are Down (messages return, redelivered); the suspected consumers
        of this incarnation resume."""
        node, incarnation = command.node, command.incarnation
        self._suspected_nodes.pop(node, None)
        self._retire(node, incarnation)
        dead = self._owners_on(node, lambda inc: inc != incarnation)
        self._down_owners(command.now_ms, dead, effects)
        self._forget_gets(node, lambda inc: inc != incarnation)
        for enqueuer in [e for e in self._sessions if owner_node(e) == node and owner_incarnation(e) != incarnation]:
            del self._sessions[enqueuer]
        for consumer in [c for c in self._suspected if owner_node(c[0]) == node]:
            active = self._suspected.pop(consumer)
            self._fifo_apply(qc.Suspend(consumer[0], consumer[1], command.now_ms, active), effects, [consumer])
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

    def _on_node_gone(self, command: qc.NodeGone, effects: list) -> list[str]:
        """The node did not come back in time. A cluster's leader keeps the consumers
        (`_return_from_gone`); otherwise (a dead shard, an older log): Down its owners of the incarnations
        it had when suspected (all of them if it never was). A newer incarnation
        that spoke since is left alone: this command may have been proposed
        before the node restarted."""
        node = command.node
        if command.keep_consumers:
            return self._return_from_gone(node, command.now_ms, effects)
        incarnations = self._suspected_nodes.pop(node, None)
        if incarnations is None:
            owners = self._owners_on(node)
            self._forget_gets(node, lambda inc: True)
        else:
            owners = self._owners_on(node, lambda inc: inc in incarnations)
            self._forget_gets(node, lambda inc: inc in incarnations)
        self._down_owners(command.now_ms, owners, effects)
        return owners

    def _return_from_gone(self, node: str, now_ms: int, effects: list) -> list[str]:
        """As RabbitMQ's consumers on a node it lost its connection to: what the node's
        consumers (of the incarnations suspected) hold goes back to the queue, for others,
        and they stay, suspended, so that a node that comes back with its channels alive
        goes on consuming (NodeUp resumes them; a new incarnation Downs them). Dropping
        them instead left such a channel's consumer registered nowhere: it got nothing,
        for good (warren-chaos seed 23, a partition longer than the gone timeout)."""
        incarnations = self._suspected_nodes.get(node)
        consumers = [c for c in self._consumers_on(node)
                     if incarnations is None or owner_incarnation(c[0]) in incarnations]
        for consumer in consumers:
            self._suspect(consumer, now_ms, effects)
            held = tuple(self._fifo.consumers[consumer].checked_out)
            if held:
                self._fifo_apply(qc.Return(consumer[0], consumer[1], now_ms, held), effects, [consumer])
        if incarnations is None and consumers:
            self._suspected_nodes[node] = sorted({incarnation for c in consumers
                                                  if (incarnation := owner_incarnation(c[0])) is not None})
        fifo.step_aside(self._fifo, [c for c in consumers if c in self._fifo.consumers], effects)
        return list(dict.fromkeys(c[0] for c in consumers))

    # --- snapshots -----------------------------------------------------------------------
    def snapshot(self) -> bytes:
        return self.capture().pack()

    def capture(self) -> snapshot_codec.CapturedSnapshot:
        """The state now, to `pack` into a snapshot now or later: see `CapturedSnapshot`."""
        sessions = [[e, s.next_seq, list(s.held.items())] for e, s in self._sessions.items()]
        seqs = [[list(c), state.last_seq, snapshot_codec.int_map(state.checked_out)]
                for c, state in self._fifo.consumers.items() if state.last_seq]
        suspected = [[list(c), active] for c, active in self._suspected.items()]
        nodes = list(self._suspected_nodes.items())
        retired = list(self._retired.items())
        return snapshot_codec.CapturedSnapshot([SNAPSHOT_VERSION, self.next_msg_id, snapshot_codec.capture(self._fifo),
                                                sessions, seqs, suspected, nodes, retired,
                                                snapshot_codec.gets_to_wire(self._gets)])

    @classmethod
    def restore(cls, data: bytes) -> QuorumMachine:
        version, next_msg_id, state, sessions, seqs, suspected, nodes, retired, gets = msgpack.unpackb(data, raw=False)
        assert version in (2, SNAPSHOT_VERSION), f"unknown snapshot version {version}"
        machine = cls()
        machine._fifo = snapshot_codec.fifo_from_wire(state, version)
        machine._late = None   # found again when first needed
        machine.next_msg_id = next_msg_id
        for enqueuer, next_seq, held in sessions:
            machine._sessions[enqueuer] = EnqueuerSession(next_seq, {seq: _payload_from_wire(message)
                                                                     for seq, message in held})
        for consumer, last_seq, checked_out in seqs:
            by_id = dict(checked_out) if version == 2 else snapshot_codec.int_map_from(checked_out)
            state = machine._fifo.consumers.get(tuple(consumer))
            if state is not None:
                state.last_seq = last_seq
                state.checked_out.update(by_id)   # the same ids, in the same order
        machine._suspected = {tuple(consumer): active for consumer, active in suspected}
        machine._suspected_nodes = {node: incarnations for node, incarnations in nodes}
        machine._retired = {node: incarnations for node, incarnations in retired}
        machine._gets = snapshot_codec.gets_from_wire(gets)
        return machine


# The reply to a command from a dead incarnation (nobody is listening for it).
_REFUSED: dict[type, Any] = {qc.Enqueue: [], qc.EnqueueBatch: [], qc.Checkout: fifo.REJECTED, qc.Dequeue: None}
_APPLY = {
    qc.Enqueue: QuorumMachine._on_enqueue_command, qc.EnqueueBatch: QuorumMachine._on_enqueue_batch,
    qc.Checkout: QuorumMachine._on_checkout, qc.Cancel: QuorumMachine._on_cancel,
    qc.Settle: QuorumMachine._on_release, qc.Return: QuorumMachine._on_release, qc.Discard: QuorumMachine._on_release,
    qc.Suspend: QuorumMachine._on_suspend, qc.Dequeue: QuorumMachine._on_dequeue, qc.Purge: QuorumMachine._on_purge,
    qc.Down: QuorumMachine._on_down, qc.NodeDown: QuorumMachine._on_node_down, qc.NodeUp: QuorumMachine._on_node_up,
    qc.NodeGone: QuorumMachine._on_node_gone, qc.Tick: QuorumMachine._on_tick,
    qc.DropTransient: QuorumMachine._on_drop_transient, qc.DropTransientBefore: QuorumMachine._on_drop_transient_before,
    qc.Stat: lambda machine, command, effects: (machine.ready_count, machine.consumer_count),   # reads only
}
assert set(_APPLY) == set(qc.COMMANDS), "every command has its handler"


def _owner_of(command: Any) -> str:
    return command.enqueuer if type(command) in (qc.Enqueue, qc.EnqueueBatch) else command.owner


def _payload_from_wire(message: list) -> list:
    if type(message[1]) is list:
        message[1] = tuple(message[1])
    return message
