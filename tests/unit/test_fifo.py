"""broker/queues/fifo.py: the queue as a pure machine, apply(command, state) -> (reply, effects).

Unit tests for each command and effect, then a property test that folds
random command logs through apply() and checks the invariants after every
step (after rabbit_fifo_prop_SUITE).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warren.broker.queues import fifo, snapshot_codec
from warren.broker.queues import queue_commands as qc
from warren.broker.queues.fifo import (
    ACCEPTED,
    DROP_HEAD,
    REJECT_PUBLISH,
    REJECT_PUBLISH_DLX,
    REJECTED,
    FifoState,
    QueueLimits,
    restore,
)
from warren.broker.queues.queue_commands import DeadLettered, Delivery, Dequeued


# -- the tests' short forms of the queue vocabulary (broker/queues/queue_commands.py) --------
# A consumer is (owner, tag); the time comes from the Meta the test applies at.
@dataclass(frozen=True)
class Meta:
    index: int      # an enqueue's message id
    time_ms: int


@dataclass(frozen=True)
class Enqueue:
    """One message as the quorum machine releases it to the fifo (`fifo.enqueue`)."""
    payload: object
    size: int
    ttl_ms: int | None = None
    priority: int = 0


def Checkout(consumer, prefetch, priority=0, no_ack=False, active=True, exclusive=False):  # noqa: N802
    return qc.Checkout(consumer[0], consumer[1], 0, prefetch, priority, no_ack, active, exclusive)


def Cancel(consumer):  # noqa: N802
    return qc.Cancel(consumer[0], consumer[1], 0)


def Settle(consumer, msg_ids):  # noqa: N802
    return qc.Settle(consumer[0], consumer[1], 0, tuple(msg_ids))


def Return(consumer, msg_ids):  # noqa: N802
    return qc.Return(consumer[0], consumer[1], 0, tuple(msg_ids))


def Discard(consumer, msg_ids):  # noqa: N802
    return qc.Discard(consumer[0], consumer[1], 0, tuple(msg_ids))


def Dequeue(consumer, no_ack):  # noqa: N802
    assert consumer[1] is None, "basic.get's pseudo-consumer is (owner, None)"
    return qc.Dequeue(consumer[0], 0, 0, no_ack)


def Purge():  # noqa: N802
    return qc.Purge("owner", 0, 0)


def Down(owner):  # noqa: N802
    return qc.Down(owner, 0)


def Tick():  # noqa: N802
    return qc.Tick(0)


def Suspend(consumer, active):  # noqa: N802
    return qc.Suspend(consumer[0], consumer[1], 0, active)


def consumer_of(command) -> tuple:
    return (command.owner, command.tag)


def apply(meta: Meta, command, state: FifoState):
    """An Enqueue through `fifo.enqueue` with the index as its id, any other
    record through `fifo.apply`, at the meta's time."""
    if isinstance(command, Enqueue):
        effects: list = []
        accepted = fifo.enqueue(state, meta.index, meta.time_ms, command.payload, command.size, command.ttl_ms,
                                command.priority, effects)
        return (ACCEPTED if accepted else REJECTED), effects
    return fifo.apply(dataclasses.replace(command, now_ms=meta.time_ms), state)


A = ("ch1", "a")
B = ("ch1", "b")
C = ("ch2", "c")
GET1 = ("ch1", None)  # basic.get's pseudo-consumer on channel ch1


class Queue:
    """Drives apply() with increasing log indexes; the msg id of an enqueue is its index."""

    def __init__(self, **limits):
        self.state = FifoState(limits=QueueLimits(**limits))
        self.index = 0

    def apply(self, command):
        self.index += 1
        return apply(Meta(self.index, 1_000 * self.index), command, self.state)

    def enqueue(self, payload, size: int = 1):
        """Returns (msg_id, reply, effects)."""
        reply, effects = self.apply(Enqueue(payload, size))
        return self.index, reply, effects

    def enqueue_many(self, *payloads, size: int = 1) -> list[int]:
        ids = []
        for payload in payloads:
            msg_id, reply, _ = self.enqueue(payload, size)
            assert reply == ACCEPTED, f"enqueue of {payload!r} was {reply}"
            ids.append(msg_id)
        return ids

    def ready_payloads(self) -> list:
        order = sorted(self.state.returns) + list(self.state.ready)
        return [self.state.messages[m][0] for m in order]


def delivered(effects) -> list[tuple]:
    """(consumer, payload, redelivered) of each Delivery effect."""
    return [(e.consumer, e.payload, e.redelivered) for e in effects if isinstance(e, Delivery)]


def dead_letters(effects) -> list[tuple]:
    return [(e.reason, e.payloads) for e in effects if isinstance(e, DeadLettered)]


# -- enqueue, checkout, settle ------------------------------------------------

def test_enqueue_without_consumers_waits_in_ready():
    q = Queue()
    msg_id, reply, effects = q.enqueue("m1", size=10)
    assert reply == ACCEPTED, f"enqueue reply {reply}"
    assert effects == [], f"no consumer, yet effects {effects}"
    assert (q.state.ready_count, q.state.ready_bytes, q.state.message_bytes) == (1, 10, 10), (
        f"ready_count/ready_bytes/message_bytes = {q.state.ready_count}/{q.state.ready_bytes}/{q.state.message_bytes}")
    assert q.state.messages[msg_id] == ("m1", 10), "message stored under the log index of its enqueue"


