"""broker/queues/queue_client.py: a node's enqueuer and delivery sequences with one
queue, and what it sends again, over a fake route that records every send."""
from __future__ import annotations

from warren.broker.queues import queue_commands as qc
from warren.broker.queues.queue import ConsumerSink
from warren.broker.queues.queue_client import (
    DOWNED_OWNERS_SECONDS,
    ENQUEUE_BATCH_MAX_BYTES,
    RESEND_SECONDS,
    QueueClient,
)

OWNER = (7, 1)
KEY = "n1/i1/7/1"


class FakeRoute:
    node = "n1"

    def __init__(self) -> None:
        self.leader_now: str | None = "a"
        self.sent: list[tuple[str | None, object]] = []    # (leader, command)
        self.submitted: list[object] = []
        self.end_of_turn: list = []
        self.resends_asked: list[tuple] = []
        self.downs: list[qc.Down] = []

    def at_end_of_turn(self, callback) -> None:
        self.end_of_turn.append(callback)

    def run_turn(self) -> None:
        callbacks, self.end_of_turn = self.end_of_turn, []
        for callback in callbacks:
            callback()

    def send(self, command) -> str | None:
        self.sent.append((self.leader_now, command))
        return self.leader_now

    def submit(self, command, on_done) -> None:
        self.submitted.append(command)

    def submit_down(self, down) -> None:
        self.downs.append(down)

    def leader(self) -> str | None:
        return self.leader_now

    def ask_resend(self, owner, tag, after_seq) -> None:
        self.resends_asked.append((owner, tag, after_seq))

    def send_to(self, peer, message) -> None:
        self.sent.append((peer, message))


class FakeQueue:
    def delivery_payload(self, payload, delivery_count):
        return payload


class Channel(ConsumerSink):
    def __init__(self) -> None:
        self.handed: list[tuple] = []

    def deliver(self, queue, consumer_tag, delivery_id, payload, redelivered) -> None:
        self.handed.append((consumer_tag, delivery_id, payload[3]))


def make_client() -> tuple[QueueClient, FakeRoute, Channel]:
    route = FakeRoute()
    route.queue = FakeQueue()   # the client holds its queue weakly: something else must keep it
    return QueueClient("g", route, lambda owner: f"n1/i1/{owner[0]}/{owner[1]}", route.queue), route, Channel()


def publish(client: QueueClient, *bodies: bytes) -> list[list[bool]]:
    outcomes = []
    for body in bodies:
        outcome: list[bool] = []
        client.enqueue_from(OWNER, ("", "q", b"", body), None, 0, outcome.append)
        outcomes.append(outcome)
    return outcomes


def batches(route: FakeRoute) -> list[tuple[str | None, int, list[bytes]]]:
    return [(leader, c.first_seq, [m[3] for m in c.messages]) for leader, c in route.sent
            if isinstance(c, qc.EnqueueBatch)]


def test_a_turns_publishes_go_as_one_batch_at_its_end():
    client, route, _ = make_client()
    publish(client, b"1", b"2", b"3")
    assert route.sent == [] and len(route.end_of_turn) == 1, "scheduled once, sent at the end of the turn"
    route.run_turn()
    assert batches(route) == [("a", 1, [b"1", b"2", b"3"])]
    assert route.sent[0][1].enqueuer == KEY


def test_a_turns_large_publishes_go_in_batches_of_a_bounded_size():
    """300 KB publishes read in one turn made one 30 MB Raft entry: a WAL write and a
    follower's AppendEntries that a disk near its limit took whole or not at all."""
    client, route, _ = make_client()
    size = 300_000
    publish(client, *(b"%d" % n + b"x" * (size - len(b"%d" % n)) for n in range(10)))
    route.run_turn()
    per_batch = ENQUEUE_BATCH_MAX_BYTES // size + 1   # the one that reaches the bound is the last
    assert [(first, len(bodies)) for _, first, bodies in batches(route)] == [
        (1, per_batch), (1 + per_batch, per_batch), (1 + 2 * per_batch, 10 - 2 * per_batch)]
    assert [b[:1] for _, _, bodies in batches(route) for b in bodies] == [b"%d" % n for n in range(10)]
    publish(client, b"small", b"x" * (ENQUEUE_BATCH_MAX_BYTES + 1), b"small")
    route.run_turn()
    assert [len(bodies) for _, _, bodies in batches(route)][3:] == [2, 1], "a body past the bound goes alone"


