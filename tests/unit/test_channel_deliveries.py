"""A channel's deliveries of a queue's turn given at once (`Channel.deliver_many`)
are the frames, tags and unacked records that one `deliver` each would make."""
from __future__ import annotations

from types import SimpleNamespace

from warren.broker.amqp import channel as channel_module
from warren.broker.amqp.channel import Channel
from warren.broker.amqp.channel_consumers import Consumer
from warren.protocol import codec


class Connection:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.frame_max = 131072
        self.writes_paused = False
        self.user_name = "guest"
        self.id = "c1"
        self.vhost = SimpleNamespace(name="/")
        self.broker = SimpleNamespace(
            counters=SimpleNamespace(delivered=0),
            settings=SimpleNamespace(commands_soft_limit=32, credit_flow_default_credit=(400, 200)),
            access=SimpleNamespace(permission=lambda user, vhost: None))

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def write_parts(self, parts: list, size: int) -> None:
        data = b"".join(parts)
        assert len(data) == size, f"{size} bytes said, {len(data)} written"
        self.written.append(data)


class Queue:
    deleted = False

    def __init__(self) -> None:
        self.suspended: list[bool] = []

    def suspend(self, consumer: tuple, active: bool) -> None:
        self.suspended.append(not active)


def consuming_channel(no_ack: bool = False, global_prefetch: int = 0) -> Channel:
    channel = Channel(Connection(), 1)
    channel.consumers["ctag"] = Consumer("ctag", codec.shortstr("ctag"), Queue(), no_ack)
    channel.global_prefetch_count = global_prefetch
    return channel


DELIVERIES = [((10 + n, n), ("amq.direct" if n % 2 else "", f"key{n % 3}", b"\x00\x00", bytes([n]) * (n * 40)),
               n == 2) for n in range(1, 7)]


def one_by_one(channel: Channel) -> None:
    for msg_id, payload, redelivered in DELIVERIES:
        channel.deliver("queue", "ctag", msg_id, payload, redelivered)


def test_deliveries_given_at_once_are_what_one_deliver_each_makes():
    for no_ack in (False, True):
        alone, together = consuming_channel(no_ack), consuming_channel(no_ack)
        alone.next_delivery_tag = together.next_delivery_tag = 5
        one_by_one(alone)
        together.deliver_many("queue", "ctag", DELIVERIES)
        assert b"".join(together.connection.written) == b"".join(alone.connection.written), "the same frames"
        assert together.unacked == alone.unacked and len(alone.unacked) == (0 if no_ack else 6)
        assert together.next_delivery_tag == alone.next_delivery_tag == 11
        assert together.broker.counters.delivered == alone.broker.counters.delivered == 6
        assert len(together.delivery_times) == len(alone.delivery_times) == (0 if no_ack else 1)


def test_a_run_of_large_deliveries_goes_out_in_parts_as_it_is_made(monkeypatch):
    monkeypatch.setattr(channel_module, "WRITE_PARTS_BYTES", 300)
    alone, together = consuming_channel(), consuming_channel()
    one_by_one(alone)
    together.deliver_many("queue", "ctag", DELIVERIES)
    assert b"".join(together.connection.written) == b"".join(alone.connection.written), "the same frames"
    assert len(together.connection.written) == 3, "a write each time the run's frames pass 300 bytes, then the rest"


def test_past_a_global_prefetch_the_rest_is_held_as_one_by_one():
    alone, together = consuming_channel(global_prefetch=4), consuming_channel(global_prefetch=4)
    one_by_one(alone)
    together.deliver_many("queue", "ctag", DELIVERIES)
    assert b"".join(together.connection.written) == b"".join(alone.connection.written)
    assert len(together.unacked) == 4 and list(together.held) == list(alone.held) and len(alone.held) == 2
    assert together.consumers["ctag"].queue.suspended == [True], "the consumer stops at the limit"


def test_a_runs_frames_name_each_deliverys_own_exchange_and_key():
    """The run looks its frames up again only when the exchange or the key changes:
    each change alone, and neither, must still give one `deliver` each's bytes."""
    pairs = [("", "a"), ("amq.direct", "a"), ("amq.direct", "b"), ("amq.direct", "b"), ("", "b"), ("", "a")]
    deliveries = [((n, n), (exchange, key, b"\x00\x00", bytes([n])), False)
                  for n, (exchange, key) in enumerate(pairs, 1)]
    alone, together = consuming_channel(), consuming_channel()
    for msg_id, payload, redelivered in deliveries:
        alone.deliver("queue", "ctag", msg_id, payload, redelivered)
    together.deliver_many("queue", "ctag", deliveries)
    assert b"".join(together.connection.written) == b"".join(alone.connection.written)