def test_checkout_delivers_in_fifo_order_up_to_prefetch():
    q = Queue()
    q.enqueue_many("m1", "m2", "m3")
    reply, effects = q.apply(Checkout(A, prefetch=2))
    assert reply == ACCEPTED, f"checkout reply {reply}"
    assert delivered(effects) == [(A, "m1", False), (A, "m2", False)], f"prefetch 2 deliveries: {delivered(effects)}"
    assert q.ready_payloads() == ["m3"], f"left in ready: {q.ready_payloads()}"
    assert q.state.unacked_count == 2, f"unacked_count {q.state.unacked_count}"


def test_enqueue_goes_straight_to_a_consumer_with_credit():
    q = Queue()
    q.apply(Checkout(A, prefetch=1))
    _, _, effects = q.enqueue("m1")
    assert delivered(effects) == [(A, "m1", False)], f"{delivered(effects)}"
    _, _, effects = q.enqueue("m2")
    assert effects == [], f"consumer at prefetch 1 received more: {effects}"


def test_settle_frees_credit_and_forgets_the_message():
    q = Queue()
    m1, m2 = q.enqueue_many("m1", "m2", size=5)
    q.apply(Checkout(A, prefetch=1))
    reply, effects = q.apply(Settle(A, (m1,)))
    assert reply == 1, f"settle of one held message replied {reply}"
    assert delivered(effects) == [(A, "m2", False)], f"credit not returned: {delivered(effects)}"
    assert m1 not in q.state.messages, "settled message still stored"
    assert q.state.message_bytes == 5, (
        f"message_bytes {q.state.message_bytes} after settling one of two 5-byte messages")


def test_settle_of_messages_not_held_is_ignored():
    q = Queue()
    m1, m2 = q.enqueue_many("m1", "m2")
    q.apply(Checkout(A, prefetch=1))
    q.apply(Checkout(B, prefetch=1))
    assert q.apply(Settle(A, (m2,)))[0] == 0, "A settled a message B holds"
    assert q.apply(Settle(C, (m1,)))[0] == 0, "an unknown consumer settled a message"
    assert q.apply(Settle(A, (999,)))[0] == 0, "settled a message that does not exist"
    assert m1 in q.state.consumers[A].checked_out and m2 in q.state.consumers[B].checked_out, "holdings changed"


def test_prefetch_zero_is_unlimited():
    q = Queue()
    q.enqueue_many(*range(100))
    _, effects = q.apply(Checkout(A, prefetch=0))
    assert len(delivered(effects)) == 100, f"prefetch 0 delivered {len(delivered(effects))} of 100"


# -- return, discard, redelivered ----------------------------------------------

def test_return_requeues_ahead_of_ready_messages_in_id_order_and_marks_redelivered():
    q = Queue()
    m1, m2, m3, m4 = q.enqueue_many("m1", "m2", "m3", "m4")
    q.apply(Checkout(A, prefetch=2))  # holds m1, m2
    q.apply(Suspend(A, active=False))
    q.apply(Return(A, (m2,)))
    q.apply(Return(A, (m1,)))
    assert q.ready_payloads() == ["m1", "m2", "m3", "m4"], f"requeue order: {q.ready_payloads()}"
    _, effects = q.apply(Checkout(B, prefetch=0))
    assert delivered(effects) == [(B, "m1", True), (B, "m2", True), (B, "m3", False), (B, "m4", False)], (
        f"returned messages first, redelivered set only on them: {delivered(effects)}")


def test_return_of_messages_not_held_is_ignored():
    q = Queue()
    m1, = q.enqueue_many("m1")
    q.apply(Checkout(A, prefetch=1))
    assert q.apply(Return(B, (m1,)))[0] == 0, "a consumer that never existed returned a message"
    assert q.state.consumers[A].checked_out == {m1: 1}, "A lost its message (its delivery 1)"


def test_discard_dead_letters_as_rejected():
    q = Queue()
    m1, m2 = q.enqueue_many("m1", "m2")
    q.apply(Checkout(A, prefetch=2))
    reply, effects = q.apply(Discard(A, (m1, m2)))
    assert reply == 2, f"discard reply {reply}"
    assert dead_letters(effects) == [("rejected", ("m1", "m2"))], f"dead letters: {dead_letters(effects)}"
    assert not q.state.messages, f"discarded messages still stored: {q.state.messages}"


def test_discard_of_nothing_emits_no_dead_letter():
    q = Queue()
    q.apply(Checkout(A, prefetch=1))
    reply, effects = q.apply(Discard(A, (42,)))
    assert (reply, dead_letters(effects)) == (0, []), f"discarding an unheld id gave {reply}, {effects}"


# -- dequeue (basic.get) ---------------------------------------------------------

def test_dequeue_from_an_empty_queue_is_none():
    assert Queue().apply(Dequeue(GET1, no_ack=False)) == (None, []), "basic.get on empty queue"


def test_dequeue_no_ack_forgets_the_message():
    q = Queue()
    m1, _ = q.enqueue_many("m1", "m2")
    reply, effects = q.apply(Dequeue(GET1, no_ack=True))
    assert reply == Dequeued(m1, "m1", False, 1), f"dequeue reply {reply}"
    assert m1 not in q.state.messages, "no-ack dequeue kept the message"
    assert GET1 not in q.state.consumers, "no-ack dequeue created a consumer"


