"""broker/queues/quorum_machine.py: the quorum queue's replicated state machine.

Unit tests for every command, the enqueuer sessions and the delivery seqs,
then properties: a random command log folded through the machine keeps its
invariants, and restore(snapshot()) behaves exactly like the original.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warren.broker.queues import fifo, message_table
from warren.broker.queues import queue_codec as qcodec
from warren.broker.queues import queue_commands as qc
from warren.broker.queues import quorum_machine as qm
from warren.broker.queues.queue_commands import Applied, Delivery, Got, Purged
from warren.broker.queues.queue_snapshots import ReleaseCursor
from warren.broker.queues.quorum_machine import QuorumMachine

P1 = "n1/i1/p1"
P2 = "n2/i1/p2"
C1 = ("n1/i1/ch1", "a")
C2 = ("n2/i1/ch2", "b")
C3 = ("n3/i1/ch3", "c")


class Replica:
    """Drives a machine through the wire format, with a clock that advances."""

    def __init__(self, **limits) -> None:
        self.machine = QuorumMachine(fifo.QueueLimits(**limits))
        self.now_ms = 1_000

    def run(self, data: bytes):
        self.now_ms += 10
        return self.machine.apply(qcodec.decode(data))

    def publish(self, enqueuer: str, seq: int, body: bytes = b"x", **options):
        return self.run(qcodec.encode(qc.Enqueue(enqueuer, seq, self.now_ms, "", "q", b"", body, **options)))

    def consume(self, consumer: tuple, prefetch: int = 0, **options):
        return self.run(qcodec.encode(qc.Checkout(consumer[0], consumer[1], self.now_ms, prefetch, **options)))

    def settle(self, consumer: tuple, msg_ids):
        return self.run(qcodec.encode(qc.Settle(consumer[0], consumer[1], self.now_ms, msg_ids)))

    def requeue(self, consumer: tuple, msg_ids):
        return self.run(qcodec.encode(qc.Return(consumer[0], consumer[1], self.now_ms, msg_ids)))


def wire(record):
    """The record as it comes out of the log: through the codec and back."""
    return qcodec.decode(qcodec.encode(record))


def deliveries(effects) -> list[Delivery]:
    return [e for e in effects if isinstance(e, Delivery)]


def bodies(effects) -> list[bytes]:
    return [d.payload[3] for d in deliveries(effects)]


# --- encoding -------------------------------------------------------------------------------

def test_an_enqueue_batch_is_exactly_its_enqueues_one_after_the_other():
    m = [["ex", "rk", b"p", b"m%d" % i, None, 0] for i in range(5)]
    batched, single = qm.QuorumMachine(), qm.QuorumMachine()
    # seq 1; then 3..5 (held: 2 is missing); then 2 and 3 again (2 releases 3..5; the second 3 is a duplicate)
    batches = [(1, [m[0]]), (3, [m[2], m[3], m[4]]), (2, [m[1], m[2]])]
    effects_b, effects_s = [], []
    for first, messages in batches:
        effects_b += batched.apply(wire(qc.EnqueueBatch(P1, first, 5, messages)))[1]
        for offset, fields in enumerate(messages):
            effects_s += single.apply(wire(qc.Enqueue(P1, first + offset, 5, *fields)))[1]
    assert effects_b == effects_s
    assert [(a.seq, a.duplicate) for a in effects_b if isinstance(a, qm.Applied)] == [
        (1, False), (2, False), (3, False), (4, False), (5, False), (3, True)]
    assert batched.snapshot() == single.snapshot()


def test_an_id_named_twice_in_one_settle_or_return_is_released_once():
    machine = qm.QuorumMachine()
    machine.apply(wire(qc.Enqueue(P1, 1, 5, "", "q", b"", b"x")))
    machine.apply(wire(qc.Checkout("n1/i1/c", "t", 5, 10)))
    (delivery,) = machine.checked_out_deliveries()
    pair = (delivery.msg_id, delivery.seq)
    assert machine.apply(wire(qc.Return("n1/i1/c", "t", 6, [pair, pair])))[0] == 1
    (again,) = machine.checked_out_deliveries()
    assert machine.apply(wire(qc.Settle("n1/i1/c", "t", 7, [again.msg_id, again.msg_id])))[0] == 1
    assert machine.ready_count == 0 and machine.unacked_count == 0


def test_a_malformed_command_is_a_bug_not_a_silent_no_op():
    with pytest.raises(AssertionError, match="malformed"):
        QuorumMachine().apply([qc.Tick.TAG, 5])
    with pytest.raises(AssertionError, match="malformed"):
        QuorumMachine().apply(qc.Purged("o", 1, 0))   # an effect, not a command


def test_owner_names_carry_node_and_incarnation():
    assert qm.owner_node("n1/i7/ch3") == "n1"
    assert qm.owner_incarnation("n1/i7/ch3") == "i7"
    assert qm.owner_incarnation("n1/i7/ch/with/slashes") == "i7"
    assert qm.owner_node("plain") is None and qm.owner_incarnation("plain") is None
    assert qm.owner_node(None) is None


# --- enqueue and sessions -------------------------------------------------------------------

def test_enqueue_applies_and_confirms():
    replica = Replica()
    reply, effects = replica.publish(P1, 1, b"hello")
    assert reply == [Applied(P1, 1, accepted=True)]
    assert effects == reply
    assert replica.machine.ready_count == 1 and replica.machine.message_bytes == 5
    assert replica.machine.state.messages[1] == (("", "q", b"", b"hello"), 5)
    assert replica.machine.next_seq(P1) == 2


def test_a_duplicate_is_confirmed_but_not_enqueued_twice():
    replica = Replica()
    replica.publish(P1, 1)
    replica.publish(P1, 2)
    reply, effects = replica.publish(P1, 1)
    assert reply == effects == [Applied(P1, 1, accepted=True, duplicate=True)]
    assert replica.machine.ready_count == 2


def test_out_of_order_enqueues_are_held_then_released_in_order_with_distinct_ids():
    replica = Replica()
    replica.publish(P1, 1, b"1")
    assert replica.publish(P1, 4, b"4") == ([], [])
    assert replica.publish(P1, 3, b"3") == ([], [])
    assert replica.publish(P1, 4, b"4") == ([], [])     # a resend of a held one: held once
    assert replica.machine.held_count(P1) == 2 and replica.machine.ready_count == 1
    reply, _ = replica.publish(P1, 2, b"2")
    assert [a.seq for a in reply] == [2, 3, 4]
    assert replica.machine.held_count(P1) == 0
    state = replica.machine.state
    assert [state.messages[m][0][3] for m in state.ready] == [b"1", b"2", b"3", b"4"]
    assert list(state.ready) == [1, 2, 3, 4]
    assert replica.machine.next_msg_id == 5


def test_released_enqueues_are_delivered_in_seq_order():
    replica = Replica()
    replica.consume(C1)
    replica.publish(P1, 1, b"1")
    replica.publish(P1, 3, b"3")
    _, effects = replica.publish(P1, 2, b"2")
    assert bodies(effects) == [b"2", b"3"]
    assert [type(e) for e in effects] == [Delivery, Applied, Delivery, Applied]


def test_the_hold_is_bounded_and_beyond_it_commands_are_dropped_for_the_sender_to_resend():
    replica = Replica()
    replica.publish(P1, 1)
    for seq in range(3, 3 + qm.HOLD_MAX):
        replica.publish(P1, seq)
    assert replica.machine.held_count(P1) == qm.HOLD_MAX
    assert replica.publish(P1, 3 + qm.HOLD_MAX) == ([], [])
    assert replica.machine.held_count(P1) == qm.HOLD_MAX
    reply, _ = replica.publish(P1, 2)
    assert len(reply) == 1 + qm.HOLD_MAX
    assert replica.machine.next_seq(P1) == 3 + qm.HOLD_MAX
    reply, _ = replica.publish(P1, 3 + qm.HOLD_MAX)             # the resend
    assert reply == [Applied(P1, 3 + qm.HOLD_MAX, accepted=True)]


def test_an_unknown_enqueuer_starts_at_seq_1_and_enqueuers_are_independent():
    """As rabbit_fifo's #enqueuer{next_seqno = 1}: a publisher's session always starts at 1
    (broker/queues/quorum.py), so a first command with a later seq was overtaken by earlier ones
    that are still on their way (sent before a leader was known, say). Taking it for the
    start would confirm those earlier ones as duplicates without enqueuing them: confirmed
    messages lost (found by warren-chaos: the first two publishes of a run, confirmed, never
    delivered)."""
    replica = Replica()
    assert replica.publish(P1, 3, b"3") == ([], [])
    assert replica.publish(P2, 1)[0] == [Applied(P2, 1, accepted=True)]
    assert replica.publish(P1, 1, b"1")[0] == [Applied(P1, 1, accepted=True)]
    reply, _ = replica.publish(P1, 2, b"2")
    assert reply == [Applied(P1, 2, accepted=True), Applied(P1, 3, accepted=True)]
    state = replica.machine.state
    assert [state.messages[m][0][3] for m in state.ready if state.messages[m][0][3] != b"x"] == [b"1", b"2", b"3"]
    assert replica.publish(P1, 2)[0] == [Applied(P1, 2, accepted=True, duplicate=True)]


def test_a_refused_enqueue_is_applied_as_not_accepted():
    replica = Replica(max_length=1, overflow=fifo.REJECT_PUBLISH)
    replica.publish(P1, 1)
    reply, _ = replica.publish(P1, 2)
    assert reply == [Applied(P1, 2, accepted=False)]
    assert replica.machine.next_seq(P1) == 3 and replica.machine.ready_count == 1


def test_reject_publish_dlx_dead_letters_and_applies_as_not_accepted():
    replica = Replica(max_length=1, overflow=fifo.REJECT_PUBLISH_DLX)
    replica.publish(P1, 1)
    _, effects = replica.publish(P1, 2, b"late")
    assert effects == [qc.DeadLettered("maxlen", (("", "q", b"", b"late"),)), Applied(P1, 2, accepted=False)]


def test_message_ids_are_never_reused_even_after_refusals():
    replica = Replica(max_length=1, overflow=fifo.REJECT_PUBLISH)
    replica.publish(P1, 1)
    replica.publish(P1, 2)                         # refused: id 2 is spent anyway
    replica.run(qcodec.encode(qc.Purge("o", 1, 0)))
    replica.publish(P1, 3)
    assert list(replica.machine.state.messages) == [3]


# --- consumers and delivery seqs ----------------------------------------------------------------

def test_each_consumer_numbers_its_own_deliveries():
    replica = Replica()
    replica.consume(C1)
    replica.consume(C2)
    effects = []
    for seq in range(1, 5):
        effects += replica.publish(P1, seq)[1]
    got = [(d.consumer, d.seq, d.msg_id) for d in deliveries(effects)]
    assert got == [(C1, 1, 1), (C2, 1, 2), (C1, 2, 3), (C2, 2, 4)]
    assert all(not d.redelivered and d.delivery_count == 0 for d in deliveries(effects))


def test_checked_out_deliveries_lists_the_unsettled_with_their_original_seqs():
    replica = Replica()
    replica.consume(C1)
    replica.consume(C2)
    for seq in range(1, 7):
        replica.publish(P1, seq)
    replica.settle(C1, [1])          # C1 held msgs 1, 3, 5 with seqs 1, 2, 3
    replica.settle(C2, [(4, 2)])     # C2 held msgs 2, 4, 6 with seqs 1, 2, 3
    listed = [(d.consumer, d.seq, d.msg_id) for d in replica.machine.checked_out_deliveries()]
    assert listed == [(C1, 2, 3), (C1, 3, 5), (C2, 1, 2), (C2, 3, 6)]
    assert replica.machine.deliveries_since(C1, 2) == [
        Delivery(C1, 3, 5, ("", "q", b"", b"x"), False, 0)]
    assert replica.machine.deliveries_since(list(C2), 0)[0].seq == 1    # a decoded consumer id works too
    assert replica.machine.deliveries_since(("nobody", "x"), 0) == []


def test_a_returned_message_comes_back_with_a_new_seq_and_the_old_one_is_forgotten():
    replica = Replica()
    replica.consume(C1, prefetch=1)
    replica.publish(P1, 1)
    _, effects = replica.requeue(C1, [(1, 1)])
    assert deliveries(effects) == [Delivery(C1, 2, 1, ("", "q", b"", b"x"), True, 1)]
    assert [(d.seq, d.msg_id) for d in replica.machine.checked_out_deliveries()] == [(2, 1)]


def test_a_stale_seq_qualified_return_is_ignored():
    """A RETURN resent after the message came back must not return the new delivery."""
    replica = Replica()
    replica.consume(C1)
    replica.publish(P1, 1)
    replica.requeue(C1, [(1, 1)])              # redelivered as seq 2
    reply, effects = replica.requeue(C1, [(1, 1)])
    assert reply == 0 and effects == []
    assert replica.machine.unacked_count == 1
    assert replica.settle(C1, [(1, 2)])[0] == 1
    assert replica.machine.unacked_count == 0 and replica.machine.checked_out_deliveries() == []


def test_settling_unknown_or_foreign_ids_is_harmless():
    replica = Replica()
    replica.consume(C1)
    replica.consume(C2)
    replica.publish(P1, 1)
    replica.publish(P1, 2)
    assert replica.settle(C1, [2, 99, (1, 5)])[0] == 0        # 2 is C2's; seq 5 never was
    assert replica.settle(("ghost", "t"), [1])[0] == 0
    assert replica.machine.unacked_count == 2


def test_no_ack_deliveries_are_numbered_but_not_remembered():
    replica = Replica()
    replica.consume(C1, no_ack=True)
    _, effects = replica.publish(P1, 1)
    assert [d.seq for d in deliveries(effects)] == [1]
    assert replica.machine.checked_out_deliveries() == [] and replica.machine.unacked_count == 0


def test_discard_dead_letters_and_forgets_the_seq():
    replica = Replica()
    replica.consume(C1)
    replica.publish(P1, 1, b"bad")
    reply, effects = replica.run(qcodec.encode(qc.Discard(C1[0], C1[1], 0, [1])))
    assert reply == 1 and effects == [qc.DeadLettered("rejected", (("", "q", b"", b"bad"),))]
    assert replica.machine.checked_out_deliveries() == []


def test_cancel_keeps_what_is_held_and_a_reused_tag_numbers_from_one_again():
    replica = Replica()
    replica.consume(C1)
    replica.publish(P1, 1)
    assert replica.run(qcodec.encode(qc.Cancel(C1[0], C1[1], 0)))[0] == fifo.ACCEPTED
    assert replica.machine.consumer_count == 0
    _, effects = replica.publish(P1, 2)
    assert deliveries(effects) == []
    assert [d.seq for d in replica.machine.checked_out_deliveries()] == [1]
    replica.settle(C1, [1])                     # the cancelled consumer is gone now
    assert C1 not in replica.machine.state.consumers
    _, effects = replica.consume(C1)
    assert [(d.seq, d.msg_id) for d in deliveries(effects)] == [(1, 2)]


def test_suspend_and_resume_a_consumer():
    replica = Replica()
    replica.consume(C1, active=False)
    assert deliveries(replica.publish(P1, 1)[1]) == []
    _, effects = replica.run(qcodec.encode(qc.Suspend(C1[0], C1[1], 0, True)))
    assert [d.msg_id for d in deliveries(effects)] == [1]


def test_dequeue_answers_with_got_and_an_acked_get_is_settled_with_tag_none():
    replica = Replica()
    replica.publish(P1, 1, b"g")
    reply, effects = replica.run(qcodec.encode(qc.Dequeue("n1/i1/ch1", 42, 0, False)))
    assert reply == fifo.Dequeued(1, ("", "q", b"", b"g"), False, 0, 0)
    assert effects == [Got("n1/i1/ch1", 42, reply)]
    assert replica.machine.unacked_count == 1
    assert replica.machine.checked_out_deliveries() == []       # answered by Got, not resent
    assert replica.run(qcodec.encode(qc.Settle("n1/i1/ch1", None, 0, [1])))[0] == 1
    reply, effects = replica.run(qcodec.encode(qc.Dequeue("n1/i1/ch1", 43, 0, True)))
    assert reply is None and effects == [Got("n1/i1/ch1", 43, None)]


def test_purge_answers_with_purged():
    replica = Replica()
    replica.publish(P1, 1)
    replica.publish(P1, 2)
    reply, effects = replica.run(qcodec.encode(qc.Purge("n1/i1/ch1", 7, 0)))
    assert reply == 2 and effects == [Purged("n1/i1/ch1", 7, 2)]
    assert replica.machine.message_bytes == 0


def test_tick_expires_by_the_commands_time():
    replica = Replica(message_ttl_ms=100)
    replica.run(qcodec.encode(qc.Enqueue(P1, 1, 1_000, "", "q", b"", b"old", None, 0)))
    assert replica.run(qcodec.encode(qc.Tick(1_100)))[1] == []
    _, effects = replica.run(qcodec.encode(qc.Tick(1_101)))
    assert effects == [qc.DeadLettered("expired", (("", "q", b"", b"old"),))]


def test_time_never_goes_back():
    replica = Replica(message_ttl_ms=100)
    replica.run(qcodec.encode(qc.Tick(5_000)))
    replica.run(qcodec.encode(qc.Enqueue(P1, 1, 1_000, "", "q", b"", b"m", None, 0)))   # a slow clock
    assert replica.machine.state.expiries[1] == 5_100
    assert replica.run(qcodec.encode(qc.Tick(2_000)))[1] == []


def test_down_returns_what_the_owner_held_and_forgets_it_as_an_enqueuer():
    replica = Replica()
    replica.consume(C1)
    replica.run(qcodec.encode(qc.Enqueue(C1[0], 1, 0, "", "q", b"", b"m", None, 0)))
    replica.consume(C2)
    reply, effects = replica.run(qcodec.encode(qc.Down(C1[0], 0)))
    assert reply == 1
    assert deliveries(effects) == [Delivery(C2, 1, 1, ("", "q", b"", b"m"), True, 1)]
    assert replica.machine.next_seq(C1[0]) is None
    assert replica.machine.consumer_count == 1


# --- nodes ------------------------------------------------------------------------------------

def test_a_suspected_node_keeps_what_it_holds_and_gets_nothing_new():
    replica = Replica()
    replica.consume(C1)
    replica.consume(C2)
    replica.publish(P1, 1)
    reply, _ = replica.run(qcodec.encode(qc.NodeDown("n1", 0)))
    assert reply == [C1]
    assert replica.machine.suspected_nodes == {"n1"} and replica.machine.suspected_consumers == {C1}
    effects = replica.publish(P1, 2)[1] + replica.publish(P1, 3)[1]
    assert {d.consumer for d in deliveries(effects)} == {C2}
    assert [d.msg_id for d in replica.machine.deliveries_since(C1, 0)] == [1]
    assert replica.settle(C1, [1])[0] == 1       # a late settle from the suspected node still counts


def test_node_up_with_the_same_incarnation_resumes_its_consumers():
    replica = Replica()
    replica.consume(C1)
    replica.run(qcodec.encode(qc.NodeDown("n1", 0)))
    replica.publish(P1, 1)
    reply, effects = replica.run(qcodec.encode(qc.NodeUp("n1", "i1", 0)))
    assert reply == []
    assert [d.consumer for d in deliveries(effects)] == [C1]
    assert replica.machine.suspected_nodes == frozenset() and replica.machine.suspected_consumers == frozenset()


def test_a_suspend_during_suspicion_is_the_state_resumed_into():
    replica = Replica()
    replica.consume(C1)
    replica.run(qcodec.encode(qc.NodeDown("n1", 0)))
    replica.run(qcodec.encode(qc.Suspend(C1[0], C1[1], 0, False)))
    replica.publish(P1, 1)
    assert deliveries(replica.run(qcodec.encode(qc.NodeUp("n1", "i1", 0)))[1]) == []
    assert replica.machine.state.consumers[C1].suspended


def test_node_up_with_a_new_incarnation_downs_the_old_owners():
    replica = Replica()
    replica.consume(C1)
    replica.run(qcodec.encode(qc.Enqueue("n1/i1/pub", 1, 0, "", "q", b"", b"m", None, 0)))
    replica.run(qcodec.encode(qc.NodeDown("n1", 0)))
    replica.consume(C2)
    reply, effects = replica.run(qcodec.encode(qc.NodeUp("n1", "i2", 0)))
    assert reply == [C1[0]]
    assert deliveries(effects) == [Delivery(C2, 1, 1, ("", "q", b"", b"m"), True, 1)]
    assert C1 not in replica.machine.state.consumers
    assert replica.machine.next_seq("n1/i1/pub") is None       # that publisher died with i1
    assert replica.machine.suspected_consumers == frozenset()


def test_after_node_up_the_dead_incarnations_late_commands_are_refused():
    """A resend from the dead publisher, still in flight, must not restart its
    forgotten session (it would enqueue seq 1 again)."""
    replica = Replica()
    replica.publish("n1/i1/pub", 1)
    replica.run(qcodec.encode(qc.NodeUp("n1", "i2", 0)))
    assert replica.publish("n1/i1/pub", 1) == ([], [])
    assert replica.consume(("n1/i1/ch", "t")) == (fifo.REJECTED, [])
    assert replica.run(qcodec.encode(qc.Dequeue("n1/i1/ch", 1, 0, False))) == (None, [])
    assert replica.machine.ready_count == 1 and replica.machine.consumer_count == 0
    assert replica.publish("n1/i2/pub", 1)[0] == [Applied("n1/i2/pub", 1, accepted=True)]
    assert replica.publish("n1/i3/pub", 1)[0] == [Applied("n1/i3/pub", 1, accepted=True)]   # not yet known dead


def test_retired_incarnations_are_bounded_per_node():
    replica = Replica()
    for incarnation in range(qm.RETIRED_MAX + 5):
        replica.publish(f"n1/i{incarnation}/pub", 1)
        replica.run(qcodec.encode(qc.NodeUp("n1", f"i{incarnation + 1}", 0)))
    assert replica.publish("n1/i0/pub", 1)[0] == [Applied("n1/i0/pub", 1, accepted=True)]   # long forgotten
    assert replica.publish(f"n1/i{qm.RETIRED_MAX + 4}/pub", 2) == ([], [])


def test_node_up_after_a_quick_restart_without_suspicion_also_downs_the_old_owners():
    replica = Replica()
    replica.consume(C1)
    replica.publish(P1, 1)
    reply, _ = replica.run(qcodec.encode(qc.NodeUp("n1", "i2", 0)))
    assert reply == [C1[0]] and replica.machine.unacked_count == 0 and replica.machine.ready_count == 1


def test_node_gone_downs_the_suspected_incarnation_but_not_a_newer_one():
    replica = Replica()
    replica.consume(C1)
    replica.publish(P1, 1)
    replica.run(qcodec.encode(qc.NodeDown("n1", 0)))
    newer = ("n1/i2/ch9", "z")
    replica.consume(newer)                      # the node restarted before NODE_GONE committed
    reply, effects = replica.run(qcodec.encode(qc.NodeGone("n1", 0)))
    assert reply == [C1[0]]
    assert [d.consumer for d in deliveries(effects)] == [newer]
    assert newer in replica.machine.state.consumers and replica.machine.suspected_nodes == frozenset()


def test_node_gone_without_suspicion_downs_every_owner_on_the_node():
    replica = Replica()
    replica.consume(C1)
    replica.consume(("n1/i1/other", "t"))
    replica.consume(C2)
    reply, _ = replica.run(qcodec.encode(qc.NodeGone("n1", 0)))
    assert reply == [C1[0], "n1/i1/other"]
    assert list(replica.machine.state.consumers) == [C2]


def test_a_cluster_node_gone_gives_back_what_its_consumers_hold_and_they_resume_when_it_is_back():
    """As RabbitMQ on `noconnection`: a node away longer than the gone timeout loses what its
    consumers hold (others take it), not its consumers. Dropping them left a channel that
    lived through a partition consuming from nowhere, for good (warren-chaos seed 23)."""
    replica = Replica()
    replica.consume(C1, prefetch=2)
    replica.publish(P1, 1)
    replica.publish(P1, 2)
    replica.run(qcodec.encode(qc.NodeDown("n1", 0)))
    reply, effects = replica.run(qcodec.encode(qc.NodeGone("n1", 0, keep_consumers=True)))
    assert reply == [C1[0]] and deliveries(effects) == []
    assert replica.machine.ready_count == 2 and replica.machine.unacked_count == 0
    assert C1 in replica.machine.state.consumers and C1 in replica.machine.suspected_consumers
    replica.consume(C2, prefetch=1)
    assert [d.consumer for d in deliveries(replica.publish(P1, 3)[1])] == []   # C2 took message 1 already
    reply, effects = replica.run(qcodec.encode(qc.NodeUp("n1", "i1", 0)))   # back, the same incarnation
    assert reply == [] and C1 not in replica.machine.suspected_consumers
    redelivered = [d for d in deliveries(effects) if d.consumer == C1]
    assert [(d.seq, d.redelivered) for d in redelivered] == [(3, True), (4, False)], \
        "its deliveries go on counting after the two it held; the one it held comes again, flagged"


def test_a_cluster_node_gone_hands_single_active_consumption_to_the_next_consumer():
    replica = Replica(single_active_consumer=True)
    replica.consume(C1, prefetch=1)
    replica.consume(C2, prefetch=1)
    replica.publish(P1, 1)
    replica.run(qcodec.encode(qc.NodeDown("n1", 0)))
    _, effects = replica.run(qcodec.encode(qc.NodeGone("n1", 0, keep_consumers=True)))
    assert [(d.consumer, d.redelivered) for d in deliveries(effects)] == [(C2, True)]
    assert list(replica.machine.state.consumers) == [C2, C1], "C1 waits behind, for its node"


def test_a_checkout_from_a_suspected_node_is_not_suspected():
    replica = Replica()
    replica.run(qcodec.encode(qc.NodeDown("n1", 0)))
    replica.consume(C1)
    assert replica.machine.suspected_consumers == frozenset()
    assert [d.consumer for d in deliveries(replica.publish(P1, 1)[1])] == [C1]


# --- properties -----------------------------------------------------------------------------------

OWNERS = ["n1/i1/a", "n1/i2/b", "n2/i1/c", "n3/i1/d"]
ENQUEUERS = ["n1/i1/a", "n2/i1/p"]
NODES = ["n1", "n2", "n3"]
KINDS = (["enqueue"] * 6 + ["release"] * 4 + ["checkout"] * 3
         + ["cancel", "suspend", "dequeue", "purge", "down", "node_down", "node_up", "node_gone", "tick"])


class Choices:
    """Hypothesis draws a string of bytes; commands are read from it against
    the machine's current state (fast to generate, quick to shrink)."""

    def __init__(self, numbers: bytes) -> None:
        self.numbers = numbers
        self.position = 0

    def int(self, low: int, high: int) -> int:
        number = self.numbers[self.position] if self.position < len(self.numbers) else 0
        self.position += 1
        return low + number % (high - low + 1)

    def pick(self, options):
        return options[self.int(0, len(options) - 1)]

    def exhausted(self) -> bool:
        return self.position >= len(self.numbers)


