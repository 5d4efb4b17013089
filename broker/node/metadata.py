"""The metadata Raft group's shell on one node (the machine: broker/node/metadata_machine.py).

Theory of operation. The channel checks a topology change against its node's
vhost first (so that mistakes get RabbitMQ's reply at once), warrenctl
checks a users/vhosts/permissions or membership change against the machine's
state here; then the change is submitted to the group as a typed command
(broker/node/metadata_commands.py). Every node applies the committed command to
its own `MetaState` through the pure machine and performs the effects it
returns (broker/node/metadata_effects.py): the routing read model
(`VirtualHost`, broker/routing/metadata_read_model.py), users and permissions
(broker/admin/definitions.py), Raft groups hosted, dropped and campaigned for,
connections closed, and the membership reconciler's follow-up
(broker/node/metadata_reconcile.py). The asking node answers once it, and every
running node, applied the change.

What goes through the group: every durable exchange, every replicated queue
(quorum, and durable classic queues, auto-delete ones too, on a group of
one), the bindings between those, users, vhosts and permissions, and quorum
queue membership (warrenctl add_member, delete_member, grow, shrink,
rebalance). Exclusive and transient objects, and bindings with such an end,
stay on the node that made them, in memory only. The group's log is the
node's only record of all this: its first entry, snapshots and compaction
are broker/node/metadata_log.py's.

Membership: `SetMembers` sets the queue's wanted members on every node; the
node added hosts the group with an empty log (`RaftRuntime.join_group`: no
vote until the leader's CONFIG entry makes it a voter) and a fresh machine;
a node removed keeps its replica until its removal is committed (it may be
needed for that commit), so the machine notes it as leaving until a
`ReleaseReplica`. `TransferLeaders` has the node leading each group hand
leadership over (rebalance; best effort).
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Callable

import structlog

from warren.broker.node import metadata_commands as mc
from warren.broker.node import metadata_effects as fx
from warren.broker.node import metadata_machine as machine
from warren.broker.node.metadata_answers import APPLIED_AT
from warren.broker.node.metadata_log import MetadataLog
from warren.broker.node.metadata_reconcile import Reconciler
from warren.broker.node.metadata_state import MetaState
from warren.broker.node.node_core import META
from warren.broker.queues import quorum_machine as qm
from warren.broker.queues.queue_factory import Placement, make_queue
from warren.broker.queues.quorum import QuorumQueue
from warren.broker.routing import metadata_read_model as read_model
from warren.protocol.errors import ChannelError
from warren.raft.member_ids import on_node

if TYPE_CHECKING:
    from warren.broker.node.broker import Broker
    from warren.broker.node.cluster import Cluster
    from warren.broker.routing.vhost import VirtualHost
    from warren.raft.messages import Entry, Snapshot

log = structlog.get_logger("warren.metadata")

# A metadata change that cannot be made: an HTTP status and one line of text (the
# machine's refusal; the shell raises it as MembershipError or DefinitionError).
ChangeRefused = machine.Refused


class MembershipError(ChangeRefused):
    """A quorum queue membership change that cannot be made."""


def raise_if_error(result: Any) -> None:
    if isinstance(result, list) and len(result) == 4:
        code, text, class_id, method_id = result
        raise ChannelError(code, text, class_id, method_id)


class Metadata:
    def __init__(self, broker: "Broker", cluster: "Cluster") -> None:
        self.broker = broker
        self.cluster = cluster
        cluster.metadata = self
        # the machine's state: empty until the group's snapshot is installed or its entries applied
        self.state = MetaState()
        self.applied_index = 0   # the group's last entry (or snapshot) applied here
        self.log = MetadataLog(self, META)
        self.reconciler = Reconciler(self)
        cluster.core.membership = self.reconciler   # run on the core's ticks and turns

    def seed_if_empty(self) -> mc.SeedDefinitions | None:
        """On an empty metadata log: the config's definitions, to propose as its first entry."""
        return self.log.seed_if_empty()

    def install_snapshot(self, snapshot: "Snapshot") -> None:
        self.log.install(snapshot)

    # -- asked by channels ---------------------------------------------------------
    def submit(self, command: mc.Command, on_done: Callable[[Any], None], everywhere: bool = True) -> None:
        """Have the metadata group apply `command`; `on_done(reply)` once this
        node has applied it and (`everywhere`) so has every running node
        (broker/node/metadata_answers.py)."""
        self.cluster.core.submit_meta(mc.encode(command), on_done, everywhere)
        self.cluster.after_input()

    def barrier(self, on_applied: Callable[[], None], command: mc.Command | None = None) -> None:
        """A no-op through the group (or `command`): `on_applied()` once this node applied
        it, and so everything committed before it was submitted (Raft's read index, by an entry)."""
        self.submit(command or mc.Sync(), lambda _: on_applied(), everywhere=False)

    async def catch_up(self, seconds: float, barrier: mc.Command | None = None) -> bool:
        """A barrier through the group (Raft's read index, by a no-op entry, or
        `barrier`, e.g. the seed of an empty log): True once this node applied
        everything committed before it started, so a restarted node does not
        answer 404 or route past a queue declared while it was away. False if
        no leader answered in `seconds` (no majority: nothing new can be
        declared then either)."""
        caught_up = asyncio.Event()
        self.barrier(caught_up.set, barrier)
        try:
            await asyncio.wait_for(caught_up.wait(), seconds)
        except TimeoutError:
            return False
        return True

    def replicates_binding(self, vhost: "VirtualHost", source: str, kind: str, destination: str) -> bool:
        return read_model.owns_binding(vhost, source, kind, destination)

    def check_membership(self, vhost: str, name: str, op: str, node: str) -> list[str]:
        """The queue's members after `op` of `node`, or MembershipError (checked again where applied)."""
        try:
            return machine.members_after(self.state, vhost, name, op, node, tuple(self.cluster.nodes))[1]
        except machine.Refused as refused:
            raise MembershipError(refused.status, refused.text) from None

    # -- applied on every node ---------------------------------------------------------
    def apply(self, entry: "Entry") -> Any:
        """Apply one committed entry: the machine decides, this node performs the effects."""
        try:
            command = mc.decode(entry.data)
        except (mc.BadCommand, ValueError, TypeError):
            log.warning("metadata.bad_command", index=entry.index)
            return [APPLIED_AT, entry.index, None]
        meta = machine.Meta(entry.index, tuple(self.cluster.nodes))
        self.state, reply, effects = machine.apply(meta, command, self.state)
        self.applied_index = entry.index
        counts = self.perform_all(effects, entry.index)
        if isinstance(reply, machine.MessageCountOfDeletedQueue):
            reply = counts.get(reply.group) or 0
        self.log.applied(entry.index)
        return [APPLIED_AT, entry.index, reply]

    def perform_all(self, effects: list, index: int) -> dict[str, int]:
        """Perform an entry's (or a snapshot's) effects; the message counts of the queues deleted."""
        counts: dict[str, int] = {}
        for effect in effects:
            try:
                outcome = self.perform(effect, index)
            except Exception:  # noqa: BLE001 -- a bug: logged; the other effects and entries go on
                log.exception("metadata.effect_failed", effect=type(effect).__name__, index=index)
                continue
            if isinstance(effect, fx.QueueDeleted):
                counts[effect.group] = outcome
        return counts

    def perform(self, effect: fx.Effect, index: int) -> Any:
        """Perform one effect of the entry (or snapshot) at `index`."""
        match effect:
            case fx.ExchangeDeclared():
                read_model.exchange_declared(self.broker.vhosts, effect)
            case fx.ExchangeDeleted():
                read_model.exchange_deleted(self.broker.vhosts, effect)
                self.broker.local_topology.forget(effect.vhost, "exchange", effect.name)
            case fx.BindingChanged():
                read_model.binding_changed(self.broker.vhosts, effect)
            case fx.QueueDeclared():
                self._queue_declared(effect, index)
            case fx.Campaign():
                self._campaign_first(effect)
            case fx.QueueDeleted():
                count = self._queue_deleted(effect)
                self.broker.local_topology.forget(effect.vhost, "queue", effect.name)
                return count
            case fx.MembersChanged():
                self._members_changed(effect, index)
            case fx.HostIfMember():
                self._host_if_member(effect, index)
            case fx.ReplicaReleased():
                self._replica_released(effect, index)
            case fx.LeavingNoted():
                if effect.group in self.cluster.runtime.groups:
                    self.reconciler.converging.add(effect.group)
            case fx.TransferLeadership():
                self._transfer_leadership(effect)
            case _:
                self.broker.definitions.perform(effect)
        return None

    def _vhost(self, name: str) -> "VirtualHost | None":
        return self.broker.vhosts.get(name)

    def _queue(self, vhost_name: str, name: str, group: str) -> QuorumQueue | None:
        vhost = self._vhost(vhost_name)
        queue = vhost.queues.get(name) if vhost is not None else None
        return queue if isinstance(queue, QuorumQueue) and queue.group == group else None

    def _queue_declared(self, effect: fx.QueueDeclared, index: int) -> None:
        vhost = self._vhost(effect.vhost)
        if vhost is None:
            return
        if effect.name in vhost.queues:
            log.warning("metadata.queue_name_taken_here", queue=effect.name, vhost=effect.vhost)
            return   # a local (exclusive, auto-delete or transient) queue of that name
        cluster = self.cluster
        queue = make_queue(vhost, effect.name, effect.arguments, durable=True, exclusive_owner=None,
                           auto_delete=effect.auto_delete,
                           placement=Placement(cluster, effect.group, tuple(effect.members)))
        vhost.add_queue(queue)
        cluster.queue_known(queue)
        if cluster.node not in effect.members:
            return
        ids = effect.member_ids or effect.members
        me = on_node(ids, cluster.node)
        if me == cluster.node:
            cluster.runtime.add_group(effect.group, list(ids), hosted_at=index)
        else:   # added to the group after its start (learnt from a snapshot): it joins
            cluster.runtime.join_group(effect.group, list(ids), hosted_at=index, me=me)

    def _campaign_first(self, effect: fx.Campaign) -> None:
        status = self.cluster.runtime.status(effect.group)
        if effect.node != self.cluster.node or status is None or status.last_index > 0:
            # Not ours, or the declaration applied again at a restart: the group came back
            # with its log and elects as usual (a campaign here would hold its Ready, with
            # the whole committed log, until the vote is durable).
            return
        if self.cluster.local_leader(effect.group) is None:
            self.cluster.runtime.campaign(effect.group)
        # The other members may not host the group yet (they apply this entry a little
        # later) and drop the votes asked: ask again before their election timers fire.
        self.cluster.core.campaign_again(effect.group)

    def _queue_deleted(self, effect: fx.QueueDeleted) -> int:
        queue = self._queue(effect.vhost, effect.name, effect.group)
        if queue is None:
            return 0
        return self.drop_queue(queue.vhost, queue)

    def drop_queue(self, vhost: "VirtualHost", queue: QuorumQueue) -> int:
        """Delete a replicated queue here (its consumers cancelled, its replica dropped); its message count."""
        count = queue.message_count
        vhost.delete_queue_now(queue)
        self.cluster.queues.pop(queue.group, None)
        self.reconciler.forget(queue.group)
        if queue.group in self.cluster.runtime.groups:
            self.cluster.runtime.remove_group(queue.group)
        return count

    def _members_changed(self, effect: fx.MembersChanged, index: int) -> None:
        queue = self._queue(effect.vhost, effect.name, effect.group)
        if queue is None:
            return
        queue.members = list(effect.members)
        log.info("quorum.members_changed", queue=effect.name, vhost=effect.vhost, op=effect.op, node=effect.node,
                 members=list(effect.members))
        self.reconciler.soon(effect.group, index)

    def _host_if_member(self, effect: fx.HostIfMember, index: int) -> None:
        """A member that does not host the group joins it: a fresh machine, an
        empty log starting from the voters before (the leader sends the rest),
        under the id the change gave it (raft/member_ids.py). An older replica
        hosted here under another id (this node left and was added again before
        that one was released) is dropped first: only the new id is added.
        The replica is marked with `index`, for `_replica_released`."""
        queue = self._queue(effect.vhost, effect.name, effect.group)
        runtime = self.cluster.runtime
        node = self.cluster.node
        if queue is None or node not in queue.members:
            return
        me = on_node(effect.member_ids, node) or node
        hosted = runtime.member_id(queue.group)
        if hosted == me or (hosted is not None and (runtime.hosted_at(queue.group) or 0) > index):
            return   # hosted already, or by a later entry (a restart applies this one again)
        if hosted is not None:
            log.info("quorum.older_replica_dropped", queue=effect.name, vhost=effect.vhost, replica=hosted, new=me)
            runtime.remove_group(queue.group)
        voters = effect.voters_before
        if voters is None:
            voters = tuple(member for member in effect.member_ids or queue.members if member != me)
        queue.machine = qm.QuorumMachine(queue.state.limits)   # a new replica, counting from 0
        runtime.join_group(queue.group, list(voters), hosted_at=index, me=me)

    def _replica_released(self, effect: fx.ReplicaReleased, index: int) -> None:
        """This node may drop its replica, unless the one it hosts was made by a
        later entry: a restart re-applies the metadata entries after the snapshot,
        and a replica that left, joined again, took entries and acknowledged them
        must not be dropped (and made again empty) by its old release: its leader
        counts on what it acknowledged (tests/sim membership seed 0 before this)."""
        self.reconciler.released(effect.group, effect.node)
        queue = self._queue(effect.vhost, effect.name, effect.group)
        cluster = self.cluster
        me = cluster.node
        if queue is None or effect.node != me or me in queue.members or effect.group not in cluster.runtime.groups:
            return
        if (cluster.runtime.hosted_at(effect.group) or 0) > index:
            return
        leader = cluster.local_leader(effect.group)
        cluster.runtime.remove_group(effect.group)
        queue.machine = None
        queue.leader_hint = leader if leader not in (None, me) else queue.members[0]
        self.reconciler.forget(effect.group)
        log.info("quorum.replica_released", queue=effect.name, vhost=effect.vhost)

    def _transfer_leadership(self, effect: fx.TransferLeadership) -> None:
        for _, _, group, to in effect.moves:
            if to != self.cluster.node and self.cluster.is_leader(group):
                voter = self.cluster.runtime.voter_on(group, to)
                if voter is not None:
                    self.cluster.runtime.transfer_leadership(group, voter)