def test_dequeue_with_ack_is_held_until_settled_and_redelivered_after_return():
    q = Queue()
    m1, = q.enqueue_many("m1")
    reply, _ = q.apply(Dequeue(GET1, no_ack=False))
    assert reply == Dequeued(m1, "m1", False, 0), f"dequeue reply {reply}"
    assert q.state.unacked_count == 1, "dequeued message not counted as unacked"
    assert q.apply(Return(GET1, (m1,)))[0] == 1, "return of a dequeued message ignored"
    reply, _ = q.apply(Dequeue(GET1, no_ack=False))
    assert reply == Dequeued(m1, "m1", True, 0, delivery_count=1), f"second get should be redelivered: {reply}"
    assert q.apply(Settle(GET1, (m1,)))[0] == 1, "settle of a dequeued message ignored"
    assert not q.state.messages and GET1 not in q.state.consumers, "settled get left state behind"


def test_dequeued_messages_are_never_delivered_to_consumers():
    q = Queue()
    q.enqueue_many("m1")
    q.apply(Dequeue(GET1, no_ack=False))
    _, effects = q.apply(Checkout(A, prefetch=0))
    assert effects == [], f"a message held by basic.get was delivered: {effects}"


# -- purge, down ----------------------------------------------------------------

def test_purge_removes_ready_and_returned_but_not_unacked():
    q = Queue()
    m1, m2, m3 = q.enqueue_many("m1", "m2", "m3", size=4)
    q.apply(Checkout(A, prefetch=2))
    q.apply(Suspend(A, active=False))
    q.apply(Return(A, (m1,)))
    reply, effects = q.apply(Purge())
    assert reply == 2, f"purge count {reply}, expected 2 (m1 returned + m3 ready)"
    assert effects == [], f"purge has no effects, got {effects}"
    assert list(q.state.messages) == [m2], f"after purge: {list(q.state.messages)}"
    assert (q.state.ready_bytes, q.state.message_bytes) == (0, 4), (
        f"ready_bytes/message_bytes after purge: {q.state.ready_bytes}/{q.state.message_bytes}")


def test_down_returns_everything_the_owner_held_and_removes_its_consumers():
    q = Queue()
    q.enqueue_many("m1", "m2", "m3", "m4")
    q.apply(Checkout(A, prefetch=1))  # ch1: m1
    q.apply(Checkout(B, prefetch=1))  # ch1: m2
    q.apply(Checkout(C, prefetch=1))  # ch2: m3
    reply, effects = q.apply(Down("ch1"))
    assert reply == 2, f"down returned {reply}, expected 2"
    assert A not in q.state.consumers and B not in q.state.consumers, "ch1's consumers survived Down"
    assert C in q.state.consumers, "ch2's consumer removed by Down(ch1)"
    assert effects == [], f"C is at prefetch; nothing to deliver, got {effects}"
    assert q.ready_payloads() == ["m1", "m2", "m4"], f"ready after down: {q.ready_payloads()}"
    _, effects = q.apply(Settle(C, tuple(q.state.consumers[C].checked_out)))
    assert delivered(effects) == [(C, "m1", True)], f"m1 should come back redelivered: {delivered(effects)}"


def test_down_also_returns_basic_get_holdings():
    q = Queue()
    q.enqueue_many("m1")
    q.apply(Dequeue(GET1, no_ack=False))
    assert q.apply(Down("ch1"))[0] == 1, "Down did not return the message held by basic.get"
    assert q.ready_payloads() == ["m1"], f"ready after down: {q.ready_payloads()}"


# -- suspend, cancel --------------------------------------------------------------

def test_an_exclusive_consumer_only_on_a_queue_without_consumers_and_none_beside_it():
    """RabbitMQ's classic queue: basic.consume exclusive=true on a queue with a consumer, or any
    consumer on a queue with an exclusive one, is refused (the channel answers 403)."""
    q = Queue()
    assert q.apply(Checkout(A, 1))[0] == ACCEPTED
    assert q.apply(Checkout(C, 1, exclusive=True)) == (fifo.IN_EXCLUSIVE_USE, [])
    assert C not in q.state.consumers, "a refused consumer is not registered"
    assert q.apply(Cancel(A))[0] == ACCEPTED
    assert q.apply(Checkout(C, 1, exclusive=True))[0] == ACCEPTED, "a cancelled consumer does not count"
    assert q.apply(Checkout(B, 1)) == (fifo.IN_EXCLUSIVE_USE, [])
    assert q.apply(Checkout(C, 2, exclusive=True))[0] == ACCEPTED, "its own tag again is no other consumer"
    q.apply(qc.Down("ch2", 0))
    assert q.apply(Checkout(B, 1))[0] == ACCEPTED, "its channel went: the queue takes consumers again"
    q.apply(Cancel(B))
    assert q.apply(Checkout(C, 1, exclusive=True))[0] == ACCEPTED
    wire = snapshot_codec.fifo_to_wire(q.state)
    assert snapshot_codec.fifo_from_wire(wire, 3).consumers[C].exclusive, "a snapshot keeps it"
    for consumer in wire[10]:
        del consumer[9:]   # as a snapshot written before consumers had the field
    assert not snapshot_codec.fifo_from_wire(wire, 3).consumers[C].exclusive


def test_suspended_consumer_gets_nothing_until_resumed():
    q = Queue()
    q.apply(Checkout(A, prefetch=0))
    assert q.apply(Suspend(A, active=False))[0] == ACCEPTED
    _, _, effects = q.enqueue("m1")
    assert effects == [], f"suspended consumer received {effects}"
    reply, effects = q.apply(Suspend(A, active=True))
    assert delivered(effects) == [(A, "m1", False)], f"resume did not deliver: {effects}"
    assert q.apply(Suspend(C, active=True))[0] == REJECTED, "suspend of an unknown consumer"