def draw_command(choices: Choices, machine: QuorumMachine) -> bytes:
    """One command, read with the machine's state in view so that settles name
    messages actually held, seqs land near what the session expects, and so on."""
    now = choices.int(0, 20) * 1_000
    owner, tag = choices.pick(OWNERS), choices.pick(["x", "y"])
    match choices.pick(KINDS):
        case "enqueue":
            enqueuer = choices.pick(ENQUEUERS)
            seq = max(1, (machine.next_seq(enqueuer) or 1) + choices.int(-2, 3))
            body = b"b" * choices.int(0, 6)
            ttl = choices.pick([None, 0, 1_000, 3_000])
            return qcodec.encode(qc.Enqueue(enqueuer, seq, now, "", "q", b"", body, ttl, choices.int(0, 4)))
        case "release":
            release = choices.pick([qc.Settle, qc.Return, qc.Discard])
            owner, tag, msg_ids = draw_release(choices, machine, owner, tag)
            return qcodec.encode(release(owner, tag, now, msg_ids))
        case "checkout":
            return qcodec.encode(qc.Checkout(owner, tag, now, choices.int(0, 3), choices.int(0, 1),
                                      choices.int(0, 3) == 0, choices.int(0, 3) != 0))
        case "cancel":
            return qcodec.encode(qc.Cancel(owner, tag, now))
        case "suspend":
            return qcodec.encode(qc.Suspend(owner, tag, now, choices.int(0, 1) == 1))
        case "dequeue":
            return qcodec.encode(qc.Dequeue(owner, choices.int(0, 9), now, choices.int(0, 1) == 1))
        case "purge":
            return qcodec.encode(qc.Purge(owner, 1, now))
        case "down":
            return qcodec.encode(qc.Down(owner, now))
        case "node_down":
            return qcodec.encode(qc.NodeDown(choices.pick(NODES), now))
        case "node_up":
            return qcodec.encode(qc.NodeUp(choices.pick(NODES), choices.pick(["i1", "i2"]), now))
        case "node_gone":
            return qcodec.encode(qc.NodeGone(choices.pick(NODES), now))
        case "tick":
            return qcodec.encode(qc.Tick(now))
    raise AssertionError("unreachable")


