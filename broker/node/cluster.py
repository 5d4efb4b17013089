"""The node in its cluster: the asyncio shell around the node's pure core.

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
  entries after it); the channel that asked replies once its node, and every
  running node, has applied it (broker/node/metadata_answers.py);
* one group per quorum queue on its members (`broker/queues/quorum.py`).

What the node decides beside Raft (forwarding commands to a group's leader,
resends, answers, nodes up/down/gone, timers) is the pure `NodeCore`
(broker/node/node_core.py). This shell feeds it the application messages
of the peers' frames and the link events, the runtime's applies and leader changes, and the
time at every Raft tick; it runs in the runtime's one turn (raft/turns.py):
at the end of the turn the core's messages for each peer go in ONE frame
with the turn's Raft messages for it (raft/frames.py: one encode, one send
per peer), and input that arrives between turns asks for a turn.
"""
from __future__ import annotations

import asyncio
import random
import secrets
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from warren.broker.node.metadata_fence import GAP_SECONDS, MetadataFence, fenced_by_seconds
from warren.broker.node.node_core import (  # noqa: F401 -- the message kinds and constants, re-exported for the queue shell
    APPLIED,
    CMD,
    DELIVERIES,
    DONE,
    HELLO,
    META,
    METADATA_APPLIED,
    RESEND,
    RESEND_SECONDS,
    NodeCore,
    forwardable_op,
    unpack,
)
from warren.broker.node.shard_link import FRAME_KEY as SHARD_PART
from warren.broker.queues import quorum_machine as qm
from warren.broker.queues.queue_factory import place_members
from warren.broker.queues.read_back import ReadAhead
from warren.raft.frames import HOST as HOST_PART
from warren.raft.member_ids import node_of
from warren.raft.messages import Entry, EntryKind, Role, Snapshot
from warren.raft.runtime import RaftRuntime
from warren.raft.transport import TransportLimits

if TYPE_CHECKING:
    from warren.broker.node.broker import Broker
    from warren.broker.node.metadata import Metadata
    from warren.broker.node.metadata_commands import SeedDefinitions
    from warren.broker.queues.quorum import QuorumQueue

log = structlog.get_logger("warren.cluster")
REFUSALS_LOGGED_EVERY_SECONDS = 10.0

STARTUP_APPLY_SECONDS = 10.0
STARTUP_LINKS_SECONDS = 2.0
# A turn's deliveries to a peer leave in frames of this size as they are made (_maybe_early_frame).
EARLY_FRAME_BYTES = 64 * 1024
DELIVERY_OVERHEAD_BYTES = 48   # a delivery's fields in a run beside its body, roughly, in msgpack


def run_bytes(deliveries: list) -> int:
    """A DELIVERIES run's size on the link, roughly: its bodies and the fields beside each."""
    return sum(len(delivery[2][3]) for delivery in deliveries) + DELIVERY_OVERHEAD_BYTES * len(deliveries)


class NodeRuntime(RaftRuntime):
    """The Raft runtime, with application frames, peer events and ticks routed to the cluster."""

    def __init__(self, cluster: "Cluster", *args: Any, **kwargs: Any) -> None:
        self.cluster = cluster
        super().__init__(*args, **kwargs)
        self.take_host_parts = cluster.host_parts
        self.on_host_frame = cluster.on_app_frame

    def on_peer_up(self, peer: str) -> None:
        super().on_peer_up(peer)
        if not self.stopped:
            self.cluster.on_peer_up(peer)

    def on_peer_down(self, peer: str) -> None:
        super().on_peer_down(peer)
        if not self.stopped:
            self.cluster.on_peer_down(peer)

    def on_tick(self) -> None:
        super().on_tick()
        if not self.halted():
            self.cluster.on_tick()


class RuntimePort:
    """The runtime as the core's `RaftPort`."""

    def __init__(self, runtime: RaftRuntime) -> None:
        self.runtime = runtime

    def propose(self, group: str, data: bytes) -> int | None:
        return self.runtime.propose(group, data)

    def leader_of(self, group: str) -> str | None:
        system = self.runtime.system
        return system.leader_id(group) if system is not None and group in system.groups else None

    def hosts(self, group: str) -> bool:
        return group in self.runtime.groups

    def campaign(self, group: str) -> bool:
        return self.runtime.campaign(group)


