"""A seeded, deterministic harness for `raft.system.RaftSystem`: several nodes,
each a RaftSystem with a fake disk, joined by a fake network.

Theory of operation. One `random.Random(seed)` drives everything. A turn of
the world is one event-loop turn on every node: deliver the frames that are
due, `tick()`, `process_ready()`, then let the fake disks make some of their
pending batches durable (`on_persisted`). Storage latency is random per
batch: durable inside `persist` itself (synchronous storage), at the end of
the turn, or some turns later. The network keeps each link FIFO (one TCP
connection per node pair) with a random latency of a few turns, and a node
that is cut off or crashed loses what was in flight to and from it. A crash
loses the disk's pending batches; a restart rebuilds every group from what
was durable.

Timer ticks come every `turns_per_tick` turns.

The harness checks, as it goes, what the system promises; any breach raises
`HarnessFailure` naming the seed:
* at most one `persist` call and one frame per peer per `process_ready`, and
  frames only from inside it;
* nothing is sent before the persist it depends on is durable: the sender's
  durable term covers every message's term and, unless a later term is
  durable already, a granted vote is durable, an acknowledged entry is
  durable, an AppendEntries carries only durable entries, and a commit
  index sent is durable;
* entries are applied in order, only once their commit is durable, and
  every node applies the same entry at each index of a group; at most one
  leader per term per group.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import msgpack

from tests.unit.raftsim import SimStorage
from warren.raft.core import RecoveredState
from warren.raft.group import QUIESCE, PersistItem
from warren.raft.messages import (
    AppendEntriesResponse,
    Entry,
    Heartbeat,
    Message,
    RequestVote,
    RequestVoteResponse,
    Role,
    Snapshot,
    entry_from_wire,
    entry_to_wire,
    from_wire,
)
from warren.raft.system import RaftSystem


class HarnessFailure(AssertionError):
    pass


def replay_command(seed: int) -> str:
    return f"WARREN_SYSTEM_SEED={seed} .venv/bin/pytest tests/unit/test_raft_system.py"


def encode_applied(entries: list[Entry]) -> bytes:
    """A state machine's snapshot: everything it applied (this harness's
    state machine is its applied log)."""
    return msgpack.packb([entry_to_wire(entry) for entry in entries])


def decode_applied(data: bytes) -> list[Entry]:
    return [entry_from_wire(fields) for fields in msgpack.unpackb(data)]


class FakeDisk:
    """One node's storage: per group, what is durable; and the batches
    handed over by `persist` but not durable yet (lost in a crash)."""

    def __init__(self) -> None:
        self.groups: dict[object, SimStorage] = {}
        self.pending: list[tuple[int, list[PersistItem]]] = []
        self.next_token = 1
        self.persist_calls = 0

    def persist(self, items: list[PersistItem]) -> int:
        self.persist_calls += 1
        token = self.next_token
        self.next_token += 1
        self.pending.append((token, list(items)))
        return token

    def make_durable(self, count: int) -> list[int]:
        """The oldest `count` pending batches reach the disk, in order."""
        done, self.pending = self.pending[:count], self.pending[count:]
        for _, items in done:
            for item in items:
                self.write(item)
        return [token for token, _ in done]

    def write(self, item: PersistItem) -> None:
        storage = self.groups.setdefault(item.group_id, SimStorage())
        if item.snapshot is not None:
            storage.snapshot, storage.entries = item.snapshot, []
        if item.truncate_from is not None:
            del storage.entries[item.truncate_from - storage.first_index():]
        for entry in item.entries:
            storage.write_entry(entry)
        if item.hard_state is not None:
            assert item.hard_state.commit_index >= storage.hard_state.commit_index, "durable commit went back"
            assert item.hard_state.term >= storage.hard_state.term, "durable term went back"
            storage.hard_state = item.hard_state

    def last_index(self, group_id: object) -> int:
        storage = self.groups.get(group_id)
        if storage is None:
            return 0
        return storage.entries[-1].index if storage.entries else storage.first_index() - 1

    def term_at(self, group_id: object, index: int) -> int | None:
        storage = self.groups.get(group_id)
        if storage is None or index < storage.first_index() or index > self.last_index(group_id):
            return None
        return storage.entries[index - storage.first_index()].term

    def holds(self, group_id: object, entry: Entry) -> bool:
        """`entry` is on this disk, or under its snapshot (compacted: committed)."""
        storage = self.groups.get(group_id)
        if storage is None:
            return False
        return entry.index < storage.first_index() or self.term_at(group_id, entry.index) == entry.term

    def crash(self) -> None:
        self.pending = []

    def recovered(self, group_id: object) -> RecoveredState | None:
        storage = self.groups.get(group_id)
        if storage is None:
            return None
        return RecoveredState(storage.hard_state, storage.snapshot, list(storage.entries))


@dataclass
class Host:
    name: str
    disk: FakeDisk
    system: RaftSystem | None = None
    applied: dict[object, list[Entry]] = field(default_factory=dict)
    in_turn: bool = False
    frames_this_turn: Counter = field(default_factory=Counter)
    persists_this_turn: int = 0


class SystemCluster:
    def __init__(self, seed: int, node_count: int = 3, latency_max_turns: int = 2, turns_per_tick: int = 3,
                 sync_now_rate: float = 0.3, sync_rate: float = 0.6, **system_options) -> None:
        self.seed = seed
        # Event-loop turns are far more frequent than timer ticks (100 ms in
        # production): a round trip with fsyncs takes a few turns, not ticks.
        self.turns_per_tick = turns_per_tick
        self.rng = random.Random(seed)
        self.latency_max_turns = latency_max_turns
        self.sync_now_rate = sync_now_rate
        self.sync_rate = sync_rate
        self.system_options = {"election_ticks": 10, **system_options}
        self.now = 0
        self.names = [f"n{i}" for i in range(1, node_count + 1)]
        self.hosts = {name: Host(name, FakeDisk()) for name in self.names}
        self.members: dict[object, tuple[str, ...]] = {}
        # per directed link: frames in flight (deliver_at, frame), FIFO
        self.links: dict[tuple[str, str], list[tuple[int, bytes]]] = {}
        self.cut: set[str] = set()
        # history for the checks
        self.committed: dict[object, dict[int, Entry]] = {}
        self.leader_of_term: dict[tuple[object, int], str] = {}
        self.frames: Counter[str] = Counter()
        self.largest_frame = 0
        self.compactions = 0
        self.installs = 0
        for host in self.hosts.values():
            self.start(host)

    # --- reporting --------------------------------------------------------------------------------

    def fail(self, why: str) -> None:
        raise HarnessFailure(f"{why}\n  seed={self.seed} turn={self.now}\n  replay: {replay_command(self.seed)}")

    def check(self, condition: bool, why: str) -> None:
        if not condition:
            self.fail(why)

    # --- nodes -------------------------------------------------------------------------------------

    def start(self, host: Host) -> None:
        """A fresh system on `host`, its groups rebuilt from the durable disk."""
        name = host.name
        host.system = RaftSystem(
            name, random.Random(self.rng.random()),
            persist=lambda items, host=host: self.on_persist(host, items),
            send=lambda peer, frame, host=host: self.on_send(host, peer, frame),
            apply=lambda group_id, entry, host=host: self.on_apply(host, group_id, entry),
            install_snapshot=lambda group_id, snapshot, host=host: self.on_install(host, group_id, snapshot),
            on_role_change=lambda group_id, role, leader, term, host=host: self.on_role(host, group_id, role, term),
            **self.system_options)
        host.applied = {}
        for group_id, members in self.members.items():
            self.host_group(host, group_id, members)
        for other in self.cut:
            if other != name:
                host.system.peer_down(other)

    def host_group(self, host: Host, group_id: object, members: tuple[str, ...]) -> None:
        if host.name in members:
            recovered = host.disk.recovered(group_id)
            snapshot = recovered.snapshot if recovered else None
            host.applied[group_id] = decode_applied(snapshot.data) if snapshot else []
            host.system.add_group(group_id, members, recovered=recovered)

    def add_groups(self, group_ids, members: tuple[str, ...] | None = None) -> None:
        members = tuple(members or self.names)
        for group_id in group_ids:
            self.members[group_id] = members
            for host in self.live_hosts():
                self.host_group(host, group_id, members)

    def live_hosts(self) -> list[Host]:
        return [h for h in self.hosts.values() if h.system is not None]

    def disconnect(self, name: str) -> None:
        """Cut `name` off: its links drop what is in flight; every side's
        failure detector reports the other down."""
        self.cut.add(name)
        for (sender, to) in list(self.links):
            if name in (sender, to):
                self.links[(sender, to)] = []
        for host in self.live_hosts():
            if host.name == name:
                for other in self.names:
                    if other != name:
                        host.system.peer_down(other)
            else:
                host.system.peer_down(name)

    def reconnect(self, name: str) -> None:
        self.cut.discard(name)
        for host in self.live_hosts():
            if host.name == name:
                for other in self.names:
                    if other != name and other not in self.cut:
                        host.system.peer_up(other)
            elif host.name not in self.cut:
                host.system.peer_up(name)

    def crash(self, name: str) -> None:
        host = self.hosts[name]
        self.disconnect(name)
        host.disk.crash()
        host.system = None

    def restart(self, name: str) -> None:
        host = self.hosts[name]
        assert host.system is None
        self.start(host)
        self.reconnect(name)

    # --- the callables a RaftSystem is given ---------------------------------------------------------

    def on_persist(self, host: Host, items: list[PersistItem]) -> int:
        self.check(host.in_turn, f"{host.name}: persist outside process_ready")
        host.persists_this_turn += 1
        self.check(host.persists_this_turn == 1, f"{host.name}: {host.persists_this_turn} persist calls in one turn")
        token = host.disk.persist(items)
        if self.rng.random() < self.sync_now_rate:   # synchronous storage: durable inside persist()
            self.sync(host, len(host.disk.pending))
        return token

    def sync(self, host: Host, count: int) -> None:
        for token in host.disk.make_durable(count):
            host.system.on_persisted(token)

    def on_send(self, host: Host, peer: str, frame: list) -> None:
        self.check(host.in_turn, f"{host.name}: frame to {peer} outside process_ready")
        host.frames_this_turn[peer] += 1
        self.check(host.frames_this_turn[peer] == 1, f"{host.name}: a second frame to {peer} in one turn")
        self.frames[host.name] += 1
        self.largest_frame = max(self.largest_frame, len(frame))
        raw = msgpack.packb(frame)   # frames must be msgpack-able as they are
        for item in frame:
            self.check_durable_before_send(host, item[0], from_wire(item[1]), len(item) > 2 and item[2] == QUIESCE)
        if peer in self.cut or host.name in self.cut:
            return
        queue = self.links.setdefault((host.name, peer), [])
        deliver_at = self.now + self.rng.randint(1, self.latency_max_turns)
        if queue:
            deliver_at = max(deliver_at, queue[-1][0])   # FIFO per link
        queue.append((deliver_at, raw))

    def check_durable_before_send(self, host: Host, group_id: object, message: Message, quiesce: bool) -> None:
        disk = host.disk
        storage = disk.groups.get(group_id)
        durable_term = storage.hard_state.term if storage else 0
        durable_commit = storage.hard_state.commit_index if storage else 0
        where = f"{host.name} group {group_id}: {message}"
        self.check(message.sender == host.name and message.to != host.name, f"misaddressed {where}")
        if isinstance(message, RequestVote) and message.pre_vote:
            self.check(message.term - 1 <= durable_term,
                       f"pre-vote before its term was durable ({durable_term}): {where}")
        elif isinstance(message, RequestVoteResponse) and message.pre_vote:
            pass   # a granted pre-vote names the candidate's future term and promises nothing
        else:
            self.check(message.term <= durable_term, f"sent before its term was durable ({durable_term}): {where}")
        if durable_term > message.term:
            # Generated in an earlier term of the same Ready (a vote in term 6,
            # then one in term 7): the durable higher term covers its promise,
            # as in etcd-raft -- this node can never act in that term again.
            return
        if isinstance(message, RequestVoteResponse) and message.vote_granted and not message.pre_vote:
            self.check(durable_term == message.term and storage.hard_state.voted_for == message.to,
                       f"vote granted before it was durable ({storage.hard_state if storage else None}): {where}")
        if isinstance(message, AppendEntriesResponse) and message.success:
            self.check(disk.last_index(group_id) >= message.match_index,
                       f"acknowledged entries not durable (durable last {disk.last_index(group_id)}): {where}")
        # A leader's AppendEntries may carry entries it is still writing (Raft thesis
        # §10.2.1, RaftSystem.may_send_before_persist): they promise nothing; the
        # leader counts itself toward commit only once they are durable, which the
        # commit checks of the safety properties cover. The commit index they carry
        # is known committed (a durable majority), so it needs no durability here either.
        if isinstance(message, Heartbeat):
            if quiesce:
                # (the commit index may reach the disk a batch later: it is volatile state)
                self.check(disk.last_index(group_id) == message.commit_index >= durable_commit,
                           f"quiesce heartbeat with work left: {where}")

    def on_apply(self, host: Host, group_id: object, entry: Entry) -> None:
        applied = host.applied[group_id]
        self.check(entry.index == len(applied) + 1, f"{host.name} group {group_id} applies {entry.index} "
                                                    f"after {len(applied)}")
        # Committed means durable on a majority (the commit index itself is volatile
        # state: RaftSystem.only_commit_advances applies before writing it).
        durable_on = sorted(h.name for h in self.hosts.values() if h.disk.holds(group_id, entry))
        voters = host.system.groups[group_id].raft.voters if host.system and group_id in host.system.groups else ()
        self.check(len(durable_on) >= len(voters) // 2 + 1 and host.name in durable_on,
                   f"{host.name} group {group_id} applies {entry.index} durable only on {durable_on} of {voters}")
        first = self.committed.setdefault(group_id, {}).setdefault(entry.index, entry)
        self.check(first == entry, f"{host.name} group {group_id} applies {entry}, another node applied {first}")
        applied.append(entry)

    def on_install(self, host: Host, group_id: object, snapshot: Snapshot) -> None:
        entries = decode_applied(snapshot.data)
        self.check(len(entries) == snapshot.index, f"{host.name} group {group_id}: snapshot data/index mismatch")
        committed = self.committed.get(group_id, {})
        for entry in entries:
            self.check(committed.get(entry.index) == entry, f"{host.name} group {group_id}: snapshot has {entry}, "
                                                            f"applied elsewhere: {committed.get(entry.index)}")
        host.applied[group_id] = entries
        self.installs += 1

    def compact(self, name: str, group_id: object) -> bool:
        """The state machine of `group_id` on `name` snapshots what it applied."""
        host = self.hosts[name]
        if host.system is None:
            return False
        applied = host.applied[group_id]
        status = host.system.groups[group_id].raft.status()
        if len(applied) <= status.snapshot_index or len(applied) != status.last_applied:
            return False
        snapshot = host.system.compact(group_id, len(applied), encode_applied(applied))
        host.disk.groups[group_id].compact(snapshot)   # the snapshot is written, then the log cut
        self.compactions += 1
        return True

    def on_role(self, host: Host, group_id: object, role: Role, term: int) -> None:
        if role == Role.LEADER:
            first = self.leader_of_term.setdefault((group_id, term), host.name)
            self.check(first == host.name, f"group {group_id}: two leaders in term {term}: {first}, {host.name}")

    # --- the world -----------------------------------------------------------------------------------

    def turn(self) -> None:
        self.now += 1
        for (sender, to), queue in self.links.items():
            while queue and queue[0][0] <= self.now:
                _, raw = queue.pop(0)
                target = self.hosts[to].system
                if target is not None:
                    target.step(sender, msgpack.unpackb(raw))
        if self.now % self.turns_per_tick == 0:
            for host in self.live_hosts():
                host.system.tick()
        for host in self.live_hosts():
            host.in_turn, host.persists_this_turn = True, 0
            host.frames_this_turn.clear()
            host.system.process_ready()
            host.in_turn = False
        for host in self.live_hosts():
            durable = 0
            while durable < len(host.disk.pending) and self.rng.random() < self.sync_rate:
                durable += 1
            self.sync(host, durable)

    def run(self, turns: int) -> None:
        for _ in range(turns):
            self.turn()

    def run_until(self, condition, max_turns: int, what: str) -> int:
        """Turns until `condition()` holds; fails after `max_turns`."""
        for turns in range(max_turns + 1):
            if condition():
                return turns
            self.turn()
        self.fail(f"not reached within {max_turns} turns: {what}")

    # --- views ----------------------------------------------------------------------------------------

    def leader(self, group_id: object) -> Host | None:
        """The live leader of the highest term, if any."""
        best = None
        for host in self.live_hosts():
            if group_id in host.system and host.system.role(group_id) == Role.LEADER:
                term = host.system.group_metrics(group_id).term
                if best is None or term > best[0]:
                    best = (term, host)
        return best[1] if best else None

    def all_led(self, group_ids) -> bool:
        return all(self.leader(g) is not None for g in group_ids)

    def propose(self, group_id: object, data: bytes) -> int | None:
        host = self.leader(group_id)
        return None if host is None else host.system.propose(group_id, data)

    def applied_data(self, host: Host, group_id: object) -> list[bytes]:
        return [e.data for e in host.applied[group_id] if e.data]

    def caught_up(self, group_ids, hosts: list[Host] | None = None) -> bool:
        """Every live (or given) member applied its leader's whole log."""
        for group_id in group_ids:
            leader = self.leader(group_id)
            if leader is None:
                return False
            last = leader.system.groups[group_id].raft.status().last_index
            for host in hosts or self.live_hosts():
                if group_id in host.applied and len(host.applied[group_id]) != last:
                    return False
        return True

    def quiescent(self) -> bool:
        return all(host.system.active_count == 0 for host in self.live_hosts())

    def totals(self) -> dict[str, int]:
        """Summed counters over live systems, plus the fake disks' persist calls."""
        total: Counter[str] = Counter()
        for host in self.live_hosts():
            total.update(host.system.counters.as_dict())
        total["disk_persists"] = sum(h.disk.persist_calls for h in self.hosts.values())
        total["frames"] = sum(self.frames.values())
        return dict(total)


