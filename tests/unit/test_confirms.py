"""broker/amqp/confirms.py: ConfirmTracker turns settlements into basic.ack/nack replies.

The client's view (RabbitMQ's publisher confirms): it keeps the set of
outstanding sequence numbers; a reply with multiple=false answers one of them,
multiple=true answers every outstanding one at or below its tag. So the rules:
a single reply must name an outstanding seq; a multiple reply must only cover
outstanding seqs that the broker has settled, with the same outcome.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warren.broker.amqp.confirms import ConfirmTracker


class Client:
    """A publisher that tracks outstanding confirms and checks each reply."""

    def __init__(self) -> None:
        self.outstanding: set[int] = set()
        self.answers: dict[int, bool] = {}

    def published(self, seq: int) -> None:
        self.outstanding.add(seq)

    def receive(self, replies, settled: dict[int, bool]) -> None:
        for tag, multiple, ok in replies:
            if multiple:
                assert ok, f"reply {(tag, multiple, ok)}: a multiple nack is never needed here"
                covered = sorted(s for s in self.outstanding if s <= tag)
                assert covered, (
                    f"multiple ack {tag} covers no outstanding publish (outstanding {sorted(self.outstanding)})")
                for seq in covered:
                    assert seq in settled, (
                        f"multiple ack {tag} covers seq {seq}, which the broker has not settled yet")
                    assert settled[seq] is True, f"multiple ack {tag} covers seq {seq}, which the broker nacked"
            else:
                assert tag in self.outstanding, (
                    f"reply {(tag, multiple, ok)} answers seq {tag}, which is not outstanding "
                    f"({'already answered' if tag in self.answers else 'never published'})")
                assert tag in settled, f"reply {(tag, multiple, ok)} for a seq the broker has not settled"
                assert settled[tag] is ok, f"seq {tag} settled ok={settled[tag]} but answered ok={ok}"
                covered = [tag]
            for seq in covered:
                self.outstanding.discard(seq)
                self.answers[seq] = ok


def publish(tracker: ConfirmTracker, client: Client, count: int) -> list[int]:
    seqs = [tracker.next_publish() for _ in range(count)]
    for seq in seqs:
        client.published(seq)
    return seqs


def test_sequence_numbers_start_at_one():
    tracker = ConfirmTracker()
    assert [tracker.next_publish() for _ in range(3)] == [1, 2, 3], "publish seqs must be 1, 2, 3, ..."


def test_nothing_settled_nothing_to_say():
    tracker = ConfirmTracker()
    tracker.next_publish()
    assert tracker.take_replies() == [], "replies without any settlement"


def test_in_order_settles_coalesce_into_one_multiple_ack():
    tracker = ConfirmTracker()
    for seq in publish(tracker, Client(), 5):
        tracker.settle(seq, True)
    assert tracker.take_replies() == [(5, True, True)], "five in-order acks should be one multiple ack of 5"
    assert tracker.take_replies() == [], "replies repeated on the next call"


def test_nacks_break_runs():
    tracker = ConfirmTracker()
    for seq, ok in zip(publish(tracker, Client(), 5), [True, False, True, True, False]):
        tracker.settle(seq, ok)
    assert tracker.take_replies() == [(1, False, True), (2, False, False), (4, True, True), (5, False, False)], (
        "acks coalesce around nacks; nacks are sent one by one")


def test_a_run_of_one_is_acked_without_multiple():
    """As RabbitMQ's channel does: multiple is set only when an ack covers more than one publish."""
    tracker = ConfirmTracker()
    seq = tracker.next_publish()
    tracker.settle(seq, True)
    assert tracker.take_replies() == [(1, False, True)], "one confirmed publish is one plain ack"
    first, second = tracker.next_publish(), tracker.next_publish()
    tracker.settle(second, True)
    assert tracker.take_replies() == [(3, False, True)], "settled past a gap: a plain ack"
    tracker.settle(first, True)
    assert tracker.take_replies() == [(2, False, True)], "one publish closes the gap: a plain ack"


def test_out_of_order_settles_past_a_gap_are_answered_one_by_one():
    tracker, client = ConfirmTracker(), Client()
    publish(tracker, client, 4)
    settled = {3: True, 2: True}
    for seq, ok in settled.items():
        tracker.settle(seq, ok)
    replies = tracker.take_replies()
    assert replies == [(2, False, True), (3, False, True)], f"seq 1 is outstanding: no multiple ack, got {replies}"
    client.receive(replies, settled)
    tracker.settle(1, True)
    settled[1] = True
    replies = tracker.take_replies()
    client.receive(replies, settled)
    assert client.outstanding == {4}, f"after settling 1, only 4 should be outstanding: {sorted(client.outstanding)}"


def test_early_nack_is_not_overridden_by_a_later_multiple_ack():
    tracker, client = ConfirmTracker(), Client()
    publish(tracker, client, 3)
    settled = {2: False}
    tracker.settle(2, False)
    client.receive(tracker.take_replies(), settled)
    assert client.answers == {2: False}, f"seq 2 should be nacked on its own: {client.answers}"
    for seq in (1, 3):
        tracker.settle(seq, True)
        settled[seq] = True
    client.receive(tracker.take_replies(), settled)
    assert client.answers == {1: True, 2: False, 3: True}, f"answers {client.answers}"


def test_settle_of_a_publish_never_made_is_an_assertion():
    tracker = ConfirmTracker()
    tracker.next_publish()
    with pytest.raises(AssertionError):
        tracker.settle(2, True)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_random_settlement_orders_answer_every_publish_exactly_once(data):
    tracker, client = ConfirmTracker(), Client()
    settled: dict[int, bool] = {}
    for _ in range(data.draw(st.integers(1, 40), label="steps")):
        unsettled = sorted(set(range(1, tracker.last_seq + 1)) - set(settled))
        choices = ["publish", "settle", "settle", "take"] if unsettled else ["publish", "take"]
        choice = data.draw(st.sampled_from(choices))
        if choice == "publish":
            publish(tracker, client, data.draw(st.integers(1, 4)))
        elif choice == "settle":
            seq = data.draw(st.sampled_from(unsettled))
            ok = data.draw(st.booleans())
            tracker.settle(seq, ok)
            settled[seq] = ok
        else:
            client.receive(tracker.take_replies(), settled)
    client.receive(tracker.take_replies(), settled)
    assert client.answers == settled, (
        f"every settled publish must be answered exactly once with its outcome: answers {client.answers}, "
        f"settled {settled}")
    unsettled = set(range(1, tracker.last_seq + 1)) - set(settled)
    assert client.outstanding == unsettled, (
        f"outstanding {sorted(client.outstanding)} should be exactly the unsettled {sorted(unsettled)}")
    # Settle the rest: the client ends with nothing outstanding.
    for seq in sorted(unsettled, reverse=True):
        tracker.settle(seq, True)
        settled[seq] = True
    client.receive(tracker.take_replies(), settled)
    assert not client.outstanding, f"still outstanding after settling everything: {sorted(client.outstanding)}"
