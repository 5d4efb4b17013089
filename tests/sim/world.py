"""The whole-cluster deterministic simulation of the production node (issue 11, item 5).

Theory of operation. One `random.Random(seed)` drives a world of N
`SimNode`s (tests/sim/node.py: the real `Cluster` shell and `NodeCore`,
`NodeRuntime` with the real `RaftSystem`, the real metadata and queue
machines and shells, the real WAL over the fault-injecting file layer), the
network and failure detector between them (tests/sim/network.py) and the
simulated clients (tests/sim/clients.py; in the `membership` scenario an
admin also adds and removes queue members). Time advances `STEP_SECONDS` per
step; in a step the network delivers what is due, the failure detectors
look, every running node runs its due loop callbacks (ticks, turns) and its
WAL writer makes some batches durable, the clients act, and the scenario's
faults strike: drops, delays, duplicates (and so reorders), partitions
(majority/minority, bridge, one-way), pauses longer than the failure
detector, crashes that lose what was not synced, disk errors (the node
fails, and is restarted as by a supervisor). A quarter of the crashes,
pauses and minority partitions last past the gone timeout (`PAST_GONE_RATE`):
the leader takes back what the node's consumers held, and they must go on
when it is back. A paused node's clients wait on their sockets.

Raft's safety is checked as it happens: at most one leader per group and
term; every node applies, at each index of a group, the entry every other
node applied there, in index order; a new leader's log holds every entry
applied anywhere up to its last index. After the fault phase the world
heals (every node up, every link whole), the publishers stop, and the
consumers drain; then the user's promises are checked (tests/sim/history.py).
A failure raises `SimulationFailure` naming the seed and the replay command.
"""
from __future__ import annotations

import itertools
import logging
import random
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import structlog

import warren.broker.queues.queue_snapshots as snapshot_policy
from tests.sim.clients import Admin, Consumer, Publisher
from tests.sim.history import History, SimulationFailure
from tests.sim.loop import SimClock, patch_time
from tests.sim.network import Network
from tests.sim.node import NODE_GONE_SECONDS, SimNode
from warren.raft.messages import Role

STEP_SECONDS = 0.002
PAST_GONE_RATE = 0.25   # of crashes, pauses and minority partitions: longer than the gone timeout


@dataclass(frozen=True)
class Scenario:
    name: str
    nodes: int = 3
    fault_seconds: float = 8.0
    drain_seconds: float = 30.0
    queues: int = 2
    publishers_per_queue: int = 2
    consumers_per_queue: int = 2
    publish_rate: float = 0.05     # per step and publisher
    drop_rate: float = 0.01
    duplicate_rate: float = 0.01
    fault_rate: float = 0.004      # per step: a new fault (when none is on)
    fault_seconds_max: float = 2.5
    faults: tuple[str, ...] = ("minority", "bridge", "one-way", "pause", "crash", "disk", "full")
    churn_rate: float = 0.002      # per step: declare or delete a scratch queue
    reconnect_rate: float = 0.0005
    snapshot_entries: int | None = None   # a queue snapshots (and compacts its log) this often
    forward_delay_rate: float = 0.0   # of the commands a node forwards to the leader: held back longer
    forward_delay_seconds: float = 0.0
    member_change_rate: float = 0.0   # per step: add a node to a queue's members, or remove one


SCENARIOS = {
    "faults": Scenario("faults"),
    "snapshots": Scenario("snapshots", snapshot_entries=24),
    # a consumer's CHECKOUT forwarded by a node with an old leader hint reaches the leader
    # after its channel's DOWN (issue 11 item 5): channels close often, forwards lag
    "slow-forwards": Scenario("slow-forwards", nodes=5, reconnect_rate=0.004, fault_rate=0.01, forward_delay_rate=1.0,
                              forward_delay_seconds=1.0),
    # warrenctl add_member / delete_member on the checked queues while the faults run:
    # replicas join (empty, caught up by the leader) and leave (after their removal commits)
    "membership": Scenario("membership", nodes=4, member_change_rate=0.004),
    "calm": Scenario("calm", fault_rate=0.0, drop_rate=0.0, duplicate_rate=0.0, reconnect_rate=0.0, fault_seconds=4.0),
}