def test_settle_does_not_wake_a_suspended_consumer():
    q = Queue()
    m1, _ = q.enqueue_many("m1", "m2")
    q.apply(Checkout(A, prefetch=1))
    q.apply(Suspend(A, active=False))
    _, effects = q.apply(Settle(A, (m1,)))
    assert effects == [], f"settle delivered to a suspended consumer: {effects}"


def test_cancel_stops_deliveries_but_keeps_what_is_held():
    q = Queue()
    m1, = q.enqueue_many("m1")
    q.apply(Checkout(A, prefetch=0))
    assert q.apply(Cancel(A))[0] == ACCEPTED
    _, _, effects = q.enqueue("m2")
    assert effects == [], f"cancelled consumer received {effects}"
    assert q.state.consumers[A].checked_out == {m1: 1}, "cancel dropped the unacked message"
    assert q.apply(Settle(A, (m1,)))[0] == 1, "settle after cancel ignored"
    assert A not in q.state.consumers, "cancelled consumer with nothing held should be gone"
    assert q.apply(Cancel(A))[0] == REJECTED, "second cancel should be REJECTED"


def test_each_consumer_numbers_its_deliveries_and_a_reused_tag_goes_on_counting():
    q = Queue()
    m1, m2, m3 = q.enqueue_many("m1", "m2", "m3")
    _, effects = q.apply(Checkout(A, prefetch=2))
    assert [(e.seq, e.msg_id) for e in effects if isinstance(e, Delivery)] == [(1, m1), (2, m2)]
    _, effects = q.apply(Return(A, (m1,)))   # m1 comes back to A as its third delivery
    assert [(e.seq, e.msg_id, e.redelivered) for e in effects if isinstance(e, Delivery)] == [(3, m1, True)]
    assert q.state.consumers[A].checked_out == {m2: 2, m1: 3}, "held in seq order"
    q.apply(Cancel(A))
    _, effects = q.apply(Checkout(A, prefetch=3))   # the tag again, while m1 and m2 are still held
    assert [(e.seq, e.msg_id) for e in effects if isinstance(e, Delivery)] == [(4, m3)]
    q.enqueue("m4")
    assert q.apply(Dequeue(GET1, False))[0].payload == "m4"
    assert list(q.state.consumers[GET1].checked_out.values()) == [0], "basic.get's message has no delivery seq"


def test_return_after_cancel_goes_to_another_consumer():
    q = Queue()
    m1, = q.enqueue_many("m1")
    q.apply(Checkout(A, prefetch=0))
    q.apply(Cancel(A))
    q.apply(Checkout(B, prefetch=0))
    _, effects = q.apply(Return(A, (m1,)))
    assert delivered(effects) == [(B, "m1", True)], f"{delivered(effects)}"
    assert A not in q.state.consumers, "cancelled consumer kept after returning its last message"


def test_consumer_tag_reused_after_cancel_keeps_the_old_unacked_messages():
    """basic.cancel frees the tag on the channel, so basic.consume may reuse it while
    the cancelled consumer still holds unacked messages. The new Checkout must not
    orphan those messages: acking them must still work, and Down must return them."""
    q = Queue()
    m1, = q.enqueue_many("m1")
    q.apply(Checkout(A, prefetch=0))
    q.apply(Cancel(A))
    q.apply(Checkout(A, prefetch=0))  # same (owner, consumer_tag)
    holders = [c for c, s in q.state.consumers.items() if m1 in s.checked_out]
    assert holders or m1 in q.state.ready or m1 in q.state.returns, (
        f"message {m1} is stored but neither ready, returned nor held by any consumer after Checkout reused "
        f"the cancelled consumer's id {A}: it can never be acked, delivered or returned")
    reply, _ = q.apply(Down("ch1"))
    assert q.ready_payloads() == ["m1"], f"Down(ch1) did not bring m1 back; ready is {q.ready_payloads()}"


# -- priorities and round-robin ---------------------------------------------------

def test_checkout_inactive_creates_a_suspended_consumer():
    q = Queue()
    q.enqueue_many("m1")
    _, effects = q.apply(Checkout(A, prefetch=0, active=False))
    assert effects == [], f"a consumer created suspended received {effects}"
    _, effects = q.apply(Suspend(A, active=True))
    assert delivered(effects) == [(A, "m1", False)], f"resume did not deliver: {effects}"


def test_higher_priority_consumer_is_served_first_while_it_has_credit():
    q = Queue()
    q.apply(Checkout(A, prefetch=2, priority=0))
    q.apply(Checkout(B, prefetch=2, priority=5))
    effects = []
    for i in range(4):
        effects += q.enqueue(f"m{i}")[2]
    assert [c for c, _, _ in delivered(effects)] == [B, B, A, A], f"priority order: {delivered(effects)}"


def test_round_robin_within_a_priority():
    q = Queue()
    q.apply(Checkout(A, prefetch=0))
    q.apply(Checkout(B, prefetch=0))
    q.apply(Checkout(C, prefetch=0))
    effects = []
    for i in range(6):
        effects += q.enqueue(i)[2]
    assert [c for c, _, _ in delivered(effects)] == [A, B, C, A, B, C], f"round robin: {delivered(effects)}"


