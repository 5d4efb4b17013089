"""One Raft group as a pure, deterministic state machine (etcd-raft style).

Theory of operation. A `RaftNode` does no I/O and reads no clock: time is
`tick()` calls, randomness is the `random.Random` it is handed, and the
network and disk belong to the caller. The caller feeds inputs -- `tick()`,
`step(message)`, `propose(data)`, `propose_conf_change(op, node_id)`,
`transfer_leadership(to)`, `compact(index, data)`, `forget_leader()` --
and then drains effects with `ready()`, and for each Ready, in this order:

1. persists `snapshot` (replacing its whole log), drops stored entries from
   `truncate_from`, appends `entries`, and persists `hard_state`;
2. sends `messages` (they may promise what step 1 made durable: votes,
   AppendEntries acknowledgements, Raft Figure 2 "Persistent state");
3. installs `snapshot` in the state machine, then applies
   `committed_entries` in order;
4. calls `advance(ready)`.

At most one Ready is outstanding. The leader counts its own log toward a
commit quorum only once it is persisted (after `advance`).

The rules come from the Raft paper (§5 basics, §7 snapshots) and Ongaro's
thesis: single-server membership changes (§4.1: a configuration takes effect
when its entry is appended, one change at a time), leadership transfer
(§3.10), check-quorum and the leader lease (§6.2, §4.2.3), pre-vote (§9.6).
The replication pacing (progress states, pipelining) lives in replication.py,
the elections (vote handling, pre-vote, the lease) in election.py.

Reading the node. `status()` is a frozen snapshot of what a host may look at
(term, role, leader, log bounds, per-voter match on a leader);
`is_idle(unreachable)` is the leader's "nothing left to do" test used for
quiescence (raft/group.py). Hosts use these rather than the attributes behind
them (`log`, `progress`, `outstanding`, ...), which are the core's own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from warren.raft import election, replication
from warren.raft.log import RaftLog
from warren.raft.messages import (
    AppendEntries,
    AppendEntriesResponse,
    ConfigChange,
    ConfigChangeOp,
    Entry,
    EntryKind,
    HardState,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    Message,
    RequestVote,
    RequestVoteResponse,
    Role,
    Snapshot,
    SoftState,
    TimeoutNow,
)
from warren.raft.progress import Progress

if TYPE_CHECKING:
    import random
    from collections.abc import Collection


@dataclass(frozen=True, slots=True)
class Status:
    """A read-only view of one node at one moment (`RaftNode.status()`)."""
    node_id: str
    term: int
    voted_for: str | None
    role: Role
    leader_id: str | None
    voters: tuple[str, ...]
    commit_index: int
    last_applied: int
    last_index: int           # of the log (the snapshot's index when it holds no entries)
    last_term: int
    snapshot_index: int
    log_entries: int          # entries held in memory, after the snapshot
    ready_outstanding: bool   # a Ready was taken and not advanced yet
    lead_transferee: str | None
    # on a leader: (voter, match_index) for every voter, sorted; empty otherwise
    match_indexes: tuple[tuple[str, int], ...]

    @property
    def quorum(self) -> int:
        return len(self.voters) // 2 + 1

    def match_index(self, voter: str) -> int | None:
        """What the leader knows `voter` holds; None when not a leader or not a voter."""
        for name, match in self.match_indexes:
            if name == voter:
                return match
        return None


@dataclass(frozen=True, slots=True)
class Ready:
    hard_state: HardState | None
    soft_state: SoftState | None
    snapshot: Snapshot | None
    truncate_from: int | None
    entries: tuple[Entry, ...]
    messages: tuple[Message, ...]
    committed_entries: tuple[Entry, ...]


class RaftStorageView(Protocol):
    """What a node recovered from its storage at start."""

    def initial_state(self) -> tuple[HardState, Snapshot | None, list[Entry]]: ...


@dataclass(frozen=True, slots=True)
class RecoveredState:
    hard_state: HardState
    snapshot: Snapshot | None
    entries: list[Entry]

    def initial_state(self) -> tuple[HardState, Snapshot | None, list[Entry]]:
        return self.hard_state, self.snapshot, self.entries


class RaftNode:
    def __init__(self, node_id: str, peers: list[str], rng: random.Random,
                 election_ticks: int = 10, heartbeat_ticks: int = 1,
                 storage: RaftStorageView | None = None, pre_vote: bool = True,
                 check_quorum: bool = True, max_message_bytes: int = 1 << 20, eager_commit: bool = True,
                 max_inflight_messages: int = 256, max_inflight_bytes: int = 32 << 20) -> None:
        assert heartbeat_ticks >= 1
        assert election_ticks > heartbeat_ticks, "followers would time out between heartbeats"
        assert not peers or node_id in peers or storage is not None, "peers must include node_id"
        self.node_id = node_id
        self.rng = rng
        self.election_ticks = election_ticks
        self.heartbeat_ticks = heartbeat_ticks
        self.pre_vote, self.check_quorum = pre_vote, check_quorum
        self.eager_commit = eager_commit   # see replication.flush
        self.max_message_bytes = max_message_bytes
        self.max_inflight_messages = max_inflight_messages
        self.max_inflight_bytes = max_inflight_bytes
        hard_state, snapshot, entries = storage.initial_state() if storage else (HardState(), None, [])
        if snapshot is None:
            snapshot = Snapshot(0, 0, tuple(sorted(peers)), b"")
        self.log = RaftLog(snapshot, entries, hard_state.commit_index)
        self.term = hard_state.term
        self.voted_for = hard_state.voted_for
        self.config_index, self.voters = self.log.config_at(self.log.last_index())
        self.role = Role.FOLLOWER
        self.leader_id: str | None = None
        self.votes: dict[str, bool] = {}
        self.progress: dict[str, Progress] = {}
        self.lead_transferee: str | None = None
        self.pending_config_index = 0
        self.messages: list[Message] = []
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_election_timeout = election_ticks
        self.broadcast_pending = False
        self.commit_broadcast_pending = False
        self.prev_hard_state = HardState(self.term, self.voted_for, self.log.commit_index)
        self.prev_soft_state = SoftState(None, Role.FOLLOWER.value)
        self.outstanding: Ready | None = None
        self.become_follower(self.term, None)

    @classmethod
    def restore(cls, node_id: str, peers: list[str], rng: random.Random, *, hard_state: HardState,
                entries: list[Entry], snapshot: Snapshot | None = None, **options) -> RaftNode:
        """A node rebuilt from what it persisted: its state machine is the
        snapshot's, so committed entries after it are applied again."""
        return cls(node_id, peers, rng, storage=RecoveredState(hard_state, snapshot, entries), **options)

    # --- read-only views for metrics and tests ---------------------------------

    @property
    def commit_index(self) -> int:
        return self.log.commit_index

    @property
    def last_applied(self) -> int:
        return self.log.applied_index

    def is_promotable(self) -> bool:
        """Only a member of its own latest configuration campaigns (§4.2.2)."""
        return self.node_id in self.voters

    def quorum(self) -> int:
        return len(self.voters) // 2 + 1

    def status(self) -> Status:
        """What a host may read about this node (metrics, quiescence, tests)."""
        log = self.log
        match = tuple(sorted((voter, progress.match_index) for voter, progress in self.progress.items()
                             if voter in self.voters)) if self.role == Role.LEADER else ()
        return Status(self.node_id, self.term, self.voted_for, self.role, self.leader_id, self.voters,
                      log.commit_index, log.applied_index, log.last_index(), log.last_term(),
                      log.snapshot_index, len(log.entries), self.outstanding is not None,
                      self.lead_transferee, match)

    def awaiting_advance(self) -> bool:
        """Whether a Ready was taken and not advanced yet (`ready()` must wait)."""
        return self.outstanding is not None

    def is_idle(self, unreachable: Collection[str] = ()) -> bool:
        """A leader with nothing left to do: it leads its own configuration,
        has no Ready outstanding or pending and no leadership transfer;
        everything in its log is committed (an entry of its own term last)
        and applied; and every voter outside `unreachable` has acknowledged
        the whole log -- at least a quorum of them. Cheaper than `status()`:
        a host may ask it of every awake group on every tick."""
        if self.role != Role.LEADER or self.outstanding is not None or self.lead_transferee is not None:
            return False
        if self.node_id not in self.voters or self.has_ready():
            return False
        log = self.log
        last_index = log.last_index()
        if log.commit_index != last_index or log.applied_index != last_index or log.last_term() != self.term:
            return False
        caught_up = 0
        for voter in self.voters:
            if voter in unreachable:
                continue
            progress = self.progress.get(voter)
            if progress is None or progress.match_index != last_index:
                return False
            caught_up += 1
        return caught_up >= self.quorum()

    # --- inputs ----------------------------------------------------------------------

    def tick(self) -> None:
        if self.role == Role.LEADER:
            self.tick_heartbeat()
        else:
            self.tick_election()

    def tick_election(self) -> None:
        self.election_elapsed += 1
        if self.is_promotable() and self.election_elapsed >= self.randomized_election_timeout:
            self.election_elapsed = 0
            self.campaign()

    def tick_heartbeat(self) -> None:
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        if self.election_elapsed >= self.election_ticks:
            self.election_elapsed = 0
            # §6.2: a leader that has not heard from a quorum for an election
            # timeout steps down, so clients look for the real leader.
            quorum_active = replication.quorum_recently_active(self)
            if self.check_quorum and not quorum_active:
                self.become_follower(self.term, None)
                return
            self.lead_transferee = None  # §3.10: a transfer that takes this long is aborted
            replication.restart_stalled(self)
        if self.heartbeat_elapsed >= self.heartbeat_ticks:
            self.heartbeat_elapsed = 0
            replication.broadcast_heartbeat(self)

    def propose(self, data: bytes) -> int | None:
        """Append `data` on the leader; the index it will have, or None when
        this node is not the leader or is handing leadership over (§3.10)."""
        if self.role != Role.LEADER or self.lead_transferee is not None:
            return None
        return self.append_as_leader(EntryKind.NORMAL, data)

    def propose_conf_change(self, op: ConfigChangeOp | str, node_id: str) -> int | None:
        """Add or remove one voter (thesis §4.1). Refused (None) while an
        earlier change is uncommitted: the leader's first entry of its term
        must commit first too (pending_config_index starts at its no-op)."""
        op = ConfigChangeOp[op.upper()] if isinstance(op, str) else op
        if self.role != Role.LEADER or self.lead_transferee is not None:
            return None
        if self.pending_config_index > self.log.commit_index:
            return None
        if op == ConfigChangeOp.ADD:
            if node_id in self.voters:
                return None
            voters = tuple(sorted(self.voters + (node_id,)))
        else:
            if node_id not in self.voters or len(self.voters) == 1:
                return None
            voters = tuple(v for v in self.voters if v != node_id)
        change = ConfigChange(op, node_id, voters)
        index = self.append_as_leader(EntryKind.CONFIG, change.encode())
        self.pending_config_index = index
        return index

    def transfer_leadership(self, to: str) -> bool:
        """Thesis §3.10: stop taking proposals, bring `to` up to date, then
        send it TimeoutNow. Aborted after an election timeout."""
        if self.role != Role.LEADER or to == self.node_id or to not in self.voters:
            return False
        if self.lead_transferee == to:
            return True
        self.lead_transferee = to
        self.election_elapsed = 0
        if self.progress[to].match_index == self.log.last_index():
            self.send(TimeoutNow(self.term, self.node_id, to))
        else:
            replication.send_appends(self, to)
        return True

    def compact(self, index: int, snapshot_data: bytes) -> Snapshot:
        """Raft §7: the application captured everything up to `index` (which it
        has applied) in `snapshot_data` and persisted it; drop that prefix.
        Returns the snapshot the log now starts with (an earlier one when
        `index` is not beyond it)."""
        assert index <= self.log.applied_index, f"compact({index}) beyond last_applied {self.log.applied_index}"
        if index > self.log.snapshot_index:
            _, voters = self.log.config_at(index)
            self.log.compact(Snapshot(index, self.log.term(index), voters, snapshot_data))
        return self.log.snapshot

    def forget_leader(self) -> bool:
        """A follower stops believing in its leader (etcd-raft's ForgetLeader),
        in the same term: told by the host's failure detector that the
        leader's node is gone. With no leader, the lease (§4.2.3, §9.6) no
        longer makes it ignore vote requests, so another node can be elected
        within a pre-vote and a vote round trip instead of after the lease
        and an election timeout. Its own
        election timer runs on unchanged, and a message from the leader in
        this term makes it follow again.

        Safety does not depend on it: votes stay one per term and durable
        (§5.2); the lease only protects a live leader from disruption. It
        would break a lease-based read (the leader's lease assumes followers
        keep ignoring votes), so if lease reads are ever added, this must be
        refused while they are on (etcd-raft refuses it under
        ReadOnlyLeaseBased). Returns whether it forgot anything: leaders,
        (pre-)candidates and followers without a leader are left as they are."""
        if self.role != Role.FOLLOWER or self.leader_id is None:
            return False
        self.leader_id = None
        return True

    def campaign(self, transfer: bool = False) -> None:
        """Start an election (§5.2), behind a pre-vote round (§9.6) unless
        this is a leadership transfer, which must not wait."""
        if not self.is_promotable() or self.role == Role.LEADER:
            return
        if self.pre_vote and not transfer:
            self.become_pre_candidate()
            election.request_votes(self, pre_vote=True, transfer=False)
        else:
            self.become_candidate()
            election.request_votes(self, pre_vote=False, transfer=transfer)

    def step(self, message: Message) -> None:
        assert message.to == self.node_id, f"{self.node_id} got a message for {message.to}"
        if message.term > self.term:
            if not election.on_higher_term(self, message):
                return
        elif message.term < self.term:
            election.on_lower_term(self, message)
            return
        match message:
            case RequestVote():
                election.on_request_vote(self, message)
            case RequestVoteResponse():
                election.on_request_vote_response(self, message)
            case AppendEntries():
                self.on_append_entries(message)
            case AppendEntriesResponse():
                replication.on_append_entries_response(self, message)
            case Heartbeat():
                self.on_heartbeat(message)
            case HeartbeatResponse():
                replication.on_heartbeat_response(self, message)
            case InstallSnapshot():
                self.on_install_snapshot(message)
            case TimeoutNow():
                election.on_timeout_now(self, message)
            case _:
                raise AssertionError(f"unknown message {message!r}")

    # --- output: the Ready contract ------------------------------------------------

    def has_ready(self) -> bool:
        """Whether `ready()` has something (cheap, no side effects); a leader
        with a pending broadcast to paused followers may get None after all."""
        if self.outstanding is not None:
            return False
        return bool(
            self.messages or self.log.pending_snapshot is not None
            or self.log.stable_index < self.log.last_index()
            or self.log.commit_index > self.log.applied_index
            or (self.role == Role.LEADER and (self.broadcast_pending or self.commit_broadcast_pending))
            or HardState(self.term, self.voted_for, self.log.commit_index) != self.prev_hard_state
            or SoftState(self.leader_id, self.role.value) != self.prev_soft_state)

    def ready(self) -> Ready | None:
        assert self.outstanding is None, "advance() the previous Ready first"
        if self.role == Role.LEADER:
            replication.flush(self)
        hard_state = HardState(self.term, self.voted_for, self.log.commit_index)
        soft_state = SoftState(self.leader_id, self.role.value)
        entries = self.log.unstable_entries()
        truncate_from = None
        if entries and entries[0].index <= self.log.storage_last_index:
            truncate_from = entries[0].index
        committed = self.log.committed_unapplied(self.log.applied_index)
        ready = Ready(
            hard_state=hard_state if hard_state != self.prev_hard_state else None,
            soft_state=soft_state if soft_state != self.prev_soft_state else None,
            snapshot=self.log.pending_snapshot, truncate_from=truncate_from,
            entries=tuple(entries), messages=tuple(self.messages),
            committed_entries=tuple(committed))
        if not (ready.hard_state or ready.soft_state or ready.snapshot or ready.entries
                or ready.messages or ready.committed_entries):
            return None
        self.messages = []
        self.prev_soft_state = soft_state
        self.outstanding = ready
        return ready

    def advance(self, ready: Ready) -> None:
        """Everything in `ready` was persisted, sent and applied."""
        assert ready is self.outstanding, "advance() takes the Ready last returned"
        self.outstanding = None
        if ready.hard_state is not None:
            self.prev_hard_state = ready.hard_state
        if ready.snapshot is not None:
            if self.log.pending_snapshot is ready.snapshot:
                self.log.pending_snapshot = None
            self.log.applied_index = max(self.log.applied_index, ready.snapshot.index)
        if ready.entries and self.log.pending_snapshot is None:
            last = ready.entries[-1]
            self.log.stable_to(last.index, last.term)
            self.log.storage_last_index = last.index
        if ready.committed_entries:
            last_index = ready.committed_entries[-1].index
            assert last_index <= self.log.commit_index
            self.log.applied_index = max(self.log.applied_index, last_index)
        if self.role == Role.LEADER:
            # The leader's own log counts toward a quorum once durable (§5.3).
            self.progress[self.node_id].maybe_update(self.log.stable_index)
            replication.maybe_commit(self)

    # --- role transitions ------------------------------------------------------------

    def reset(self, term: int) -> None:
        if term != self.term:
            assert term > self.term, "terms only grow"
            self.term = term
            self.voted_for = None
        self.leader_id = None
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        # §5.2: randomized in [T, 2T) so that split votes are rare.
        self.randomized_election_timeout = self.election_ticks + self.rng.randrange(self.election_ticks)
        self.votes = {}
        self.progress = {}
        self.lead_transferee = None
        self.broadcast_pending = False
        self.commit_broadcast_pending = False

    def become_follower(self, term: int, leader_id: str | None) -> None:
        self.reset(term)
        self.role = Role.FOLLOWER
        self.leader_id = leader_id

    def become_pre_candidate(self) -> None:
        # §9.6: neither the term nor the vote changes until pre-votes are in.
        assert self.role != Role.LEADER
        self.role = Role.PRE_CANDIDATE
        self.leader_id = None
        self.votes = {}

    def become_candidate(self) -> None:
        assert self.role != Role.LEADER
        self.reset(self.term + 1)
        self.voted_for = self.node_id
        self.role = Role.CANDIDATE

    def become_leader(self) -> None:
        assert self.role == Role.CANDIDATE
        self.reset(self.term)
        self.role = Role.LEADER
        self.leader_id = self.node_id
        last_index = self.log.last_index()
        for voter in sorted(set(self.voters) | {self.node_id}):
            self.progress[voter] = self.new_progress(last_index + 1)
        own = self.progress[self.node_id]
        own.maybe_update(self.log.stable_index)
        own.recent_active = True
        # §4.1 (and the single-server change bug fix): no config change until
        # an entry of this term, the no-op below, is committed.
        self.pending_config_index = last_index + 1
        # §5.4.2, §8: a no-op entry of the new term commits the earlier ones.
        self.append_as_leader(EntryKind.NOOP, b"")

    def new_progress(self, next_index: int) -> Progress:
        return Progress(next_index, self.max_inflight_messages, self.max_inflight_bytes)

    # --- following -------------------------------------------------------------------

    def follow(self, leader_id: str) -> None:
        """Any message of the current term from its leader (§5.2)."""
        assert self.role != Role.LEADER, f"two leaders in term {self.term}"
        if self.role != Role.FOLLOWER:
            self.become_follower(self.term, leader_id)
        self.leader_id = leader_id
        self.election_elapsed = 0

    def on_append_entries(self, message: AppendEntries) -> None:
        self.follow(message.sender)
        self.send(replication.handle_append_entries(self, message))

    def on_heartbeat(self, message: Heartbeat) -> None:
        self.follow(message.sender)
        # The leader sends min(its commit, our match): we hold that prefix.
        assert message.commit_index <= self.log.last_index(), "heartbeat commit beyond our log"
        self.log.commit_to(message.commit_index)
        self.send(HeartbeatResponse(self.term, self.node_id, message.sender))

    def on_install_snapshot(self, message: InstallSnapshot) -> None:
        self.follow(message.sender)
        snapshot = message.snapshot
        if snapshot.index <= self.log.commit_index:
            match_index = self.log.commit_index
        elif self.log.match_term(snapshot.index, snapshot.term):
            self.log.commit_to(snapshot.index)  # we hold its prefix already
            match_index = snapshot.index
        else:
            self.log.restore(snapshot)          # Raft §7: discard the entire log
            self.config_index, self.voters = snapshot.index, snapshot.voters
            match_index = snapshot.index
        self.send(AppendEntriesResponse(self.term, self.node_id, message.sender, True, match_index))

    # --- leading ---------------------------------------------------------------------

    def append_as_leader(self, kind: EntryKind, data: bytes) -> int:
        index = self.log.last_index() + 1
        self.log.append([Entry(self.term, index, kind, data)])
        if kind == EntryKind.CONFIG:
            self.apply_config(index, ConfigChange.decode(data).voters)
        self.broadcast_pending = True
        return index

    def apply_config(self, config_index: int, voters: tuple[str, ...]) -> None:
        """Thesis §4.1: a configuration is used as soon as its entry is in the log."""
        self.config_index, self.voters = config_index, voters
        if self.role != Role.LEADER:
            return
        for voter in voters:
            if voter not in self.progress:
                self.progress[voter] = self.new_progress(self.log.last_index())
                self.progress[voter].recent_active = True
        for node_id in list(self.progress):
            if node_id not in voters and node_id != self.node_id:
                del self.progress[node_id]
        if self.lead_transferee is not None and self.lead_transferee not in voters:
            self.lead_transferee = None

    def send(self, message: Message) -> None:
        self.messages.append(message)