def test_applied_confirms_and_refused_rejects_each_seq_once():
    client, route, _ = make_client()
    outcomes = publish(client, b"1", b"2", b"3")
    route.run_turn()
    client.on_applied(KEY, 1, 2, refused=[2])
    client.on_applied(KEY, 1, 3, refused=[])    # a duplicate answer confirms nothing twice
    assert outcomes == [[True], [False], [True]]
    assert client.enqueues_pending == 0


def test_a_new_leader_gets_every_unconfirmed_enqueue_again_in_order():
    client, route, _ = make_client()
    publish(client, b"1", b"2", b"3", b"4")
    route.run_turn()
    client.on_applied(KEY, 1, 1, [])
    client.on_applied(KEY, 3, 3, [])            # 3 was applied, 2 and 4 were not
    route.leader_now = "b"
    client.resend_enqueues(now=0.0, leader_changed=True)
    assert batches(route)[1:] == [("b", 2, [b"2"]), ("b", 4, [b"4"])], "runs of consecutive seqs"
    client.resend_enqueues(now=0.0, leader_changed=True)
    assert len(batches(route)) == 3, "already sent to that leader: not again"


def test_without_progress_for_the_resend_period_everything_unconfirmed_goes_again():
    client, route, _ = make_client()
    publish(client, b"1", b"2")
    route.run_turn()
    started = client.enqueuers[OWNER].progress_at
    client.resend_enqueues(now=started + RESEND_SECONDS / 2, leader_changed=False)
    assert len(batches(route)) == 1, "too early"
    client.resend_enqueues(now=started + RESEND_SECONDS, leader_changed=False)
    assert batches(route)[1:] == [("a", 1, [b"1", b"2"])]


def test_publishes_not_yet_sent_wait_for_their_turn_and_are_not_resent_before():
    client, route, _ = make_client()
    publish(client, b"1")
    route.run_turn()
    publish(client, b"2")                       # waits for the end of this turn
    route.leader_now = "b"
    client.resend_enqueues(now=0.0, leader_changed=True)
    route.run_turn()
    assert batches(route) == [("a", 1, [b"1"]), ("b", 1, [b"1"]), ("b", 2, [b"2"])]


def test_publishes_sent_when_no_leader_was_known_go_first_with_the_next_ones():
    client, route, _ = make_client()
    route.leader_now = None
    publish(client, b"1")
    route.run_turn()
    route.leader_now = "a"
    publish(client, b"2")
    route.run_turn()
    assert batches(route) == [(None, 1, [b"1"]), ("a", 1, [b"1", b"2"])]


def test_any_other_command_goes_after_the_publishes_before_it():
    client, route, _ = make_client()
    publish(client, b"1")
    client.get(OWNER, True, lambda reply: None)
    assert batches(route) == [("a", 1, [b"1"])]
    assert [type(c) for c in route.submitted] == [qc.Dequeue]


def test_a_deleted_queue_confirms_what_it_was_given():
    client, route, _ = make_client()
    outcomes = publish(client, b"1", b"2")
    client.confirm_all()
    route.run_turn()
    assert outcomes == [[True], [True]] and batches(route) == []


def test_deliveries_are_handed_over_in_seq_order_once_and_a_gap_is_asked_for():
    client, route, channel = make_client()
    client.checkout((OWNER, "t"), channel, 10, 0, False, True)
    payload = ("", "q", b"", b"m")
    client.on_delivery(KEY, "t", 1, 11, payload, False, 0)
    client.on_delivery(KEY, "t", 3, 13, payload, False, 0)      # 2 is missing: held, asked for
    assert route.resends_asked == [(KEY, "t", 1)]
    client.on_delivery(KEY, "t", 1, 11, payload, False, 0)      # seen: dropped
    client.on_delivery(KEY, "t", 2, 12, payload, False, 0)      # fills the gap: 2 then 3
    assert [delivery_id for _, delivery_id, _ in channel.handed] == [(11, 1), (12, 2), (13, 3)]


