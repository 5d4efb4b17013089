"""Consumers over pika: prefetch, priorities, cancel, get, ack/nack/reject, recover."""
from __future__ import annotations

import pytest
from pamqp import commands
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from tests.integration.pika_raw_client import RawClient
from tests.integration.pika_support import (  # noqa: F401
    assert_closed_by,
    cleanup,
    connect,
    connection,
    drain,
    get_one,
    message_count,
    pump_for,
    pump_until,
    sync,
)

# How long we watch to see that no delivery beyond the prefetch limit arrives.
QUIET_SECONDS = 0.3


class Deliveries:
    """A basic_consume callback recording (consumer_tag, delivery_tag, redelivered, body)."""

    def __init__(self) -> None:
        self.items: list[tuple[str, int, bool, bytes]] = []

    def __call__(self, channel, method, properties, body) -> None:
        self.items.append((method.consumer_tag, method.delivery_tag, method.redelivered, body))

    def __len__(self) -> int:
        return len(self.items)

    @property
    def bodies(self) -> list[bytes]:
        return [item[3] for item in self.items]


def _fill(channel, queue: str, count: int) -> None:
    for i in range(count):
        channel.basic_publish("", queue, b"%d" % i)
    sync(channel)


def test_prefetch_limits_unacked_deliveries_per_consumer(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    _fill(channel, name, 10)
    channel.basic_qos(prefetch_count=3)
    got = Deliveries()
    channel.basic_consume(name, got)
    pump_until(connection, lambda: len(got) >= 3, "3 deliveries")
    pump_for(connection, QUIET_SECONDS)
    assert len(got) == 3, f"prefetch 3 but {len(got)} unacked deliveries arrived"
    channel.basic_ack(got.items[0][1])
    pump_until(connection, lambda: len(got) >= 4, "a 4th delivery after one ack")
    pump_for(connection, QUIET_SECONDS)
    assert len(got) == 4, f"one ack should free one slot, got {len(got)} deliveries"
    channel.basic_ack(got.items[-1][1], multiple=True)
    pump_until(connection, lambda: len(got) >= 7, "3 more deliveries after acking all")
    pump_for(connection, QUIET_SECONDS)
    assert len(got) == 7
    assert got.bodies == [b"%d" % i for i in range(7)]


def test_per_consumer_prefetch_applies_to_each_consumer(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name + "-a"))
    channel.queue_declare(cleanup.queue(name + "-b"))
    _fill(channel, name + "-a", 5)
    _fill(channel, name + "-b", 5)
    channel.basic_qos(prefetch_count=2)
    got = Deliveries()
    channel.basic_consume(name + "-a", got)
    channel.basic_consume(name + "-b", got)
    pump_until(connection, lambda: len(got) >= 4, "2 deliveries to each consumer")
    pump_for(connection, QUIET_SECONDS)
    assert len(got) == 4, f"prefetch 2 per consumer, 2 consumers: expected 4, got {len(got)}"


def test_global_qos_is_shared_by_the_channels_consumers(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name + "-a"))
    channel.queue_declare(cleanup.queue(name + "-b"))
    _fill(channel, name + "-a", 5)
    _fill(channel, name + "-b", 5)
    channel.basic_qos(prefetch_count=3, global_qos=True)
    got = Deliveries()
    channel.basic_consume(name + "-a", got)
    channel.basic_consume(name + "-b", got)
    pump_until(connection, lambda: len(got) >= 3, "3 deliveries")
    pump_for(connection, QUIET_SECONDS)
    assert len(got) == 3, f"global prefetch 3 over two consumers, but {len(got)} deliveries arrived"
    channel.basic_ack(0, multiple=True)
    pump_until(connection, lambda: len(got) >= 6, "3 more deliveries after acking all")
    pump_for(connection, QUIET_SECONDS)
    assert len(got) == 6


def test_global_qos_with_consumers_registered_before_publishing(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name + "-a"))
    channel.queue_declare(cleanup.queue(name + "-b"))
    channel.basic_qos(prefetch_count=3, global_qos=True)
    got = Deliveries()
    channel.basic_consume(name + "-a", got)
    channel.basic_consume(name + "-b", got)
    _fill(channel, name + "-a", 5)
    _fill(channel, name + "-b", 5)
    pump_until(connection, lambda: len(got) >= 3, "3 deliveries")
    pump_for(connection, QUIET_SECONDS)
    assert len(got) == 3, f"global prefetch 3 over two consumers, but {len(got)} deliveries arrived"


