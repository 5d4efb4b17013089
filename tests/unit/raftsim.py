"""A seeded, deterministic simulator for a Raft group (TigerBeetle's VOPR idea).

Theory of operation. One `random.Random(seed)` drives everything: the
network (per-message delay in ticks, drops, duplicates, hence reorders;
partitions that come and heal), crashes and restarts, the client's
proposals, membership changes, leadership transfers and compactions. A
crashed node loses everything it had not persisted through a Ready: its
storage (`SimStorage`) holds only what Ready processing wrote, and a crash may
even interrupt that processing part-way (a prefix of the Ready's records
lands, nothing is sent). Ready processing itself happens at random moments
after each input, so a crash often finds in-memory state (votes, entries,
messages) that never reached disk.

After every step `check_safety` checks Raft's safety properties (§5.2, §5.3,
§5.4; Figure 3) over the whole history; `run()` ends with a liveness phase
(faults off, partitions healed, every node up) that must reach a leader and
identical applied sequences on every voter, containing every proposal the
client saw committed. Every failure raises `SimulationFailure`, whose message
names the seed, the replay command, and the recent events.
"""
from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import dataclass, field

import msgpack

from warren.raft.core import RaftNode, Ready
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
    TimeoutNow,
)


class SimulationFailure(AssertionError):
    pass


@dataclass(frozen=True)
class Scenario:
    name: str
    node_count: int = 3
    spare_count: int = 0            # nodes outside the initial configuration
    steps: int = 300
    max_delay_ticks: int = 3
    drop_rate: float = 0.03
    duplicate_rate: float = 0.02
    partition_rate: float = 0.01    # per step: cut off a random subset
    heal_rate: float = 0.05         # per step: heal all partitions
    crash_rate: float = 0.01
    restart_rate: float = 0.08
    propose_rate: float = 0.5
    conf_change_rate: float = 0.0
    transfer_rate: float = 0.0
    compact_rate: float = 0.0
    forget_rate: float = 0.0        # per step and follower: forget_leader(), as on a peer_down
    ready_rate: float = 0.7         # chance to process a node's Ready right after an input
    election_ticks: int = 10
    pre_vote: bool = True
    check_quorum: bool = True
    max_message_bytes: int = 256    # small, so that batching and its limits are exercised
    max_inflight_messages: int = 4
    quiesce_ticks: int = 400


SCENARIOS = {
    "three": Scenario("three"),
    "five": Scenario("five", node_count=5, max_delay_ticks=4, crash_rate=0.015),
    "membership": Scenario("membership", node_count=3, spare_count=2, conf_change_rate=0.04,
                           compact_rate=0.02),
    "snapshots": Scenario("snapshots", compact_rate=0.1, crash_rate=0.02, drop_rate=0.08),
    "transfer": Scenario("transfer", node_count=5, transfer_rate=0.03, partition_rate=0.02),
    # Crash-restart storms with plain elections: split votes, lost votes.
    # Followers forget their leader at random (a failure detector's false
    # alarms) and half the time campaign at once: the lease stops protecting
    # the leader, never safety.
    "forget": Scenario("forget", node_count=5, forget_rate=0.03, partition_rate=0.02),
    "chaos": Scenario("chaos", node_count=5, crash_rate=0.1, restart_rate=0.5, pre_vote=False,
                      check_quorum=False, max_delay_ticks=5, election_ticks=6, ready_rate=0.4),
}


def replay_command(scenario: str, seed: int) -> str:
    return (f"WARREN_RAFT_SEED={seed} .venv/bin/pytest tests/unit/test_raft_simulation.py "
            f"-k 'replay and {scenario}'")