def draw_release(choices: Choices, machine: QuorumMachine, owner: str, tag: str):
    """(owner, tag, msg_ids): mostly what some consumer holds, bare or with its
    seq (right or stale), sometimes anything."""
    holders = [c for c, state in machine.state.consumers.items() if state.checked_out]
    if not holders or choices.int(0, 9) == 0:
        return owner, tag, [choices.int(1, 20) for _ in range(choices.int(0, 3))]
    consumer = choices.pick(holders)
    seqs = {d.msg_id: d.seq for d in machine.deliveries_since(consumer, 0)}
    held = list(machine.state.consumers[consumer].checked_out)
    ids = []
    for msg_id in dict.fromkeys(choices.pick(held) for _ in range(choices.int(1, 3))):
        form = choices.int(0, 2)
        if form == 0 or msg_id not in seqs:
            ids.append(msg_id)
        else:
            ids.append((msg_id, seqs[msg_id] - (form == 2)))     # form 2: a stale seq
    return consumer[0], consumer[1], ids


limits_strategy = st.builds(
    fifo.QueueLimits,
    max_length=st.none() | st.integers(1, 6),
    max_length_bytes=st.none() | st.integers(4, 40),
    overflow=st.sampled_from([fifo.DROP_HEAD, fifo.REJECT_PUBLISH, fifo.REJECT_PUBLISH_DLX]),
    message_ttl_ms=st.none() | st.integers(0, 5000),
    single_active_consumer=st.booleans(),
    max_priority=st.none() | st.just(3),
    delivery_limit=st.none() | st.integers(0, 3),
)