class Cluster:
    def __init__(self, broker: "Broker", rng: random.Random | None = None, incarnation: str | None = None) -> None:
        """`rng` and `incarnation` are drawn here unless given (a seeded simulation gives them)."""
        settings = broker.settings
        self.broker = broker
        self.settings = settings
        self.node = settings.node_name
        limits = TransportLimits.from_settings(settings)
        self.runtime = NodeRuntime(self, settings, broker.node_log.committer, self.apply, rng,
                                   install_snapshot=self.install_snapshot, on_role_change=self.on_role_change,
                                   transport_limits=limits, vital_groups=frozenset({META}),
                                   admits_replicated=self.admits_replicated)
        self.refusal_logged_at = -REFUSALS_LOGGED_EVERY_SECONDS
        # queues reading a backlog back from the log read ahead while the WAL writer works
        self.read_ahead = ReadAhead(lambda callback: self.runtime.turns.loop.call_soon(callback))
        broker.node_log.committer.subscribe(self.read_ahead.on_written, on_writing=self.read_ahead.on_writing)
        nodes = {n.name for n in settings.cluster_nodes} | {self.node}
        self.core = NodeCore(self.node, incarnation or secrets.token_hex(4), nodes, RuntimePort(self.runtime),
                             settings.cluster_node_gone_seconds, time.monotonic(),
                             broker_housekeeping_seconds=settings.alarm_check_interval_seconds,
                             answer_grace_seconds=fenced_by_seconds(settings.cluster_heartbeat_seconds))
        self.incarnation = self.core.incarnation
        self.nodes = self.core.nodes
        self.multi_node = len(self.nodes) > 1
        # held up while this node may have been counted down by the others (metadata_fence.py)
        self.fence = MetadataFence(min(GAP_SECONDS, settings.cluster_heartbeat_seconds)) if self.multi_node else None
        self._fence_waiters: list[Callable[[], None]] = []
        self.metadata: "Metadata | None" = None   # set by Metadata, which applies the group's entries
        # queue groups' snapshots and committed entries recovered before the metadata entry
        # declaring the queue is re-applied: the replica takes them when the queue is made
        self.early_snapshots: dict[str, Snapshot] = {}
        self.early_frame_bytes: dict[str, int] = {}   # peer -> bodies of deliveries held for it this turn
        self.early_entries: dict[str, list[Entry]] = {}

    # the core's state that the queue shell reads
    @property
    def queues(self) -> dict[str, "QuorumQueue"]:
        return self.core.queues   # type: ignore[return-value]

    @property
    def down_since(self) -> dict[str, float]:
        return self.core.down_since

    @property
    def peer_incarnations(self) -> dict[str, str]:
        return self.core.peer_incarnations

    # -- lifecycle -------------------------------------------------------------
    async def start(self) -> None:
        """After the node's recovery: host the groups, apply what they committed."""
        await self.runtime.start()   # installs the metadata snapshot: the read model and its queues
        seed = self.host_groups()
        await self._settle_solo_groups()
        # Clients connect once this node knows what was declared while it was away.
        if self.multi_node or seed is not None:
            await self._catch_up(seed)
        if self.multi_node and await self._await_links(STARTUP_LINKS_SECONDS):
            # A declaration a peer answered before it counted this node running did not wait for
            # it, and may have committed after the first barrier: a second one takes it in.
            await self._catch_up()

    async def _catch_up(self, barrier: "SeedDefinitions | None" = None) -> None:
        waiting = self.settings.cluster_startup_catch_up_seconds
        if not await self.metadata.catch_up(waiting, barrier):
            log.warning("cluster.metadata_not_caught_up", waited_seconds=waiting)

    def host_groups(self) -> "SeedDefinitions | None":
        """The runtime started (the metadata snapshot installed): the metadata group
        hosted, the recovered committed entries re-applied. On an empty metadata log
        the config's definitions are returned, to propose as its first entry (`catch_up`)."""
        self.core.meta_applied_index = self.metadata.applied_index
        if META not in self.runtime.groups:
            self.runtime.add_group(META, self.nodes)
        seed = self.metadata.seed_if_empty()
        # Re-apply the recovered committed entries now, before clients connect: a turn
        # applies 4 MiB of them at most (raft/log.py), so turns until none is left, or
        # until a turn applies none (one waits for its write: the loop goes on with it).
        # `turn_now`: a turn each pass requests drops, not left scheduled for later.
        system = self.runtime.system
        applied, committed = system.applied_total()
        while True:
            self.runtime.turn_now()
            before, (applied, committed) = applied, system.applied_total()
            if applied >= committed or applied == before:
                return seed

    async def _await_links(self, seconds: float) -> bool:
        """Before clients connect, let the links to the running nodes come up and each
        peer greet this node: a node answers a declaration once every node it counts
        running applied it, so a peer that has not counted this one yet would answer
        without it (and a publish through this node could miss the new queue). A
        peer's HELLO comes from its `peer_up`, so once it is here the peer counts this
        node. A peer that is down does not answer its dial; after `seconds` the port
        opens without it. True if any peer greeted this node."""
        deadline = time.monotonic() + seconds
        while len(self.core.greeting_peers()) < len(self.nodes) - 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)   # the transport dials and handshakes meanwhile
        return bool(self.core.greeting_peers())

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
            if configuration is not None and tuple(map(node_of, configuration[0])) == (self.node,):
                targets[group] = runtime.status(group).last_index
                runtime.campaign(group)
        deadline = time.monotonic() + STARTUP_APPLY_SECONDS
        while time.monotonic() < deadline and runtime.failed is None:
            if all((runtime.applied_index(group) or 0) >= last for group, last in targets.items()):
                return
            await asyncio.sleep(0.005)   # the groups' turns and WAL batches run meanwhile
        log.warning("cluster.solo_groups_not_applied", groups=len(targets))

    async def stop(self) -> None:
        await self.runtime.stop()

    # -- the core's turn ---------------------------------------------------------------
    def _input(self) -> NodeCore:
        """The core, its clock set, before an input."""
        self.core.now = time.monotonic()
        return self.core

    def after_input(self) -> None:
        """After an input: the core's messages go at the end of this turn, or of one asked for now;
        publishers are blocked or unblocked if the resources in alarm anywhere changed."""
        if self.core.alarms.changed:
            self.broker.on_cluster_alarms(self.core.alarms)
        if self.core.has_output:
            self.frame_soon()

    def set_local_alarms(self, resources: list[str]) -> None:
        """This node's own resource alarms changed (Broker.check_alarms): the peers hear."""
        self._input().set_local_alarms(resources)
        self.after_input()

    def frame_soon(self) -> None:
        """Messages are waiting for the turn's frame: the end of this turn, or of one asked for now."""
        if self.runtime.turns.in_turn:
            return
        if self.runtime.halted() or self.runtime.turns.loop is None:
            self.runtime.end_turn()
        else:
            self.runtime.request_turn()

    def host_parts(self) -> dict[str, dict[str, list]]:
        """The end of the runtime's turn: the core's messages and the shard link's, per peer,
        to go with Raft's in one frame per peer (raft/frames.py)."""
        self.early_frame_bytes.clear()
        parts = {HOST_PART: self._input().end_turn()}
        link = self.broker.shard_link
        if link is not None and link.outbox:
            parts[SHARD_PART] = link.take_outbox()
        return parts

    def on_tick(self) -> None:
        now = time.monotonic()
        if self.fence is not None:
            self.fence.saw_time(now)
            if self.broker.connections:   # lowered before its clients' next publish; none (the simulation's): counted
                self._start_fence_barrier()
        self._input().tick(now)
        late = self.core.answers.late
        while late:
            index, lagging = late.pop()
            log.warning("metadata.change_not_applied_everywhere", index=index, lagging=lagging)
        if self.core.take_broker_housekeeping():
            self.broker_housekeeping()
        self.after_input()

    def broker_housekeeping(self) -> None:
        """Resource alarms, message TTL and x-expires, consumer timeouts: due on the core's clock."""
        try:
            self.broker.check_alarms()
            self.broker.tick_queues()
            self.broker.check_consumer_timeouts()
        except Exception:  # noqa: BLE001 -- housekeeping must go on; the bug is logged
            log.exception("broker.housekeeping_failed")

    # -- submitting commands -----------------------------------------------------
    def submit(self, group: str, data: bytes, callback: Callable[[Any], None] | None = None) -> None:
        """Have `data` applied by `group`; `callback(reply)` on this node once the
        leader has applied it (never, if it is lost for good)."""
        self._input().submit(group, data, callback)
        self.after_input()

    def submit_down(self, group: str, owner_key: str, data: bytes) -> None:
        """A channel's DOWN: its unanswered commands to `group` are not resent after it."""
        self._input().submit_down(group, owner_key, data)
        self.after_input()

    def send_command(self, group: str, data: bytes, token: int = 0) -> str | None:
        """Send to the leader this node knows of; returns it (None: none known, not sent)."""
        leader = self._input().send_command(group, data, token)
        self.after_input()
        return leader

    def local_leader(self, group: str) -> str | None:
        """The leader as this node's replica knows it (None: not hosted, or no leader)."""
        return self.core.raft.leader_of(group)

    def leader_hint(self, group: str) -> str | None:
        return self.core.leader_hint(group)

    def is_leader(self, group: str) -> bool:
        return self.core.is_leader(group)

    def app_send(self, peer: str, message: list) -> None:
        self.core.send(peer, message)
        if message[0] == DELIVERIES and self.runtime.turns.in_turn:
            self._maybe_early_frame(peer, run_bytes(message[4]))
        self.after_input()

    def _maybe_early_frame(self, peer: str, size: int) -> None:
        """A turn that delivers a consumer's window to another node sends it in frames of
        EARLY_FRAME_BYTES as it is made, not all at the turn's end: the peer hands the
        first deliveries to its client while this turn makes the rest (as
        AMQPConnection.write does for a local consumer), so the window's acks come back
        spread out instead of as one wave."""
        held = self.early_frame_bytes.get(peer, 0) + size
        if held < EARLY_FRAME_BYTES:
            self.early_frame_bytes[peer] = held
            return
        self.early_frame_bytes.pop(peer, None)
        messages = self.core.take_messages_for(peer)
        if messages:
            self.runtime.send_frame(peer, {HOST_PART: messages}, now=True)

    def running_peers(self) -> list[str]:
        """The other nodes whose link is up."""
        return self.core.running_peers()

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
                elif group in self.runtime.groups:
                    # At start a queue group may apply before the metadata group re-applies
                    # its declaration (after the metadata snapshot): applied when it is made.
                    self.early_entries.setdefault(group, []).append(entry)
        self._input().on_applied(group, entry.index, result)

    def apply_meta(self, entry: Entry) -> Any:
        result = self.metadata.apply(entry)
        self.core.on_meta_applied(entry.index)
        return result

    def admits_replicated(self, group: Any, size: int, kind: str) -> bool:
        """Whether what a leader replicates here is taken in: while the disk has room for it
        (broker/node/disk_watch.py); the metadata group's always (small, and the cluster's own).
        Refusals are logged once every REFUSALS_LOGGED_EVERY_SECONDS, with their count."""
        if group == META or self.broker.disk_watch.admits_replicated(size, kind):
            return True
        now = time.monotonic()
        if now - self.refusal_logged_at >= REFUSALS_LOGGED_EVERY_SECONDS:
            # the system counts each refusal once this returns: this one is not counted yet
            refused = self.runtime.system.counters.messages_refused + 1
            log.warning("raft.replication_refused", node=self.node, refused=refused,
                        bytes=size, kind=kind, free=self.broker.disk_watch.free_at_look,
                        detail="no room on the disk for what the leaders replicate: they send it again later")
            self.refusal_logged_at = now
        return False

    def install_snapshot(self, group: Any, snapshot: Snapshot) -> None:
        if group == META:
            self.metadata.install_snapshot(snapshot)
            self.core.on_meta_applied(self.metadata.applied_index)
            return
        queue = self.queues.get(group)
        if queue is not None:
            queue.install_snapshot(snapshot)
        else:   # at start, a queue declared after the metadata snapshot: its entry is re-applied later
            self.early_snapshots[group] = snapshot
            self.early_entries.pop(group, None)   # the snapshot holds them

    def queue_known(self, queue: "QuorumQueue") -> None:
        """A queue the metadata group made here: its replica's state if this node hosts its group."""
        self.queues[queue.group] = queue
        if queue.machine is None and queue.group in self.runtime.groups:
            # removed from the queue's members but not yet released when this node stopped
            queue.machine = qm.QuorumMachine(queue.state.limits)
        snapshot = self.early_snapshots.pop(queue.group, None)
        if snapshot is not None:
            queue.install_snapshot(snapshot)
        for entry in self.early_entries.pop(queue.group, ()):
            queue.apply_entry(entry, False)   # a replay: the leader's effects were performed, or are resent

    def on_role_change(self, group: Any, role: Role, leader_id: str | None, term: int) -> None:
        if group == META and leader_id is None and self.fence is not None:
            # No metadata leader heard: one may lead elsewhere, where this node's links all stay up
            # (the leader it heard stepped down, cut off from the rest) and answer changes without it.
            self.fence.raise_fence()
        self._input().on_role_change(group, role == Role.LEADER, leader_id)
        self.after_input()

    # -- application messages and nodes coming and going -----------------------------------
    def on_app_frame(self, peer: str, frame: dict) -> None:
        """A peer's frame, its Raft items stepped: the shard link's messages, then the node
        core's (raft/frames.py), in the order the sender's turn made them."""
        shard_messages = frame.get(SHARD_PART)   # between the shards of one node (broker/node/shard_link.py)
        if shard_messages is not None and self.broker.shard_link is not None:
            self.broker.shard_link.on_messages(peer, shard_messages)
        core_messages = frame.get(HOST_PART)
        if core_messages:
            for message in self._input().on_messages(peer, core_messages):
                log.warning("cluster.bad_message", peer=peer, kind=message[0] if message else None)
            self.after_input()

    def on_peer_up(self, peer: str) -> None:
        self.broker.peer_up(peer)
        self._input().peer_up(peer)
        self.after_input()

    def on_peer_down(self, peer: str) -> None:
        self.broker.peer_down(peer)
        if self.fence is not None:   # the peer may count this node down too, and answer changes without it
            self.fence.raise_fence()
        self._input().peer_down(peer)
        self.after_input()

    # -- the metadata fence (metadata_fence.py) ---------------------------------------------
    def holds_clients(self, now: float) -> bool:
        """True while this node must catch up before it routes its clients' publishes: the
        caller holds them and is called back with `when_fence_lowered`."""
        fence = self.fence
        if fence is None:
            return False
        fence.saw_time(now)
        if not fence.up:
            return False
        self._start_fence_barrier()
        return True

    def when_fence_lowered(self, callback: Callable[[], None]) -> None:
        self._fence_waiters.append(callback)

    def _start_fence_barrier(self) -> None:
        if self.metadata is not None and self.fence is not None and self.fence.barrier_to_start():
            self.metadata.barrier(self._on_fence_barrier)

    def _on_fence_barrier(self) -> None:
        if not self.fence.barrier_applied():   # it went up again meanwhile
            self._start_fence_barrier()
            return
        waiters, self._fence_waiters = self._fence_waiters, []
        for callback in waiters:
            try:
                callback()
            except Exception:  # noqa: BLE001 -- one connection's bug must not keep the others held
                log.exception("cluster.fence_release_failed")

    @property
    def enqueues_pending(self) -> int:
        """Publishes of this node's channels that no quorum queue has applied yet."""
        return sum(len(session.pending) for queue in self.queues.values() for session in queue.enqueuers.values())

    def owner_key(self, owner: Any) -> str:
        """A channel's name in queue state: node/incarnation/connection/channel."""
        return self.core.owner_key(owner)

    # -- placement ---------------------------------------------------------------------
    def place_members(self, arguments: dict) -> list[str]:
        """The members of a replicated queue declared here (queue_factory.place_members); on
        nodes over several processes whose connections move, on the least loaded shards."""
        hosted = None
        if self.settings.node_shard is not None and self.settings.move_connections:
            hosted = Counter(str(member) for vhost in self.broker.vhosts.values() for queue in vhost.queues.values()
                             if queue.replicated for member in queue.members)
        return place_members(arguments, self.node, self.nodes, self.settings.quorum_cluster_size, hosted)

    def status(self) -> dict:
        metrics = self.runtime.metrics() if self.runtime.system is not None else {}
        return {"node": self.node, "nodes": self.nodes, "incarnation": self.incarnation, "raft": metrics}