def test_round_robin_stays_fair_after_suspend_and_resume():
    q = Queue()
    q.apply(Checkout(A, prefetch=0))
    q.apply(Checkout(B, prefetch=0))
    q.apply(Suspend(A, active=False))
    q.apply(Suspend(A, active=True))
    effects = []
    for i in range(8):
        effects += q.enqueue(i)[2]
    counts = {consumer: sum(1 for c, _, _ in delivered(effects) if c == consumer) for consumer in (A, B)}
    assert counts == {A: 4, B: 4}, (
        f"8 messages to two equal consumers after A was suspended and resumed: {counts}; "
        f"order {[c[1] for c, _, _ in delivered(effects)]}")


def test_removed_priority_level_is_recreated_by_a_new_consumer():
    q = Queue()
    q.apply(Checkout(A, prefetch=0, priority=3))
    q.apply(Cancel(A))
    q.apply(Checkout(B, prefetch=0, priority=3))
    _, _, effects = q.enqueue("m1")
    assert delivered(effects) == [(B, "m1", False)], f"{delivered(effects)}"


def test_no_ack_consumer_settles_on_delivery():
    q = Queue()
    q.enqueue_many("m1", "m2", size=3)
    _, effects = q.apply(Checkout(A, prefetch=0, no_ack=True))
    assert delivered(effects) == [(A, "m1", False), (A, "m2", False)], f"{delivered(effects)}"
    assert not q.state.messages and q.state.message_bytes == 0, "no-ack deliveries still stored"
    assert not q.state.consumers[A].checked_out, "no-ack consumer holds messages"


# -- limits -----------------------------------------------------------------------

def test_max_length_drop_head_dead_letters_the_oldest():
    q = Queue(max_length=2, overflow=DROP_HEAD)
    q.enqueue_many("m1", "m2")
    _, reply, effects = q.enqueue("m3")
    assert reply == ACCEPTED, f"drop-head accepts the new message, replied {reply}"
    assert dead_letters(effects) == [("maxlen", ("m1",))], f"{dead_letters(effects)}"
    assert q.ready_payloads() == ["m2", "m3"], f"{q.ready_payloads()}"


def test_max_length_bytes_drop_head():
    q = Queue(max_length_bytes=10)
    q.enqueue_many("a", "b", size=4)
    _, _, effects = q.enqueue("c", size=5)
    assert dead_letters(effects) == [("maxlen", ("a",))], f"{dead_letters(effects)}"
    assert q.state.ready_bytes == 9, f"ready_bytes {q.state.ready_bytes}"


def test_max_length_counts_only_ready_messages():
    q = Queue(max_length=1)
    q.enqueue_many("m1")
    q.apply(Checkout(A, prefetch=1))
    _, reply, effects = q.enqueue("m2")
    assert (reply, effects) == (ACCEPTED, []), f"an unacked message counted towards max-length: {reply}, {effects}"


def test_max_length_zero_drops_every_message():
    q = Queue(max_length=0)
    _, reply, effects = q.enqueue("m1")
    assert (reply, dead_letters(effects)) == (ACCEPTED, [("maxlen", ("m1",))]), f"{reply}, {effects}"
    assert not q.state.messages, "max-length 0 kept a message"


def test_reject_publish_refuses_without_dead_lettering():
    q = Queue(max_length=2, overflow=REJECT_PUBLISH)
    q.enqueue_many("m1", "m2")
    _, reply, effects = q.enqueue("m3")
    assert (reply, effects) == (REJECTED, []), f"reject-publish: {reply}, {effects}"
    assert q.ready_payloads() == ["m1", "m2"], f"{q.ready_payloads()}"


def test_reject_publish_dlx_refuses_and_dead_letters_the_new_message():
    q = Queue(max_length_bytes=5, overflow=REJECT_PUBLISH_DLX)
    q.enqueue_many("m1", size=5)
    _, reply, effects = q.enqueue("m2", size=1)
    assert (reply, dead_letters(effects)) == (REJECTED, [("maxlen", ("m2",))]), f"{reply}, {effects}"


def test_unknown_command_is_an_assertion_not_a_client_error():
    with pytest.raises(AssertionError):
        fifo.apply(qc.Purged("owner", 0, 0), FifoState())   # an effect, not a command


# -- property: random command logs --------------------------------------------------

OWNERS = ("ch1", "ch2")


@dataclass
class Ledger:
    """What the test knows happened to each accepted message."""

    accepted: dict[int, int] = field(default_factory=dict)  # msg_id -> size
    gone: dict[int, str] = field(default_factory=dict)  # msg_id -> settled/no-ack/dropped/discarded/purged
    returned: set[int] = field(default_factory=set)
    next_tag: int = 0