def check_invariants(machine: QuorumMachine) -> None:
    """The seqs remembered are exactly what the consumers hold (pseudo-consumers of
    basic.get aside); listings are in seq order; a suspected consumer is suspended."""
    state = machine.state
    for consumer, consumer_state in state.consumers.items():
        listed = machine.deliveries_since(consumer, 0)
        assert [d.seq for d in listed] == sorted(d.seq for d in listed)
        if consumer[1] is not None:
            assert {d.msg_id for d in listed} == set(consumer_state.checked_out)
    for consumer in machine.suspected_consumers:
        assert state.consumers[consumer].suspended
    assert all(msg_id < machine.next_msg_id for msg_id in state.messages)
    assert machine.ready_count + machine.unacked_count == len(state.messages)
    assert machine.message_bytes == sum(message_table.unpacked(held)[1] for held in state.messages.values())


def run_log(choices: Choices, machine: QuorumMachine, length: int | None = None) -> list[tuple[bytes, tuple]]:
    """Reads and applies commands (`length` of them, or until the choices run
    out); returns each with what it produced."""
    log = []
    while (len(log) < length) if length is not None else not choices.exhausted():
        command = draw_command(choices, machine)
        log.append((command, machine.apply(qcodec.decode(command))))
        check_invariants(machine)
    return log