def run_chaos(cluster: SystemCluster, group_ids: list, turns: int) -> int:
    """Random proposals, compactions, crashes (pending batches lost),
    restarts, node cut-offs and reconnections; then everything back up and
    connected.
    Returns how many proposals were made."""
    rng = random.Random(cluster.seed * 7919)
    proposals = 0
    for _ in range(turns):
        cluster.turn()
        if rng.random() < 0.3:
            cluster.propose(rng.choice(group_ids), f"x{proposals}".encode())
            proposals += 1
        live = [h.name for h in cluster.live_hosts()]
        down = [h.name for h in cluster.hosts.values() if h.system is None]
        if rng.random() < 0.01 and len(live) == len(cluster.names):
            cluster.crash(rng.choice(live))
        if rng.random() < 0.03 and down:
            cluster.restart(down[0])
        if rng.random() < 0.005 and not cluster.cut:
            cluster.disconnect(rng.choice(live))
        if rng.random() < 0.02:
            cluster.compact(rng.choice(live), rng.choice(group_ids))
        if rng.random() < 0.05:
            for name in sorted(cluster.cut):
                if cluster.hosts[name].system is not None:
                    cluster.reconnect(name)
    for name in cluster.names:
        if cluster.hosts[name].system is None:
            cluster.restart(name)
    for name in sorted(cluster.cut):
        cluster.reconnect(name)
    return proposals
