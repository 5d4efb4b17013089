"""Behaviours RabbitMQ clients' own test suites check (issue 9): declares,
dead-lettering, update-secret, channel and frame limits, each with
RabbitMQ's reply code and text."""
from __future__ import annotations

import pika
import pytest
from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader
from pika.exceptions import ChannelClosedByBroker

from tests.integration.pika_raw_client import RawClient
from tests.integration.pika_support import (  # noqa: F401
    assert_closed_by,
    cleanup,
    connect,
    connection,
    get_one,
)

FRAME_OVERHEAD_BYTES = 8


# -- item 8: x-death keeps the expiration as original-expiration ------------
@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_dead_lettered_message_keeps_its_expiration_as_original_expiration(connection, name, cleanup, queue_type):
    """rabbit_dead_letter: x-death gets original-expiration, the property goes."""
    channel = connection.channel()
    dlx, dead = cleanup.exchange(name + "-dlx"), cleanup.queue(name + "-dead")
    channel.exchange_declare(dlx, "fanout")
    channel.queue_declare(dead)
    channel.queue_bind(dead, dlx)
    channel.queue_declare(cleanup.queue(name), durable=True,
                          arguments={"x-dead-letter-exchange": dlx, "x-queue-type": queue_type})
    channel.basic_publish("", name, b"doomed", pika.BasicProperties(expiration="600000"))
    method, _, _ = get_one(channel, name)
    channel.basic_reject(method.delivery_tag, requeue=False)
    _, properties, body = get_one(channel, dead, auto_ack=True)
    assert body == b"doomed"
    death = properties.headers["x-death"][0]
    assert death.get("original-expiration") == "600000", death
    assert properties.expiration is None, properties


def test_message_without_expiration_gets_no_original_expiration(connection, name, cleanup):
    channel = connection.channel()
    dlx, dead = cleanup.exchange(name + "-dlx"), cleanup.queue(name + "-dead")
    channel.exchange_declare(dlx, "fanout")
    channel.queue_declare(dead)
    channel.queue_bind(dead, dlx)
    channel.queue_declare(cleanup.queue(name), arguments={"x-dead-letter-exchange": dlx})
    channel.basic_publish("", name, b"doomed")
    method, _, _ = get_one(channel, name)
    channel.basic_reject(method.delivery_tag, requeue=False)
    _, properties, _ = get_one(channel, dead, auto_ack=True)
    assert "original-expiration" not in properties.headers["x-death"][0]


# -- item 9: update-secret with the internal user store ---------------------
def test_update_secret_is_accepted_whatever_the_secret(server, name, cleanup):
    """rabbit_auth_backend_internal's state cannot expire: update_state keeps it, update-secret-ok."""
    with connect(server) as connection:
        connection.update_secret("not the password", "token rotation")
        channel = connection.channel()
        channel.queue_declare(cleanup.queue(name))
        assert channel.is_open


# -- item 10: exclusive mismatch from the owning connection is 405 -----------
@pytest.mark.parametrize("first_exclusive", [True, False])
def test_redeclare_with_other_exclusive_is_resource_locked(connection, name, cleanup, first_exclusive):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name), exclusive=first_exclusive)
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.queue_declare(name, exclusive=not first_exclusive)
    assert_closed_by(excinfo.value, 405, f"cannot obtain exclusive access to locked queue '{name}' in vhost '/'")


# -- item 15: auto_delete is checked for equivalence, before exclusivity ------
def test_redeclare_with_other_auto_delete_is_precondition_failed(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.queue_declare(name, auto_delete=True, exclusive=True)
    assert_closed_by(excinfo.value, 406, f"inequivalent arg 'auto_delete' for queue '{name}' in vhost '/': "
                                         "received 'true' but current is 'false'")


# -- item 11: the default exchange cannot be declared, even passively --------
def test_passive_declare_of_the_default_exchange_is_access_refused(connection):
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.exchange_declare("", passive=True)
    assert_closed_by(excinfo.value, 403, "ACCESS_REFUSED - operation not permitted on the default exchange")


# -- item 13: the direct reply-to pseudo-queue can be declared ----------------
@pytest.mark.parametrize("passive", [True, False])
def test_declare_of_the_direct_reply_to_queue_is_ok(connection, passive):
    """rabbit_channel: every declare of it is passive and it 'by definition has one consumer'."""
    channel = connection.channel()
    declared = channel.queue_declare("amq.rabbitmq.reply-to", passive=passive)
    assert declared.method.queue == "amq.rabbitmq.reply-to"
    assert (declared.method.message_count, declared.method.consumer_count) == (0, 1)
    assert channel.is_open


def test_declare_of_a_reply_address_is_ok_while_its_channel_waits(connection, name, cleanup):
    requester, responder = connection.channel(), connection.channel()
    requester.basic_consume("amq.rabbitmq.reply-to", lambda *args: None, auto_ack=True)
    requester.queue_declare(cleanup.queue(name))
    requester.basic_publish("", name, b"ask", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
    _, properties, _ = get_one(responder, name, auto_ack=True)
    declared = responder.queue_declare(properties.reply_to, passive=True)
    assert (declared.method.message_count, declared.method.consumer_count) == (0, 1)
    requester.close()
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        responder.queue_declare(properties.reply_to, passive=True)
    assert_closed_by(excinfo.value, 404, f"no queue '{properties.reply_to}' in vhost '/'")


# -- item 12: channel_max limits open channels, not channel numbers -----------
def test_channel_number_above_channel_max_opens_while_under_the_count(server):
    with RawClient(server.amqp_port) as client:
        client.handshake(channel_max=2)
        client.open_channel(65535)
        client.open_channel(3)
        client.send(5, commands.Channel.Open())
        close = client.expect(commands.Connection.Close)
        assert (close.reply_code, close.reply_text) == (
            530, "NOT_ALLOWED - number of channels opened (2) has reached the negotiated channel_max (2)")
        client.send(0, commands.Connection.CloseOk())


# -- item 14: RabbitMQ's FRAME_SIZE_FUDGE ---------------------------------------
def _publish_one_body_frame(client: RawClient, payload_size: int) -> None:
    client.send(1, commands.Basic.Publish(exchange="", routing_key="nowhere"),
                ContentHeader(0, payload_size, commands.Basic.Properties()), ContentBody(b"x" * payload_size))


def test_body_frame_up_to_eight_bytes_over_frame_max_is_accepted(server):
    with RawClient(server.amqp_port) as client:
        tune = client.handshake()
        client.open_channel(1)
        client.send(1, commands.Confirm.Select())
        client.expect(commands.Confirm.SelectOk)
        _publish_one_body_frame(client, tune.frame_max)  # the frame: frame_max + 8 bytes
        client.expect(commands.Basic.Ack)
        client.close_connection()


def test_body_frame_nine_bytes_over_frame_max_is_a_frame_error(server):
    with RawClient(server.amqp_port) as client:
        tune = client.handshake()
        client.open_channel(1)
        _publish_one_body_frame(client, tune.frame_max + 1)
        close = client.expect(commands.Connection.Close)
        limit = tune.frame_max - FRAME_OVERHEAD_BYTES
        assert (close.reply_code, close.reply_text) == (
            501, f"FRAME_ERROR - type 3, all octets = <<>>: {{frame_too_large,{tune.frame_max + 1},{limit}}}")
        client.send(0, commands.Connection.CloseOk())
