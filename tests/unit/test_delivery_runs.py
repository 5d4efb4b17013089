"""A leader's deliveries to a consumer of another node (or shard) go as runs, one
DELIVERIES message per consumer per turn, bounded in bytes (broker/queues/queue_replica.py),
and the consumer's node hands a run to the consumer's channel in one call
(NodeCore.on_message -> QueueClient.on_deliveries): neither node handles the group,
owner and tag of each delivery."""
from __future__ import annotations

import msgpack

from tests.unit.test_node_core import FakeRaft
from tests.unit.test_quorum_liveness import queue_on
from warren.broker.node.node_core import DELIVERIES, NodeCore
from warren.broker.queues import queue_codec as qcodec
from warren.broker.queues import queue_commands as qc
from warren.broker.queues.queue import ConsumerSink
from warren.broker.queues.queue_replica import LOCAL_RUN_MAX, REMOTE_RUN_BYTES
from warren.broker.queues.quorum import LocalConsumer

B_CONSUMER, C_CONSUMER = "b/ib/1/1", "c/ic/1/1"


def leader_with_backlog(bodies: list[bytes]):
    queue = queue_on("a", leading=True)
    machine = queue.machine
    machine.apply(qc.Checkout(B_CONSUMER, "tb", 1, 100_000), 1)
    machine.apply(qc.Checkout(C_CONSUMER, "tc", 1, 100_000), 2)
    for seq, body in enumerate(bodies, start=1):
        machine.apply(qcodec.decode(qcodec.encode(qc.Enqueue("a/i1/1/1", seq, 1, "", "q", b"\x00\x00", body))))
    return queue


def runs_to(queue, peer: str) -> list[list]:
    return [message for to, message in queue.cluster.sent if to == peer and message[0] == DELIVERIES]


def test_a_turns_deliveries_to_a_peers_consumer_leave_as_one_run_per_consumer():
    queue = leader_with_backlog([b"m%d" % n for n in range(1, 201)])
    queue.replica.perform(queue.machine.checked_out_deliveries())
    for peer, owner, tag in (("b", B_CONSUMER, "tb"), ("c", C_CONSUMER, "tc")):
        runs = runs_to(queue, peer)
        assert len(runs) == 1, f"{peer}: {len(runs)} messages for one turn's deliveries"
        _, group, run_owner, run_tag, deliveries = runs[0]
        assert (group, run_owner, run_tag) == ("g", owner, tag)
        seqs = [delivery[0] for delivery in deliveries]
        assert seqs == list(range(1, len(seqs) + 1)), "in the order made, each once"
    bodies = sorted(d[2][3] for peer in "bc" for run in runs_to(queue, peer) for d in run[4])
    assert bodies == sorted(b"m%d" % n for n in range(1, 201)), "every message to one consumer or the other"


def test_a_run_is_bounded_so_a_window_still_leaves_in_pieces():
    queue = leader_with_backlog([bytes(1024)] * 400 + [b"s"] * 2 * LOCAL_RUN_MAX)
    queue.replica.perform(queue.machine.checked_out_deliveries())
    runs = runs_to(queue, "b")
    sizes = [sum(len(d[2][3]) for d in run[4]) for run in runs]
    counts = [len(run[4]) for run in runs]
    assert len(runs) > 1
    assert all(size <= REMOTE_RUN_BYTES + 1024 for size in sizes), sizes
    assert all(count <= LOCAL_RUN_MAX for count in counts), counts
    assert all(size >= REMOTE_RUN_BYTES or count == LOCAL_RUN_MAX for size, count in zip(sizes[:-1], counts[:-1])), \
        "a run leaves early only once it is full"
    seqs = [d[0] for run in runs for d in run[4]]
    assert seqs == list(range(1, len(seqs) + 1))


class RecordingSink(ConsumerSink):
    def __init__(self) -> None:
        self.calls: list[list] = []

    def deliver(self, queue, consumer_tag, msg_id, payload, redelivered) -> None:
        self.calls.append([(msg_id, tuple(payload), redelivered)])

    def deliver_many(self, queue, consumer_tag, deliveries) -> None:
        self.calls.append([(msg_id, tuple(payload), redelivered) for msg_id, payload, redelivered in deliveries])


def test_the_consumers_node_hands_a_run_to_the_channel_in_one_call():
    leader = leader_with_backlog([b"m%d" % n for n in range(1, 101)])
    leader.replica.perform(leader.machine.checked_out_deliveries())
    run = runs_to(leader, "b")[0]
    on_the_wire = msgpack.unpackb(msgpack.packb(run))

    follower = queue_on("b", leading=False)
    sink = RecordingSink()
    follower.local_consumers[(B_CONSUMER, "tb")] = LocalConsumer(sink=sink, consumer_id=((1, 1), "tb"), last_seq=0)
    core = NodeCore("b", "ib", ["a", "b", "c"], FakeRaft({}), 10.0)
    core.queues["g"] = follower
    assert core.on_messages("a", [on_the_wire]) == []

    assert len(sink.calls) == 1, "one call for the run"
    expected = [((d[1], d[0]), tuple(d[2]), d[3]) for d in run[4]]
    assert sink.calls[0] == expected
    assert follower.leader_hint == "a"


def test_a_run_out_of_sequence_is_held_and_asked_for_and_a_malformed_one_is_refused():
    leader = leader_with_backlog([b"m%d" % n for n in range(1, 11)])
    leader.replica.perform(leader.machine.checked_out_deliveries())
    deliveries = msgpack.unpackb(msgpack.packb(runs_to(leader, "b")[0]))[4]

    follower = queue_on("b", leading=False)
    follower.leader_hint = "a"
    sink = RecordingSink()
    follower.local_consumers[(B_CONSUMER, "tb")] = LocalConsumer(sink=sink, consumer_id=((1, 1), "tb"), last_seq=0)
    core = NodeCore("b", "ib", ["a", "b", "c"], FakeRaft({}), 10.0)
    core.queues["g"] = follower
    later, first = deliveries[2:], deliveries[:2]
    assert core.on_messages("a", [[DELIVERIES, "g", B_CONSUMER, "tb", later]]) == []
    assert sink.calls == [], "seqs 3.. wait for 1 and 2"
    assert core.on_messages("a", [[DELIVERIES, "g", B_CONSUMER, "tb", first]]) == []
    assert [msg_id for call in sink.calls for msg_id, _, _ in call] == [(d[1], d[0]) for d in deliveries]

    malformed = [DELIVERIES, "g", B_CONSUMER, "tb", [[1, 2]]]
    assert core.on_messages("a", [malformed, [DELIVERIES, "g", B_CONSUMER]]) == [malformed,
                                                                                [DELIVERIES, "g", B_CONSUMER]]