def test_no_ack_consumer_gets_everything(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    channel.basic_qos(prefetch_count=1)  # prefetch does not apply to no-ack consumers
    got = Deliveries()
    channel.basic_consume(name, got, auto_ack=True)
    _fill(channel, name, 20)
    pump_until(connection, lambda: len(got) >= 20, "20 no-ack deliveries")
    assert got.bodies == [b"%d" % i for i in range(20)]
    assert message_count(connection, name) == 0


def test_exclusive_consumer_blocks_a_second_consumer(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    channel.basic_consume(name, lambda *a: None, exclusive=True)
    other = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        other.basic_consume(name, lambda *a: None)
    assert_closed_by(excinfo.value, 403, f"queue '{name}' in vhost '/' in exclusive use")


def test_exclusive_consume_on_a_queue_with_consumers_is_refused(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    channel.basic_consume(name, lambda *a: None)
    other = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        other.basic_consume(name, lambda *a: None, exclusive=True)
    assert_closed_by(excinfo.value, 403, "in exclusive use")


def test_server_generates_consumer_tags(server, name, cleanup):
    with RawClient(server.amqp_port) as client:
        client.handshake()
        client.open_channel(1)
        client.send(1, commands.Queue.Declare(queue=cleanup.queue(name)))
        client.expect(commands.Queue.DeclareOk)
        tags = set()
        for _ in range(2):
            client.send(1, commands.Basic.Consume(queue=name, consumer_tag=""))
            tags.add(client.expect(commands.Basic.ConsumeOk).consumer_tag)
        assert len(tags) == 2, f"server-generated tags must be unique, got {tags}"
        assert all(tag.startswith("amq.ctag-") for tag in tags), tags
        client.close_connection()


def test_reusing_a_consumer_tag_is_530(server, name, cleanup):
    """RabbitMQ: connection error 530 NOT_ALLOWED "attempt to reuse consumer tag 'same'"."""
    with RawClient(server.amqp_port) as client:
        client.handshake()
        client.open_channel(1)
        client.send(1, commands.Queue.Declare(queue=cleanup.queue(name)))
        client.expect(commands.Queue.DeclareOk)
        client.send(1, commands.Basic.Consume(queue=name, consumer_tag="same"))
        client.expect(commands.Basic.ConsumeOk)
        client.send(1, commands.Basic.Consume(queue=name, consumer_tag="same"))
        close = client.expect(commands.Connection.Close)
        assert close.reply_code == 530, f"expected 530, got {close.reply_code} {close.reply_text!r}"
        assert "attempt to reuse consumer tag 'same'" in close.reply_text, close.reply_text
        client.send(0, commands.Connection.CloseOk())


def test_higher_priority_consumer_gets_messages_while_it_has_credit(connection, name, cleanup):
    high, low = connection.channel(), connection.channel()
    high.queue_declare(cleanup.queue(name))
    high.basic_qos(prefetch_count=2)
    low.basic_qos(prefetch_count=10)
    got_high, got_low = Deliveries(), Deliveries()
    low.basic_consume(name, got_low, arguments={"x-priority": 0})
    high.basic_consume(name, got_high, arguments={"x-priority": 10})
    _fill(high, name, 5)
    pump_until(connection, lambda: len(got_high) + len(got_low) >= 5, "5 deliveries")
    assert got_high.bodies == [b"0", b"1"], f"high got {got_high.bodies}, low got {got_low.bodies}"
    assert got_low.bodies == [b"2", b"3", b"4"]


def test_priority_consumer_resumes_when_credit_returns(connection, name, cleanup):
    high, low = connection.channel(), connection.channel()
    high.queue_declare(cleanup.queue(name))
    high.basic_qos(prefetch_count=1)
    low.basic_qos(prefetch_count=1)
    got_high, got_low = Deliveries(), Deliveries()
    low.basic_consume(name, got_low, arguments={"x-priority": 1})
    high.basic_consume(name, got_high, arguments={"x-priority": 5})
    _fill(high, name, 4)
    pump_until(connection, lambda: len(got_high) == 1 and len(got_low) == 1, "one delivery each")
    high.basic_ack(got_high.items[0][1])
    pump_until(connection, lambda: len(got_high) == 2, "the high-priority consumer's next delivery")
    assert got_high.bodies == [b"0", b"2"]
    assert got_low.bodies == [b"1"]


def test_invalid_x_priority_is_406(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.basic_consume(name, lambda *a: None, arguments={"x-priority": "high"})
    assert_closed_by(excinfo.value, 406, "x-priority")


def test_basic_cancel_stops_deliveries(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    got = Deliveries()
    tag = channel.basic_consume(name, got)
    _fill(channel, name, 1)
    pump_until(connection, lambda: len(got) == 1, "the first delivery")
    channel.basic_ack(got.items[0][1])
    channel.basic_cancel(tag)
    _fill(channel, name, 2)
    pump_for(connection, QUIET_SECONDS)
    assert len(got) == 1, "a cancelled consumer received a message"
    assert message_count(connection, name) == 2


def test_consume_on_missing_queue_is_404(connection, name):
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.basic_consume(name, lambda *a: None)
    assert_closed_by(excinfo.value, 404, f"no queue '{name}' in vhost '/'")


def test_consumer_cancel_notify_when_queue_is_deleted(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    cancels = []
    channel.add_on_cancel_callback(lambda method_frame: cancels.append(method_frame.method))
    tag = channel.basic_consume(name, lambda *a: None)
    connection.channel().queue_delete(name)
    pump_until(connection, lambda: bool(cancels), "basic.cancel from the broker")
    assert cancels[0].consumer_tag == tag
    assert channel.is_open, "a consumer cancel notification must not close the channel"
    sync(channel)


@pytest.mark.parametrize("arguments", [{"durable": True}, {"durable": False},
                                       {"durable": True, "arguments": {"x-queue-type": "quorum"}}],
                         ids=["durable", "transient", "quorum"])
def test_a_channel_deleting_the_queue_it_consumes_gets_delete_ok_before_its_cancel(server, name, cleanup, arguments):
    """RabbitMQ's channel answers queue.delete-ok, then sends basic.cancel for its own
    consumer of that queue (the queue's cancel waits in the channel's mailbox behind the
    delete it is blocked in). py-amqp (kombu, Celery) raises ConsumerCancelled when the
    cancel comes while it waits for the delete-ok (kombu's own integration tests do this)."""
    with RawClient(server.amqp_port) as client:
        client.handshake()
        client.open_channel(1)
        client.send(1, commands.Queue.Declare(queue=cleanup.queue(name), **arguments))
        client.expect(commands.Queue.DeclareOk)
        client.send(1, commands.Basic.Consume(queue=name, consumer_tag="own"))
        client.expect(commands.Basic.ConsumeOk)
        client.send(1, commands.Queue.Delete(queue=name))
        first = client.expect(object)
        assert isinstance(first, commands.Queue.DeleteOk), f"before the delete-ok came {first!r}"
        cancel = client.expect(commands.Basic.Cancel)
        assert cancel.consumer_tag == "own"
        client.close_connection()


def test_basic_get_and_get_empty(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    assert channel.basic_get(name) == (None, None, None)
    _fill(channel, name, 2)
    method, _, body = channel.basic_get(name, auto_ack=True)
    assert body == b"0"
    assert method.message_count == 1, "get-ok's message_count is what remains"
    assert method.redelivered is False
    assert method.exchange == ""
    assert method.routing_key == name
    method, _, body = channel.basic_get(name, auto_ack=True)
    assert (body, method.message_count) == (b"1", 0)
    assert channel.basic_get(name) == (None, None, None)


def test_basic_get_on_missing_queue_is_404(connection, name):
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.basic_get(name)
    assert_closed_by(excinfo.value, 404, f"no queue '{name}'")


def test_ack_multiple_settles_all_up_to_the_tag(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    _fill(channel, name, 4)
    tags = [get_one(channel, name)[0].delivery_tag for _ in range(4)]
    assert tags == [1, 2, 3, 4], tags
    channel.basic_ack(3, multiple=True)
    channel.close()
    assert message_count(connection, name) == 1, "only the unacked 4th should return on close"
    channel = connection.channel()
    assert drain(channel, name) == [b"3"]


def test_nack_multiple_requeue_returns_them_redelivered(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    _fill(channel, name, 3)
    for _ in range(3):
        get_one(channel, name)
    channel.basic_nack(3, multiple=True, requeue=True)
    again = [get_one(channel, name, auto_ack=True) for _ in range(3)]
    assert [body for _, _, body in again] == [b"0", b"1", b"2"], "requeued messages must keep their order"
    assert all(method.redelivered for method, _, _ in again)


def test_nack_without_requeue_drops(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    _fill(channel, name, 2)
    first = get_one(channel, name)[0].delivery_tag
    second = get_one(channel, name)[0].delivery_tag
    channel.basic_nack(first, requeue=False)
    channel.basic_reject(second, requeue=False)
    channel.close()
    assert message_count(connection, name) == 0


def test_reject_requeue_sets_redelivered(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    _fill(channel, name, 1)
    method, _, body = get_one(channel, name)
    assert method.redelivered is False
    channel.basic_reject(method.delivery_tag, requeue=True)
    method, _, again = get_one(channel, name, auto_ack=True)
    assert again == body
    assert method.redelivered is True


def test_basic_recover_requeue_redelivers(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    got = Deliveries()
    channel.basic_consume(name, got)
    _fill(channel, name, 2)
    pump_until(connection, lambda: len(got) >= 2, "2 deliveries")
    channel.basic_recover(requeue=True)
    pump_until(connection, lambda: len(got) >= 4, "2 redeliveries after basic.recover")
    assert [(body, redelivered) for _, _, redelivered, body in got.items] == [
        (b"0", False), (b"1", False), (b"0", True), (b"1", True)]
    first_tags, later_tags = {t for _, t, _, _ in got.items[:2]}, {t for _, t, _, _ in got.items[2:]}
    assert not first_tags & later_tags, "redeliveries must carry new delivery tags"


def test_unknown_delivery_tag_is_406(connection, name, cleanup):
    channel = connection.channel()
    channel.basic_ack(99)
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        sync(channel)
    assert_closed_by(excinfo.value, 406, "unknown delivery tag 99")
    assert connection.is_open


def test_double_ack_is_406(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    _fill(channel, name, 1)
    method, _, _ = get_one(channel, name)
    channel.basic_ack(method.delivery_tag)
    channel.basic_ack(method.delivery_tag)
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        sync(channel)
    assert_closed_by(excinfo.value, 406, f"unknown delivery tag {method.delivery_tag}")


def test_ack_of_a_no_ack_delivery_is_406(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    _fill(channel, name, 1)
    method, _, _ = get_one(channel, name, auto_ack=True)
    channel.basic_ack(method.delivery_tag)
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        sync(channel)
    assert_closed_by(excinfo.value, 406, "unknown delivery tag")


def test_unacked_messages_return_when_the_channel_closes(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    _fill(channel, name, 3)
    get_one(channel, name)
    got = Deliveries()
    channel.basic_consume(name, got)
    pump_until(connection, lambda: len(got) >= 2, "2 deliveries")
    assert message_count(connection, name) == 0
    channel.close()
    assert message_count(connection, name) == 3
    channel = connection.channel()
    again = [get_one(channel, name, auto_ack=True) for _ in range(3)]
    assert sorted(body for _, _, body in again) == [b"0", b"1", b"2"]
    assert all(method.redelivered for method, _, _ in again)


def test_unacked_messages_return_to_another_consumer(connection, name, cleanup):
    first, second = connection.channel(), connection.channel()
    first.queue_declare(cleanup.queue(name))
    first.basic_qos(prefetch_count=1)
    got_first, got_second = Deliveries(), Deliveries()
    first.basic_consume(name, got_first)
    _fill(first, name, 1)
    pump_until(connection, lambda: len(got_first) == 1, "the first consumer's delivery")
    second.basic_consume(name, got_second)
    first.close()
    pump_until(connection, lambda: len(got_second) == 1, "the returned message at the second consumer")
    assert got_second.items[0][2] is True, "a returned message must be marked redelivered"


def test_unacked_messages_return_when_the_connection_closes(server, connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    _fill(channel, name, 2)
    with connect(server) as other:
        other_channel = other.channel()
        get_one(other_channel, name)
        get_one(other_channel, name)
        assert message_count(connection, name) == 0
    pump_until(connection, lambda: message_count(connection, name) == 2,
               "both unacked messages back in the queue after their connection closed")


def test_qos_prefetch_size_is_not_implemented(connection):
    """RabbitMQ: connection error 540 NOT_IMPLEMENTED "prefetch_size!=0 (10)"."""
    channel = connection.channel()
    with pytest.raises(ConnectionClosedByBroker) as excinfo:
        channel.basic_qos(prefetch_size=10, prefetch_count=1)
    assert_closed_by(excinfo.value, 540, "prefetch_size!=0")