def check_invariants(state: FifoState, ledger: Ledger, step: str) -> None:
    where: dict[int, list[str]] = {}
    for msg_id in state.ready:
        where.setdefault(msg_id, []).append("ready")
    for msg_id in state.returns:
        where.setdefault(msg_id, []).append("returns")
    for consumer_id, consumer in state.consumers.items():
        for msg_id in consumer.checked_out:
            where.setdefault(msg_id, []).append(f"checked out by {consumer_id}")
        if consumer.prefetch > 0:
            assert len(consumer.checked_out) <= consumer.prefetch, (
                f"after {step}: {consumer_id} holds {len(consumer.checked_out)} > prefetch {consumer.prefetch}")
    for msg_id in state.messages:
        assert len(where.get(msg_id, [])) == 1, (
            f"after {step}: message {msg_id} is in {where.get(msg_id, [])}, must be in exactly one place")
    for msg_id in where:
        assert msg_id in state.messages, f"after {step}: {msg_id} is {where[msg_id]} but not stored"
    ready_ids = list(state.ready) + list(state.returns)
    assert state.ready_bytes == sum(state.messages[m][1] for m in ready_ids), (
        f"after {step}: ready_bytes {state.ready_bytes} != sum of ready sizes "
        f"{sum(state.messages[m][1] for m in ready_ids)}")
    assert state.message_bytes == sum(size for _, size in state.messages.values()), (
        f"after {step}: message_bytes {state.message_bytes} != sum of stored sizes")
    for msg_id in ledger.accepted:
        present = msg_id in state.messages
        gone = msg_id in ledger.gone
        assert present != gone, (
            f"after {step}: accepted message {msg_id} is "
            + ("both stored and recorded as " + ledger.gone[msg_id] if present else "lost (neither stored nor "
               "delivered, dropped, discarded or purged)"))
    # Work conservation: a ready message never waits while an active consumer has credit.
    if state.ready_count:
        idle = [c for c, s in state.consumers.items()
                if not s.cancelled and not s.suspended and s.has_credit()]
        assert not idle, f"after {step}: {state.ready_count} ready messages while {idle} could take them"


@st.composite
def command_for(draw, state: FifoState, ledger: Ledger):
    held = [(c, m) for c, s in state.consumers.items() for m in s.checked_out]
    consumers = list(state.consumers)
    choices = ["enqueue", "enqueue", "checkout", "dequeue", "purge", "down", "suspend", "cancel"]
    if held:
        choices += ["settle", "settle", "return", "discard"]
    kind = draw(st.sampled_from(choices))
    if kind == "enqueue":
        return Enqueue(payload=None, size=draw(st.integers(0, 50)))
    if kind == "checkout":
        ledger.next_tag += 1  # fresh tags only; reuse is its own test above
        return Checkout((draw(st.sampled_from(OWNERS)), f"t{ledger.next_tag}"), prefetch=draw(st.integers(0, 3)),
                        priority=draw(st.integers(0, 2)), no_ack=draw(st.booleans()),
                        active=draw(st.sampled_from([True, True, False])))
    if kind == "dequeue":
        return Dequeue((draw(st.sampled_from(OWNERS)), None), no_ack=draw(st.booleans()))
    if kind == "purge":
        return Purge()
    if kind == "down":
        return Down(draw(st.sampled_from(OWNERS)))
    if kind in ("suspend", "cancel"):
        target = draw(st.sampled_from(consumers)) if consumers and draw(st.booleans()) else ("ch1", "nobody")
        return Suspend(target, active=draw(st.booleans())) if kind == "suspend" else Cancel(target)
    consumer = draw(st.sampled_from(sorted({c for c, _ in held}, key=repr)))
    mine = [m for c, m in held if c == consumer]
    msg_ids = draw(st.lists(st.sampled_from(mine + [10 ** 6]), min_size=1, max_size=4, unique=True))
    return {"settle": Settle, "return": Return, "discard": Discard}[kind](consumer, tuple(msg_ids))


def fold(state: FifoState, ledger: Ledger, index: int, command) -> None:
    """Apply one command and account for what it did; checks the reply and effects."""
    meta = Meta(index, index * 7)
    if isinstance(command, Enqueue):
        command = Enqueue(payload=("p", index), size=command.size)
    before_ready = list(state.returns) + list(state.ready)
    snapshot = {c: dict(s.checked_out) for c, s in state.consumers.items()}
    no_ack = {c for c, s in state.consumers.items() if s.no_ack}
    reply, effects = apply(meta, command, state)
    step = f"{command} at index {index}"

    if isinstance(command, Enqueue):
        assert reply in (ACCEPTED, REJECTED), f"{step}: reply {reply}"
        if reply == ACCEPTED:
            ledger.accepted[index] = command.size
    if isinstance(command, qc.Purge):
        assert reply == len(before_ready), f"{step}: purge replied {reply}, {len(before_ready)} were ready"
        for msg_id in before_ready:
            ledger.gone[msg_id] = "purged"
    if isinstance(command, qc.Settle):
        for msg_id in command.msg_ids:
            if msg_id in snapshot.get(consumer_of(command), {}):
                ledger.gone[msg_id] = "settled"
    if isinstance(command, (qc.Return, qc.Down)):
        owner_of = ((lambda c: c == consumer_of(command)) if isinstance(command, qc.Return)
                    else (lambda c: c[0] == command.owner))
        for consumer, held in snapshot.items():
            if owner_of(consumer):
                ids = command.msg_ids if isinstance(command, qc.Return) else tuple(held)
                ledger.returned.update(m for m in ids if m in held)
    if isinstance(command, qc.Dequeue) and reply is not None:
        assert isinstance(reply, Dequeued), f"{step}: reply {reply!r}"
        assert reply.msg_id in before_ready, f"{step}: dequeued {reply.msg_id}, which was not ready"
        assert reply.redelivered == (reply.msg_id in ledger.returned), f"{step}: wrong redelivered flag"
        assert reply.message_count == state.ready_count, f"{step}: message_count {reply.message_count}"
        if command.no_ack:
            ledger.gone[reply.msg_id] = "no-ack"

    for effect in effects:
        if isinstance(effect, Delivery):
            assert effect.msg_id not in ledger.gone, (
                f"{step}: delivered message {effect.msg_id}, already {ledger.gone.get(effect.msg_id)}")
            assert effect.payload == ("p", effect.msg_id), f"{step}: payload mix-up in {effect}"
            assert effect.redelivered == (effect.msg_id in ledger.returned), (
                f"{step}: {effect} has the wrong redelivered flag")
            consumer = state.consumers.get(effect.consumer)
            if effect.consumer in no_ack or (consumer is not None and consumer.no_ack):
                ledger.gone[effect.msg_id] = "no-ack"
            else:
                assert consumer is not None and effect.msg_id in consumer.checked_out, (
                    f"{step}: {effect} but the consumer does not hold it")
                assert not consumer.cancelled and not consumer.suspended, f"{step}: delivered to an inactive consumer"
        elif isinstance(effect, DeadLettered):
            assert effect.reason in ("maxlen", "rejected"), f"{step}: dead-letter reason {effect.reason}"
            for payload in effect.payloads:
                msg_id = payload[1]
                if isinstance(command, Enqueue) and msg_id == index and reply == REJECTED:
                    continue  # reject-publish-dlx: never accepted, never stored
                assert msg_id not in ledger.gone, f"{step}: dead-lettered {msg_id}, already {ledger.gone[msg_id]}"
                ledger.gone[msg_id] = "dropped" if effect.reason == "maxlen" else "discarded"
        else:
            raise AssertionError(f"{step}: unknown effect {effect!r}")
    check_invariants(state, ledger, step)


