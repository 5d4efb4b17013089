"""A publishing channel holds its socket unread only past the soft limit plus
the reader's credit (broker/amqp/publish_credit.py), as RabbitMQ's reader
stops only once its credit is spent: a client's window of 256 publishes in
flight, read in two socket reads, is read on at once."""
from __future__ import annotations

from types import SimpleNamespace

from warren.broker.amqp.channel import Channel

SOFT_LIMIT = 32
CREDIT = (400, 200)


class Queue:
    deleted = False

    def __init__(self) -> None:
        self.answers: list = []

    def enqueue_from(self, owner, payload, ttl_ms, priority, on_applied) -> None:
        self.answers.append(on_applied)


class Connection:
    def __init__(self, queue: Queue) -> None:
        self.id = "c1"
        self.user_name = "guest"
        self.frame_max = 131072
        self.pauses: list[bool] = []
        exchange = SimpleNamespace(name="", internal=False)
        self.vhost = SimpleNamespace(name="/", exchanges={"": exchange}, route=lambda exchange, key, props: [queue])
        self.broker = SimpleNamespace(
            counters=SimpleNamespace(published=0),
            settings=SimpleNamespace(commands_soft_limit=SOFT_LIMIT, credit_flow_default_credit=CREDIT),
            access=SimpleNamespace(permission=lambda user, vhost: None))

    def set_channel_paused(self, channel: Channel, paused: bool) -> None:
        self.pauses.append(paused)

    def want_flush(self, channel: Channel) -> None:
        pass


def publishing_channel() -> tuple[Channel, Queue, Connection]:
    queue = Queue()
    connection = Connection(queue)
    channel = Channel(connection, 1)
    channel.publish_permitted.add("")
    return channel, queue, connection


def publish(channel: Channel, count: int) -> None:
    for _ in range(count):
        channel.on_publish("", "q", False, False, b"\x00\x00", b"x" * 1024)


def test_a_window_of_256_publishes_is_read_without_a_pause():
    channel, queue, connection = publishing_channel()
    publish(channel, 235)   # the first socket read of the client's window
    publish(channel, 21)    # the rest of it, in the next read
    assert connection.pauses == [], "the channel paused its socket within a client's window of 256"


def test_the_socket_pauses_past_soft_limit_plus_credit_and_reads_again_after_more_credit_after():
    channel, queue, connection = publishing_channel()
    publish(channel, SOFT_LIMIT + CREDIT[0])
    assert connection.pauses == []
    publish(channel, 10)
    assert connection.pauses == [True]
    for answer in queue.answers[:CREDIT[1] + 9]:
        answer(True)
    assert connection.pauses == [True], "read again before more_credit_after enqueues were done"
    queue.answers[CREDIT[1] + 9](True)
    assert connection.pauses == [True, False]
