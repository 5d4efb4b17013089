"""Publishing over pika: mandatory, immediate, confirms, transactions, direct reply-to,
large bodies and message properties."""
from __future__ import annotations

import datetime
import decimal
import os

import pika
import pytest
from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader
from pika.exceptions import ChannelClosedByBroker, UnroutableError

from tests.integration.pika_raw_client import RawClient
from tests.integration.pika_support import (  # noqa: F401
    assert_closed_by,
    cleanup,
    connect,
    connection,
    drain,
    get_one,
    message_count,
    pump_until,
    sync,
)

REPLY_TO = "amq.rabbitmq.reply-to"
CONTENT_HEADER_FIXED_BYTES = 12  # class id, weight, body size (AMQP 0-9-1 §4.2.6)


def test_mandatory_unroutable_is_returned_under_confirms(connection, name):
    channel = connection.channel()
    channel.confirm_delivery()
    with pytest.raises(UnroutableError) as excinfo:
        channel.basic_publish("amq.direct", name, b"nowhere", mandatory=True)
    returned = excinfo.value.messages
    assert len(returned) == 1
    assert returned[0].method.reply_code == 312
    assert returned[0].method.reply_text == "NO_ROUTE"
    assert returned[0].method.exchange == "amq.direct"
    assert returned[0].method.routing_key == name
    assert returned[0].body == b"nowhere"


def test_mandatory_unroutable_is_returned_without_confirms(connection, name):
    channel = connection.channel()
    returned = []
    channel.add_on_return_callback(lambda ch, method, properties, body: returned.append((method, properties, body)))
    channel.basic_publish("", name, b"nowhere", pika.BasicProperties(message_id="m1"), mandatory=True)
    pump_until(connection, lambda: bool(returned), "basic.return")
    method, properties, body = returned[0]
    assert (method.reply_code, method.reply_text) == (312, "NO_ROUTE")
    assert (method.exchange, method.routing_key, body) == ("", name, b"nowhere")
    assert properties.message_id == "m1"


def test_unroutable_without_mandatory_is_dropped_and_acked(connection, name):
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish("amq.direct", name, b"dropped")  # acked: no exception
    assert channel.is_open


def test_immediate_publish_closes_the_connection_with_540(server, name, cleanup):
    with RawClient(server.amqp_port) as client:
        client.handshake()
        client.open_channel(1)
        client.send(1, commands.Queue.Declare(queue=cleanup.queue(name)))
        client.expect(commands.Queue.DeclareOk)
        client.publish(1, commands.Basic.Publish(exchange="", routing_key=name, immediate=True), b"now")
        close = client.expect(commands.Connection.Close)
        assert close.reply_code == 540, f"expected 540, got {close.reply_code} {close.reply_text!r}"
        assert "immediate=true" in close.reply_text, close.reply_text
        assert (close.class_id, close.method_id) == (60, 40), "the close must blame basic.publish"
        client.send(0, commands.Connection.CloseOk())


