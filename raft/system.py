"""The node-wide Raft system: thousands of groups (one per quorum queue) on one
node, sharing one storage batch and one frame per peer node per turn.

Theory of operation (after rabbitmq/ra). A `RaftSystem` does no I/O and
reads no clock; the shell hands it inputs and gives it four callables:

* `persist(items) -> token`: make a list of `PersistItem`s durable (the shell
  turns them into WAL records: one batch, one fsync) and later call
  `on_persisted(token)`, possibly from inside `persist` if storage is
  synchronous. With `storage.group_commit`, the token is the batch number
  the last record went into (batches become durable in order).
* `send(peer, frame)`: one frame per peer node (voters are member ids, raft/member_ids.py, and
  `node_of` gives their node), a list of items `[group_id, message_wire]` or `[group_id,
  message_wire, QUIESCE]` (a leader's last heartbeat before it falls quiet); msgpack-able.
* `apply(group_id, entry)`: every committed entry, in order (NORMAL, NOOP
  and CONFIG: the state machine skips what it does not use). After a
  restart, entries after the snapshot are applied again; the system does
  not hand a recovered snapshot to `install_snapshot`: the host restores
  the state machine from `RecoveredState.snapshot` before `add_group`
  (raft/runtime.py does).
* `install_snapshot(group_id, snapshot)`, `on_role_change(group_id, role,
  leader_id, term)`, `request_turn()`: optional.

`eager_commit_groups` (optional): the groups whose leader tells a caught-up
follower of a new commit index at once, in an AppendEntries of its own; the
others' followers learn it with their next entries or heartbeat (None: every
group is eager; see `replication.flush`).

Inputs: `add_group`, `remove_group`, `propose`, `propose_conf_change`, `transfer_leadership`,
`campaign`, `compact`, `step(from_node, frame)`, `tick()` on a timer, `peer_down(node)` /
`peer_up(node)` from the transport's per-node failure detector, `on_persisted(token)`. Then, once per event-loop turn,
`process_ready()`, which keeps the etcd-raft order across all groups at once
(persist, then send, then apply, then advance):

1. completes the Readies whose batch `on_persisted` reported durable: queues
   their messages, applies their committed entries, advances their groups;
2. takes a Ready from every group touched since the last turn; those with
   nothing to persist are completed at once (heartbeats, acks of state that
   is already durable), and so are those that only advance the commit index,
   whose hard state waits for the next batch that writes anything else
   (raft/carried_commits.py: the commit index is volatile state, Raft Figure 2); the
   others go into ONE `persist` call, with the waiting commit indexes; a
   leader whose Ready is still being written sends the AppendEntries for what
   was proposed since (`replication.take_pipelined`: they promise nothing);
3. completes that batch if storage acknowledged it synchronously;
4. sends what was queued: at most one frame per peer node (split only
   beyond `frame_max_messages`).

A group has at most one Ready outstanding; it may be stepped, ticked and proposed to meanwhile,
and its next Ready is taken after `advance`, so a message always travels after the persist of the
state it promises (a vote, an acknowledged entry, a term). Only groups that were touched are
visited by `process_ready`; only awake groups are visited by `tick`: idle groups cost nothing.
Quiescence, and why it is safe, is explained in raft/group.py.

Losing a node: `peer_down(node)` wakes the groups with a member there, and those whose leader was
there elect a new one at once (raft/reelection.py).

A failed persist (`on_persisted(token, ok=False)`) leaves groups whose state
in memory is ahead of the disk: `process_ready` then raises `PersistFailed`
and the shell must rebuild the system from storage (etcd-raft and ra crash
and recover in that case too): the storage is shared, so that failure is
the node's.

Groups dropped and groups that fail. `remove_group` may be called at any
time, also from inside `apply` during `process_ready` (the broker's metadata
group applies a queue's deletion): a Ready of the group already taken is
then neither persisted nor completed (see `still_hosted`). A failure that
belongs to one group stays in that group: an exception out of its `apply`,
`install_snapshot` or `on_role_change`, or out of the core while completing its Ready, or the
shell's `fail_group` (say its records could not be encoded), makes the group failed: it is no
longer hosted (no ticks, messages, proposals or applies, as a crashed replica: Raft tolerates
that, and its records on disk bring it back at the next start), `failed_groups` keeps the error
and `on_group_failed(group_id, error)` is called; every other group goes on.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from warren.raft import replication
from warren.raft.carried_commits import CarriedCommits
from warren.raft.core import RaftNode, Ready, RecoveredState
from warren.raft.group import (
    QUIESCE, Group, GroupId, PersistItem, follower_may_quiesce, leader_may_quiesce,
    persist_item, quiesce_heartbeats,
)
from warren.raft.messages import (
    ENTRY_OVERHEAD_BYTES, AppendEntries, ConfigChangeOp, Entry, Heartbeat, HeartbeatResponse, Message, Role,
    Snapshot, from_wire, to_wire,
)
from warren.raft.messages import InstallSnapshot as InstallSnapshotMessage
from warren.raft.member_ids import node_of
from warren.raft.reelection import campaigner
from warren.raft.system_counters import SystemCounters
from warren.raft.system_views import SystemViews

if TYPE_CHECKING:
    import random

Persist = Callable[[list[PersistItem]], int]
Send = Callable[[str, list], None]
Apply = Callable[[GroupId, Entry], None]
InstallSnapshot = Callable[[GroupId, Snapshot], None]
RoleChange = Callable[[GroupId, Role, "str | None", int], None]
GroupFailed = Callable[[GroupId, BaseException], None]
# What a leader replicates, as the node's room sees it: a snapshot; entries the leader has
# committed already (a catch-up: the group commits without this node); or entries it has
# not, for which it may need this node's vote (refused by two followers of three, nothing
# behind them commits: a consumer's gets and acks wait, and so does the space they free).
SNAPSHOT, COMMITTED_ENTRIES, UNCOMMITTED_ENTRIES = "snapshot", "committed entries", "uncommitted entries"
# (group, bytes, which of the three): whether the node has room for what a leader replicates
AdmitsReplicated = Callable[[GroupId, int, str], bool]


class PersistFailed(RuntimeError):
    """Storage reported a batch lost; the system must be rebuilt from disk."""


class RaftSystem(SystemViews):
    def __init__(self, node_name: str, rng: random.Random, persist: Persist, send: Send, apply: Apply, *,
                 install_snapshot: InstallSnapshot | None = None, on_role_change: RoleChange | None = None,
                 request_turn: Callable[[], None] | None = None, on_group_failed: GroupFailed | None = None,
                 eager_commit_groups: frozenset[GroupId] | None = None,
                 admits_replicated: AdmitsReplicated | None = None,
                 quiesce_after_ticks: int = 2, frame_max_messages: int = 65536, **raft_options) -> None:
        assert quiesce_after_ticks >= 1
        assert frame_max_messages >= 1
        self.node_name = node_name
        # One generator for all groups: deterministic given the order of inputs.
        self.rng = rng
        self.persist = persist
        self.send = send
        self.apply = apply
        self.install_snapshot = install_snapshot
        self.on_role_change = on_role_change
        self.request_turn = request_turn
        self.on_group_failed = on_group_failed
        # the groups whose followers hear of a new commit index at once (None: all); see replication.flush
        self.eager_commit_groups = eager_commit_groups
        self.admits_replicated = admits_replicated
        self.quiesce_after_ticks = quiesce_after_ticks
        self.frame_max_messages = frame_max_messages
        self.raft_options = raft_options
        self.groups: dict[GroupId, Group] = {}
        # dicts used as ordered sets, so that every run visits groups in one order
        self.active: dict[GroupId, Group] = {}       # ticked
        self.touched: dict[GroupId, Group] = {}      # may have a Ready
        self.members_on: dict[str, dict[GroupId, Group]] = {}
        self.down_nodes: set[str] = set()
        # persist token -> (group, Ready, whether its messages went out already)
        self.waiting: dict[int, list[tuple[Group, Ready, bool]]] = {}
        # commit-only hard states waiting for the next batch (raft/carried_commits.py)
        self.carried_commits = CarriedCommits()
        self.durable_tokens: list[int] = []
        self.outbox: dict[str, list[list]] = {}
        self.turn_requested = False
        self.failed = False
        # groups stopped by a failure of their own (see the module docstring): id -> the error
        self.failed_groups: dict[GroupId, BaseException] = {}
        self.counters = SystemCounters()

    # --- groups ------------------------------------------------------------------------------

    def add_group(self, group_id: GroupId, members: Iterable[str], recovered: RecoveredState | None = None,
                  me: str | None = None, **raft_options) -> None:
        """Host a group whose voters are `members` (member ids, raft/member_ids.py; `me`
        this replica's, the node's name by default), fresh or rebuilt from storage."""
        assert group_id not in self.groups, f"group {group_id!r} already hosted"
        assert me is None or node_of(me) == self.node_name, f"{me} is not a replica on {self.node_name}"
        options = {**self.raft_options, **raft_options}
        if self.eager_commit_groups is not None:
            options.setdefault("eager_commit", group_id in self.eager_commit_groups)
        raft = RaftNode(me or self.node_name, sorted(members), self.rng, storage=recovered, **options)
        group = Group(group_id, raft)
        self.groups[group_id] = group
        self.index_members(group)
        self.active[group_id] = group
        self.touch(group)   # a recovered group re-applies its committed entries

    def remove_group(self, group_id: GroupId) -> None:
        """Stop hosting the group; a Ready of it still in storage is dropped
        when its batch completes."""
        self.failed_groups.pop(group_id, None)
        group = self.groups.pop(group_id, None)
        if group is None:
            return
        self.active.pop(group_id, None)
        self.touched.pop(group_id, None)
        self.carried_commits.drop(group_id)
        for member in group.members:
            self.members_on.get(node_of(member), {}).pop(group_id, None)

    def fail_group(self, group_id: GroupId, error: BaseException) -> None:
        """Contain a failure to the group it belongs to: stop hosting it (as
        if its replica had crashed; the rest of the node goes on), keep the
        error in `failed_groups` and report it. A Ready of it in flight is
        dropped as for `remove_group`. The shell calls this for failures it
        can attribute to one group (e.g. its records could not be encoded)."""
        if group_id not in self.groups:
            return
        self.remove_group(group_id)
        self.failed_groups[group_id] = error
        if self.on_group_failed is not None:
            self.on_group_failed(group_id, error)

    def index_members(self, group: Group) -> None:
        """Keep `members_on` (node -> groups with a voter there) current."""
        voters = group.raft.voters
        if voters == group.members:
            return
        for member in group.members:
            self.members_on.get(node_of(member), {}).pop(group.group_id, None)
        for member in voters:
            if member != group.raft.node_id:
                self.members_on.setdefault(node_of(member), {})[group.group_id] = group
        group.members = voters

    def __contains__(self, group_id: GroupId) -> bool:
        return group_id in self.groups

    # --- inputs ---------------------------------------------------------------------------------

    def propose(self, group_id: GroupId, data: bytes) -> int | None:
        """The index `data` will have, or None (not the leader, or no such group)."""
        group = self.groups.get(group_id)
        if group is None:
            return None
        index = group.raft.propose(data)
        if index is not None:
            self.on_work(group)
        return index

    def propose_conf_change(self, group_id: GroupId, op: ConfigChangeOp | str, node_id: str) -> int | None:
        group = self.groups.get(group_id)
        if group is None:
            return None
        index = group.raft.propose_conf_change(op, node_id)
        if index is not None:
            self.on_work(group)
        return index

    def transfer_leadership(self, group_id: GroupId, to: str) -> bool:
        group = self.groups.get(group_id)
        if group is None or not group.raft.transfer_leadership(to):
            return False
        self.on_work(group)
        return True

    def compact(self, group_id: GroupId, index: int, snapshot_data: bytes) -> Snapshot:
        """Raft §7: the state machine captured its state at `index` (applied)
        in `snapshot_data`; drop the log up to it. Returns the snapshot the
        log now starts with (an earlier one when `index` is not beyond it).
        The host must persist a new snapshot before its storage drops the
        entries it covers (the runtime: a SNAPSHOT record, then the cursor)."""
        return self.groups[group_id].raft.compact(index, snapshot_data)

    def campaign(self, group_id: GroupId) -> bool:
        """This node campaigns for the group now (`RaftNode.campaign`, behind a
        pre-vote): e.g. the first member of a new group, so that it need not
        wait out an election timeout. The group wakes (its election goes on
        on ticks). The followers of a live leader refuse it inside their lease
        (use `transfer_leadership` to move a healthy leader). False if the
        group is not hosted here."""
        group = self.groups.get(group_id)
        if group is None:
            return False
        group.raft.campaign()
        self.on_work(group)
        return True

    def step(self, from_node: str, frame: list) -> None:
        """A frame from a peer node: messages for many groups. Items for
        groups not hosted here, or not addressed from `from_node` to this
        node, are dropped and counted; a malformed item raises (the
        transport should then drop the connection). So is a message for another
        (older, dropped) replica id on this node (raft/member_ids.py)."""
        for item in frame:
            self.counters.messages_received += 1
            group = self.groups.get(item[0])
            if group is None:
                # Not (or no longer) hosted here; Raft retries whatever matters.
                self.counters.messages_dropped += 1
                continue
            message = from_wire(item[1])
            if message.to != group.raft.node_id or node_of(message.sender) != from_node:
                self.counters.messages_dropped += 1
                continue
            if self.admits_replicated is not None and not self.admitted(group.group_id, message):
                self.counters.messages_refused += 1
                continue
            self.on_message(group, message, quiesce=len(item) > 2 and item[2] == QUIESCE)

    def admitted(self, group_id: GroupId, message: Message) -> bool:
        """Whether the disk has room for the entries or snapshot `message` brings. Refused, they
        are as lost on the way (Raft lets a follower drop what it has not acknowledged): the
        leader sends them again, or a snapshot once its log let go of them."""
        if isinstance(message, AppendEntries) and message.entries:
            size = sum(len(entry.data) for entry in message.entries) + ENTRY_OVERHEAD_BYTES * len(message.entries)
            committed = message.entries[-1].index <= message.leader_commit
            return self.admits_replicated(group_id, size, COMMITTED_ENTRIES if committed else UNCOMMITTED_ENTRIES)
        if isinstance(message, InstallSnapshotMessage):
            return self.admits_replicated(group_id, len(message.snapshot.data), SNAPSHOT)
        return True

    def on_message(self, group: Group, message: Message, quiesce: bool) -> None:
        raft = group.raft
        role, term = raft.role, raft.term
        raft.step(message)
        if quiesce and isinstance(message, Heartbeat):
            if follower_may_quiesce(raft, message):
                self.quiesce(group)
            else:
                self.wake(group)
        elif not (group.quiescent and isinstance(message, HeartbeatResponse) and raft.role == role
                  and raft.term == term and not raft.has_ready()):
            # The only message a quiet group takes without waking: a
            # follower's answer to the leader's quiesce heartbeat.
            self.wake(group)
        self.touch(group)

    def tick(self) -> None:
        """One timer tick for every awake group; quiet groups are not visited."""
        self.counters.ticks += 1
        for group in list(self.active.values()):
            if self.leader_is_idle(group):
                self.quiesce_leader(group)
                continue
            group.raft.tick()
            self.counters.group_ticks += 1
            self.touch(group)

    def peer_down(self, node: str) -> None:
        """The failure detector lost `node`: wake the groups with a member
        there; those it led forget it and elect a new leader at once (see
        `elect_without`, raft/reelection.py)."""
        self.down_nodes.add(node)
        self.wake_members_on(node)
        self.elect_without(node)

    def peer_up(self, node: str) -> None:
        """`node` is reachable again: wake its groups, so that their leaders
        bring it up to date (then they fall quiet again)."""
        self.down_nodes.discard(node)
        self.wake_members_on(node)

    def on_persisted(self, token: int, ok: bool = True) -> None:
        """Storage made the batch `token` durable (or lost it). May be called
        from inside `persist`; the work happens in `process_ready`."""
        if not ok:
            self.failed = True
        self.durable_tokens.append(token)
        self.request()

    # --- quiescence (see raft/group.py) --------------------------------------------------------------

    def leader_is_idle(self, group: Group) -> bool:
        if group.raft.role != Role.LEADER or not leader_may_quiesce(group.raft, self.down_nodes):
            group.quiet_ticks = 0
            return False
        group.quiet_ticks += 1
        return group.quiet_ticks >= self.quiesce_after_ticks

    def quiesce_leader(self, group: Group) -> None:
        for heartbeat in quiesce_heartbeats(group.raft, self.down_nodes):
            self.queue(heartbeat.to, [group.group_id, to_wire(heartbeat), QUIESCE])
        self.quiesce(group)

    def quiesce(self, group: Group) -> None:
        if not group.quiescent:
            self.counters.quiesced += 1
        group.quiescent = True
        group.quiet_ticks = 0
        self.active.pop(group.group_id, None)

    def wake(self, group: Group) -> None:
        if group.quiescent:
            self.counters.woken += 1
            group.quiescent = False
            group.quiet_ticks = 0
            self.active[group.group_id] = group

    def on_work(self, group: Group) -> None:
        """New work for the group (a proposal): awake, and not idle."""
        self.wake(group)
        group.quiet_ticks = 0
        self.touch(group)

    def wake_members_on(self, node: str) -> None:
        for group in list(self.members_on.get(node, {}).values()):
            self.wake(group)

    # --- fast re-election after a node is lost ------------------------------------------------------

    def elect_without(self, node: str) -> None:
        """Every group here that followed a leader on `node` forgets it
        (`RaftNode.forget_leader`: the lease no longer blocks votes), and the
        one survivor `campaigner` names campaigns at once (with a pre-vote),
        so the group has a new leader a pre-vote and a vote round trip later
        instead of after the lease and a randomized election timeout. Every survivor computes the same
        campaigner from what it knows (the group's voters and the nodes its
        failure detector calls down), so normally exactly one campaigns; if
        they disagree (detectors that fire at different times, a stale
        configuration) the others' election timers still elect, as before."""
        for group in list(self.members_on.get(node, {}).values()):
            raft = group.raft
            if raft.leader_id is None or node_of(raft.leader_id) != node or not raft.forget_leader():
                continue
            if campaigner(group.group_id, group.raft.voters, self.down_nodes) == raft.node_id:
                raft.campaign()
            self.touch(group)

    # --- the turn: persist, send, apply, advance ------------------------------------------------------

    def touch(self, group: Group) -> None:
        if group.raft.has_ready() or replication.has_pipelined(group.raft):
            self.touched[group.group_id] = group
            self.request()

    def request(self) -> None:
        if not self.turn_requested and self.request_turn is not None:
            self.turn_requested = True
            self.request_turn()

    def needs_turn(self) -> bool:
        return bool(self.touched or self.durable_tokens or self.outbox)

    def applied_total(self) -> tuple[int, int]:
        """(entries applied, entries committed) summed over every group: a turn applies
        a bounded size of them (raft/log.py), so a restart's re-application takes turns."""
        logs = [group.raft.log for group in self.groups.values()]
        return sum(log.applied_index for log in logs), sum(log.commit_index for log in logs)

    def process_ready(self) -> None:
        """One event-loop turn's Ready processing for all groups (see above)."""
        if self.failed:
            raise PersistFailed(f"{self.node_name}: a storage batch failed; rebuild the Raft system from disk")
        self.turn_requested = False
        self.complete_durable()
        touched, self.touched = self.touched, {}
        items: list[tuple[Group, PersistItem]] = []
        batch: list[tuple[Group, Ready, bool]] = []
        for group_id, group in touched.items():
            if self.groups.get(group_id) is not group:
                continue   # removed
            if group.raft.awaiting_advance():
                self.queue_messages(group_id, replication.take_pipelined(group.raft))
                continue   # touched again after its Ready was taken: retaken on advance
            ready = group.raft.ready()
            if ready is None:
                continue
            self.counters.readies += 1
            item = persist_item(group_id, ready)
            if item is None:
                self.complete(group, ready)
            elif self.only_commit_advances(group, ready):
                self.carried_commits.carry(group, item)
                self.complete(group, ready)
            else:
                early = self.may_send_before_persist(group, ready)
                if early:
                    self.queue_messages(group_id, ready.messages)
                items.append((group, self.carried_commits.with_carried(group, item)))
                batch.append((group, ready, early))
        to_persist = [item for group, item in items if self.still_hosted(group)]
        if to_persist:
            to_persist.extend(self.take_carried_commits())
            self.counters.persist_calls += 1
            self.counters.persist_items += len(to_persist)
            token = self.persist(to_persist)
            self.waiting.setdefault(token, []).extend(entry for entry in batch if self.still_hosted(entry[0]))
            self.complete_durable()   # synchronous storage acknowledged inside persist()
        if self.failed:
            raise PersistFailed(f"{self.node_name}: a storage batch failed; rebuild the Raft system from disk")
        self.flush()

    def still_hosted(self, group: Group) -> bool:
        """Whether `group` is still hosted (the same object: an id may be
        hosted again later). A Ready taken in this turn may belong to a group
        dropped later in the same turn: applying a commit-only Ready inside
        the loop above runs the host's `apply`, which may `remove_group` (the
        broker deletes a queue just declared) or fail one. Such a Ready is not
        persisted and never completed. That is safe for Raft: nothing it
        promises (a vote, an acknowledged entry, a term) has been sent -- a
        leader's early AppendEntries promise nothing (`may_send_before_persist`)
        -- so it is as if the node had crashed before the write, and the
        group is gone from this node anyway. And it keeps the WAL right: the
        shell wrote the group's REMOVED record when it dropped it, and a
        removed group's log id has no storage any more; records after REMOVED
        would only be dead weight. (Deferring the drop to the end of the turn
        instead would write those records, and leave the host's view of the
        group and Raft's disagreeing for the rest of the turn.)"""
        return self.groups.get(group.group_id) is group

    def complete_durable(self) -> None:
        while self.durable_tokens and not self.failed:
            token = self.durable_tokens.pop(0)
            for group, ready, sent in self.waiting.pop(token, ()):
                self.complete(group, ready, sent)

    def may_send_before_persist(self, group: Group, ready: Ready) -> bool:
        """A leader's AppendEntries may go out while the same entries are being
        written (Raft thesis §10.2.1; etcd-raft allows it): they promise nothing
        durable, and the leader counts its own log toward a quorum only once
        `advance` reports it stable. Not when the Ready changes the term or the
        vote (those must be durable before anyone hears of them) or installs a
        snapshot. Saves one fsync on the path to commit."""
        raft = group.raft
        if raft.role != Role.LEADER or ready.snapshot is not None or not ready.messages:
            return False
        hard = ready.hard_state
        previous = raft.prev_hard_state
        return hard is None or (hard.term == previous.term and hard.voted_for == previous.voted_for)

    @staticmethod
    def only_commit_advances(group: Group, ready: Ready) -> bool:
        """Whether all `ready` would write is a higher commit index: no entries,
        snapshot or truncation, term and vote unchanged. Its committed entries
        are then durable here already (earlier Readies) and on a majority, and
        its messages promise nothing new, so it completes at once, and it is
        not written on its own (raft/carried_commits.py): a lone publish costs one
        fsync, not two."""
        hard = ready.hard_state
        previous = group.raft.prev_hard_state
        return (hard is not None and not ready.entries and ready.snapshot is None and ready.truncate_from is None
                and hard.term == previous.term and hard.voted_for == previous.voted_for)

    # --- commit indexes carried by the next batch (raft/carried_commits.py) ---------------------

    @property
    def carried(self) -> dict[GroupId, tuple[Group, PersistItem]]:
        return self.carried_commits.by_group

    def take_carried_commits(self) -> list[PersistItem]:
        """Every commit index waiting for a batch, of groups still hosted."""
        return self.carried_commits.take(self.still_hosted)

    def persist_carried_commits(self) -> None:
        """Hand the waiting commit indexes to storage now (a clean shutdown:
        the next start then re-applies everything without waiting for a
        leader). Nothing waits for that batch."""
        to_persist = self.take_carried_commits()
        if to_persist:
            self.counters.persist_calls += 1
            self.counters.persist_items += len(to_persist)
            self.persist(to_persist)

    def queue_messages(self, group_id: GroupId, messages: Iterable[Message]) -> None:
        for message in messages:
            self.queue(node_of(message.to), [group_id, to_wire(message)])

    def complete(self, group: Group, ready: Ready, messages_sent: bool = False) -> None:
        """`ready` is durable: send its messages (unless they went out already,
        see `may_send_before_persist`), apply, advance (etcd-raft order). An
        exception on the way is the group's failure (`fail_group`), not the
        node's: the other groups of the batch are completed all the same."""
        if not self.still_hosted(group):
            return
        try:
            self.complete_group(group, ready, messages_sent)
        except Exception as error:  # noqa: BLE001 -- contained to the group, reported by fail_group
            self.fail_group(group.group_id, error)

    def complete_group(self, group: Group, ready: Ready, messages_sent: bool) -> None:
        group_id, raft = group.group_id, group.raft
        if not messages_sent:
            self.queue_messages(group_id, ready.messages)
        if ready.snapshot is not None:
            assert self.install_snapshot is not None, "a snapshot arrived but no install_snapshot callback was given"
            self.install_snapshot(group_id, ready.snapshot)
        for entry in ready.committed_entries:
            self.apply(group_id, entry)
            if not self.still_hosted(group):
                return   # the group dropped itself: nothing of it is left to advance
        raft.advance(ready)
        if ready.soft_state is not None and self.on_role_change is not None:
            leader = ready.soft_state.leader_id
            self.on_role_change(group_id, Role(ready.soft_state.role), leader and node_of(leader), raft.term)
            if not self.still_hosted(group):
                return
        self.index_members(group)
        self.touch(group)   # advance may have committed (leader) or left work behind

    def queue(self, peer: str, item: list) -> None:
        self.outbox.setdefault(peer, []).append(item)
        self.request()

    def flush(self) -> None:
        """One frame per peer node with everything queued for it this turn."""
        outbox, self.outbox = self.outbox, {}
        for peer, items in outbox.items():
            if peer in self.down_nodes:
                self.counters.messages_dropped += len(items)
                continue
            for start in range(0, len(items), self.frame_max_messages):
                frame = items[start:start + self.frame_max_messages]
                self.counters.frames_sent += 1
                self.counters.messages_sent += len(frame)
                self.send(peer, frame)