class SimStorage:
    """What one node made durable: hard state, snapshot, entries after it."""

    def __init__(self) -> None:
        self.hard_state = HardState()
        self.snapshot: Snapshot | None = None
        self.entries: list[Entry] = []

    def first_index(self) -> int:
        return (self.snapshot.index if self.snapshot else 0) + 1

    def persist(self, ready: Ready, rng: random.Random | None = None) -> bool:
        """Write the Ready's records in order; with `rng`, a crash tears the
        write after a random number of records. Returns whether all landed."""
        records: list[tuple[str, object]] = []
        if ready.snapshot is not None:
            records.append(("snapshot", ready.snapshot))
        records += [("entry", entry) for entry in ready.entries]
        if ready.hard_state is not None:
            records.append(("hard_state", ready.hard_state))
        keep = len(records) if rng is None else rng.randrange(len(records) + 1)
        for kind, value in records[:keep]:
            if kind == "snapshot":
                self.snapshot, self.entries = value, []
            elif kind == "entry":
                self.write_entry(value)
            else:
                assert value.commit_index >= self.hard_state.commit_index, "persisted commit went back"
                self.hard_state = value
        return keep == len(records)

    def write_entry(self, entry: Entry) -> None:
        position = entry.index - self.first_index()
        assert 0 <= position <= len(self.entries), f"storage hole writing {entry.index}"
        del self.entries[position:]
        self.entries.append(entry)

    def compact(self, snapshot: Snapshot) -> None:
        drop = snapshot.index - self.first_index() + 1
        assert 0 < drop <= len(self.entries), "compacting what storage does not hold"
        assert self.entries[drop - 1].term == snapshot.term
        self.snapshot, self.entries = snapshot, self.entries[drop:]


@dataclass
class SimNode:
    node_id: str
    storage: SimStorage
    raft: RaftNode | None = None
    # the state machine: the NORMAL payloads applied, in order, and where it is
    payloads: list[bytes] = field(default_factory=list)
    applied_index: int = 0
    seen_commit: int = 0          # commit_index seen, for monotonicity within a life


def encode_state(index: int, payloads: list[bytes]) -> bytes:
    return msgpack.packb([index, payloads])


def decode_state(data: bytes) -> tuple[int, list[bytes]]:
    index, payloads = msgpack.unpackb(data)
    return index, [bytes(p) for p in payloads]


