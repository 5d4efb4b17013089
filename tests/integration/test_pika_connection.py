"""Connection-level behaviour seen by pika (and a raw socket where pika cannot go)."""
from __future__ import annotations

import os

import pika
import pytest
from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader
from pamqp.heartbeat import Heartbeat
from pika.exceptions import (
    AuthenticationError,
    ConnectionClosedByBroker,
    ProbableAccessDeniedError,
    ProbableAuthenticationError,
)

from tests.integration.pika_raw_client import RawClient
from tests.integration.pika_support import assert_closed_by, cleanup, connect, parameters  # noqa: F401
from tests.serverproc import make_server

CAPABILITIES = (
    "publisher_confirms", "exchange_exchange_bindings", "basic.nack", "consumer_cancel_notify",
    "connection.blocked", "consumer_priorities", "authentication_failure_close", "per_consumer_qos",
    "direct_reply_to",
)
# A server proposing 1 s heartbeats sends one at least every 1 s once negotiated.
HEARTBEAT_SERVER_SECONDS = "1"
HEARTBEAT_OBSERVE_SECONDS = 3.5


def test_connect_open_channel_and_close(server):
    connection = pika.BlockingConnection(parameters(server))
    try:
        assert connection.is_open
        channel = connection.channel()
        assert channel.is_open
        channel.close()
        assert channel.is_closed
    finally:
        connection.close()
    assert connection.is_closed


def test_wrong_password_is_access_refused(server):
    with pytest.raises((ProbableAuthenticationError, AuthenticationError, ConnectionClosedByBroker)) as excinfo:
        pika.BlockingConnection(parameters(server, credentials=pika.PlainCredentials("guest", "not-the-password")))
    text = repr(excinfo.value)
    assert "403" in text, f"expected 403 ACCESS_REFUSED, got {text}"
    assert "ACCESS_REFUSED" in text, f"expected 403 ACCESS_REFUSED, got {text}"


def test_unknown_user_is_access_refused(server):
    with pytest.raises((ProbableAuthenticationError, AuthenticationError, ConnectionClosedByBroker)) as excinfo:
        pika.BlockingConnection(parameters(server, credentials=pika.PlainCredentials("nobody", "guest")))
    assert "403" in repr(excinfo.value), f"expected 403 ACCESS_REFUSED, got {excinfo.value!r}"


def test_unknown_vhost_is_not_allowed(server):
    with pytest.raises((ProbableAccessDeniedError, ConnectionClosedByBroker)) as excinfo:
        pika.BlockingConnection(parameters(server, virtual_host="no-such-vhost"))
    text = repr(excinfo.value)
    assert "530" in text, f"expected 530 NOT_ALLOWED, got {text}"
    assert "no-such-vhost" in text, f"expected the vhost named in the reply, got {text}"


def test_server_properties_announce_capabilities(server):
    with connect(server) as connection:
        capabilities = connection._impl.server_capabilities
        missing = [c for c in CAPABILITIES if capabilities.get(c) is not True]
        assert not missing, f"capabilities not announced as true: {missing}; got {capabilities}"
        properties = connection._impl.server_properties
        assert properties.get("product"), f"no product in server properties {properties}"
        assert properties.get("version"), f"no version in server properties {properties}"


def test_pika_heartbeat_zero_is_negotiated(server):
    with connect(server, heartbeat=0) as connection:
        assert connection._impl.params.heartbeat == 0


@pytest.fixture
def heartbeat_server(tmp_path):
    process = make_server(tmp_path, WARREN_HEARTBEAT=HEARTBEAT_SERVER_SECONDS).start()
    yield process
    process.stop()


def test_heartbeat_zero_means_no_heartbeat_frames(heartbeat_server):
    with RawClient(heartbeat_server.amqp_port) as client:
        tune = client.handshake(heartbeat=0)
        assert tune.heartbeat == int(HEARTBEAT_SERVER_SECONDS)
        got = client.read_frame(timeout=HEARTBEAT_OBSERVE_SECONDS)
        assert got is None, f"heartbeat=0 was negotiated but the server sent {got!r}"
        client.close_connection()