def test_a_turns_deliveries_given_together_keep_the_seq_rules_and_the_order():
    client, route, channel = make_client()
    client.checkout((OWNER, "t"), channel, 10, 0, False, True)
    calls: list[list] = []
    channel.deliver_many = lambda queue, tag, run: (calls.append(run),
                                                    ConsumerSink.deliver_many(channel, queue, tag, run))
    payload = ("", "q", b"", b"m")
    client.on_deliveries(KEY, "t", [(1, 11, payload, False, 0), (2, 12, payload, False, 0),
                                    (4, 14, payload, False, 0),     # 3 is missing: held, asked for
                                    (2, 12, payload, False, 0),     # seen: dropped
                                    (3, 13, payload, False, 0),     # fills the gap: 3 then 4
                                    (5, 15, payload, False, 0), (6, 16, payload, False, 0)])
    assert route.resends_asked == [(KEY, "t", 2)]
    assert [delivery_id for _, delivery_id, _ in channel.handed] == [(11, 1), (12, 2), (13, 3), (14, 4), (15, 5),
                                                                     (16, 6)]
    assert [[d[0] for d in run] for run in calls] == [[(11, 1), (12, 2)], [(15, 5), (16, 6)]], \
        "the deliveries in sequence go in one call per run"
    client.on_deliveries(KEY, "gone", [(1, 21, payload, False, 0)])
    assert len(channel.handed) == 6, "a consumer not of this node is given nothing"


def test_a_resends_answer_skips_the_seqs_no_longer_checked_out():
    """Seqs 2 and 3 were delivered while this node was cut off, and went back to the queue
    (its node was gone). The consumer came back and got 4 and 5: the leader resends nothing
    below 4 and says it assigned up to 5, so 4 and 5 go to the channel. Waiting for 2 for
    good left the consumer's window full and the consumer stalled (warren-chaos seed 23)."""
    client, route, channel = make_client()
    client.checkout((OWNER, "t"), channel, 10, 0, False, True)
    payload = ("", "q", b"", b"m")
    client.on_delivery(KEY, "t", 1, 11, payload, False, 0)
    client.on_delivery(KEY, "t", 4, 14, payload, True, 1)
    client.on_delivery(KEY, "t", 5, 15, payload, False, 0)
    assert route.resends_asked == [(KEY, "t", 1)]
    client.on_resent(KEY, "t", 5, [4, 5])
    assert [delivery_id for _, delivery_id, _ in channel.handed] == [(11, 1), (14, 4), (15, 5)]
    client.on_delivery(KEY, "t", 3, 13, payload, False, 0)      # a late copy of a returned one: dropped
    client.on_delivery(KEY, "t", 6, 16, payload, False, 0)
    assert [delivery_id for _, delivery_id, _ in channel.handed][3:] == [(16, 6)]


def test_a_resends_answer_leaves_what_comes_after_it_held():
    client, route, channel = make_client()
    client.checkout((OWNER, "t"), channel, 10, 0, False, True)
    payload = ("", "q", b"", b"m")
    client.on_delivery(KEY, "t", 3, 13, payload, False, 0)
    client.on_delivery(KEY, "t", 6, 16, payload, False, 0)
    client.on_resent(KEY, "t", 4, [3])     # 1, 2 and 4 are not checked out; 5 may still come
    assert [delivery_id for _, delivery_id, _ in channel.handed] == [(13, 3)]
    client.on_delivery(KEY, "t", 5, 15, payload, False, 0)
    assert [delivery_id for _, delivery_id, _ in channel.handed] == [(13, 3), (15, 5), (16, 6)]


def test_a_held_copy_of_a_delivery_no_longer_checked_out_is_dropped():
    client, route, channel = make_client()
    client.checkout((OWNER, "t"), channel, 10, 0, False, True)
    payload = ("", "q", b"", b"m")
    client.on_delivery(KEY, "t", 2, 12, payload, False, 0)    # went back to the queue since
    client.on_delivery(KEY, "t", 3, 13, payload, False, 0)
    client.on_resent(KEY, "t", 3, [3])
    assert [delivery_id for _, delivery_id, _ in channel.handed] == [(13, 3)]