choices_strategy = st.binary(min_size=300, max_size=900).map(Choices)


@settings(max_examples=300, deadline=None)
@given(limits_strategy, st.integers(0, 80), choices_strategy)
def test_restore_of_a_snapshot_behaves_exactly_like_the_original(limits, before, choices):
    original = QuorumMachine(limits)
    run_log(choices, original, before)
    snapshot = original.snapshot()
    restored = QuorumMachine.restore(snapshot)
    assert restored.snapshot() == snapshot
    for command, produced in run_log(choices, original):
        assert restored.apply(qcodec.decode(command)) == produced
    assert restored.snapshot() == original.snapshot()
    assert restored.checked_out_deliveries() == original.checked_out_deliveries()


@settings(max_examples=100, deadline=None)
@given(limits_strategy, choices_strategy)
def test_replicas_applying_the_same_log_agree(limits, choices):
    first, second = QuorumMachine(limits), QuorumMachine(limits)
    for command, produced in run_log(choices, first):
        assert second.apply(qcodec.decode(command)) == produced
    assert first.snapshot() == second.snapshot()


def test_the_snapshot_holds_every_part_of_the_state():
    replica = Replica(max_priority=3, message_ttl_ms=60_000, single_active_consumer=True, delivery_limit=5)
    replica.consume(C1, prefetch=2, priority=1)
    replica.consume(C2)
    replica.publish(P1, 1, b"a", priority=2)
    replica.publish(P1, 2, b"b", ttl_ms=50)
    replica.requeue(C1, [1])
    replica.publish(P1, 5, b"held")
    replica.run(qcodec.encode(qc.NodeDown("n2", 0)))
    replica.run(qcodec.encode(qc.Enqueue("n3/i1/gone", 1, 0, "", "q", b"", b"", None, 0)))
    replica.run(qcodec.encode(qc.NodeUp("n3", "i2", 0)))
    restored = QuorumMachine.restore(replica.machine.snapshot())
    state, original = restored.state, replica.machine.state
    assert state.limits == original.limits
    assert state.messages == original.messages and state.delivery_counts == original.delivery_counts
    assert state.expiries == original.expiries and state.message_priorities == original.message_priorities
    assert list(state.consumers) == list(original.consumers)
    assert state.consumers[C1].checked_out == original.consumers[C1].checked_out
    assert restored.held_count(P1) == 1 and restored.next_seq(P1) == 3
    assert restored.suspected_nodes == {"n2"} and restored.suspected_consumers == {C2}
    assert restored.next_msg_id == replica.machine.next_msg_id
    assert restored.apply(wire(qc.Enqueue("n3/i1/gone", 2, 0, "", "q", b"", b"", None, 0))) == ([], [])
    assert restored.checked_out_deliveries() == replica.machine.checked_out_deliveries()


