"""The node in its cluster: Raft groups for metadata and quorum queues, and
the messages nodes exchange beside Raft's own.

Theory of operation (after RabbitMQ's Ra + rabbit_fifo). Every node runs one
`RaftRuntime` (raft/runtime.py) over its WAL and the cluster transport. It
hosts:

* the metadata group `META` over every node of `cluster_nodes` (a single node
  is a cluster of one): quorum queue declarations and deletions always, and
  in a cluster of several nodes also durable exchanges and bindings between
  durable exchanges and quorum queues, so every node routes the same way.
  Each node applies a committed change through the metadata machine
  (broker/node/metadata_machine.py; broker/node/metadata.py performs its effects on
  the node's `VirtualHost` read model and compacts the group's log with the
  machine's snapshot, so a restart installs that snapshot and re-applies the
  entries after it); the channel that asked replies once its node has applied it;
* one group per quorum queue on its members (`broker/queues/quorum.py`).

Commands reach a group's leader wherever they start: `submit` proposes
locally when this node leads, else sends a CMD message to the leader this
node knows of (a non-leader forwards it once more). The leader remembers
which index carries which (origin, token) and answers DONE with the apply's
reply when it applies that index. An origin resends what is still
unanswered when the group's leader changes and every `RESEND_SECONDS`; the
commands tolerate being applied twice (enqueues carry enqueuer sequences
the queue de-duplicates). Publishes use the enqueuer sessions of
broker/queues/quorum.py instead of tokens: the leader answers APPLIED per run of sequences.

Application messages travel on the cluster transport beside Raft frames, as
a dict frame {"a": [message, ...]}: one frame per peer per event-loop turn.
"""
from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack
import structlog

from warren.broker.queues import quorum_machine as qm
from warren.raft.messages import Entry, EntryKind, Role, Snapshot
from warren.raft.runtime import RaftRuntime
from warren.raft.transport import TransportLimits

if TYPE_CHECKING:
    from warren.broker.node.broker import Broker
    from warren.broker.node.metadata import Metadata
    from warren.broker.queues.quorum import QuorumQueue

log = structlog.get_logger("warren.cluster")

META = "meta"
# application message kinds
CMD = 0        # [CMD, group, data, origin, token]
DONE = 1       # [DONE, group, token, result]
DELIVER = 2    # [DELIVER, group, owner, tag, seq, msg_id, exchange, routing_key, properties, body, redelivered, count]
APPLIED = 3    # [APPLIED, group, enqueuer, first_seq, last_seq, [refused seqs]]
RESEND = 4     # [RESEND, group, owner, tag, after_seq]: a consumer's node lost deliveries
HELLO = 5      # [HELLO, incarnation]: sent to a peer whenever its link comes up
METADATA_APPLIED = 6   # [METADATA_APPLIED, index]: how far the sender applied the metadata group

STARTUP_APPLY_SECONDS = 10.0
STARTUP_LINKS_SECONDS = 2.0
RESEND_SECONDS = 1.0
APP_FRAME_MESSAGES_MAX = 4096


def forwardable_op(data: Any) -> int | None:
    """The opcode of a queue command a peer may forward: a msgpack list with a known
    opcode and arity, and not a liveness command (a node's up/down/gone is stated by
    the current leader's own view only, never forwarded: issue 9, item 5). None if not."""
    try:
        command = qm.decode(data)
    except Exception:  # noqa: BLE001 -- anything undecodable is simply not well formed
        return None
    op = command[0]
    if not isinstance(op, int) or qm.ARITY.get(op) != len(command) or op in qm.LIVENESS_OPS:
        return None
    return op


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


@dataclass(slots=True)
class Pending:
    group: str
    data: bytes
    callback: Callable[[Any], None] | None
    sent_at: float
    sent_to: str | None = None   # the leader it was last sent to (None: no leader was known)


class NodeRuntime(RaftRuntime):
    """The Raft runtime, with application frames and peer events routed to the cluster."""

    def __init__(self, cluster: "Cluster", *args: Any, **kwargs: Any) -> None:
        self.cluster = cluster
        super().__init__(*args, **kwargs)

    def on_frame(self, peer: str, frame: Any) -> None:
        if isinstance(frame, dict):
            if not self.stopped and self.failed is None:
                self.cluster.on_app_frame(peer, frame)
            return
        super().on_frame(peer, frame)

    def on_peer_up(self, peer: str) -> None:
        super().on_peer_up(peer)
        if not self.stopped:
            self.cluster.on_peer_up(peer)

    def on_peer_down(self, peer: str) -> None:
        super().on_peer_down(peer)
        if not self.stopped:
            self.cluster.on_peer_down(peer)