def replay_command(scenario: str, seed: int) -> str:
    return f".venv/bin/python -m tests.sim --scenario {scenario} --seed {seed}"


@contextmanager
def quiet_logs(exceptions: list[str]) -> Iterator[None]:
    """The nodes' logs would drown the report: nothing is printed while the world runs. An
    exception a node caught and logged (a turn's hook, a callback: the node goes on, half
    working) is put in `exceptions`, and the world fails the seed with it."""
    def record(_logger: Any, _method: str, event: dict) -> dict:
        if event.get("exc_info"):
            exceptions.append(f"{event.get('event')}: {''.join(traceback.format_exc(limit=-3))}")
        raise structlog.DropEvent
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR),
                        processors=[record], cache_logger_on_first_use=False)
    try:
        yield
    finally:
        structlog.configure(**saved)


@contextmanager
def snapshots_every(entries: int | None) -> Iterator[None]:
    """Queues snapshot after `entries` applied entries (or 64 bytes each) instead of thousands."""
    saved = snapshot_policy.SNAPSHOT_ENTRIES_MIN, snapshot_policy.SNAPSHOT_BYTES_MIN
    if entries is not None:
        snapshot_policy.SNAPSHOT_ENTRIES_MIN, snapshot_policy.SNAPSHOT_BYTES_MIN = entries, 64 * entries
    try:
        yield
    finally:
        snapshot_policy.SNAPSHOT_ENTRIES_MIN, snapshot_policy.SNAPSHOT_BYTES_MIN = saved