def test_negotiated_heartbeat_sends_heartbeat_frames(heartbeat_server):
    """The control for the test above: with heartbeat=1 frames do come."""
    with RawClient(heartbeat_server.amqp_port) as client:
        client.handshake(heartbeat=1)
        got = client.read_frame(timeout=HEARTBEAT_OBSERVE_SECONDS)
        assert got is not None, f"no heartbeat within {HEARTBEAT_OBSERVE_SECONDS}s at heartbeat=1"
        assert isinstance(got[1], Heartbeat), f"expected a heartbeat frame, got {got!r}"
        client.close_connection()


def test_channel_max_is_negotiated_and_enforced(server):
    """RabbitMQ: 530 NOT_ALLOWED "number of channels opened (2) has reached the negotiated channel_max (2)"."""
    connection = pika.BlockingConnection(parameters(server, channel_max=2))
    try:
        assert connection._impl.params.channel_max == 2
        connection.channel()
        connection.channel()
        with pytest.raises(ConnectionClosedByBroker) as excinfo:
            connection.channel(channel_number=3)
        assert_closed_by(excinfo.value, 530, "channel_max")
    finally:
        if connection.is_open:
            connection.close()


def test_channel_numbers_are_reusable_after_close(server):
    with connect(server, channel_max=1) as connection:
        for _ in range(3):
            channel = connection.channel(channel_number=1)
            channel.close()


def test_frame_max_negotiation_with_pika(server, name, cleanup):
    body = os.urandom(20_000)
    with connect(server, frame_max=4096) as connection:
        assert connection._impl.params.frame_max == 4096
        channel = connection.channel()
        channel.queue_declare(cleanup.queue(name))
        channel.basic_publish("", name, body)
        method, _, got = channel.basic_get(name, auto_ack=True)
        assert method is not None, "the published message did not arrive"
        assert got == body


def test_deliveries_respect_a_small_frame_max(server, name, cleanup):
    body = os.urandom(10_000)
    with RawClient(server.amqp_port) as client:
        client.handshake(frame_max=4096)
        client.open_channel(1)
        client.send(1, commands.Queue.Declare(queue=cleanup.queue(name)))
        client.expect(commands.Queue.DeclareOk)
        client.publish(1, commands.Basic.Publish(exchange="", routing_key=name), body)
        client.send(1, commands.Basic.Get(queue=name, no_ack=True))
        client.expect(commands.Basic.GetOk)
        client.expect(ContentHeader)
        received = b""
        while len(received) < len(body):
            received += client.expect(ContentBody).value
        assert received == body
        too_big = [size for _, _, size, _ in client.frames if size > 4096]
        assert not too_big, f"server sent frames over the negotiated frame_max 4096: {too_big}"
        client.close_connection()


@pytest.mark.parametrize("frame_max", [1000, 10 * 1024 * 1024])
def test_frame_max_out_of_bounds_is_refused(server, frame_max):
    """RabbitMQ closes with 530 NOT_ALLOWED when tune-ok's frame_max is below 4096 or above its own."""
    with RawClient(server.amqp_port) as client:
        client.handshake(frame_max=frame_max, expect_open_ok=False)
        close = client.expect(commands.Connection.Close)
        assert close.reply_code == 530, f"expected 530, got {close.reply_code} {close.reply_text!r}"
        assert "frame_max" in close.reply_text, close.reply_text
        client.send(0, commands.Connection.CloseOk())


def test_update_secret_with_the_right_password(server, name, cleanup):
    with connect(server) as connection:
        connection.update_secret("guest", "token rotation")
        channel = connection.channel()
        channel.queue_declare(cleanup.queue(name))
        assert channel.is_open