class Cluster:
    def __init__(self, broker: "Broker") -> None:
        settings = broker.settings
        self.broker = broker
        self.settings = settings
        self.node = settings.node_name
        # Owners and enqueuers carry it: a restarted node's old sessions are told apart.
        self.incarnation = secrets.token_hex(4)
        self.nodes = sorted({n.name for n in settings.cluster_nodes} | {self.node})
        self.multi_node = len(self.nodes) > 1
        limits = TransportLimits.from_settings(settings)
        self.runtime = NodeRuntime(self, settings, broker.node_log.committer, self.apply,
                                   install_snapshot=self.install_snapshot, on_role_change=self.on_role_change,
                                   transport_limits=limits, vital_groups=frozenset({META}))
        self.queues: dict[str, "QuorumQueue"] = {}         # every quorum queue known here, by group id
        self.pending: dict[int, Pending] = {}
        self.tokens = itertools.count(1)
        # group -> index -> (origin node, token): what the leader answers when it applies
        self.awaiting_apply: dict[str, dict[int, tuple[str, int]]] = {}
        self.outbox: dict[str, list] = {}
        self._flush_scheduled = False
        self.peer_incarnations: dict[str, str] = {}
        self.down_since: dict[str, float] = {}
        self.metadata: "Metadata | None" = None   # set by Metadata, which applies the group's entries
        self._meta_applied_noted = False
        self._resend_task: asyncio.Task | None = None
        # queue groups' snapshots recovered before the metadata entry declaring the queue is re-applied
        self.early_snapshots: dict[str, Snapshot] = {}

    # -- lifecycle -------------------------------------------------------------
    async def start(self) -> None:
        """After the node's recovery: host the groups, apply what they committed."""
        await self.runtime.start()   # installs the metadata snapshot: the read model and its queues
        if META not in self.runtime.groups:
            self.runtime.add_group(META, self.nodes)
        # On an empty metadata log the config's definitions are the first entry proposed (`catch_up`).
        seed = self.metadata.seed_if_empty()
        # Re-apply the recovered committed entries now, before clients connect.
        self.runtime.on_turn()
        await self._settle_solo_groups()
        for peer in self.nodes:
            if peer != self.node:
                self.down_since[peer] = time.monotonic()
        self._resend_task = asyncio.create_task(self._resend_forever())
        # Clients connect once this node knows what was declared while it was away.
        waiting = self.settings.cluster_startup_catch_up_seconds
        if (self.multi_node or seed is not None) and not await self.metadata.catch_up(waiting, seed):
            log.warning("cluster.metadata_not_caught_up", waited_seconds=waiting)
        if self.multi_node:
            await self._await_links(STARTUP_LINKS_SECONDS)

    async def _await_links(self, seconds: float) -> None:
        """Before clients connect, let the links to the running nodes come up: a node
        answers a declaration once every node it is linked to applied it, so a peer
        that has not seen this one yet would answer without it (and a publish
        through this node could miss the new queue). A peer that is down does not
        answer its dial; after `seconds` the port opens without it."""
        deadline = time.monotonic() + seconds
        while len(self.running_peers()) < len(self.nodes) - 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)   # the transport dials and handshakes meanwhile

    async def _settle_solo_groups(self) -> None:
        """Groups whose only voter is this node (a single node's queues, classic
        queues in a cluster) lead themselves at once and apply their whole log
        before clients connect, so a declare after a restart counts every
        message (the commit index on disk may lag the log a little). Bounded:
        a node that cannot write goes on after STARTUP_APPLY_SECONDS."""
        runtime = self.runtime
        targets = {}
        for group in list(runtime.groups):
            configuration = runtime.configuration(group)
            if configuration is not None and configuration[0] == (self.node,):
                targets[group] = runtime.status(group).last_index
                runtime.campaign(group)
        deadline = time.monotonic() + STARTUP_APPLY_SECONDS
        while time.monotonic() < deadline and runtime.failed is None:
            if all((runtime.applied_index(group) or 0) >= last for group, last in targets.items()):
                return
            await asyncio.sleep(0.005)   # the groups' turns and WAL batches run meanwhile
        log.warning("cluster.solo_groups_not_applied", groups=len(targets))

    async def stop(self) -> None:
        if self._resend_task is not None:
            self._resend_task.cancel()
        await self.runtime.stop()

    # -- submitting commands -----------------------------------------------------
    def submit(self, group: str, data: bytes, callback: Callable[[Any], None] | None = None) -> None:
        """Have `data` applied by `group`; `callback(reply)` on this node once the
        leader has applied it (never, if it is lost for good)."""
        token = next(self.tokens)
        pending = self.pending[token] = Pending(group, data, callback, time.monotonic())
        pending.sent_to = self.send_command(group, data, token)

    def send_command(self, group: str, data: bytes, token: int = 0) -> str | None:
        """Send to the leader this node knows of; returns it (None: none known, not sent)."""
        leader = self.leader_hint(group)
        if leader == self.node:
            self.propose(group, data, self.node, token)
        elif leader is not None:
            self.app_send(leader, [CMD, group, data, self.node, token])
        return leader

    def propose(self, group: str, data: bytes, origin: str, token: int) -> None:
        index = self.runtime.propose(group, data)
        if index is None:
            leader = self.local_leader(group)
            if leader is not None and leader not in (self.node, origin):
                self.app_send(leader, [CMD, group, data, origin, token])
            return  # else dropped: the origin resends
        if token:
            self.awaiting_apply.setdefault(group, {})[index] = (origin, token)

    def local_leader(self, group: str) -> str | None:
        """The leader as this node's replica knows it (None: not hosted, or no leader)."""
        system = self.runtime.system
        hosted = system.groups.get(group) if system is not None else None
        return hosted.raft.leader_id if hosted is not None else None

    def leader_hint(self, group: str) -> str | None:
        if group in self.runtime.groups:
            return self.local_leader(group)
        queue = self.queues.get(group)
        if queue is None:
            return None
        if queue.leader_hint is None or queue.leader_hint in self.down_since:
            # Not a member here: ask a live member (it forwards to the leader it knows).
            live = [member for member in queue.members if member not in self.down_since]
            queue.leader_hint = live[0] if live else queue.leader_hint
        return queue.leader_hint

    def resend(self, group: str | None = None) -> None:
        """Send unanswered commands again: all of them after `RESEND_SECONDS`
        without an answer, or those of `group` that went elsewhere than its leader now."""
        now = time.monotonic()
        leader = self.leader_hint(group) if group is not None else None
        for token, pending in list(self.pending.items()):
            if pending.group != META and pending.group not in self.queues:
                del self.pending[token]   # the queue was deleted: nobody will answer, so answer None here
                if pending.callback is not None:
                    pending.callback(None)
                continue
            if group is None and now - pending.sent_at < RESEND_SECONDS:
                continue
            if group is not None and (pending.group != group or pending.sent_to == leader):
                continue
            pending.sent_at = now
            pending.sent_to = self.send_command(pending.group, pending.data, token)
        for queue in self.queues.values():
            if group is None or queue.group == group:
                queue.resend_enqueues(now, leader_changed=group is not None)

    async def _resend_forever(self) -> None:
        while True:
            await asyncio.sleep(RESEND_SECONDS / 2)
            try:
                self.resend()
                self.check_gone_nodes()
                self.metadata.release_answers()   # a wait for a lagging node is bounded
            except Exception:  # noqa: BLE001 -- housekeeping must go on; the bug is logged
                log.exception("cluster.resend_failed")

    def on_done(self, token: int, result: Any) -> None:
        pending = self.pending.pop(token, None)
        if pending is not None and pending.callback is not None:
            pending.callback(result)

    # -- applying committed entries ------------------------------------------------
    def apply(self, group: Any, entry: Entry) -> None:
        result = None
        if entry.kind == EntryKind.NORMAL:
            if group == META:
                result = self.apply_meta(entry)
            else:
                queue = self.queues.get(group)
                if queue is not None:
                    result = queue.apply_entry(entry, self.is_leader(group))
        waiting = self.awaiting_apply.get(group)
        if waiting:
            answer = waiting.pop(entry.index, None)
            if answer is not None:
                origin, token = answer
                self.reply_done(origin, group, token, result)

    def apply_meta(self, entry: Entry) -> Any:
        result = self.metadata.apply(entry)
        if not self._meta_applied_noted:
            self._meta_applied_noted = True   # once per turn, with the turn's last index
            asyncio.get_running_loop().call_soon(self._note_meta_applied)
        return result

    def _note_meta_applied(self) -> None:
        self._meta_applied_noted = False
        self.metadata.on_applied_here(self.metadata.applied_index)

    def running_peers(self) -> list[str]:
        """The other nodes whose link is up."""
        return [peer for peer in self.nodes if peer != self.node and peer not in self.down_since]

    def reply_done(self, origin: str, group: str, token: int, result: Any) -> None:
        if origin == self.node:
            self.on_done(token, result)
        else:
            self.app_send(origin, [DONE, group, token, result])

    def install_snapshot(self, group: Any, snapshot: Snapshot) -> None:
        if group == META:
            self.metadata.install_snapshot(snapshot)
            return
        queue = self.queues.get(group)
        if queue is not None:
            queue.install_snapshot(snapshot)
        else:   # at start, a queue declared after the metadata snapshot: its entry is re-applied later
            self.early_snapshots[group] = snapshot

    def queue_known(self, queue: "QuorumQueue") -> None:
        """A queue the metadata group made here: its replica's state if this node hosts its group."""
        self.queues[queue.group] = queue
        if queue.machine is None and queue.group in self.runtime.groups:
            # removed from the queue's members but not yet released when this node stopped
            queue.machine = qm.QuorumMachine(queue.state.limits)
            queue.state = queue.machine.state
        snapshot = self.early_snapshots.pop(queue.group, None)
        if snapshot is not None:
            queue.install_snapshot(snapshot)

    def is_leader(self, group: str) -> bool:
        return self.local_leader(group) == self.node

    def on_role_change(self, group: Any, role: Role, leader_id: str | None, term: int) -> None:
        if role != Role.LEADER:
            self.awaiting_apply.pop(group, None)
        queue = self.queues.get(group)
        if queue is not None:
            queue.on_leader_change(leader_id, role == Role.LEADER)
        if leader_id is not None:
            self.resend(group)

    # -- application messages ------------------------------------------------------
    def app_send(self, peer: str, message: list) -> None:
        self.outbox.setdefault(peer, []).append(message)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        outbox, self.outbox = self.outbox, {}
        transport = self.runtime.transport
        for peer, messages in outbox.items():
            for start in range(0, len(messages), APP_FRAME_MESSAGES_MAX):
                if transport is None or not transport.send(peer, {"a": messages[start:start + APP_FRAME_MESSAGES_MAX]}):
                    self.runtime.frames_dropped += 1

    def on_app_frame(self, peer: str, frame: dict) -> None:
        for message in frame.get("a", ()):
            try:
                self.on_app_message(peer, message)
            except (TypeError, ValueError, IndexError, KeyError):
                log.warning("cluster.bad_message", peer=peer, kind=message[0] if message else None)

    def on_app_message(self, peer: str, message: list) -> None:
        kind = message[0]
        if kind == CMD:
            _, group, data, origin, token = message
            if group != META and forwardable_op(data) is None:
                log.warning("cluster.bad_command", peer=peer, group=group)
                return
            self.propose(group, data, origin, token)
        elif kind == DONE:
            self.on_done(message[2], message[3])
        elif kind == DELIVER:
            queue = self.queues.get(message[1])
            if queue is not None:
                queue.leader_hint = peer
                queue.on_remote_delivery(message)
        elif kind == APPLIED:
            queue = self.queues.get(message[1])
            if queue is not None:
                queue.leader_hint = peer
                queue.on_applied(message[2], message[3], message[4], message[5])
        elif kind == RESEND:
            queue = self.queues.get(message[1])
            if queue is not None and self.is_leader(queue.group):
                queue.resend_deliveries(message[2], message[3], message[4])
        elif kind == METADATA_APPLIED:
            self.metadata.on_peer_applied(peer, message[1])
        elif kind == HELLO:
            self.peer_incarnations[peer] = message[1]
            for queue in self.queues.values():
                queue.on_node_up(peer, message[1])

    # -- nodes coming and going ------------------------------------------------------
    def on_peer_up(self, peer: str) -> None:
        self.broker.peer_up(peer)
        self.down_since.pop(peer, None)
        self.app_send(peer, [HELLO, self.incarnation])
        self.metadata.on_peer_up(peer)
        for queue in self.queues.values():
            queue.on_link_up(peer)

    def on_peer_down(self, peer: str) -> None:
        self.broker.peer_down(peer)
        self.down_since.setdefault(peer, time.monotonic())
        self.metadata.on_peer_down(peer)
        for queue in self.queues.values():
            queue.on_node_down(peer)

    def check_gone_nodes(self) -> None:
        limit = self.settings.cluster_node_gone_seconds
        now = time.monotonic()
        for peer, since in list(self.down_since.items()):
            if now - since >= limit:
                for queue in self.queues.values():
                    queue.on_node_gone(peer)

    @property
    def enqueues_pending(self) -> int:
        """Publishes of this node's channels that no quorum queue has applied yet."""
        return sum(len(session.pending) for queue in self.queues.values() for session in queue.enqueuers.values())

    def owner_key(self, owner: Any) -> str:
        """A channel's name in queue state: node/incarnation/connection/channel."""
        return f"{self.node}/{self.incarnation}/{owner[0]}/{owner[1]}"

    # -- placement ---------------------------------------------------------------------
    def place_members(self, size: int | None) -> list[str]:
        """The declaring node plus the next ones (sorted, wrapping), `size` in all."""
        wanted = min(size or self.settings.quorum_cluster_size, len(self.nodes))
        start = self.nodes.index(self.node)
        return [self.nodes[(start + i) % len(self.nodes)] for i in range(wanted)]

    def status(self) -> dict:
        metrics = self.runtime.metrics() if self.runtime.system is not None else {}
        return {"node": self.node, "nodes": self.nodes, "incarnation": self.incarnation, "raft": metrics}
