"""A quorum queue replicated by Raft, under the seeded simulator of raftsim.py.

Theory of operation. `QueueSimulation` is raftsim's `Simulation` (one Raft
group of `raft.core.RaftNode`s; a network that drops, delays, duplicates and
so reorders; partitions; crashes that lose what was not persisted; restarts)
whose state machine is a `QuorumMachine` per node instead of a list of
payloads. A restarted node rebuilds its machine from its snapshot and the
committed log Raft hands it again. As in the broker, the machine keeps
messages as references into the log (the leader reads bodies back from its
log to deliver them) and compaction takes the snapshot the release cursor
offers (`ReleaseCursor`), so a log is never cut below a message kept.

Clients live on nodes, as channels do, and die with their node; a restart
brings new ones with the node's next incarnation (owners are named
``node/incarnation/rest``). They talk to the node they believe leads over a
second, equally faulty network (`ClientNetwork`):

* a publisher numbers its ENQUEUEs, keeps the unconfirmed ones (at most
  `publish_window`) and resends them all, in order, on a timer and when the
  leader changes. Until its first confirm it always sends its whole window,
  so the first ENQUEUE of its session is the first one Raft commits;
* a consumer checks out (resent until the leader's apply answers), drops the
  delivery seqs it saw, settles (or sometimes returns) what it gets naming
  the delivery as (msg_id, seq), resends unanswered settles, and now and then
  asks the leader for the deliveries after its contiguous seqs (a gap).

The leader, and only it, performs the effects of what it applies: confirms
to publishers, deliveries to consumers, answers to checkouts and settles. A
new leader resends every checked-out delivery once it has applied its log.
Its failure detector proposes NODE_DOWN for nodes it cannot reach, NODE_UP
with the incarnation of nodes it reaches again, and NODE_GONE for nodes down
longer than `gone_ticks`.

Checked after every step: raftsim's Raft safety checks; every replica's
outputs (reply and effects) for an index are the same; snapshots at one index
are the same bytes; no body is enqueued twice; first deliveries of each
publisher come in its order; no consumer gets a message again after it
settled it. At the end, after a liveness phase with faults off, the queue is
drained, every confirmed message was delivered, and every replica's machine
is the same.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.unit.raftsim import (
    Scenario,
    SimNode,
    Simulation,
    SimulationFailure,
    decode_state,
    encode_state,
)
from warren.broker.queues import fifo
from warren.broker.queues import queue_codec as qcodec
from warren.broker.queues import queue_commands as qc
from warren.broker.queues import quorum_machine as qm
from warren.broker.queues.queue_snapshots import ReleaseCursor
from warren.raft.messages import EntryKind, Role, Snapshot

__all__ = ["QUEUE_SCENARIOS", "QueueScenario", "QueueSimulation", "SimulationFailure", "replay_command"]


@dataclass(frozen=True)
class QueueScenario:
    name: str
    raft: Scenario
    publish_rate: float = 0.4      # per step and publisher, while faults are on
    publish_window: int = 6        # unconfirmed publishes per publisher (backpressure)
    return_rate: float = 0.15      # share of deliveries a consumer returns
    prefetch: int = 3
    resend_ticks: int = 12         # clients resend what is unanswered this often
    poll_ticks: int = 25           # consumers ask for deliveries after their last contiguous seq
    gone_ticks: int = 40           # a node down this long is declared gone
    detector_retry_ticks: int = 8  # the failure detector re-proposes after this long


QUEUE_SCENARIOS = {
    "faults": QueueScenario("faults", Scenario(
        "faults", steps=300, crash_rate=0.02, restart_rate=0.06, partition_rate=0.02, drop_rate=0.05,
        max_message_bytes=4096, max_inflight_messages=8, quiesce_ticks=1500)),
    "snapshots": QueueScenario("snapshots", Scenario(
        "snapshots", steps=300, crash_rate=0.02, restart_rate=0.08, compact_rate=0.05, drop_rate=0.08,
        max_message_bytes=4096, max_inflight_messages=8, quiesce_ticks=1500)),
}


def replay_command(scenario: str, seed: int) -> str:
    return (f"WARREN_QQ_SEED={seed} .venv/bin/pytest tests/unit/test_quorum_simulation.py "
            f"-k 'replay and {scenario}'")


# --- clients ---------------------------------------------------------------------------------------

@dataclass
class Publisher:
    enqueuer: str
    node: str
    next_seq: int = 1
    unconfirmed: dict[int, bytes] = field(default_factory=dict)   # seq -> body
    established: bool = False   # a confirm came back: the session exists in the machine
    leader: str | None = None
    last_send: int = 0


@dataclass
class Consumer:
    owner: str
    tag: str
    node: str
    registered: bool = False
    seen: set[int] = field(default_factory=set)
    watermark: int = 0          # every seq up to it was seen
    settled: set[int] = field(default_factory=set)               # msg ids it settled
    pending: dict[int, tuple[int, tuple[int, int]]] = field(default_factory=dict)  # msg_id -> (op, (msg_id, seq))
    leader: str | None = None
    last_send: int = 0
    last_poll: int = 0

    @property
    def consumer_id(self) -> tuple[str, str]:
        return (self.owner, self.tag)


class ClientNetwork:
    """Client <-> node traffic: the same faults as Raft's network. A message
    from a client on node `a` to node `b` is lost if either end is down or
    the two are partitioned when it arrives."""

    def __init__(self, simulation: QueueSimulation) -> None:
        self.simulation = simulation
        self.in_flight: list[tuple[int, int, str, str, object]] = []
        self.sequence = 0

    def send(self, source: str, target: str, handler) -> None:
        simulation = self.simulation
        scenario = simulation.scenario
        if simulation.faults and simulation.rng.random() < scenario.drop_rate:
            return
        delay = simulation.rng.randint(1, scenario.max_delay_ticks) if simulation.faults else 1
        self.sequence += 1
        self.in_flight.append((simulation.now + delay, self.sequence, source, target, handler))

    def deliver_due(self) -> None:
        simulation = self.simulation
        due = [item for item in self.in_flight if item[0] <= simulation.now]
        self.in_flight = [item for item in self.in_flight if item[0] > simulation.now]
        simulation.rng.shuffle(due)
        for _, _, source, target, handler in due:
            if simulation.nodes[source].raft is None or simulation.nodes[target].raft is None:
                continue
            if frozenset((source, target)) in simulation.cut:
                continue
            handler()


# --- the simulation ----------------------------------------------------------------------------------

class QueueSimulation(Simulation):
    def __init__(self, queue_scenario: QueueScenario, seed: int) -> None:
        self.queue_scenario = queue_scenario
        self.limits = fifo.QueueLimits()
        self.machines: dict[str, qm.QuorumMachine] = {}
        self.cursors: dict[str, ReleaseCursor] = {}
        self.incarnations: dict[str, int] = {}
        self.publishers: dict[str, Publisher] = {}
        self.consumers: dict[str, Consumer] = {}
        self.down_since: dict[str, int] = {}
        self.outputs: dict[int, tuple] = {}              # index -> (reply, effects), from its first apply
        self.snapshot_at: dict[int, bytes] = {}
        self.enqueued: set[bytes] = set()
        self.confirmed: set[bytes] = set()
        self.received: set[bytes] = set()
        self.last_first_delivery: dict[str, int] = {}    # publisher -> seq of its last first delivery
        self.resent_term: dict[str, int] = {}
        self.detector_last: dict[tuple, int] = {}
        self.network = ClientNetwork(self)
        super().__init__(queue_scenario.raft, seed)

    # --- reporting: replay through this module's test --------------------------------------------

    def fail(self, why: str) -> None:
        recent = "\n  ".join(self.events)
        raise SimulationFailure(
            f"{why}\n  scenario={self.queue_scenario.name} seed={self.seed} tick={self.now}\n"
            f"  replay: {replay_command(self.queue_scenario.name, self.seed)}\n  recent events:\n  {recent}")

    def now_ms(self, node_id: str) -> int:
        # Each node's clock is a little off: the machine must not let time go back.
        return self.now * 10 + 7 * int(node_id[1:])

    # --- node life: the machine is rebuilt from the snapshot and the log --------------------------

    def start(self, node: SimNode) -> None:
        super().start(node)
        node_id = node.node_id
        if node.storage.snapshot is not None:
            self.machines[node_id] = qm.QuorumMachine.restore(node.payloads[0])
        else:
            self.machines[node_id] = qm.QuorumMachine(self.limits)
        node.payloads = []
        self.cursors[node_id] = ReleaseCursor()
        incarnation = self.incarnations[node_id] = self.incarnations.get(node_id, 0) + 1
        self.down_since.pop(node_id, None)
        publisher = Publisher(f"{node_id}/inc{incarnation}/p", node_id, last_send=self.now)
        consumer = Consumer(f"{node_id}/inc{incarnation}/c", "t", node_id, last_send=-1_000)
        self.publishers[node_id], self.consumers[node_id] = publisher, consumer

    def crash(self, node: SimNode, torn: bool | None = None) -> None:
        super().crash(node, torn)
        self.publishers.pop(node.node_id, None)   # its clients die with it
        self.consumers.pop(node.node_id, None)
        self.down_since[node.node_id] = self.now

    def compact(self, node: SimNode) -> None:
        """As the broker does: the release cursor says which snapshot may
        replace the log (messages are references into it)."""
        offered = self.cursors[node.node_id].offer(node.applied_index, self.machines[node.node_id])
        if offered is None or offered[0] <= node.raft.log.snapshot_index:
            return
        index, data = offered
        self.check_snapshot(node, index, data)
        node.raft.compact(index, encode_state(index, [data]))
        node.storage.compact(node.raft.log.snapshot)
        self.log(f"{node.node_id} compacts to {index}")

    def install_snapshot(self, node: SimNode, snapshot: Snapshot) -> None:
        index, (data,) = decode_state(snapshot.data)
        self.check(index == snapshot.index, f"{node.node_id}: snapshot data says {index}, meta {snapshot.index}")
        self.check_snapshot(node, index, data)
        self.machines[node.node_id] = qm.QuorumMachine.restore(data)
        self.cursors[node.node_id].reset()
        node.applied_index = index
        self.log(f"{node.node_id} installs snapshot at {index}")

    def check_snapshot(self, node: SimNode, index: int, data: bytes) -> None:
        first = self.snapshot_at.setdefault(index, data)
        self.check(first == data, f"{node.node_id}: its machine at {index} differs from another replica's")

    # --- applying: every replica, then the leader's effects -----------------------------------------

    def apply(self, node: SimNode, entry) -> None:
        super().apply(node, entry)     # raftsim's checks: in order, committed, one entry per index
        node.payloads.clear()          # raftsim keeps raw payloads; the machine is the state here
        if entry.kind != EntryKind.NORMAL:
            return
        command = qcodec.decode(entry.data)
        output = self.machines[node.node_id].apply(command, entry.index)
        first = self.outputs.setdefault(entry.index, output)
        self.check(first == output, f"{node.node_id} applied {command} at {entry.index} with other results "
                                    f"than another replica: {output} vs {first}")
        if first is output:
            self.on_first_apply(node, command, output)
        if node.raft.role == Role.LEADER:
            self.perform(node.node_id, command, output)

    def body_of(self, node: SimNode, delivery: qm.Delivery) -> bytes | None:
        """The delivered message's body, read through its reference from the
        node's log; None if the log no longer has that entry."""
        index, slot = qm.ref_location(delivery.payload)
        raft_log = node.raft.log
        if not raft_log.snapshot_index < index <= raft_log.last_index():
            return None
        return qm.message_payload(qcodec.decode(raft_log.entry(index).data), slot)[3]

    def on_first_apply(self, node: SimNode, command: Any, output: tuple) -> None:
        """History checks, once per index (all replicas produce the same output)."""
        reply, effects = output
        if type(command) is qc.Enqueue and not reply:
            self.stats["held"] += 1
        for effect in effects:
            match effect:
                case qm.Delivery(delivery_count=0):
                    body = self.body_of(node, effect)
                    self.check(body is not None, f"{node.node_id}: the body of a first delivery is gone: {effect}")
                    self.check_first_delivery(body)
                case qc.DeadLettered():
                    self.fail(f"dead-lettered without limits: {effect}")
        if type(command) is qc.Enqueue:
            self.check_enqueued_once(command, reply)
        if type(command) in qc.LIVENESS and reply:
            self.stats[{qc.NodeDown: "suspects", qc.NodeUp: "ups", qc.NodeGone: "gone"}[type(command)]] += 1

    def check_enqueued_once(self, command: Any, applied: list) -> None:
        for result in applied:
            if result.duplicate:
                self.stats["duplicates"] += 1
                continue
            body = f"{result.enqueuer}#{result.seq}".encode()
            self.check(body not in self.enqueued, f"{body!r} enqueued twice")
            self.enqueued.add(body)

    def check_first_delivery(self, body: bytes) -> None:
        enqueuer, seq = body.decode().rsplit("#", 1)
        last = self.last_first_delivery.get(enqueuer, 0)
        self.check(int(seq) > last, f"{enqueuer}: first delivery of seq {seq} after seq {last}")
        self.last_first_delivery[enqueuer] = int(seq)

    def perform(self, leader: str, command: Any, output: tuple) -> None:
        """The leader's effects and answers, sent to the clients' nodes."""
        for effect in output[1]:
            match effect:
                case qm.Applied():
                    self.to_publisher(leader, effect.enqueuer, lambda p, e=effect: self.on_applied(p, e))
                case qm.Delivery():
                    self.send_delivery(leader, effect)
        if type(command) is qc.Checkout:
            self.to_consumer(leader, command.owner, self.on_consume_ok)
        elif type(command) in (qc.Settle, qc.Return):
            owner = command.owner
            items = [tuple(item) for item in command.msg_ids]
            self.to_consumer(leader, owner, lambda c: self.on_release_ok(c, items))

    def with_bodies(self, leader: str, deliveries: list[qm.Delivery]) -> list[tuple[qm.Delivery, bytes]]:
        """The leader reads each delivery's body through its reference. A body
        can be gone only for a message a later committed entry settles
        (ReleaseCursor); it is skipped, and the end checks fail if one that
        mattered was."""
        found = []
        for delivery in deliveries:
            body = self.body_of(self.nodes[leader], delivery)
            if body is None:
                self.stats["deliveries without a body"] += 1
            else:
                found.append((delivery, body))
        return found

    def send_delivery(self, leader: str, delivery: qm.Delivery) -> None:
        for with_body, body in self.with_bodies(leader, [delivery]):
            self.to_consumer(leader, with_body.consumer[0], lambda c, d=with_body, b=body: self.on_delivery(c, d, b))

    # --- client-side handlers -----------------------------------------------------------------------

    def to_publisher(self, source: str, enqueuer: str, handler) -> None:
        """To the publisher `enqueuer`, if it is still alive when this arrives."""
        def arrive() -> None:
            publisher = self.publishers.get(node)
            if publisher is not None and publisher.enqueuer == enqueuer:
                handler(publisher)
        node = qm.owner_node(enqueuer)
        self.network.send(source, node, arrive)

    def to_consumer(self, source: str, owner: str, handler) -> None:
        def arrive() -> None:
            consumer = self.consumers.get(node)
            if consumer is not None and consumer.owner == owner:
                handler(consumer)
        node = qm.owner_node(owner)
        self.network.send(source, node, arrive)

    def on_applied(self, publisher: Publisher, applied: qm.Applied) -> None:
        self.check(applied.accepted, f"a publish was refused without limits: {applied}")
        publisher.established = True
        body = publisher.unconfirmed.pop(applied.seq, None)
        if body is not None:
            self.confirmed.add(body)

    def on_consume_ok(self, consumer: Consumer) -> None:
        consumer.registered = True

    def on_delivery(self, consumer: Consumer, delivery: qm.Delivery, body: bytes) -> None:
        self.check(delivery.consumer == consumer.consumer_id, f"{delivery} sent to {consumer.owner}")
        if delivery.seq <= consumer.watermark or delivery.seq in consumer.seen:
            self.stats["dropped duplicate deliveries"] += 1
            return
        consumer.seen.add(delivery.seq)
        while consumer.watermark + 1 in consumer.seen:
            consumer.watermark += 1
            consumer.seen.discard(consumer.watermark - 1)
        self.check(delivery.msg_id not in consumer.settled,
                   f"{consumer.owner} got msg {delivery.msg_id} again after settling it: {delivery}")
        self.received.add(body)
        returning = delivery.delivery_count < 3 and self.rng.random() < self.queue_scenario.return_rate
        op = qc.Return if returning else qc.Settle
        if not returning:
            consumer.settled.add(delivery.msg_id)
        consumer.pending[delivery.msg_id] = (op, (delivery.msg_id, delivery.seq))
        self.send_releases(consumer, [consumer.pending[delivery.msg_id]])

    def on_release_ok(self, consumer: Consumer, items: list[tuple[int, int]]) -> None:
        for item in items:
            pending = consumer.pending.get(item[0])
            if pending is not None and pending[1] == item:
                del consumer.pending[item[0]]

    def on_resync(self, consumer: Consumer, deliveries: list[tuple[qm.Delivery, bytes]]) -> None:
        for delivery, body in deliveries:
            if delivery.seq > consumer.watermark and delivery.seq not in consumer.seen:
                self.stats["gaps filled"] += 1
            self.on_delivery(consumer, delivery, body)

    # --- client-side actions ------------------------------------------------------------------------

    def leader_of(self, node_id: str) -> str | None:
        raft = self.nodes[node_id].raft
        if raft is None:
            return None
        return node_id if raft.role == Role.LEADER else raft.leader_id

    def propose(self, source: str, target: str, commands: list[bytes]) -> None:
        """A client's commands to the node it believes leads; a node that does
        not lead drops them (the client resends)."""
        def arrive() -> None:
            node = self.nodes[target]
            if node.raft.role != Role.LEADER:
                return
            for data in commands:
                if node.raft.propose(data) is None:
                    return
            self.after_input(node)
        self.network.send(source, target, arrive)

    def publisher_step(self, publisher: Publisher) -> None:
        scenario = self.queue_scenario
        leader = self.leader_of(publisher.node)
        resend = leader != publisher.leader or self.now - publisher.last_send >= scenario.resend_ticks
        publisher.leader = leader
        if self.faults and len(publisher.unconfirmed) < scenario.publish_window \
                and self.rng.random() < scenario.publish_rate:
            seq = publisher.next_seq
            publisher.next_seq += 1
            publisher.unconfirmed[seq] = f"{publisher.enqueuer}#{seq}".encode()
            # Once the session exists a publish goes alone (a reorder makes a gap the
            # machine holds); before, the whole window, so that seq 1 is committed first.
            resend = resend or not publisher.established
            if not resend and leader is not None:
                self.propose(publisher.node, leader, [self.enqueue_command(publisher, seq)])
        if resend and leader is not None and publisher.unconfirmed:
            publisher.last_send = self.now
            commands = [self.enqueue_command(publisher, seq) for seq in sorted(publisher.unconfirmed)]
            self.propose(publisher.node, leader, commands)

    def enqueue_command(self, publisher: Publisher, seq: int) -> bytes:
        return qcodec.encode(qc.Enqueue(publisher.enqueuer, seq, self.now_ms(publisher.node), "", "q", b"",
                                 publisher.unconfirmed[seq]))

    def consumer_step(self, consumer: Consumer) -> None:
        scenario = self.queue_scenario
        leader = self.leader_of(consumer.node)
        resend = leader != consumer.leader or self.now - consumer.last_send >= scenario.resend_ticks
        consumer.leader = leader
        if leader is None:
            return
        if not consumer.registered and resend:
            consumer.last_send = self.now
            self.propose(consumer.node, leader, [qcodec.encode(qc.Checkout(
                consumer.owner, consumer.tag, self.now_ms(consumer.node), scenario.prefetch))])
        elif consumer.pending and resend:
            consumer.last_send = self.now
            self.send_releases(consumer, list(consumer.pending.values()))
        if consumer.registered and self.now - consumer.last_poll >= scenario.poll_ticks:
            consumer.last_poll = self.now
            self.poll(consumer, leader)

    def send_releases(self, consumer: Consumer, releases: list[tuple[int, tuple[int, int]]]) -> None:
        leader = self.leader_of(consumer.node)
        if leader is None:
            return
        now_ms = self.now_ms(consumer.node)
        settles = [item for op, item in releases if op is qc.Settle]
        returns = [item for op, item in releases if op is qc.Return]
        commands = []
        if settles:
            commands.append(qcodec.encode(qc.Settle(consumer.owner, consumer.tag, now_ms, settles)))
        if returns:
            commands.append(qcodec.encode(qc.Return(consumer.owner, consumer.tag, now_ms, returns)))
        self.propose(consumer.node, leader, commands)

    def poll(self, consumer: Consumer, leader: str) -> None:
        """Ask the leader for the deliveries after the last contiguous seq."""
        consumer_id, watermark, owner = consumer.consumer_id, consumer.watermark, consumer.owner

        def answer() -> None:
            if self.nodes[leader].raft.role != Role.LEADER:
                return
            deliveries = self.with_bodies(leader, self.machines[leader].deliveries_since(consumer_id, watermark))
            self.to_consumer(leader, owner, lambda c: self.on_resync(c, deliveries))
        self.network.send(consumer.node, leader, answer)

    # --- leader-side duties -----------------------------------------------------------------------

    def leader_step(self, node: SimNode) -> None:
        raft, node_id = node.raft, node.node_id
        caught_up = node.applied_index == raft.commit_index and raft.log.term(raft.commit_index) == raft.term
        if caught_up and self.resent_term.get(node_id) != raft.term:
            # A new leader resends what is checked out: its predecessor's deliveries
            # may have been lost with it. Consumers drop the seqs they saw.
            self.resent_term[node_id] = raft.term
            for delivery in self.machines[node_id].checked_out_deliveries():
                self.stats["resent deliveries"] += 1
                self.send_delivery(node_id, delivery)
        self.detect_failures(node)

    def detect_failures(self, leader: SimNode) -> None:
        machine = self.machines[leader.node_id]
        on_node: dict[str, list[tuple]] = {}
        for consumer in machine.state.consumers:
            on_node.setdefault(qm.owner_node(consumer[0]), []).append(consumer)
        for node_id, node in self.nodes.items():
            consumers = on_node.get(node_id, [])
            reachable = node.raft is not None and frozenset((leader.node_id, node_id)) not in self.cut
            incarnation = f"inc{self.incarnations[node_id]}"
            if reachable:
                stale = any(qm.owner_incarnation(c[0]) != incarnation for c in consumers)
                if node_id in machine.suspected_nodes or stale:
                    now_ms = self.now_ms(leader.node_id)
                    self.detector_propose(leader, qcodec.encode(qc.NodeUp(node_id, incarnation, now_ms)))
                continue
            if any(c not in machine.suspected_consumers for c in consumers):
                self.detector_propose(leader, qcodec.encode(qc.NodeDown(node_id, self.now_ms(leader.node_id))))
            down_for = self.now - self.down_since.get(node_id, self.now)
            if node_id in machine.suspected_nodes and down_for >= self.queue_scenario.gone_ticks:
                self.detector_propose(leader, qcodec.encode(qc.NodeGone(node_id, self.now_ms(leader.node_id))))

    def detector_propose(self, leader: SimNode, data: bytes) -> None:
        key = (leader.node_id, tuple(qcodec.decode_positional(data)[:2]))
        if self.now - self.detector_last.get(key, -1_000) < self.queue_scenario.detector_retry_ticks:
            return
        self.detector_last[key] = self.now
        if leader.raft.propose(data) is not None:
            self.after_input(leader)

    # --- one step of the clients --------------------------------------------------------------------

    def client_step(self) -> None:
        """Replaces raftsim's client: the queue's clients and the leader's duties."""
        self.network.deliver_due()
        for node in self.leaders():
            self.leader_step(node)
        for publisher in list(self.publishers.values()):
            self.publisher_step(publisher)
        for consumer in list(self.consumers.values()):
            self.consumer_step(consumer)

    # --- the end -----------------------------------------------------------------------------------

    def quiescent(self) -> bool:
        if not super().quiescent():
            return False
        leader = self.leaders()[0]
        machine = self.machines[leader.node_id]
        if machine.ready_count or machine.unacked_count or machine.suspected_nodes:
            return False
        if any(p.unconfirmed for p in self.publishers.values()):
            return False
        if any(not c.registered or c.pending for c in self.consumers.values()):
            return False
        current = {f"{n}/inc{i}/c" for n, i in self.incarnations.items()}
        return all(c[0] in current for c in machine.state.consumers)

    def check_liveness(self) -> None:
        self.check(self.quiescent(), f"the queue did not drain after {self.scenario.quiesce_ticks} quiet "
                   f"ticks: {self.describe_queue()}" + self.describe())
        leader = self.leaders()[0]
        reference = self.machines[leader.node_id].snapshot()
        for voter in leader.raft.voters:
            self.check(self.machines[voter].snapshot() == reference, f"{voter}'s machine differs from the leader's")
        lost = self.confirmed - self.received
        self.check(not lost, f"confirmed but never delivered: {sorted(lost)[:10]}")
        self.check(self.confirmed <= self.enqueued, "confirmed but never enqueued")

    def describe_queue(self) -> str:
        leaders = self.leaders()
        if len(leaders) != 1:
            return f"{len(leaders)} leaders"
        machine = self.machines[leaders[0].node_id]
        unconfirmed = {p.enqueuer: sorted(p.unconfirmed) for p in self.publishers.values() if p.unconfirmed}
        waiting = {c.owner: (c.registered, sorted(c.pending)) for c in self.consumers.values()}
        return (f"ready={machine.ready_count} unacked={machine.unacked_count} "
                f"suspected={sorted(machine.suspected_nodes)} consumers={list(machine.state.consumers)} "
                f"unconfirmed={unconfirmed} clients={waiting}")