limits_strategy = st.builds(
    QueueLimits,
    max_length=st.one_of(st.none(), st.integers(0, 6)),
    max_length_bytes=st.one_of(st.none(), st.integers(0, 150)),
    overflow=st.sampled_from([DROP_HEAD, REJECT_PUBLISH, REJECT_PUBLISH_DLX]),
)


@settings(max_examples=400, deadline=None)
@given(data=st.data(), limits=limits_strategy)
def test_random_command_logs_keep_the_invariants(data, limits):
    state = FifoState(limits=limits)
    ledger = Ledger()
    steps = data.draw(st.integers(1, 60), label="steps")
    for index in range(1, steps + 1):
        command = data.draw(command_for(state, ledger), label=f"command {index}")
        fold(state, ledger, index, command)
    # Drain: everything still stored can be handed to a fresh unlimited consumer or is held.
    index = steps + 1
    fold(state, ledger, index, Checkout(("drain", "all"), prefetch=0))
    assert state.ready_count == 0, f"{state.ready_count} messages still ready after an unlimited consumer joined"


@settings(max_examples=300, deadline=None)
@given(data=st.data(), limits=limits_strategy)
def test_a_lone_consumers_run_is_the_round_robin_one_message_at_a_time(data, limits):
    """The same command log, served in runs and one message at a time (the round-robin's
    own step, `fifo._deliver_one`, in place of the run), gives the same replies, effects
    and state after every command (payloads both packed ints and tuples)."""
    runs, singles = FifoState(limits=limits), FifoState(limits=dataclasses.replace(limits))
    ledger = Ledger()
    for index in range(1, data.draw(st.integers(1, 60), label="steps") + 1):
        command = data.draw(command_for(runs, ledger), label=f"command {index}")
        if isinstance(command, Enqueue):
            command = Enqueue(payload=index if index % 2 else ("p", index), size=command.size)
        meta = Meta(index, index * 7)
        with mock.patch.object(fifo, "_deliver_run", fifo._deliver_one):
            expected = apply(meta, command, singles)
        assert apply(meta, command, runs) == expected, f"{command} at {index}: effects differ"
        assert runs == singles, f"{command} at {index}: states differ"


def test_bulk_restore_equals_replaying_enqueues():
    items = [(3, ("e", "k", b"\x00\x00", b"a"), 1), (7, ("e", "k", b"\x00\x00", b"bb"), 2), (9, "stored", 5)]
    replayed = FifoState()
    for msg_id, payload, size in items:
        apply(Meta(msg_id, 0), Enqueue(payload, size), replayed)
    restored = FifoState()
    restore(restored, items)
    assert restored.messages == replayed.messages, "restored messages differ from replayed ones"
    assert list(restored.ready) == list(replayed.ready), "restored order differs"
    assert (restored.ready_bytes, restored.message_bytes) == (replayed.ready_bytes, replayed.message_bytes)


def test_message_ttl_expires_heads_on_tick_and_dead_letters_them():
    state = FifoState(limits=QueueLimits(message_ttl_ms=100))
    apply(Meta(1, 1_000), Enqueue("a", 1), state)
    apply(Meta(2, 1_050), Enqueue("b", 1, ttl_ms=500), state)   # queue TTL (100) is shorter
    apply(Meta(3, 1_060), Enqueue("c", 1, ttl_ms=10), state)    # message TTL (10) is shorter
    reply, effects = apply(Meta(4, 1_100), Tick(), state)
    assert reply is ACCEPTED and effects == [], "nothing has expired strictly before 1100 yet"
    _, effects = apply(Meta(5, 1_101), Tick(), state)
    assert effects == [DeadLettered("expired", ("a",))], f"only the head expires: {effects}"
    _, effects = apply(Meta(6, 1_200), Tick(), state)
    assert effects == [DeadLettered("expired", ("b", "c"))], effects
    assert state.ready_count == 0 and state.message_bytes == 0 and not state.expiries


def test_dequeue_skips_expired_heads():
    state = FifoState()
    apply(Meta(1, 0), Enqueue("old", 1, ttl_ms=5), state)
    apply(Meta(2, 0), Enqueue("fresh", 1), state)
    reply, effects = apply(Meta(3, 10), Dequeue(("owner", None), True), state)
    assert reply.payload == "fresh" and effects == [DeadLettered("expired", ("old",))], (reply, effects)