class Simulation:
    def __init__(self, scenario: Scenario, seed: int) -> None:
        self.scenario = scenario
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0
        self.events: deque[str] = deque(maxlen=60)
        self.stats: Counter[str] = Counter()   # what happened, to show the run exercised it
        ids = [f"n{i}" for i in range(1, scenario.node_count + scenario.spare_count + 1)]
        self.initial_voters = ids[:scenario.node_count]
        self.nodes = {node_id: SimNode(node_id, SimStorage()) for node_id in ids}
        for node in self.nodes.values():
            self.start(node)
        self.in_flight: list[tuple[int, int, Message]] = []
        self.sequence = 0
        self.cut: set[frozenset[str]] = set()
        self.faults = True
        # history for the safety checks
        self.leader_of_term: dict[int, str] = {}
        self.leaders_seen: set[tuple[int, str]] = set()
        self.entry_data: dict[tuple[int, int], tuple[int, bytes]] = {}
        self.committed: dict[int, Entry] = {}
        self.applied: dict[int, Entry] = {}
        self.durable_commit: dict[str, int] = {}
        # the client
        self.next_payload = 0
        self.leader_hint = self.initial_voters[0]
        self.proposed: dict[bytes, tuple[str, int, int]] = {}
        self.acknowledged: set[bytes] = set()

    # --- reporting ---------------------------------------------------------------------

    def fail(self, why: str) -> None:
        recent = "\n  ".join(self.events)
        raise SimulationFailure(
            f"{why}\n  scenario={self.scenario.name} seed={self.seed} tick={self.now}\n"
            f"  replay: {replay_command(self.scenario.name, self.seed)}\n  recent events:\n  {recent}")

    def check(self, condition: bool, why: str) -> None:
        if not condition:
            self.fail(why)

    def log(self, text: str) -> None:
        self.events.append(f"[{self.now}] {text}")
        words = text.split()
        self.stats[words[1] if words[0] in self.nodes else words[0]] += 1

    # --- node life --------------------------------------------------------------------

    def start(self, node: SimNode) -> None:
        storage = node.storage
        peers = self.initial_voters if node.node_id in self.initial_voters else []
        node.raft = RaftNode.restore(
            node.node_id, peers, random.Random(self.rng.random()),
            hard_state=storage.hard_state, entries=list(storage.entries), snapshot=storage.snapshot,
            election_ticks=self.scenario.election_ticks,
            pre_vote=self.scenario.pre_vote, check_quorum=self.scenario.check_quorum,
            max_message_bytes=self.scenario.max_message_bytes,
            max_inflight_messages=self.scenario.max_inflight_messages)
        if storage.snapshot is not None:
            node.applied_index, node.payloads = decode_state(storage.snapshot.data)
            self.check(node.applied_index == storage.snapshot.index, "snapshot data index mismatch")
        else:
            node.applied_index, node.payloads = 0, []
        node.seen_commit = node.raft.commit_index

    def crash(self, node: SimNode, torn: bool | None = None) -> None:
        """Power loss. If `torn` (by default: at random), it strikes while the
        next Ready is being written: a prefix of it lands, nothing is sent."""
        raft = node.raft
        if torn is None:
            torn = self.rng.random() < 0.5
        if raft is not None and torn:
            ready = raft.ready()
            if ready is not None:
                node.storage.persist(ready, self.rng)
        node.raft = None
        self.log(f"crash {node.node_id}")

    # --- Ready processing: persist, send, apply, advance -----------------------------------

    def process_ready(self, node: SimNode) -> None:
        raft = node.raft
        while raft is not None:
            ready = raft.ready()
            if ready is None:
                return
            self.check_new_entries(node, ready)
            if ready.truncate_from is not None:
                self.log(f"{node.node_id} truncates from {ready.truncate_from}")
            # As RaftSystem.may_send_before_persist: a leader's messages go out before its
            # entries are written, so a crash mid-persist finds them already sent.
            hard = ready.hard_state
            early = (raft.role == Role.LEADER and ready.snapshot is None
                     and (hard is None or (hard.term, hard.voted_for) == (raft.prev_hard_state.term,
                                                                           raft.prev_hard_state.voted_for)))
            if early:
                for message in ready.messages:
                    self.send(message)
            node.storage.persist(ready)
            self.check_durable_commit(node)
            if not early:
                for message in ready.messages:
                    self.send(message)
            if ready.snapshot is not None:
                self.install_snapshot(node, ready.snapshot)
            for entry in ready.committed_entries:
                self.apply(node, entry)
            raft.advance(ready)
            if ready.soft_state is not None:
                self.log(f"{node.node_id} {ready.soft_state.role} term={raft.term} leader={ready.soft_state.leader_id}")

    def install_snapshot(self, node: SimNode, snapshot: Snapshot) -> None:
        index, payloads = decode_state(snapshot.data)
        self.check(index == snapshot.index, f"{node.node_id}: snapshot data says {index}, meta {snapshot.index}")
        expected = [e.data for i, e in sorted(self.applied.items()) if i <= index and e.kind == EntryKind.NORMAL]
        self.check(payloads == expected, f"{node.node_id}: snapshot at {index} differs from what was applied")
        node.applied_index, node.payloads = index, payloads
        self.log(f"{node.node_id} installs snapshot at {index}")

    def apply(self, node: SimNode, entry: Entry) -> None:
        # State machine safety (Figure 3): one entry per index, applied in order.
        self.check(entry.index == node.applied_index + 1,
                   f"{node.node_id} applies {entry.index} after {node.applied_index}")
        self.check(entry.index <= node.storage.hard_state.commit_index,
                   f"{node.node_id} applies {entry.index} beyond its persisted commit "
                   f"{node.storage.hard_state.commit_index}")
        first = self.applied.setdefault(entry.index, entry)
        self.check(first == entry, f"{node.node_id} applies {entry} at {entry.index}, another node applied {first}")
        node.applied_index = entry.index
        if entry.kind == EntryKind.NORMAL:
            node.payloads.append(entry.data)
            hint = self.proposed.get(entry.data)
            if hint is not None and hint[0] == node.node_id and hint[1:] == (entry.index, entry.term):
                self.acknowledged.add(entry.data)   # the client's "confirm"

    # --- the network -------------------------------------------------------------------------

    def send(self, message: Message) -> None:
        scenario = self.scenario
        if self.faults and self.rng.random() < scenario.drop_rate:
            return
        copies = 2 if self.faults and self.rng.random() < scenario.duplicate_rate else 1
        for _ in range(copies):
            delay = self.rng.randint(1, scenario.max_delay_ticks) if self.faults else 1
            self.sequence += 1
            self.in_flight.append((self.now + delay, self.sequence, message))

    def deliver_due(self) -> None:
        due = [item for item in self.in_flight if item[0] <= self.now]
        self.in_flight = [item for item in self.in_flight if item[0] > self.now]
        self.rng.shuffle(due)
        for _, _, message in due:
            target = self.nodes[message.to]
            if target.raft is None or frozenset((message.sender, message.to)) in self.cut:
                continue
            target.raft.step(message)
            self.after_input(target)

    def after_input(self, node: SimNode) -> None:
        if self.rng.random() < self.scenario.ready_rate:
            self.process_ready(node)

    # --- one step of the world ------------------------------------------------------------------

    def step(self) -> None:
        self.now += 1
        for node in self.nodes.values():
            if node.raft is not None:
                node.raft.tick()
                self.after_input(node)
        self.deliver_due()
        if self.faults:
            self.inject_faults()
        self.client_step()
        for node in self.nodes.values():
            if self.rng.random() < 0.5 or not self.faults:
                self.process_ready(node)
        self.check_safety()

    def inject_faults(self) -> None:
        scenario, rng = self.scenario, self.rng
        ids = sorted(self.nodes)
        if rng.random() < scenario.partition_rate:
            side = set(rng.sample(ids, rng.randint(1, len(ids) // 2)))
            self.cut |= {frozenset((a, b)) for a in side for b in ids if b not in side}
            self.log(f"partition {sorted(side)} from the rest")
        if self.cut and rng.random() < scenario.heal_rate:
            self.cut = set()
            self.log("heal partitions")
        live = [n for n in self.nodes.values() if n.raft is not None]
        if live and rng.random() < scenario.crash_rate:
            self.crash(rng.choice(live))
        down = [n for n in self.nodes.values() if n.raft is None]
        if down and rng.random() < scenario.restart_rate:
            node = rng.choice(down)
            self.start(node)
            self.log(f"restart {node.node_id} term={node.raft.term} commit={node.raft.commit_index}")
        self.admin_step()

    def leaders(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.raft is not None and n.raft.role == Role.LEADER]

    def admin_step(self) -> None:
        scenario, rng = self.scenario, self.rng
        for node in self.leaders():
            raft = node.raft
            if rng.random() < scenario.conf_change_rate:
                self.change_membership(node)
            if rng.random() < scenario.transfer_rate:
                to = rng.choice(sorted(raft.voters))
                if raft.transfer_leadership(to):
                    self.log(f"{node.node_id} transfers leadership to {to}")
        if scenario.forget_rate:
            for node in self.nodes.values():
                raft = node.raft
                if raft is not None and rng.random() < scenario.forget_rate and raft.forget_leader():
                    self.log(f"{node.node_id} forgets its leader")
                    if rng.random() < 0.5:
                        raft.campaign()
                        self.log(f"{node.node_id} campaigns at once")
                    self.after_input(node)
        for node in self.nodes.values():
            raft = node.raft
            if raft is not None and rng.random() < scenario.compact_rate:
                if node.applied_index > raft.log.snapshot_index and raft.last_applied == node.applied_index:
                    self.compact(node)

    def change_membership(self, node: SimNode) -> None:
        raft, rng = node.raft, self.rng
        voters = set(raft.voters)
        spares = sorted(set(self.nodes) - voters)
        if spares and (len(voters) <= 3 or rng.random() < 0.5):
            op, target = ConfigChangeOp.ADD, rng.choice(spares)
        elif len(voters) > 3:
            op, target = ConfigChangeOp.REMOVE, rng.choice(sorted(voters))
        else:
            return
        index = raft.propose_conf_change(op, target)
        if index is not None:
            self.log(f"{node.node_id} proposes {op.name} {target} at {index}")
            self.after_input(node)

    def compact(self, node: SimNode) -> None:
        index = node.applied_index
        node.raft.compact(index, encode_state(index, node.payloads))
        node.storage.compact(node.raft.log.snapshot)
        self.log(f"{node.node_id} compacts to {index}")

    def client_step(self) -> None:
        if self.rng.random() >= self.scenario.propose_rate:
            return
        node = self.nodes[self.leader_hint]
        raft = node.raft
        if raft is None or raft.role != Role.LEADER:
            known = raft.leader_id if raft is not None else None
            self.leader_hint = known if known in self.nodes else self.rng.choice(sorted(self.nodes))
            return
        payload = f"p{self.next_payload}".encode()
        index = raft.propose(payload)
        if index is not None:
            self.next_payload += 1
            self.proposed[payload] = (node.node_id, index, raft.term)
            self.after_input(node)

    # --- safety (Raft Figure 3), checked after every step ----------------------------------------

    def check_new_entries(self, node: SimNode, ready: Ready) -> None:
        """Log matching (§5.3): one (index, term) names one entry everywhere."""
        for entry in ready.entries:
            key = (entry.index, entry.term)
            value = (int(entry.kind), entry.data)
            first = self.entry_data.setdefault(key, value)
            self.check(first == value, f"{node.node_id} persists {entry}, another log has {first} there")

    def check_durable_commit(self, node: SimNode) -> None:
        commit_index = node.storage.hard_state.commit_index
        self.check(commit_index >= self.durable_commit.get(node.node_id, 0),
                   f"{node.node_id}: persisted commit went back to {commit_index}")
        self.durable_commit[node.node_id] = commit_index

    def check_safety(self) -> None:
        for node in self.nodes.values():
            raft = node.raft
            if raft is None:
                continue
            self.check(raft.commit_index >= node.seen_commit,
                       f"{node.node_id}: commit_index went back from {node.seen_commit} to {raft.commit_index}")
            self.check_committed_prefix(node, node.seen_commit, raft.commit_index)
            node.seen_commit = raft.commit_index
            if raft.role == Role.LEADER:
                self.check_leader(node)

    def check_committed_prefix(self, node: SimNode, low: int, high: int) -> None:
        """Committed entries agree across nodes: identical committed prefixes."""
        log = node.raft.log
        for index in range(max(low, log.snapshot_index) + 1, high + 1):
            entry = log.entry(index)
            first = self.committed.setdefault(index, entry)
            self.check(first == entry, f"{node.node_id} committed {entry}, another node committed {first}")
        if log.snapshot_index in self.committed:
            self.check(self.committed[log.snapshot_index].term == log.snapshot.term,
                       f"{node.node_id}: snapshot term differs from the committed entry")

    def check_leader(self, node: SimNode) -> None:
        raft = node.raft
        # Election safety (§5.2): at most one leader per term, over all history.
        first = self.leader_of_term.setdefault(raft.term, node.node_id)
        self.check(first == node.node_id, f"two leaders in term {raft.term}: {first} and {node.node_id}")
        if (raft.term, node.node_id) in self.leaders_seen:
            return
        self.leaders_seen.add((raft.term, node.node_id))
        # Leader completeness (§5.4): every entry committed so far is in its log.
        log = raft.log
        for index, entry in self.committed.items():
            if index > log.snapshot_index:
                self.check(index <= log.last_index() and log.entry(index) == entry,
                           f"new leader {node.node_id} (term {raft.term}) lacks committed {entry}")

    # --- running -------------------------------------------------------------------------------

    def heal(self) -> None:
        """Faults off, partitions healed, every node up."""
        self.faults = False
        self.cut = set()
        for node in self.nodes.values():
            if node.raft is None:
                self.start(node)
                self.log(f"restart {node.node_id} for the liveness phase")

    def quiescent(self) -> bool:
        leaders = self.leaders()
        if len(leaders) != 1:
            return False
        leader = leaders[0].raft
        if leader.commit_index != leader.log.last_index() or leader.log.term(leader.commit_index) != leader.term:
            return False
        return all(self.nodes[v].raft.role != Role.CANDIDATE
                   and self.nodes[v].applied_index == leader.commit_index for v in leader.voters)

    def check_liveness(self) -> None:
        self.check(self.quiescent(), f"no single leader with every voter applied after "
                   f"{self.scenario.quiesce_ticks} quiet ticks: " + self.describe())
        leader = self.leaders()[0]
        sequences = {v: self.nodes[v].payloads for v in leader.raft.voters}
        reference = leader.payloads
        for voter, payloads in sequences.items():
            self.check(payloads == reference, f"{voter} applied a different sequence than leader {leader.node_id}")
        missing = self.acknowledged - set(reference)
        self.check(not missing, f"committed proposals lost: {sorted(missing)[:10]}")

    def describe(self) -> str:
        parts = []
        for node in self.nodes.values():
            raft = node.raft
            if raft is None:
                parts.append(f"{node.node_id}: down")
                continue
            parts.append(f"{node.node_id}: {raft.role.value} term={raft.term} leader={raft.leader_id} "
                         f"last={raft.log.last_index()} commit={raft.commit_index} applied={node.applied_index} "
                         f"voters={list(raft.voters)} progress={raft.progress}")
        return "\n    " + "\n    ".join(parts)

    def run(self) -> Simulation:
        try:
            for _ in range(self.scenario.steps):
                self.step()
            self.heal()
            for _ in range(self.scenario.quiesce_ticks):
                self.step()
                if self.quiescent():
                    break
            self.check_liveness()
        except SimulationFailure:
            raise
        except AssertionError as error:   # an assert inside the core
            self.fail(f"assertion in the Raft core: {error!r}")
        return self


# --- a hand-driven cluster for transcript tests ------------------------------------------------

def show(message: Message) -> str:
    """One line per message, the way transcripts spell it."""
    head = f"{message.sender}->{message.to} "
    match message:
        case RequestVote():
            kind = "PreVote" if message.pre_vote else "Vote"
            extra = " transfer" if message.transfer else ""
            return head + f"{kind} term={message.term} last={message.last_log_index}@{message.last_log_term}{extra}"
        case RequestVoteResponse():
            kind = "PreVote" if message.pre_vote else "Vote"
            verdict = "granted" if message.vote_granted else "rejected"
            return head + f"{kind}Response term={message.term} {verdict}"
        case AppendEntries():
            entries = " ".join(show_entry(e) for e in message.entries)
            return (head + f"AppendEntries term={message.term} prev={message.prev_log_index}@{message.prev_log_term} "
                    f"commit={message.leader_commit} [{entries}]")
        case AppendEntriesResponse() if message.success:
            return head + f"AppendEntriesResponse term={message.term} match={message.match_index}"
        case AppendEntriesResponse():
            return (head + f"AppendEntriesResponse term={message.term} reject={message.reject_index} "
                    f"hint={message.conflict_index}@{message.conflict_term}")
        case Heartbeat():
            return head + f"Heartbeat term={message.term} commit={message.commit_index}"
        case HeartbeatResponse():
            return head + f"HeartbeatResponse term={message.term}"
        case InstallSnapshot():
            snapshot = message.snapshot
            return head + f"InstallSnapshot term={message.term} snapshot={snapshot.index}@{snapshot.term}"
        case TimeoutNow():
            return head + f"TimeoutNow term={message.term}"
    raise AssertionError(message)


def show_entry(entry: Entry) -> str:
    """`index@term`, then the payload, `noop` or the config change."""
    if entry.kind == EntryKind.NOOP:
        return f"{entry.index}@{entry.term}:noop"
    if entry.kind == EntryKind.CONFIG:
        change = ConfigChange.decode(entry.data)
        return f"{entry.index}@{entry.term}:{change.op.name.lower()}-{change.node_id}"
    return f"{entry.index}@{entry.term}:{entry.data.decode()}"


class Cluster:
    """Nodes with perfect storage and a network the test drives by hand:
    `deliver()` hands over what is queued (except across cut links) and
    processes every Ready; `stabilize()` repeats until nothing moves and
    returns the transcript."""

    def __init__(self, voters: list[str], spares: list[str] = (), seed: int = 0, **options) -> None:
        self.options = options
        self.rng = random.Random(seed)
        self.nodes: dict[str, SimNode] = {}
        for node_id in list(voters) + list(spares):
            peers = list(voters) if node_id in voters else []
            self.nodes[node_id] = SimNode(node_id, SimStorage())
            self.nodes[node_id].raft = RaftNode(node_id, peers, random.Random(self.rng.random()), **options)
        self.queue: list[Message] = []
        self.cut: set[frozenset[str]] = set()
        self.readies: dict[str, list[Ready]] = {node_id: [] for node_id in self.nodes}

    def __getitem__(self, node_id: str) -> RaftNode:
        return self.nodes[node_id].raft

    def restore(self, node_id: str, hard_state: HardState, entries: list[Entry], peers: list[str]) -> None:
        """Replace a node by one recovered from the given persisted state."""
        node = SimNode(node_id, SimStorage())
        node.storage.hard_state, node.storage.entries = hard_state, list(entries)
        node.raft = RaftNode.restore(node_id, peers, random.Random(self.rng.random()), hard_state=hard_state,
                                     entries=list(entries), **self.options)
        self.nodes[node_id] = node

    def process(self) -> None:
        """Every node's Ready: persist, queue the messages, apply, advance."""
        for node in self.nodes.values():
            while node.raft is not None and (ready := node.raft.ready()) is not None:
                self.readies[node.node_id].append(ready)
                node.storage.persist(ready)
                self.queue += ready.messages
                if ready.snapshot is not None:
                    node.applied_index, node.payloads = decode_state(ready.snapshot.data)
                for entry in ready.committed_entries:
                    assert entry.index == node.applied_index + 1
                    node.applied_index = entry.index
                    if entry.kind == EntryKind.NORMAL:
                        node.payloads.append(entry.data)
                node.raft.advance(ready)

    def take(self) -> list[str]:
        """Process, then show (and keep queued) what is waiting to be delivered."""
        self.process()
        return [show(m) for m in self.queue]

    def deliver(self, only: set[str] | None = None) -> list[str]:
        """Deliver the queued messages (to `only` those nodes, if given);
        returns the transcript of what was delivered or dropped."""
        self.process()
        transcript = []
        pending, self.queue = self.queue, []
        for message in pending:
            if only is not None and message.to not in only:
                self.queue.append(message)
                continue
            target = self.nodes[message.to]
            if target.raft is None or frozenset((message.sender, message.to)) in self.cut:
                transcript.append(show(message) + "  (dropped)")
                continue
            transcript.append(show(message))
            target.raft.step(message)
        self.process()
        return transcript

    def stabilize(self, limit: int = 50) -> list[str]:
        transcript: list[str] = []
        for _ in range(limit):
            self.process()
            if not self.queue:
                return transcript
            transcript += self.deliver()
        raise AssertionError("the cluster did not stabilize")

    def tick(self, node_id: str, ticks: int = 1) -> None:
        for _ in range(ticks):
            self.nodes[node_id].raft.tick()

    def isolate(self, node_id: str) -> None:
        self.cut |= {frozenset((node_id, other)) for other in self.nodes if other != node_id}

    def heal(self) -> None:
        self.cut = set()

    def applied(self, node_id: str) -> list[bytes]:
        return self.nodes[node_id].payloads

    def compact(self, node_id: str) -> Snapshot:
        node = self.nodes[node_id]
        node.raft.compact(node.applied_index, encode_state(node.applied_index, node.payloads))
        node.storage.compact(node.raft.log.snapshot)
        return node.raft.log.snapshot
