"""One Raft group as the node-wide system hosts it, what it hands to storage,
what it reports as metrics, and when it may fall quiet.

Theory of operation. `raft.system.RaftSystem` keeps one `Group` per queue:
the pure `RaftNode` plus the bookkeeping the system needs to batch many
groups into one storage write and one frame per peer (which nodes the group
has members on, whether it is quiescent, how long it has been idle).

Quiescence (after rabbitmq/ra, where idle groups send nothing and failure
detection is per node, and CockroachDB's "quiesce heartbeats"). A group whose
leader has nothing to do stops being ticked, on every member:

* The leader falls quiet when, for `quiesce_after_ticks` consecutive ticks,
  `leader_may_quiesce` holds: it is the leader of its own configuration, has
  no Ready outstanding or pending, no leadership transfer, everything in its
  log is committed (in its own term) and applied, and every voter on a node
  the failure detector calls up has acknowledged its whole log -- at least a
  quorum of them. It then sends each of those voters one last heartbeat
  marked "quiesce" (its commit index, which every one of them holds) and is
  no longer ticked: no heartbeats, no check-quorum rounds.
* A follower that gets a quiesce heartbeat steps it as any heartbeat (it
  resets its election timer and learns the commit index) and falls quiet if
  `follower_may_quiesce` holds: it follows the sender in the sender's term
  and its log ends exactly at that commit index. Otherwise it stays awake.
* Anything wakes a group: a proposal the leader accepts, any message (except
  a quiesce heartbeat the follower can honour, and the answers a quiet leader
  gets to its quiesce heartbeats), and the failure detector's `peer_down` /
  `peer_up` for a node that holds one of its members. A woken group is
  ticked again from where its timers stopped, and falls quiet again once it
  has nothing to do (with a member's node down: without that member).

Safety. Raft's safety properties (election safety, log matching, leader
completeness, state machine safety; Raft Figure 3) never depend on timers:
not ticking a group is indistinguishable from a node whose clock is
arbitrarily slow, which Raft tolerates. The quiesce heartbeat is exactly the
Heartbeat the core itself would send (term and commit index are durable:
the group has no Ready outstanding), so it promises nothing new. What timers
do buy is liveness and the lease, and both are affected:

* Liveness comes from the failure detector instead of election timeouts:
  when a node holding a member goes down, its groups wake on the other
  nodes. Those it led forget that leader (`RaftNode.forget_leader`, so the
  lease below no longer blocks votes) and one survivor, the same one by
  every survivor's reckoning, campaigns at once: a new leader about one
  pre-vote and one vote round trip later (`RaftSystem.elect_without`). If
  that campaign fails (the survivors' detectors disagree, or the campaigner's
  log is behind the other survivors'), the election timers still elect
  within about two election timeouts (a woken follower's frozen lease
  expires after `election_ticks` ticks, its randomized timeout fires within
  `2 * election_ticks`). A follower woken alone (an asymmetric report)
  campaigns with a pre-vote, which wakes the leader and the other
  followers; the leader resumes heartbeats and the pre-vote changes no term.
* The lease (thesis §4.2.3, §6.2). A quiet follower's election timer is
  frozen inside its lease, so it ignores vote requests until it is woken and
  `election_ticks` ticks pass, or until it forgets its leader on that
  leader's `peer_down`: this only delays elections, never allows two
  leaders (votes are persisted, one per term, §5.2). A quiet leader runs no
  check-quorum, so it may be deposed without knowing it; it is then a stale
  leader as under any partition: its proposals wake it, reach no quorum, and
  the first answer with a higher term makes it step down. Hence a quiet
  leader holds NO lease: any future lease-based read must wake the group and
  confirm leadership with a heartbeat round (ReadIndex, thesis §6.4) first.
  The core today offers no lease reads, so nothing relies on it.
* On waking, the leader's first check-quorum round may count answers from
  before it fell quiet (the `recent_active` marks were frozen too): loss of
  quorum is detected one election timeout later than usual, at most.
"""
from __future__ import annotations

from dataclasses import dataclass

from warren.raft.core import RaftNode, Ready
from warren.raft.member_ids import node_of
from warren.raft.messages import Entry, HardState, Heartbeat, Role, Snapshot

GroupId = int | str   # msgpack-able; the WAL's log_id when an int

# The optional third element of a frame item: the heartbeat is the leader's last.
QUIESCE = 1


@dataclass(frozen=True, slots=True)
class PersistItem:
    """What one group's Ready asks storage to make durable, in this order:
    the snapshot (replacing the group's whole log), dropping stored entries
    from `truncate_from`, appending `entries`, then `hard_state`."""
    group_id: GroupId
    hard_state: HardState | None
    snapshot: Snapshot | None
    truncate_from: int | None
    entries: tuple[Entry, ...]


@dataclass(frozen=True, slots=True)
class GroupMetrics:
    group_id: GroupId
    term: int
    commit_index: int
    last_applied: int
    role: str
    leader_id: str | None
    member_count: int
    log_entries: int      # entries held in memory (after the snapshot)
    quiescent: bool


class Group:
    __slots__ = ("group_id", "raft", "members", "quiescent", "quiet_ticks")

    def __init__(self, group_id: GroupId, raft: RaftNode) -> None:
        self.group_id = group_id
        self.raft = raft
        # the voters the system indexed this group under (for peer_down/up)
        self.members: tuple[str, ...] = ()
        self.quiescent = False
        # consecutive ticks during which the leader had nothing to do
        self.quiet_ticks = 0

    def metrics(self) -> GroupMetrics:
        status = self.raft.status()
        return GroupMetrics(self.group_id, status.term, status.commit_index, status.last_applied,
                            status.role.value, status.leader_id, len(status.voters), status.log_entries,
                            self.quiescent)


def persist_item(group_id: GroupId, ready: Ready) -> PersistItem | None:
    """The storage work in `ready`, or None when it needs none (only
    messages, a role change, or entries already durable to apply)."""
    if ready.hard_state is None and ready.snapshot is None and not ready.entries and ready.truncate_from is None:
        return None
    return PersistItem(group_id, ready.hard_state, ready.snapshot, ready.truncate_from, ready.entries)


def leader_may_quiesce(raft: RaftNode, down_nodes: set[str] | frozenset[str]) -> bool:
    """Whether a leader has nothing left to do (see the module docstring).
    Voters on down nodes are left out; the rest must be a caught-up quorum."""
    return raft.is_idle([voter for voter in raft.voters if node_of(voter) in down_nodes] if down_nodes else ())


def quiesce_heartbeats(raft: RaftNode, down_nodes: set[str] | frozenset[str]) -> list[Heartbeat]:
    """The leader's last heartbeat to each voter that is up. Every one of them
    holds the commit index (leader_may_quiesce), so it is the heartbeat the
    core would send: min(commit, match) == commit."""
    return [Heartbeat(raft.term, raft.node_id, voter, raft.commit_index)
            for voter in raft.voters if voter != raft.node_id and node_of(voter) not in down_nodes]


def follower_may_quiesce(raft: RaftNode, heartbeat: Heartbeat) -> bool:
    """After stepping a quiesce heartbeat: the follower follows its sender in
    its term and holds, and has committed, exactly the leader's log."""
    status = raft.status()
    return (status.role == Role.FOLLOWER and status.term == heartbeat.term and status.leader_id == heartbeat.sender
            and status.commit_index == heartbeat.commit_index and status.last_index == heartbeat.commit_index)