def test_single_active_consumer_hands_over_in_registration_order():
    state = FifoState(limits=QueueLimits(single_active_consumer=True))
    first, second, third = ("ch1", "a"), ("ch2", "b"), ("ch3", "c")
    for index, consumer in enumerate((first, second, third), start=1):
        apply(Meta(index, 0), Checkout(consumer, prefetch=10), state)
    delivered = []
    for index in range(4, 7):
        _, effects = apply(Meta(index, 0), Enqueue(f"m{index}", 1), state)
        delivered += [e.consumer for e in effects if isinstance(e, Delivery)]
    assert delivered == [first] * 3, f"only the oldest consumer is active: {delivered}"
    _, effects = apply(Meta(7, 0), Cancel(first), state)  # still holds three unacked
    assert [e for e in effects if isinstance(e, Delivery)] == []
    _, effects = apply(Meta(8, 0), Enqueue("m8", 1), state)
    assert [e.consumer for e in effects if isinstance(e, Delivery)] == [second]
    _, effects = apply(Meta(9, 0), Down("ch2"), state)  # its message goes back, to the next in line
    assert [e.consumer for e in effects if isinstance(e, Delivery)] == [third], effects
    apply(Meta(10, 0), Settle(first, (4, 5, 6)), state)
    assert state.consumers[third].checked_out and first not in state.consumers


def test_priority_queue_serves_highest_priority_first_and_requeues_in_place():
    state = FifoState(limits=QueueLimits(max_priority=5))
    for index, priority in enumerate([0, 3, 9, 3, 1], start=1):  # 9 is capped at 5
        apply(Meta(index, 0), Enqueue(f"p{priority}-{index}", 1, priority=priority), state)
    _, effects = apply(Meta(10, 0), Checkout(("ch", "c"), prefetch=2), state)
    delivered = [e.payload for e in effects if isinstance(e, Delivery)]
    assert delivered == ["p9-3", "p3-2"], delivered
    _, effects = apply(Meta(11, 0), Return(("ch", "c"), (2,)), state)  # back into its place
    delivered = [(e.payload, e.redelivered) for e in effects if isinstance(e, Delivery)]
    assert delivered == [("p3-2", True)], delivered
    assert state.ready_count == 3


def test_restore_into_a_priority_queue_keeps_priorities():
    state = FifoState(limits=QueueLimits(max_priority=10))
    restore(state, [(1, "low", 1), (2, "high", 1), (3, "mid", 1)], {2: 7, 3: 2})
    order = [apply(Meta(10 + i, 0), Dequeue(("o", None), True), state)[0].payload for i in range(3)]
    assert order == ["high", "mid", "low"], order


def test_delivery_limit_dead_letters_after_too_many_returns():
    state = FifoState(limits=QueueLimits(delivery_limit=2))
    consumer = ("ch", "c")
    apply(Meta(1, 0), Enqueue("m", 1), state)
    _, effects = apply(Meta(2, 0), Checkout(consumer, prefetch=1), state)
    counts = [e.delivery_count for e in effects if isinstance(e, Delivery)]
    for index in (3, 4):
        _, effects = apply(Meta(index, 0), Return(consumer, (1,)), state)
        counts += [e.delivery_count for e in effects if isinstance(e, Delivery)]
    assert counts == [0, 1, 2], f"delivery counts {counts}"
    _, effects = apply(Meta(5, 0), Return(consumer, (1,)), state)
    assert effects == [DeadLettered("delivery_limit", ("m",))], effects
    assert not state.messages and state.ready_count == 0


def test_a_table_of_referenced_messages_is_never_walked_by_the_collector():
    """Messages of a replicated queue (int references) are kept as ints: the table's chunks
    are never tracked by the cyclic collector, which would otherwise visit every entry in
    each collection of its generation (the confirm tails, docs/performance.md); it walks
    the list of chunks, one per 4,096 messages. The snapshot of such a table comes back the
    same."""
    import gc
    state = fifo.FifoState()
    effects: list = []
    for msg_id in range(1, 10_001):
        assert fifo.enqueue(state, msg_id, 0, msg_id * 7 << 20, 1024 + msg_id, None, 0, effects)
    gc.collect()   # (a collection may untrack a dict of untracked tuples, until the next one goes in)
    assert fifo.enqueue(state, 10_001, 0, 1 << 20, 10, None, 0, effects)

    def walked_chunks(table):
        return [chunk for held in gc.get_referents(table) if type(held) is dict for chunk in held.values()]
    chunks = walked_chunks(state.messages)
    assert len(chunks) == 3 and sum(map(len, chunks)) == 10_001, f"chunks of {list(map(len, chunks))} messages"
    assert not any(map(gc.is_tracked, chunks)), "a chunk of the message table is tracked: every collection walks it"
    assert fifo.payload_of(state, 5) == 35 << 20 and fifo.size_of(state, 5) == 1029
    wire = snapshot_codec.fifo_to_wire(state)
    restored = snapshot_codec.fifo_from_wire(wire, 3)
    assert restored.messages == state.messages and not any(map(gc.is_tracked, walked_chunks(restored.messages)))
    inline = fifo.FifoState()   # a transient queue keeps the message itself: a tuple
    fifo.enqueue(inline, 1, 0, ("", "q", b"", b"body"), 4, None, 0, effects)
    assert fifo.payload_of(inline, 1) == ("", "q", b"", b"body") and fifo.size_of(inline, 1) == 4
