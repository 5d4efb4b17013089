"""Reconciling a quorum queue group's Raft configuration with its members.

The metadata machine (broker/node/metadata_machine.py) holds each queue's wanted
members and, per group, the nodes removed that may still hold a replica
(`MetaState.leaving`); this shell part, with timers, makes each group follow
them one single-server change at a time (thesis §4.1). The leader of each
group reconciles, on apply and every `RECONCILE_SECONDS` (the node core's,
broker/node/node_core.py) for groups in flux:
once its configuration is committed it proposes the next change, additions
first; a leader that is itself removed first hands leadership to the most
caught-up remaining voter (`TRANSFER_GRACE_SECONDS`, then it proposes its own
removal and steps down once that commits, thesis §4.2.2). When the committed
configuration no longer has a leaving node, the leader submits
`ReleaseReplica`: that node drops its replica. A leaving node not released
(say the leader restarted and forgot) submits `NoteLeaving` now and then.
Its decisions read the members and leaving nodes from the machine's state.

A node is added to the group's configuration only once it has applied the
metadata group through the change that made it a member (its
METADATA_APPLIED, broker/node/node_core.py): by then it has performed any
release of an older replica of its own and hosts the one the leader will
count on. Were it added earlier, its old replica could acknowledge entries
and then be dropped by a release it applied late, and the leader would
count on entries nobody holds (tests/sim membership seed 10 before this).

Time comes in ticks: it has no timer and no task of its own. The node's
`NodeCore` is its clock (broker/node/node_core.py): it runs the periodic
pass (`tick(now)`) every `RECONCILE_SECONDS` of its ticks, and a group
whose members just changed (`soon`) at the end of the turn that applied the
change (`run_due`), so a seeded simulation drives it like any other timer.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from warren.broker.node import metadata_commands as mc
from warren.raft.member_ids import node_of

if TYPE_CHECKING:
    from warren.broker.node.metadata import Metadata
    from warren.broker.queues.quorum import QuorumQueue

log = structlog.get_logger("warren.metadata")

# a leader being removed from its group tries this long to hand leadership over, then removes itself
TRANSFER_GRACE_SECONDS = 2.0
RELEASE_RESEND_SECONDS = 3.0
LEAVING_ANNOUNCE_SECONDS = 5.0
LEAVING_ANNOUNCE_MAX_SECONDS = 60.0


class Reconciler:
    def __init__(self, metadata: "Metadata") -> None:
        self.metadata = metadata
        self.cluster = metadata.cluster
        # groups hosted here whose Raft configuration may differ from their members
        self.converging: set[str] = set()
        self._scan_all = True
        self._transfer_started: dict[str, float] = {}
        self._release_sent: dict[tuple[str, str], float] = {}
        self._leaving_announce: dict[str, tuple[float, float]] = {}   # group -> (next at, interval)
        self.due: set[str] = set()   # groups to reconcile at the end of this turn (`run_due`)
        # group -> the metadata index of its last members change applied here (a member added
        # joins the configuration once it applied that far); before any, the index at start
        self.changed_at: dict[str, int] = {}
        self.changed_before = 0

    def soon(self, group: str, index: int) -> None:
        """The group's members changed at metadata `index`: reconcile it at the end
        of this turn and until it converged."""
        self.converging.add(group)
        self.due.add(group)
        self.changed_at[group] = index

    def forget(self, group: str) -> None:
        self.converging.discard(group)
        self.changed_at.pop(group, None)
        self._transfer_started.pop(group, None)
        self._leaving_announce.pop(group, None)
        for key in [key for key in self._release_sent if key[0] == group]:
            del self._release_sent[key]

    def released(self, group: str, node: str) -> None:
        self._release_sent.pop((group, node), None)

    def running(self) -> bool:
        runtime = self.cluster.runtime
        return runtime.system is not None and not runtime.stopped and runtime.failed is None

    def tick(self, now: float) -> None:
        """The periodic pass (every RECONCILE_SECONDS): every group still converging."""
        if not self.running():
            return
        if self._scan_all:
            # After a start: any hosted group may be mid-change (or a replica left behind).
            self._scan_all = False
            self.changed_before = self.metadata.applied_index
            runtime = self.cluster.runtime
            self.converging.update(group for group in self.cluster.queues if group in runtime.groups)
        self._reconcile_each(sorted(self.converging), now)

    def run_due(self, now: float) -> None:
        """The end of a turn that changed some groups' members: those groups now."""
        due, self.due = sorted(self.due), set()
        if self.running():
            self._reconcile_each(due, now)

    def _reconcile_each(self, groups: list[str], now: float) -> None:
        for group in groups:
            try:
                self.reconcile(group, now)
            except Exception:  # housekeeping must go on; the bug is logged and the next pass tries again
                log.exception("quorum.reconcile_failed", group=group)

    def reconcile(self, group: str, now: float) -> None:
        """One step towards the group's configuration being its members; drops
        the group from `converging` when done here."""
        cluster = self.cluster
        runtime = cluster.runtime
        queue = cluster.queues.get(group)
        config = runtime.configuration(group)
        record = self.metadata.state.queue(queue.vhost.name, queue.name) if queue is not None else None
        if queue is None or queue.deleted or config is None or record is None or record.group != group:
            self.converging.discard(group)
            return
        # Voters are replica ids: a node added again is a new voter (raft/member_ids.py).
        voters, committed = set(config[0]), config[1]
        wanted = set(record.member_ids())
        me = runtime.member_id(group)
        leaving = self.metadata.state.leaving.get(group, set())
        if not cluster.is_leader(group):
            self._transfer_started.pop(group, None)
            if cluster.node not in record.members:
                self._announce_leaving(queue, now)
            elif voters == wanted and committed and not leaving:
                self.converging.discard(group)
            return
        if not committed:
            return   # one change at a time (the leader's first entry must commit too)
        adds = sorted(member for member in wanted - voters if self._applied_its_change(group, node_of(member)))
        removes = sorted(voters - wanted - {me})
        if adds or removes:
            op, member = ("add", adds[0]) if adds else ("remove", removes[0])
            if runtime.propose_conf_change(group, op, member) is not None:
                log.info("quorum.conf_change_proposed", queue=queue.name, vhost=queue.vhost.name, op=op,
                         member=member)
            return
        if me not in wanted:
            self._hand_over(group, voters & wanted, now)
            return
        self._transfer_started.pop(group, None)
        self._release_left(queue, leaving - {node_of(voter) for voter in voters}, now)
        if not leaving and wanted <= voters:   # not while a member waits to be added
            self.converging.discard(group)

    def _applied_its_change(self, group: str, node: str) -> bool:
        """Whether `node` (running) applied the metadata group through the group's last members change:
        a voter added before it hosts its replica would only stall a small group's quorum (its id is
        new, raft/member_ids.py, so this is for liveness, not safety)."""
        applied = self.cluster.core.answers.peer_applied.get(node)
        return applied is not None and applied >= self.changed_at.get(group, self.changed_before)

    def _release_left(self, queue: "QuorumQueue", gone: set[str], now: float) -> None:
        """Nodes out of the committed configuration may drop their replicas (resent now and then)."""
        for node in sorted(gone):
            sent = self._release_sent.get((queue.group, node))
            if sent is None or now - sent >= RELEASE_RESEND_SECONDS:
                self._release_sent[(queue.group, node)] = now
                self.metadata.submit(mc.ReleaseReplica(queue.vhost.name, queue.name, queue.group, node),
                                     lambda _: None)

    def _hand_over(self, group: str, remaining: set[str], now: float) -> None:
        """This node leads `group` but is no longer a member: hand leadership
        to the most caught-up remaining voter, or after `TRANSFER_GRACE_SECONDS`
        propose its own removal (it steps down once that commits)."""
        runtime = self.cluster.runtime
        started = self._transfer_started.setdefault(group, now)
        if now - started >= TRANSFER_GRACE_SECONDS or not remaining:
            me = runtime.member_id(group)
            if me is not None and runtime.propose_conf_change(group, "remove", me) is not None:
                log.info("quorum.conf_change_proposed", group=group, op="remove", member=me)
            return
        status = runtime.status(group)
        down = self.cluster.down_since
        best = max(sorted(remaining), key=lambda voter: (node_of(voter) not in down, status.match_index(voter) or 0))
        if status.lead_transferee != best and runtime.transfer_leadership(group, best):
            log.info("quorum.leadership_handed_over", group=group, to=best)

    def _announce_leaving(self, queue: "QuorumQueue", now: float) -> None:
        group = queue.group
        due = self._leaving_announce.get(group)
        if due is None:
            self._leaving_announce[group] = (now + LEAVING_ANNOUNCE_SECONDS, LEAVING_ANNOUNCE_SECONDS)
            return
        next_at, interval = due
        if now < next_at:
            return
        interval = min(interval * 2, LEAVING_ANNOUNCE_MAX_SECONDS)
        self._leaving_announce[group] = (now + interval, interval)
        self.metadata.submit(mc.NoteLeaving(queue.vhost.name, queue.name, group, self.cluster.node), lambda _: None)
