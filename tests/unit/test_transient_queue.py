"""broker/queues/queue.py: a transient queue is a replica without a log. The same
machine, client and channel-facing methods as a replicated queue; each
command applied at once on its node, the messages kept in the machine."""
from __future__ import annotations

from warren.broker.queues import queue_commands as qc
from warren.broker.queues.queue import ConsumerSink, Queue
from warren.broker.queues.queue_factory import make_queue
from warren.broker.queues.queue_routes import LocalRoute


class FakeVhost:
    name = "/"

    def __init__(self) -> None:
        self.dead: list[tuple] = []
        self.deleted: list[Queue] = []

    def dead_letter(self, queue, reason, payloads, now_ms) -> None:
        self.dead.append((reason, payloads))

    def delete_queue_now(self, queue) -> None:
        self.deleted.append(queue)
        queue.notify_deleted()


class Channel(ConsumerSink):
    def __init__(self) -> None:
        self.delivered: list[tuple] = []
        self.cancelled: list[str] = []

    def deliver(self, queue, consumer_tag, msg_id, payload, redelivered) -> None:
        self.delivered.append((consumer_tag, msg_id, payload[3], redelivered))

    def on_queue_deleted(self, queue, consumer_tag) -> None:
        self.cancelled.append(consumer_tag)


OWNER = (1, 1)


def transient(**arguments) -> Queue:
    return make_queue(FakeVhost(), "q", arguments, durable=False, exclusive_owner=None, auto_delete=False)


def publish(queue: Queue, body: bytes) -> list[bool]:
    outcome: list[bool] = []
    queue.enqueue_from(OWNER, ("", "q", b"", body), None, 0, outcome.append)
    return outcome


def test_a_publish_is_applied_and_confirmed_at_once():
    queue = transient()
    assert isinstance(queue.route, LocalRoute) and queue.replica.log is None
    assert publish(queue, b"a") == [True]
    assert queue.message_count == 1
    assert queue.bytes_in_memory == 1, "the machine keeps the body itself"
    assert queue.state.messages[1][0] == ("", "q", b"", b"a")


def test_a_refused_publish_is_not_confirmed():
    queue = transient(**{"x-max-length": 1, "x-overflow": "reject-publish"})
    assert publish(queue, b"a") == [True]
    assert publish(queue, b"b") == [False]


def test_consume_ack_requeue_and_get_through_the_same_commands():
    queue = transient()
    channel = Channel()
    for body in (b"a", b"b"):
        publish(queue, body)
    queue.add_consumer((OWNER, "t"), channel, 1, 0, False, False)
    assert channel.delivered == [("t", (1, 1), b"a", False)], "prefetch 1, deliveries named (msg_id, seq)"
    queue.release(qc.Return, OWNER, "t", [(1, 1)])
    assert channel.delivered[-1] == ("t", (1, 2), b"a", True)
    queue.release(qc.Settle, OWNER, "t", [(1, 2)])
    assert channel.delivered[-1] == ("t", (2, 3), b"b", False)
    queue.remove_consumer((OWNER, "t"))
    got: list = []
    queue.owner_down(OWNER)                     # b goes back
    queue.get(OWNER, True, got.append)
    assert [g.payload[3] for g in got] == [b"b"] and queue.message_count == 0
    queue.get(OWNER, True, got.append)
    assert got[-1] is None


def test_purge_and_dead_letters_and_expiry():
    queue = transient(**{"x-max-length": 1, "x-expires": 0})
    publish(queue, b"a")
    publish(queue, b"b")                        # drop-head: a is dead-lettered
    assert queue.vhost.dead == [("maxlen", (("", "q", b"", b"a"),))]
    counts: list[int] = []
    queue.purge(counts.append)
    assert counts == [1] and queue.message_count == 0
    queue.tick()                                # unused past x-expires: deleted here
    assert queue.vhost.deleted == [queue] and queue.deleted
