"""Quorum queues on a single node (a cluster of one): a Raft group of one on the node's WAL."""
from __future__ import annotations

import signal
import time

import pika
import pytest

from tests.integration.pika_support import publish_confirmed
from tests.integration.quorum_cluster import queue_view, wait_for
from tests.serverproc import make_server

QUORUM = {"x-queue-type": "quorum"}


def declare(channel, name: str, **arguments) -> None:
    channel.queue_declare(name, durable=True, arguments={**QUORUM, **arguments})


def drain(channel, name: str, count: int) -> list[bytes]:
    got = []
    for _ in range(count):
        method, _, body = channel.basic_get(name, auto_ack=False)
        assert method is not None, f"queue {name} ran dry after {len(got)} of {count} messages"
        channel.basic_ack(method.delivery_tag)
        got.append(body)
    return got


def test_declare_publish_consume_ack(server, name):
    with pika.BlockingConnection(pika.URLParameters(server.url)) as connection:
        channel = connection.channel()
        declare(channel, name)
        publish_confirmed(channel, name, [b"m%d" % i for i in range(50)])
        assert channel.queue_declare(name, passive=True).method.message_count == 50
        received = []
        channel.basic_qos(prefetch_count=10)
        for method, _, body in channel.consume(name, inactivity_timeout=10):
            assert method is not None, f"consumer stalled after {len(received)} messages"
            received.append(body)
            channel.basic_ack(method.delivery_tag)
            if len(received) == 50:
                break
        channel.cancel()
        assert received == [b"m%d" % i for i in range(50)]
        assert channel.queue_declare(name, passive=True).method.message_count == 0


def test_rejected_message_is_redelivered_with_delivery_count(server, name):
    with pika.BlockingConnection(pika.URLParameters(server.url)) as connection:
        channel = connection.channel()
        declare(channel, name)
        publish_confirmed(channel, name, [b"x"])
        method, _, _ = channel.basic_get(name, auto_ack=False)
        channel.basic_reject(method.delivery_tag, requeue=True)
        method, properties, body = channel.basic_get(name, auto_ack=False)
        assert method.redelivered and body == b"x"
        assert properties.headers == {"x-delivery-count": 1}
        channel.basic_ack(method.delivery_tag)


def test_quorum_declare_properties_are_checked(server, name):
    with pika.BlockingConnection(pika.URLParameters(server.url)) as connection:
        channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.queue_declare(name, durable=False, arguments=QUORUM)
        assert closed.value.reply_code == 406
        assert closed.value.reply_text == (
            f"PRECONDITION_FAILED - invalid property 'non-durable' for queue '{name}' in vhost '/'")


def test_purge_and_delete(server, name):
    with pika.BlockingConnection(pika.URLParameters(server.url)) as connection:
        channel = connection.channel()
        declare(channel, name)
        publish_confirmed(channel, name, [b"a", b"b", b"c"])
        assert channel.queue_purge(name).method.message_count == 3
        publish_confirmed(channel, name, [b"d"])
        assert channel.queue_delete(name).method.message_count == 1
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.queue_declare(name, passive=True)
        assert closed.value.reply_code == 404


def test_dead_lettering_from_a_quorum_queue(server, name):
    with pika.BlockingConnection(pika.URLParameters(server.url)) as connection:
        channel = connection.channel()
        channel.exchange_declare(name + "-dlx", "fanout", durable=True)
        channel.queue_declare(name + "-dead", durable=True, arguments=QUORUM)
        channel.queue_bind(name + "-dead", name + "-dlx")
        declare(channel, name, **{"x-dead-letter-exchange": name + "-dlx"})
        publish_confirmed(channel, name, [b"bad"])
        method, _, _ = channel.basic_get(name, auto_ack=False)
        channel.basic_reject(method.delivery_tag, requeue=False)
        method, properties, body = None, None, None
        for _ in range(200):  # the dead letter is enqueued asynchronously by the queue's leader
            method, properties, body = channel.basic_get(name + "-dead", auto_ack=True)
            if method is not None:
                break
            connection.sleep(0.01)
        assert body == b"bad", "the rejected message never reached the dead-letter queue"
        assert properties.headers["x-death"][0]["reason"] == "rejected"
        assert channel.basic_get(name + "-dead", auto_ack=True)[0] is None, "dead-lettered twice"


def test_messages_survive_kill_9(tmp_path):
    server = make_server(tmp_path).start()
    try:
        with pika.BlockingConnection(pika.URLParameters(server.url)) as connection:
            channel = connection.channel()
            declare(channel, "survivor")
            publish_confirmed(channel, "survivor", [b"p%d" % i for i in range(200)])
            drain(channel, "survivor", 50)
            # acks are not confirmed: wait until they are applied (so on disk), else a restart
            # rightly brings an unsettled one back (at-least-once)
            wait_for(lambda: (queue_view(server, "survivor") or {}).get("messages_unacked") == 0,
                     "the 50 acks to be applied")
        server.stop(signal.SIGKILL)
        server.start()
        with pika.BlockingConnection(pika.URLParameters(server.url)) as connection:
            channel = connection.channel()
            assert channel.queue_declare("survivor", durable=True, arguments=QUORUM).method.message_count == 150
            assert drain(channel, "survivor", 150) == [b"p%d" % i for i in range(50, 200)]
    finally:
        server.stop()


def test_an_unused_quorum_queue_expires(server, name):
    with pika.BlockingConnection(pika.URLParameters(server.url)) as connection:
        channel = connection.channel()
        declare(channel, name, **{"x-expires": 300})
        publish_confirmed(channel, name, [b"still unused"])  # publishing does not count as use
        deadline = time.monotonic() + 20
        while True:
            probe = connection.channel()
            try:
                probe.queue_declare(name, passive=True)
            except pika.exceptions.ChannelClosedByBroker as closed:
                assert closed.reply_code == 404
                break
            probe.close()
            assert time.monotonic() < deadline, f"{name} with x-expires 300 ms still exists after 20 s"
            connection.sleep(0.1)  # polling for the deletion with a deadline


def test_unacked_messages_come_back_after_kill_9(tmp_path):
    """The channel holding them died with the node: the restarted node, leading
    the queue alone, returns what its earlier incarnation's channels held."""
    server = make_server(tmp_path).start()
    try:
        connection = pika.BlockingConnection(pika.URLParameters(server.url))
        channel = connection.channel()
        declare(channel, "held")
        publish_confirmed(channel, "held", [b"m%d" % i for i in range(5)])
        held = [channel.basic_get("held", auto_ack=False)[2] for _ in range(2)]
        assert held == [b"m0", b"m1"]
        server.stop(signal.SIGKILL)
        server.start()
        with pika.BlockingConnection(pika.URLParameters(server.url)) as connection:
            channel = connection.channel()
            back = []
            deadline = time.monotonic() + 10
            while len(back) < 5 and time.monotonic() < deadline:
                method, _, body = channel.basic_get("held", auto_ack=True)
                if method is None:
                    connection.process_data_events(time_limit=0.05)   # the return is a Raft command
                    continue
                back.append(body)
            assert sorted(back) == [b"m%d" % i for i in range(5)], \
                f"after the restart only {back} came back: the killed channel's messages stayed checked out"
    finally:
        server.stop()