# --- messages as references into the log ------------------------------------------------------

def test_with_log_indexes_messages_are_references_into_the_log():
    machine = QuorumMachine()
    log = {}

    def apply(index, data):
        log[index] = data
        return machine.apply(qcodec.decode(data), index)

    apply(1, qcodec.encode(qc.Enqueue(P1, 1, 5, "", "q", b"", b"one")))
    two, three = ["", "q", b"", b"two", None, 0], ["", "q", b"", b"three", None, 0]
    apply(2, qcodec.encode(qc.EnqueueBatch(P1, 2, 6, [two, three])))
    assert machine.oldest_ref_index() == 1
    _, effects = apply(3, qcodec.encode(qc.Checkout(*C1, 7, 10)))
    refs = [d.payload for d in deliveries(effects)]
    assert [qm.ref_location(ref) for ref in refs] == [(1, 0), (2, 0), (2, 1)], refs
    bodies_read = [qm.message_payload(qcodec.decode(log[index]), slot)[3] for index, slot in map(qm.ref_location, refs)]
    assert bodies_read == [b"one", b"two", b"three"]
    # a snapshot keeps references, not bodies
    assert b"three" not in machine.snapshot()
    apply(4, qcodec.encode(qc.Settle(*C1, 8, [1])))
    assert machine.oldest_ref_index() == 2
    apply(5, qcodec.encode(qc.Settle(*C1, 9, [2, 3])))
    assert machine.oldest_ref_index() is None


