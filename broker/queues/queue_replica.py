"""A queue's replica: its machine, the leader's interpreter of the machine's
effects, and when to snapshot.

Theory of operation. Every member of a queue's Raft group applies the
committed commands to its `QuorumMachine` (broker/queues/quorum_machine.py); only the
leader performs the effects. A transient queue is the same replica without a
log: its one node applies each command as it comes (`apply_now`), its machine
keeps the messages themselves instead of references into a log, and it is
always its own leader.

Effects go where their owner lives: a delivery or an enqueuer's APPLIED to a
consumer or publisher of this node goes to this node's `QueueClient`
(broker/queues/queue_client.py), any other to the owner's node as an application
message (broker/node/cluster.py); a dead-letter goes back into the vhost's routing.

Snapshots (replicated only): when, and to which index the log may be cut,
is broker/queues/queue_snapshots.py's.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from warren.broker.node.node_core import APPLIED, DELIVERIES, RESENT
from warren.broker.queues import queue_codec, queue_snapshots, read_back
from warren.broker.queues import queue_commands as qc
from warren.broker.queues import quorum_machine as qm

if TYPE_CHECKING:
    from warren.broker.queues.queue_client import QueueClient

log = structlog.get_logger("warren.quorum")
LOCAL_NODE = "local"   # the node of a queue without a log that no other node reaches (queue_routes.LocalRoute)


# Owners whose node _is_here remembers (channels come and go: forgotten all at once past this).
_OWNERS_REMEMBERED = 1024
# Deliveries to this node's consumers held in `perform` before they go to the channels.
LOCAL_RUN_MAX = 512
# A run of deliveries to another node's consumer leaves once it holds this many bytes of
# bodies (or LOCAL_RUN_MAX deliveries): the cluster's early frames are as large
# (broker/node/cluster.py), so the peer still gets a window in pieces as it is made.
REMOTE_RUN_BYTES = 64 * 1024


class ReplicaLog(Protocol):
    """A replicated queue's view of its group's Raft log."""

    def entry_data(self, index: int) -> bytes | None: ...

    def compact(self, index: int, snapshot: bytes) -> None: ...

    def read_ahead_later(self, read_ahead: Callable[[], bool]) -> None:
        """Have `read_ahead()` run (until it returns False) while the node waits for its disk."""


def _no_entry(index: int) -> None:
    return None


class QueueReplica:
    def __init__(self, machine: qm.QuorumMachine, node: str, group: str, log_: ReplicaLog | None,
                 client: "QueueClient", send: Callable[[str, list], None],
                 dead_letter: Callable[[str, tuple], None]) -> None:
        self.machine = machine
        self.node = node
        self.group = group
        self.log = log_          # None: a replica without a log (a transient queue)
        self.client = client     # this node's sessions with the queue
        self.send = send         # an application message to another node
        self.dead_letter = dead_letter
        self.applied_since_snapshot = 0
        self.bytes_since_snapshot = 0
        self.truncation = queue_snapshots.ReleaseCursor()
        # payload_of's entries, decoded (broker/queues/read_back.py)
        self.decoded = read_back.DecodedEntries(log_.entry_data if log_ is not None else _no_entry)
        self.reading_back = False   # this turn delivered from entries read back from the log
        self._here_by_owner: dict[Any, bool] = {}   # _is_here's answers, per owner seen lately

    # -- applying ---------------------------------------------------------------------
    def apply_entry(self, index: int, data: bytes, leading: bool, proposed: Any = None) -> tuple[Any, Any]:
        """A committed entry; returns (the command, the reply a leader sends back), the
        command None when it could not be applied (the same on every replica).
        `proposed`: the command itself, when this leader encoded `data` from it
        (queue_routes.ProposedCommands): what decoding `data` would give."""
        try:
            command = proposed if proposed is not None else queue_codec.decode(data)
            reply, effects = self.machine.apply(command, index)
        except Exception:  # noqa: BLE001 -- the same on every replica: skip it, keep the group alive
            log.exception("quorum.bad_command", group=self.group, index=index)
            return None, None
        if type(command) in (qc.EnqueueBatch, qc.Enqueue):
            self.decoded.remember(index, qm.entry_messages(command), len(data))   # the next delivery is likely from it
        if leading and effects:
            self.perform(effects)
        if len(self.decoded.entries) > 1 and not self.machine.state.ready:
            self.decoded.forget_read_back()   # the backlog is delivered: an idle queue holds no entries read back
        # Before a snapshot may compact the log: a basic.get without ack settles its message
        # as it is applied, and its answer read from a log compacted past it lost the message.
        answer = self.wire_reply(reply) if leading else None
        self.applied_since_snapshot += 1
        self.bytes_since_snapshot += len(data)
        if (self.applied_since_snapshot >= queue_snapshots.SNAPSHOT_ENTRIES_MIN
                or self.bytes_since_snapshot >= queue_snapshots.SNAPSHOT_BYTES_MIN
                or self.truncation.candidates):   # below all three, never `due`
            self._maybe_snapshot(index)
        return command, answer

    def apply_now(self, command: Any) -> Any:
        """A replica without a log: apply at once, perform, and return the reply."""
        reply, effects = self.machine.apply(command)
        if effects:
            self.perform(effects)
        return reply if type(reply) is qc.Dequeued else self.wire_reply(reply)   # nothing crosses a wire

    def _maybe_snapshot(self, index: int) -> None:
        state = self.machine.state
        held = len(state.messages)
        if queue_snapshots.due(self.applied_since_snapshot, self.bytes_since_snapshot, held, state.message_bytes,
                               bool(self.truncation.candidates)):
            self.applied_since_snapshot = 0
            self.bytes_since_snapshot = 0
            compactable = self.truncation.offer(index, self.machine)
            if compactable is not None and self.log is not None:
                self.log.compact(*compactable)

    def install_snapshot(self, data: bytes) -> None:
        self.machine = qm.QuorumMachine.restore(data)
        self.applied_since_snapshot = 0
        self.bytes_since_snapshot = 0
        self.truncation.reset()

    # -- the leader's effects -----------------------------------------------------------
    def payload_of(self, payload: Any) -> tuple | None:
        """A message's (exchange, routing_key, properties, body): the machine keeps a
        reference into the Raft log (`qm.ref_location`), read back from the log in
        memory or on disk. None when the entry is gone: only for a message that a
        later committed entry settles (`queue_snapshots.ReleaseCursor`)."""
        if type(payload) is not int:
            return payload
        index, slot = qm.ref_location(payload)
        held = self.decoded.entries.get(index)
        if held is not None:
            if held[2]:
                self.reading_back = True
            return tuple(held[0][slot][:4])
        messages = self.decoded.read(index)
        if messages is None:
            log.warning("quorum.message_gone", group=self.group, index=index)
            return None
        self.reading_back = True
        return tuple(messages[slot][:4])

    def read_ahead(self) -> bool:
        """Decode the entry of the next ready messages not decoded yet; False if none
        (read_back.ReadAhead runs it while the node waits for its disk)."""
        return self.decoded.read_ahead(read_back.upcoming_entries(self.machine.state))

    def _is_here(self, owner: Any) -> bool:
        if self.log is None and self.node == LOCAL_NODE:
            return True   # a single node's queue without a log: every owner is of this node
        here = self._here_by_owner.get(owner)
        if here is None:
            node = qc.owner_node(owner)
            here = node == self.node or node is None
            if len(self._here_by_owner) >= _OWNERS_REMEMBERED:
                self._here_by_owner.clear()
            self._here_by_owner[owner] = here
        return here

    def perform(self, effects: list) -> None:
        applied: list = []
        local_runs: dict[tuple, list] = {}   # this node's consumers: their deliveries, in order
        remote_runs: dict[tuple, list] = {}  # other nodes' consumers: [their deliveries, bytes of bodies]
        held = 0
        local = self.client.local_consumers
        for effect in effects:
            kind = type(effect)
            if kind is qc.Delivery:
                if effect.consumer in local:   # only this node's: no need to parse the owner's node
                    payload = self.payload_of(effect.payload)
                    if payload is not None:
                        run = local_runs.get(effect.consumer)
                        if run is None:   # not setdefault: it would build a list per delivery
                            run = local_runs[effect.consumer] = []
                        run.append((effect.seq, effect.msg_id, payload, effect.redelivered, effect.delivery_count))
                        held += 1
                        if held >= LOCAL_RUN_MAX:   # bounded: an unlimited prefetch may take a whole backlog
                            self._hand_to_consumers(local_runs)
                            held = 0
                else:
                    self._deliver_elsewhere(effect, remote_runs)
            elif kind is qc.Applied:
                applied.append(effect)
            elif kind is qc.DeadLettered:
                payloads = [self.payload_of(p) for p in effect.payloads]
                self.dead_letter(effect.reason, tuple(tuple(p) for p in payloads if p is not None))
        self._hand_to_consumers(local_runs)
        for consumer, (deliveries, _) in remote_runs.items():
            self._send_run(consumer, deliveries)
        if applied:
            self._answer_enqueuers(applied)
        if self.reading_back:   # delivering a backlog read back from the log: the next entries are read ahead
            self.reading_back = False
            if self.log is not None:
                self.log.read_ahead_later(self.read_ahead)

    def _hand_to_consumers(self, local_runs: dict[tuple, list]) -> None:
        """One call per consumer of this node for its deliveries so far: the calls and
        lookups per delivery down to the channel's frames were a large part of a
        backlog drain's CPU."""
        for (owner, tag), deliveries in local_runs.items():
            self.client.on_deliveries(owner, tag, deliveries)
        local_runs.clear()

    def _deliver_elsewhere(self, effect: qc.Delivery, remote_runs: dict[tuple, list]) -> None:
        """Adds a delivery to its consumer's run for the consumer's node: one message per
        run, not per delivery, so neither node handles the group, owner and tag of each
        (and the node there hands the run to its channel in one call)."""
        if self._is_here(effect.consumer[0]):
            return   # gone: its messages return with its cancel or channel close
        payload = self.payload_of(effect.payload)
        if payload is None:
            return
        run = remote_runs.get(effect.consumer)
        if run is None:
            run = remote_runs[effect.consumer] = [[], 0]
        run[0].append((effect.seq, effect.msg_id, payload, effect.redelivered, effect.delivery_count))
        run[1] += len(payload[3])
        if run[1] >= REMOTE_RUN_BYTES or len(run[0]) >= LOCAL_RUN_MAX:
            del remote_runs[effect.consumer]
            self._send_run(effect.consumer, run[0])

    def _send_run(self, consumer: tuple, deliveries: list) -> None:
        owner, tag = consumer
        self.send(qc.owner_node(owner), [DELIVERIES, self.group, owner, tag, deliveries])

    def _answer_enqueuers(self, applied: list) -> None:
        """One APPLIED per run of consecutive seqs of one enqueuer."""
        run: list = []
        for effect in applied + [None]:
            if run and (effect is None or effect.enqueuer != run[0].enqueuer or effect.seq != run[-1].seq + 1):
                enqueuer = run[0].enqueuer
                refused = [a.seq for a in run if not a.accepted]
                if self._is_here(enqueuer):
                    self.client.on_applied(enqueuer, run[0].seq, run[-1].seq, refused)
                else:
                    self.send(qc.owner_node(enqueuer), [APPLIED, self.group, enqueuer, run[0].seq, run[-1].seq,
                                                        refused])
                run = []
            if effect is not None:
                run.append(effect)

    def wire_reply(self, reply: Any) -> Any:
        """A reply the leader can send back in a DONE message (msgpack)."""
        if isinstance(reply, qc.Dequeued):
            payload = self.payload_of(reply.payload)
            if payload is None:
                return None
            return [reply.msg_id, list(payload), reply.redelivered, reply.message_count, reply.delivery_count]
        if reply is None or isinstance(reply, (int, str, bool)):
            return reply
        if type(reply) is tuple:   # a Stat's counts
            return list(reply)
        return None

    def resend_deliveries(self, owner: str, tag: str, after_seq: int) -> None:
        """A consumer's node saw seqs up to `after_seq`: what is still checked out to it
        after that, then (RESENT, behind it on the same link) the highest seq given so
        far, which tells the node that whatever else it missed went back to the queue."""
        deliveries = self.machine.deliveries_since((owner, tag), after_seq)
        self.perform(deliveries)
        horizon = self.machine.last_seq_of((owner, tag))
        if horizon is None or horizon <= after_seq:
            return
        checked_out = [delivery.seq for delivery in deliveries]
        if (owner, tag) in self.client.local_consumers:
            self.client.on_resent(owner, tag, horizon, checked_out)
        elif not self._is_here(owner):
            self.send(qc.owner_node(owner), [RESENT, self.group, owner, tag, horizon, checked_out])

    def resend_checked_out(self, node: str | None = None) -> None:
        """What a previous leader (or a lost link) may not have delivered: all of it again,
        or that of `node`'s consumers (consumers drop the seqs they have seen)."""
        machine = self.machine
        self.perform(machine.checked_out_deliveries() if node is None else machine.checked_out_deliveries_on(node))

    @property
    def bytes_in_memory(self) -> int:
        """Bodies held in memory, for the memory alarm. A replicated machine keeps
        references into the Raft log, whose entries keep their data in memory only
        until applied (and KEEP_RECENT_ENTRIES more, raft/entry_locations.py)."""
        return self.machine.message_bytes if self.log is None else 0