class World:
    def __init__(self, scenario: Scenario, seed: int) -> None:
        self.scenario = scenario
        self.seed = seed
        self.rng = random.Random(seed)
        self.clock = SimClock()
        self.steps = 0
        self.names = [f"n{i}" for i in range(1, scenario.nodes + 1)]
        self.network = Network(self, random.Random(self.rng.random()))
        self.network.drop_rate = scenario.drop_rate
        self.network.duplicate_rate = scenario.duplicate_rate
        self.network.forward_delay_rate = scenario.forward_delay_rate
        self.network.forward_delay_seconds = scenario.forward_delay_seconds
        self.history = History(self)
        self.connection_ids = itertools.count(1)
        self.nodes = {name: SimNode(name, self.names, self) for name in self.names}
        self.paused_until: dict[str, float] = {}
        self.down_until: dict[str, float] = {}
        self.fault_ends = 0.0
        self.fault: str | None = None
        self.stats: dict[str, int] = {}
        self.failure: SimulationFailure | None = None
        self.logged_exceptions: list[str] = []   # exceptions the nodes caught and logged (quiet_logs)
        self.reconnects = True   # clients reconnect to other nodes now and then, by choice
        self.failures: list[tuple[float, str, str]] = []   # nodes whose Raft failed: (t, node, error)
        # Raft's safety: (group, term) -> leader; group -> index -> (term, data) applied
        self.leaders: dict[tuple[str, int], str] = {}
        self.applied: dict[str, dict[int, tuple[int, bytes]]] = {}
        self.newest_term: dict[str, int] = {}   # group -> the newest term a leader was elected in
        self.committed_by: dict[tuple[str, int], int] = {}   # (group, index) -> newest term at its first apply
        self.last_applied: dict[tuple[str, int, str], int] = {}   # (node, incarnation, group) -> index
        self.queue_names = [f"q{i}" for i in range(1, scenario.queues + 1)]
        self.publisher_queue: dict[str, str] = {}
        self.publishers: list[Publisher] = []
        self.consumers: list[Consumer] = []
        for queue in self.queue_names:
            for _ in range(scenario.publishers_per_queue):
                publisher = Publisher(self, f"p{len(self.publishers) + 1}", queue)
                self.publishers.append(publisher)
                self.publisher_queue[publisher.name] = queue
            for _ in range(scenario.consumers_per_queue):
                self.consumers.append(Consumer(self, f"c{len(self.consumers) + 1}", queue))
        self.admin = Admin(self, "admin")
        self.scratch = itertools.count(1)
        self.scratch_live: list[str] = []

    # -- reporting -----------------------------------------------------------------------
    def fail(self, why: str) -> None:
        """Raise, and remember: a check inside a node's callback may be caught there
        (a group's failure is contained), so each step raises it again."""
        if self.failure is None:
            where = f"scenario={self.scenario.name} seed={self.seed} step={self.steps} t={self.clock.now - 1000:.3f}s"
            replay = replay_command(self.scenario.name, self.seed)
            self.failure = SimulationFailure(f"{why}\n  {where}\n  replay: {replay}")
        raise self.failure

    def next_connection_id(self) -> int:
        return next(self.connection_ids)

    def note(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1

    # -- Raft's safety, as it happens --------------------------------------------------------
    def watch(self, node: SimNode, cluster: Any) -> None:
        runtime = cluster.runtime
        on_role_change, apply = runtime.on_role_change, runtime.locations.apply
        incarnation = node.incarnations

        def role_changed(group: Any, role: Role, leader: str | None, term: int) -> None:
            if role == Role.LEADER:
                self.newest_term[group] = max(self.newest_term.get(group, 0), term)
                first = self.leaders.setdefault((group, term), node.name)
                if first != node.name:
                    self.fail(f"group {group}: two leaders in term {term}: {first} and {node.name}")
                self.check_leader_log(node, cluster, group)
            on_role_change(group, role, leader, term)

        def applied(group: Any, entry: Any) -> None:
            key = (node.name, incarnation, group)
            last = self.last_applied.get(key)
            if last is not None and entry.index != last + 1:
                self.fail(f"{node.name} applies {group} index {entry.index} after {last}")
            self.last_applied[key] = entry.index
            if entry.index not in self.applied.get(group, {}):
                # committed in a term no later than the newest leader's so far
                self.committed_by[(group, entry.index)] = self.newest_term.get(group, 0)
            seen = self.applied.setdefault(group, {}).setdefault(entry.index, (entry.term, entry.data))
            if seen != (entry.term, entry.data):
                self.fail(f"{node.name} applies {group} index {entry.index} term {entry.term}, "
                          f"another node applied term {seen[0]} there")
            apply(group, entry)
        runtime.on_role_change = role_changed
        runtime.locations.apply = applied
        compact, install_snapshot = runtime.compact, runtime.install_snapshot

        def compacted(group: Any, index: int, data: bytes) -> bool:
            done = compact(group, index, data)
            self.note("compact" if done else "compact refused")
            return done

        def installed(group: Any, snapshot: Any) -> None:
            self.note("install snapshot")
            self.last_applied[(node.name, incarnation, group)] = snapshot.index   # applies go on after it
            install_snapshot(group, snapshot)
        runtime.compact = compacted
        runtime.install_snapshot = installed
        remove_group = runtime.remove_group

        def removed(group: Any) -> None:
            # a replica dropped (its queue deleted, or this node released from its members):
            # if the node joins the group again, a fresh replica applies from the start
            self.last_applied.pop((node.name, incarnation, group), None)
            remove_group(group)
        runtime.remove_group = removed

    def check_leader_log(self, node: SimNode, cluster: Any, group: Any) -> None:
        """Leader completeness: a leader of term T holds every entry committed in an earlier
        term. An entry first applied when the newest leader's term was M was committed in a
        term no later than M, so every leader of a term after M must hold it. (A leader of an
        earlier term may be elected late: a paused candidate counting votes granted before.)"""
        raft = cluster.runtime.system.groups[group].raft
        log = raft.log
        applied = self.applied.get(group, {})
        for index, (term, _) in applied.items():
            if index <= log.snapshot_index or raft.term <= self.committed_by[(group, index)]:
                continue
            if index > log.last_index():
                self.fail(f"{node.name} leads {group} without index {index}, applied elsewhere")
            if log.term(index) != term:
                self.fail(f"{node.name} leads {group} with term {log.term(index)} at {index}, "
                          f"applied elsewhere with term {term}")

    # -- nodes -------------------------------------------------------------------------------
    def paused(self, name: str) -> bool:
        return self.paused_until.get(name, 0.0) > self.clock.now

    def crash(self, name: str, seconds: float) -> None:
        node = self.nodes[name]
        if not node.up:
            return
        node.crash()
        self.network.forget(name)
        self.down_until[name] = self.clock.now + seconds
        self.note("crash")

    def restart_due(self, everyone: bool = False) -> None:
        for name, until in list(self.down_until.items()):
            if everyone or until <= self.clock.now:
                del self.down_until[name]
                self.nodes[name].files.enospc_after_bytes = None   # a node starts with room (the WAL's header)
                self.nodes[name].start()
                self.note("restart")

    # -- the world's step --------------------------------------------------------------------
    def step(self, faults: bool, clients: bool) -> None:
        if self.logged_exceptions:
            self.fail(f"a node logged an exception it caught: {self.logged_exceptions[0]}")
        self.steps += 1
        self.clock.now += STEP_SECONDS
        self.network.deliver_due()
        self.network.detect()
        for node in self.nodes.values():
            if node.up and not self.paused(node.name):
                node.loop.run_due()
                if node.up:
                    node.committer.write_some(self.rng, 0.5)
                    node.loop.run_due()
                if node.cluster.runtime.failed is not None:
                    self.note("node failed")
                    self.failures.append((self.clock.now - 1000, node.name, repr(node.cluster.runtime.failed)))
                    self.crash(node.name, 0.3)
        self.restart_due()
        if clients:
            self.clients_act(publish=faults)
        if faults:
            self.strike()
        if self.failure is not None:
            raise self.failure

    def clients_act(self, publish: bool) -> None:
        scenario = self.scenario
        live = [node for node in self.nodes.values() if node.accepting]
        for client in [self.admin, *self.publishers, *self.consumers]:
            # a paused node's clients wait on their sockets, as a real client does
            if not client.connected or (self.reconnects and not self.paused(client.node.name)
                                        and self.rng.random() < scenario.reconnect_rate):
                if isinstance(client, Consumer):
                    client.close()
                if live:
                    client.connect(self.rng.choice(live))
                    self.note("connect")
        if publish:
            for publisher in self.publishers:
                if self.rng.random() < scenario.publish_rate:
                    publisher.publish()
            if self.rng.random() < scenario.churn_rate:
                self.churn()
            # no draw unless the scenario asks: the other scenarios' seeds replay as before
            if scenario.member_change_rate and self.rng.random() < scenario.member_change_rate:
                op = self.admin.change_member(self.rng.choice(self.queue_names), self.rng)
                if op is not None:
                    self.note(f"member {op}")
        for consumer in self.consumers:
            consumer.act()

    def churn(self) -> None:
        if self.scratch_live and self.rng.random() < 0.5:
            name = self.scratch_live.pop(self.rng.randrange(len(self.scratch_live)))
            self.admin.delete(name)
            self.note("delete")
        else:
            name = f"scratch{next(self.scratch)}"
            self.scratch_live.append(name)
            self.admin.declare(name)
            self.note("declare")

    def strike(self) -> None:
        now = self.clock.now
        if self.fault is not None and now >= self.fault_ends:
            self.end_fault()
        if self.fault is None and self.rng.random() < self.scenario.fault_rate:
            self.start_fault(self.rng.choice(self.scenario.faults))

    def start_fault(self, kind: str) -> None:
        rng, names = self.rng, self.names
        seconds = rng.uniform(0.5, self.scenario.fault_seconds_max)
        # now and then a node is cut off longer than cluster_node_gone_seconds: the leader
        # returns what its consumers hold, and they must go on when it is back
        past_gone = kind in ("minority", "pause") and rng.random() < PAST_GONE_RATE
        if past_gone:   # past it by 1.5 to 3.5 s: time for what it held to go to others first
            seconds += NODE_GONE_SECONDS + 1
            self.note(f"{kind} past gone")
        self.fault, self.fault_ends = kind, self.clock.now + seconds
        self.note(kind)
        shuffled = rng.sample(names, len(names))
        if past_gone:
            self.history.cut_off(shuffled[0], self.fault_ends)
        if kind == "minority":   # one node cut off from the majority, both ways
            alone = set(shuffled[:1])
            self.network.cut_links({(a, b) for a in names for b in names if (a in alone) != (b in alone)})
        elif kind == "bridge":
            left, bridge, right = shuffled[0], shuffled[1], shuffled[2:]
            self.network.cut_links({(a, b) for a in [left] for b in right} | {(b, a) for a in [left] for b in right})
            del bridge
        elif kind == "one-way":
            self.network.cut_links({(shuffled[0], shuffled[1])})
        elif kind == "pause":
            self.paused_until[shuffled[0]] = self.clock.now + max(seconds, 1.0)
        elif kind == "crash":   # now and then down longer than cluster_node_gone_seconds
            long = rng.random() < PAST_GONE_RATE
            self.crash(shuffled[0], NODE_GONE_SECONDS + 1 if long else seconds)
            if long:
                self.note("crash past gone")
        elif kind == "disk":
            node = self.nodes[shuffled[0]]
            if node.up:
                node.files.eio_on_sync = True
        elif kind == "full":   # no byte more fits on the node's disk until the fault ends
            node = self.nodes[shuffled[0]]
            if node.up:
                node.files.enospc_after_bytes = node.files.bytes_written_total

    def end_fault(self) -> None:
        self.network.heal()
        self.fault = None
        for node in self.nodes.values():   # a full disk's space is freed when the fault ends
            if node.files.enospc_after_bytes is not None:
                node.files.enospc_after_bytes = None
                if node.committer is not None and node.committer.no_space_tries:   # None: crashed meanwhile
                    self.note("batch waited for space")
                    node.committer.no_space_tries = 0

    def heal(self) -> None:
        self.end_fault()
        for name in list(self.paused_until):
            if self.paused(name):
                self.network.wake(name)
        self.paused_until.clear()
        # a fault like the others: the final round allows 2 s for a CHECKOUT, not held-back resends
        self.network.forward_delay_rate = 0.0
        self.restart_due(everyone=True)
        for node in self.nodes.values():
            node.files.eio_on_sync = False

    # -- a run -------------------------------------------------------------------------------
    def run(self) -> "World":
        try:
            return self._run()
        except SimulationFailure:
            raise
        except Exception as error:  # noqa: BLE001 -- a node's assertion: reported with its seed
            where = traceback.format_exc(limit=-3)
            self.fail(f"{type(error).__name__}: {error}\n{where}")
            raise

    def _run(self) -> "World":
        with patch_time(self.clock), quiet_logs(self.logged_exceptions), \
                snapshots_every(self.scenario.snapshot_entries):
            self.start()
            self.started_at = self.clock.now
            faults_end = self.clock.now + self.scenario.fault_seconds
            while self.clock.now < faults_end:
                self.step(faults=True, clients=True)
            self.heal()
            self.drain()
            self.final_round()
        return self

    def start(self) -> None:
        for node in self.nodes.values():
            node.start()
        for _ in range(int(1.0 / STEP_SECONDS)):
            self.step(faults=False, clients=False)
        for name in self.queue_names:
            self.admin.connect(self.rng.choice(list(self.nodes.values())))
            self.admin.declare(name)
        deadline = self.clock.now + 5
        while any(name not in self.history.known_on for name in self.queue_names):
            if self.clock.now > deadline:
                self.fail(f"the queues were not declared in 5 s: {sorted(self.history.known_on)}")
            self.step(faults=False, clients=True)

    def drain(self) -> None:
        """Faults off, publishers stopped: run until every confirmed message came and the
        nodes agree on the metadata, or the time is up; then check."""
        deadline = self.clock.now + self.scenario.drain_seconds
        while self.clock.now < deadline and not self.settled():
            for _ in range(100):
                self.step(faults=False, clients=True)
        lost = self.history.lost(set(self.queue_names))
        if lost:
            self.fail(f"{len(lost)} confirmed messages never delivered, e.g. {lost[:5]}")
        for node in self.nodes.values():
            for name in sorted(self.state_queues(node)):
                if name not in node.vhost.queues:
                    self.fail(f"{node.name}: queue {name} in the metadata state but not routable")
        states = {name: sorted(self.state_queues(node)) for name, node in self.nodes.items()}
        if len({tuple(q) for q in states.values()}) != 1:
            self.fail(f"the nodes disagree on the queues after healing: {states}")
        self.check_replicas_agree()
        if self.scenario.member_change_rate:
            for name in self.queue_names:
                wrong = self.membership_wrong(name)
                if wrong:
                    self.fail(f"queue {name}: its group did not follow its members after healing: {wrong}")

    def membership_wrong(self, name: str) -> str | None:
        """Why the queue's Raft group does not match its members yet (None: it does): the
        members' replicas alone host it, and each holds the members as its committed configuration."""
        record = self.nodes[self.names[0]].cluster.broker.metadata.state.queue("/", name)
        if record is None:
            return "no record"
        members = sorted(record.members)
        hosting = sorted(n for n, node in self.nodes.items() if record.group in node.cluster.runtime.groups)
        configs = {n: self.nodes[n].cluster.runtime.configuration(record.group) for n in hosting}
        voters = tuple(sorted(record.member_ids()))   # a node added again is a new voter (raft/member_ids.py)
        if hosting != members or any(config != (voters, True) for config in configs.values()):
            return f"members {members}, hosted on {hosting}, configurations {configs}"
        return None

    def final_round(self) -> None:
        """Healed and drained, every publisher publishes a few more: each consumer that
        consumes gets some of them (round-robin), so none stays suspended for good."""
        self.reconnects = False   # clients stay where they are; one that just reconnected is registered
        for _ in range(int(2.0 / STEP_SECONDS)):   # within 2 s (a CHECKOUT lost is resent after 1 s)
            self.step(faults=False, clients=True)
        consuming = [c for c in self.consumers if c.connected and c.consuming is not None]
        before = {c.name: (c.owner, self.history.received.get(c.name, 0)) for c in consuming}
        for _ in range(6 * self.scenario.consumers_per_queue):
            for publisher in self.publishers:
                publisher.publish()
            for _ in range(10):
                self.step(faults=False, clients=True)
        self.drain()
        starved = [c.name for c in consuming if c.connected and c.consuming is not None   # the same channel
                   and (c.owner, self.history.received.get(c.name, 0)) == before[c.name]]
        if starved:
            self.fail(f"consumers {starved} got nothing of the final round, their queues' others did")

    def check_replicas_agree(self) -> None:
        """Replicas of a queue that applied the same index hold the same machine (its snapshot bytes)."""
        for name in self.queue_names:
            by_index: dict[int, tuple[str, bytes]] = {}
            for node in self.nodes.values():
                queue = node.vhost.queues.get(name)
                runtime = node.cluster.runtime
                index = runtime.applied_index(queue.group) if queue is not None else None
                if index is None or queue.machine is None:
                    continue
                snapshot = queue.machine.snapshot()
                first = by_index.setdefault(index, (node.name, snapshot))
                if first[1] != snapshot:
                    self.fail(f"queue {name}: {node.name} and {first[0]} applied index {index} "
                              f"and hold different machines")

    @staticmethod
    def state_queues(node: SimNode) -> set[str]:
        vhost = node.cluster.broker.metadata.state.vhosts.get("/")   # none until the seed or a snapshot applied
        return set(vhost.queues) if vhost is not None else set()

    def settled(self) -> bool:
        if self.history.lost(set(self.queue_names)) or any(p.unconfirmed for p in self.publishers if p.connected):
            return False
        states = [self.state_queues(node) for node in self.nodes.values()]
        if self.scenario.member_change_rate and any(self.membership_wrong(name) for name in self.queue_names):
            return False
        return all(state == states[0] for state in states) and all(
            name in node.vhost.queues for node in self.nodes.values() for name in states[0])
