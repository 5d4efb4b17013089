"""Message TTL (x-message-ttl, the expiration property) and queue expiry (x-expires)."""
from __future__ import annotations

import time

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from tests.serverproc import make_server

WAIT_SECONDS = 10.0


@pytest.fixture(scope="module")
def fast_server(tmp_path_factory):
    """A node whose housekeeping (TTL, x-expires) runs every 50 ms."""
    server = make_server(tmp_path_factory.mktemp("ttl"), WARREN_ALARM_CHECK_INTERVAL_SECONDS="0.05").start()
    yield server
    server.stop()


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {WAIT_SECONDS}s waiting for {what}"
        time.sleep(0.02)  # polling a condition with a deadline


def count(channel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


def test_queue_ttl_dead_letters_expired_messages(fast_server, name):
    connection = pika.BlockingConnection(pika.URLParameters(fast_server.url))
    channel = connection.channel()
    channel.exchange_declare(name + "-dlx", "fanout")
    channel.queue_declare(name + "-dead")
    channel.queue_bind(name + "-dead", name + "-dlx")
    channel.queue_declare(name, arguments={"x-message-ttl": 200, "x-dead-letter-exchange": name + "-dlx"})
    for number in range(3):
        channel.basic_publish("", name, b"m%d" % number)
    wait_for(lambda: count(channel, name) == 0, "the messages to expire")
    wait_for(lambda: count(channel, name + "-dead") == 3, "the expired messages to be dead-lettered")
    method, properties, body = channel.basic_get(name + "-dead", auto_ack=True)
    assert body == b"m0" and properties.headers["x-death"][0]["reason"] == "expired", properties.headers
    connection.close()


def test_per_message_expiration_and_ttl_zero(fast_server, name):
    connection = pika.BlockingConnection(pika.URLParameters(fast_server.url))
    channel = connection.channel()
    channel.queue_declare(name)
    channel.basic_publish("", name, b"short", pika.BasicProperties(expiration="100"))
    channel.basic_publish("", name, b"long", pika.BasicProperties(expiration="600000"))
    wait_for(lambda: count(channel, name) == 1, "the short-lived message to expire")
    assert channel.basic_get(name, auto_ack=True)[2] == b"long"
    # TTL 0: delivered only if a consumer can take it at once
    channel.basic_publish("", name, b"nobody", pika.BasicProperties(expiration="0"))
    wait_for(lambda: count(channel, name) == 0, "a TTL-0 message without a consumer to expire")
    got = []
    channel.basic_consume(name, lambda ch, method, props, body: got.append(body), auto_ack=True)
    channel.basic_publish("", name, b"taken", pika.BasicProperties(expiration="0"))
    deadline = time.monotonic() + WAIT_SECONDS
    while not got and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    assert got == [b"taken"], f"a TTL-0 message with a waiting consumer was not delivered: {got}"
    connection.close()


def test_invalid_expiration_is_refused(fast_server, name):
    connection = pika.BlockingConnection(pika.URLParameters(fast_server.url))
    channel = connection.channel()
    channel.queue_declare(name)
    channel.basic_publish("", name, b"x", pika.BasicProperties(expiration="soon"))
    with pytest.raises(ChannelClosedByBroker) as closed:
        channel.queue_declare(name, passive=True)
    assert closed.value.reply_code == 406 and "invalid expiration 'soon'" in closed.value.reply_text
    connection.close()


@pytest.mark.parametrize("durable", [False, True], ids=["transient", "durable-raft-group"])
def test_unused_queue_expires_but_not_while_consumed(fast_server, name, durable):
    """A durable classic queue is a Raft group of one: its leader expires it
    through the metadata group."""
    connection = pika.BlockingConnection(pika.URLParameters(fast_server.url))
    channel = connection.channel()
    channel.queue_declare(name + "-idle", durable=durable, arguments={"x-expires": 300})
    channel.queue_declare(name + "-used", durable=durable, arguments={"x-expires": 300})
    tag = channel.basic_consume(name + "-used", lambda *args: None)

    def gone(queue: str) -> bool:
        probe = connection.channel()
        try:
            probe.queue_declare(queue, passive=True)
        except ChannelClosedByBroker as error:
            assert error.reply_code == 404
            return True
        probe.close()
        return False

    wait_for(lambda: gone(name + "-idle"), "the unused queue to expire")
    assert not gone(name + "-used"), "a queue with a consumer expired"
    channel.basic_cancel(tag)
    wait_for(lambda: gone(name + "-used"), "the queue to expire after its consumer left")
    connection.close()


def test_ttls_still_apply_after_a_restart(tmp_path):
    import signal
    server = make_server(tmp_path, WARREN_ALARM_CHECK_INTERVAL_SECONDS="0.05").start()
    try:
        connection = pika.BlockingConnection(pika.URLParameters(server.url))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("q-ttl", durable=True, arguments={"x-message-ttl": 3_000})
        channel.queue_declare("m-ttl", durable=True)
        channel.basic_publish("", "q-ttl", b"x", pika.BasicProperties(delivery_mode=2))
        channel.basic_publish("", "m-ttl", b"y", pika.BasicProperties(delivery_mode=2, expiration="3000"))
        connection.close()
        server.stop(signal.SIGKILL)
        server.start()
        connection = pika.BlockingConnection(pika.URLParameters(server.url))
        channel = connection.channel()
        assert count(channel, "q-ttl") == 1 and count(channel, "m-ttl") == 1, "lost before their TTL"
        wait_for(lambda: count(channel, "q-ttl") == 0 and count(channel, "m-ttl") == 0,
                 "recovered messages to expire")
        connection.close()
    finally:
        server.stop()