def test_queued_messages_of_one_size_share_their_size_object():
    """Memory per queued message: a body size above 256 is an int object of its
    own unless shared, and the fifo keeps one per message."""
    machine = QuorumMachine()
    body = b"x" * 1024
    batch = [["", "q", b"", bytes(body), None, 0] for _ in range(3)]
    machine.apply(qcodec.decode(qcodec.encode(qc.EnqueueBatch(P1, 1, 5, batch))), 1)
    machine.apply(qcodec.decode(qcodec.encode(qc.Enqueue(P1, 4, 5, "", "q", b"", bytes(body)))), 2)
    sizes = [message_table.unpacked(held)[1] for held in machine.state.messages.values()]
    assert sizes == [1024] * 4
    assert all(size is sizes[0] for size in sizes)


def test_a_held_enqueue_refers_to_the_entry_it_came_in():
    machine = QuorumMachine()
    machine.apply(wire(qc.Enqueue(P1, 1, 5, "", "q", b"", b"one")), 1)
    machine.apply(wire(qc.Enqueue(P1, 3, 5, "", "q", b"", b"three")), 2)   # held: seq 2 missing
    assert machine.oldest_ref_index() == 1
    machine.apply(wire(qc.Checkout(*C1, 6, 10)), 3)
    machine.apply(wire(qc.Settle(*C1, 7, [1])), 4)
    assert machine.oldest_ref_index() == 2, "the held enqueue of entry 2 still needs it"
    restored = QuorumMachine.restore(machine.snapshot())
    _, effects = restored.apply(wire(qc.Enqueue(P1, 2, 8, "", "q", b"", b"two")), 5)
    assert [qm.ref_location(d.payload)[0] for d in deliveries(effects)] == [5, 2]