def test_a_resend_too_large_to_hold_is_not_skipped():
    """A checked-out seq the client could not hold stops the skip just below it: it comes again."""
    client, route, channel = make_client()
    client.checkout((OWNER, "t"), channel, 10, 0, False, True)
    payload = ("", "q", b"", b"m")
    client.on_delivery(KEY, "t", 3, 13, payload, False, 0)
    client.on_resent(KEY, "t", 6, [3, 5, 6])                 # 5 and 6 were not held
    assert [delivery_id for _, delivery_id, _ in channel.handed] == [(13, 3)]
    client.on_delivery(KEY, "t", 5, 15, payload, False, 0)
    client.on_delivery(KEY, "t", 6, 16, payload, False, 0)
    assert [delivery_id for _, delivery_id, _ in channel.handed] == [(13, 3), (15, 5), (16, 6)]


def test_a_consumers_node_asks_a_new_leader_for_what_came_after_the_last_seq_seen():
    client, route, channel = make_client()
    client.checkout((OWNER, "t"), channel, 10, 0, False, True)
    client.on_delivery(KEY, "t", 1, 11, ("", "q", b"", b"m"), False, 0)
    client.ask_for_checked_out("b")
    assert route.sent[-1] == ("b", [4, "g", KEY, "t", 1])


def test_a_delivery_to_a_consumer_of_a_closed_channel_downs_the_channel_again():
    """Its CHECKOUT, forwarded through a third node, reached the leader after the
    DOWN: the queue delivers to a consumer nobody closes. The first delivery to it
    re-sends the DOWN, so the queue takes back what it checked out (issue 11 item 5)."""
    client, route, channel = make_client()
    client.checkout((OWNER, "t"), channel, 10, 0, False, True)
    client.owner_down(OWNER)
    assert [d.owner for d in route.downs] == [KEY]
    client.on_delivery(KEY, "t", 1, 11, ("", "q", b"", b"m"), False, 0)
    client.on_delivery(KEY, "t", 2, 12, ("", "q", b"", b"n"), False, 0)
    assert channel.handed == []
    assert [d.owner for d in route.downs] == [KEY, KEY], "once, not per delivery"


def test_a_closed_channels_down_is_sent_again_at_most_once_per_resend_period(monkeypatch):
    client, route, channel = make_client()
    clock = [100.0]
    monkeypatch.setattr("warren.broker.queues.queue_client.time.monotonic", lambda: clock[0])
    client.owner_down(OWNER)
    client.on_delivery(KEY, "t", 1, 11, ("", "q", b"", b"m"), False, 0)
    clock[0] += RESEND_SECONDS / 2
    client.on_delivery(KEY, "t", 1, 11, ("", "q", b"", b"m"), False, 0)
    assert len(route.downs) == 2
    clock[0] += RESEND_SECONDS
    client.on_delivery(KEY, "t", 1, 11, ("", "q", b"", b"m"), False, 0)
    assert len(route.downs) == 3, "the DOWN sent again may have been lost too"


def test_a_delivery_to_a_cancelled_consumer_of_a_live_channel_downs_nothing():
    client, route, channel = make_client()
    client.checkout((OWNER, "t"), channel, 10, 0, False, True)
    client.cancel((OWNER, "t"))
    client.on_delivery(KEY, "t", 1, 11, ("", "q", b"", b"m"), False, 0)
    assert route.downs == [] and channel.handed == []


def test_closed_channels_are_remembered_for_a_bounded_time(monkeypatch):
    client, route, _ = make_client()
    clock = [100.0]
    monkeypatch.setattr("warren.broker.queues.queue_client.time.monotonic", lambda: clock[0])
    client.owner_down(OWNER)
    clock[0] += DOWNED_OWNERS_SECONDS + 1
    client.owner_down((8, 1))
    assert list(client.downed_owners) == ["n1/i1/8/1"]


def test_publishes_after_a_resend_that_found_no_leader_skip_what_was_applied():
    """Seq 1 is lost, 2 and 3 applied; a resend finds no leader; the next publish sends
    the pending seqs in runs (1, then 4), not the range 1..4 over what was applied
    (a KeyError that dropped the turn's publishes: tests/sim membership seed 3)."""
    client, route, _ = make_client()
    publish(client, b"1")
    route.run_turn()
    publish(client, b"2", b"3")
    route.run_turn()
    client.on_applied(KEY, 2, 3, [])
    route.leader_now = None
    client.resend_enqueues(0.0, leader_changed=True)   # the leader is lost: sent to nobody
    route.leader_now = "b"
    route.sent.clear()
    publish(client, b"4")
    route.run_turn()
    assert batches(route) == [("b", 1, [b"1"]), ("b", 4, [b"4"])]