def test_confirms_ack_every_publish(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    channel.confirm_delivery()
    for i in range(200):
        channel.basic_publish("", name, b"%d" % i)  # raises NackError if nacked
    assert message_count(connection, name) == 200


def test_confirms_are_numbered_and_cover_every_publish(server, name, cleanup):
    """Raw: 50 pipelined publishes are acked, with multiple acks covering tags 1..50."""
    with RawClient(server.amqp_port) as client:
        client.handshake()
        client.open_channel(1)
        client.send(1, commands.Queue.Declare(queue=cleanup.queue(name)))
        client.expect(commands.Queue.DeclareOk)
        client.send(1, commands.Confirm.Select())
        client.expect(commands.Confirm.SelectOk)
        for i in range(50):
            client.publish(1, commands.Basic.Publish(exchange="", routing_key=name), b"%d" % i)
        acked: set[int] = set()
        while len(acked) < 50:
            ack = client.expect(commands.Basic.Ack)
            assert ack.delivery_tag not in acked, f"tag {ack.delivery_tag} acked twice"
            low = max(acked, default=0) + 1
            acked.update(range(low, ack.delivery_tag + 1) if ack.multiple else [ack.delivery_tag])
        assert acked == set(range(1, 51))
        client.close_connection()


def test_tx_rollback_discards_publishes_and_commit_delivers(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    channel.tx_select()
    channel.basic_publish("", name, b"rolled back")
    channel.tx_rollback()
    assert message_count(connection, name) == 0
    channel.basic_publish("", name, b"a")
    channel.basic_publish("", name, b"b")
    assert message_count(connection, name) == 0, "uncommitted publishes must not be visible"
    channel.tx_commit()
    assert message_count(connection, name) == 2
    assert drain(connection.channel(), name) == [b"a", b"b"]


def test_tx_acks_settle_only_on_commit(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    channel.basic_publish("", name, b"x")
    sync(channel)
    channel.tx_select()
    method, _, _ = get_one(channel, name)
    channel.basic_ack(method.delivery_tag)
    channel.tx_rollback()
    channel.close()  # the rolled-back ack did not settle: the message returns
    assert message_count(connection, name) == 1
    channel = connection.channel()
    channel.tx_select()
    method, _, _ = get_one(channel, name)
    channel.basic_ack(method.delivery_tag)
    channel.tx_commit()
    channel.close()
    assert message_count(connection, name) == 0


def test_tx_commit_without_select_is_406(connection):
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.tx_commit()
    assert_closed_by(excinfo.value, 406, "channel is not transactional")


def test_confirm_select_after_tx_select_is_406(connection):
    channel = connection.channel()
    channel.tx_select()
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.confirm_delivery()
    assert_closed_by(excinfo.value, 406, "cannot switch from tx to confirm mode")


def test_direct_reply_to_round_trip(server, name, cleanup):
    with connect(server) as client, connect(server) as responder:
        requests = responder.channel()
        requests.queue_declare(cleanup.queue(name))
        channel = client.channel()
        replies = []
        channel.basic_consume(REPLY_TO, lambda ch, method, properties, body: replies.append((properties, body)),
                              auto_ack=True)
        channel.basic_publish("", name, b"ping", pika.BasicProperties(reply_to=REPLY_TO, correlation_id="c-1"))
        method, properties, body = get_one(requests, name, auto_ack=True)
        assert body == b"ping"
        assert properties.reply_to.startswith(REPLY_TO + "."), f"reply_to not rewritten: {properties.reply_to!r}"
        requests.basic_publish("", properties.reply_to, b"pong",
                               pika.BasicProperties(correlation_id=properties.correlation_id))
        pump_until(client, lambda: bool(replies), "the direct reply-to response")
        reply_properties, reply_body = replies[0]
        assert reply_body == b"pong"
        assert reply_properties.correlation_id == "c-1"


def test_direct_reply_to_publish_without_consumer_is_406(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    channel.basic_publish("", name, b"ping", pika.BasicProperties(reply_to=REPLY_TO))
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        sync(channel)
    assert_closed_by(excinfo.value, 406, "fast reply consumer does not exist")


def test_direct_reply_to_with_manual_ack_is_406(connection):
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.basic_consume(REPLY_TO, lambda *a: None, auto_ack=False)
    assert_closed_by(excinfo.value, 406, "reply consumer cannot acknowledge")


def test_large_message_round_trips(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    body = os.urandom(1024 * 1024)
    channel.basic_publish("", name, body)
    _, _, got = get_one(channel, name, auto_ack=True)
    assert len(got) == len(body)
    assert got == body


def test_large_message_round_trips_to_a_consumer(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    body = os.urandom(3 * 1024 * 1024 + 17)
    received = []
    channel.basic_consume(name, lambda ch, method, properties, got: received.append(got), auto_ack=True)
    channel.basic_publish("", name, body)
    pump_until(connection, lambda: bool(received), "the 3 MiB delivery", timeout=15)
    assert received[0] == body


def test_empty_body_round_trips(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    channel.basic_publish("", name, b"", pika.BasicProperties(message_id="empty"))
    _, properties, body = get_one(channel, name, auto_ack=True)
    assert body == b""
    assert properties.message_id == "empty"


def test_message_properties_round_trip(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    sent = pika.BasicProperties(
        content_type="application/json",
        content_encoding="utf-8",
        headers={"str": "text", "int": 42, "big": 2**40, "neg": -7, "bool": True,
                 "decimal": decimal.Decimal("3.14"), "nested": {"a": [1, "two", False]},
                 "list": [1, 2, 3], "none": None,
                 "when": datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.UTC)},
        delivery_mode=2,
        priority=5,
        correlation_id="corr-1",
        reply_to="some-queue",
        expiration="600000",
        message_id="msg-1",
        timestamp=1_700_000_000,
        type="kind",
        user_id="guest",
        app_id="warren-tests",
    )
    channel.basic_publish("", name, b"{}", sent)
    _, got, body = get_one(channel, name, auto_ack=True)
    assert body == b"{}"
    for field in ("content_type", "content_encoding", "headers", "delivery_mode", "priority", "correlation_id",
                  "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id"):
        assert getattr(got, field) == getattr(sent, field), (
            f"{field}: sent {getattr(sent, field)!r}, got {getattr(got, field)!r}")


def test_wrong_user_id_is_406(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    channel.basic_publish("", name, b"x", pika.BasicProperties(user_id="mallory"))
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        sync(channel)
    assert_closed_by(excinfo.value, 406, "user_id property set to 'mallory' but authenticated user was 'guest'")


def test_content_header_properties_round_trip_byte_exactly(server, name, cleanup):
    properties = commands.Basic.Properties(
        content_type="text/plain", headers={"x": "y", "n": 7, "t": {"deep": [1, 2]}}, delivery_mode=1,
        priority=9, correlation_id="c", message_id="m", timestamp=datetime.datetime(2023, 1, 2, 3, 4, 5),
        expiration="1000000", message_type="t", app_id="a", cluster_id="")
    with RawClient(server.amqp_port) as client:
        client.handshake()
        client.open_channel(1)
        client.send(1, commands.Queue.Declare(queue=cleanup.queue(name)))
        client.expect(commands.Queue.DeclareOk)
        sent_header = client.publish(1, commands.Basic.Publish(exchange="", routing_key=name), b"body", properties)
        client.send(1, commands.Basic.Get(queue=name, no_ack=True))
        client.expect(commands.Basic.GetOk)
        client.expect(ContentHeader)
        received_header = client.frames[-1][3]
        assert received_header[7 + CONTENT_HEADER_FIXED_BYTES:] == sent_header[7 + CONTENT_HEADER_FIXED_BYTES:], (
            "the property bytes changed between publish and delivery")
        assert client.expect(ContentBody).value == b"body"
        client.close_connection()