def test_the_release_cursor_promotes_a_candidate_once_nothing_refers_below_it():
    machine = QuorumMachine()
    cursor = ReleaseCursor()
    machine.apply(wire(qc.Checkout(*C1, 5, 10)), 1)
    assert cursor.offer(1, machine) == (1, machine.snapshot()), "no message kept: the state now"
    machine.apply(wire(qc.Enqueue(P1, 1, 6, "", "q", b"", b"a")), 2)    # msg 1, delivered
    assert cursor.offer(2, machine) is None, "msg 1 refers to entry 2: a candidate, not a snapshot"
    machine.apply(wire(qc.Enqueue(P1, 2, 7, "", "q", b"", b"b")), 3)    # msg 2
    candidate_at_3 = machine.snapshot()
    assert cursor.offer(3, machine) is None
    machine.apply(wire(qc.Settle(*C1, 8, [1])), 4)
    # msg 2 (entry 3) is kept: the candidate at 2 may go, the one at 3 may not
    assert cursor.offer(4, machine)[0] == 2
    machine.apply(wire(qc.Settle(*C1, 9, [2])), 5)
    assert cursor.offer(5, machine)[0] == 5, "nothing kept: the state now, newer than every candidate"
    assert candidate_at_3 != machine.snapshot()
    assert not cursor.candidates


def test_a_resent_basic_get_gets_the_same_answer_not_a_second_message():
    replica = Replica()
    replica.publish(P1, 1, b"first")
    replica.publish(P1, 2, b"second")
    owner = "n1/i1/ch1"
    get = qcodec.encode(qc.Dequeue(owner, 7, 100, False))
    first, _ = replica.run(get)
    again, effects = replica.run(get)            # the same request, sent again after a leader change
    assert first.payload[3] == b"first" and again == first
    assert [e.dequeued for e in effects if isinstance(e, Got)] == [first]
    assert replica.machine.ready_count == 1, "the resent get took a second message"
    restored = QuorumMachine.restore(replica.machine.snapshot())
    assert restored.apply(qcodec.decode(get))[0] == first, "a snapshot forgot the answer"
    later, _ = replica.run(qcodec.encode(qc.Dequeue(owner, 8, 100, False)))
    assert later.payload[3] == b"second"
    replica.run(qcodec.encode(qc.Down(owner, 100)))
    assert owner not in replica.machine._gets
    replica.run(qcodec.encode(qc.Dequeue(owner, 9, 100, True)))
    replica.run(qcodec.encode(qc.NodeUp("n1", "i2", 100)))   # n1 restarted: the channel of i1 is dead
    assert owner not in replica.machine._gets


def test_drop_transient_removes_ready_transient_messages_only():
    machine = QuorumMachine()
    persistent = b"\x10\x00\x02"   # content properties: delivery_mode 2
    assert qm.is_transient(0) is False and qm.is_transient(-1) is True
    machine.apply(wire(qc.Enqueue(P1, 1, 5, "", "q", persistent, b"keep")), 1)
    machine.apply(wire(qc.Enqueue(P1, 2, 5, "", "q", b"\x00\x00", b"drop")), 2)
    machine.apply(wire(qc.Enqueue(P1, 3, 5, "", "q", b"\x00\x00", b"held")), 3)
    _, effects = machine.apply(wire(qc.Checkout(*C1, 6, 1)), 4)   # takes "keep"
    machine.apply(wire(qc.Settle(*C1, 7, [1])), 5)                 # takes "drop"
    assert machine.apply(wire(qc.DropTransient(8)), 6)[0] == 1, "only the ready transient one"
    assert machine.ready_count == 0 and machine.unacked_count == 1
    assert machine.oldest_ref_index() == 2, "the checked-out transient message (entry 2) stays"


def test_drop_transient_before_keeps_the_transient_messages_of_later_entries():
    """A restarted classic queue's drop names its new term's first index: a
    transient message enqueued at or after it (this incarnation's) stays even
    when its entry is applied before the drop."""
    machine = QuorumMachine()
    transient = b"\x00\x00"
    machine.apply(wire(qc.Enqueue(P1, 1, 5, "", "q", transient, b"old")), 2)
    machine.apply(wire(qc.Enqueue(P1, 2, 5, "", "q", transient, b"new")), 4)
    assert machine.apply(wire(qc.DropTransientBefore(4, 6)), 5)[0] == 1, "only entry 2's"
    assert machine.ready_count == 1 and machine.oldest_ref_index() == 4
    assert machine.apply(wire(qc.DropTransientBefore(4, 7)), 6)[0] == 0, "a resend drops nothing"


def test_stat_answers_the_ready_and_consumer_counts_and_changes_nothing():
    machine = qm.QuorumMachine()
    machine.apply(qc.EnqueueBatch("n/1/p", 1, 0, [["", "q", b"", b"a", None, 0], ["", "q", b"", b"b", None, 0]]), 1)
    machine.apply(qc.Checkout("n/1/c", "t", 0, 1, 0, False, True), 2)   # takes one of the two
    before = machine.snapshot()
    reply, effects = machine.apply(qc.Stat("n/1/x", 0), 3)
    assert reply == (1, 1) and effects == []
    assert machine.snapshot() == before
