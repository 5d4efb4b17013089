"""A node's transient objects are usable from every node of a cluster, as RabbitMQ's are
(its transient queues live in memory on their node, known to every node): a non-durable
queue, an exclusive one (locked to its connection, published to from anywhere), a
transient exchange and its bindings, and direct reply-to, each used through another node
than the one that made it. Before, each stayed on its node: 404 elsewhere, and a publish
through another node was unroutable (an RPC reply through another node was lost)."""
from __future__ import annotations

import time
import uuid

import pika
import pika.exceptions
import pytest
from pamqp import commands

from tests.integration.pika_raw_client import RawClient
from tests.integration.pika_support import publish_confirmed, wait_queue_gone
from tests.integration.quorum_cluster import connect, start_cluster, stop_all

pytestmark = pytest.mark.timeout(120)
A, B, C = "a@local", "b@local", "c@local"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    servers = start_cluster(tmp_path_factory.mktemp("transient"))
    yield servers
    stop_all(servers)


def counts(connection: pika.BlockingConnection, name: str) -> tuple[int, int]:
    declared = connection.channel().queue_declare(name, passive=True).method
    return declared.message_count, declared.consumer_count


def test_a_transient_queue_of_one_node_is_used_through_the_others(cluster):
    name = unique("transient")
    with connect(cluster[A]) as home, connect(cluster[B]) as other, connect(cluster[C]) as third:
        home.channel().queue_declare(name)   # declare-ok: every running node knows it
        publish_confirmed(other.channel(), name, [b"one", b"two", b"three"])
        assert counts(third, name) == (3, 0) and counts(home, name) == (3, 0)
        method, _, body = third.channel().basic_get(name, auto_ack=True)
        assert (body, method.message_count) == (b"one", 2)
        assert other.channel().queue_purge(name).method.message_count == 2
        third.channel().queue_delete(name)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
            counts(home, name)
        assert gone.value.reply_code == 404


def test_an_exclusive_queue_is_locked_to_its_connection_on_every_node(cluster):
    name = unique("exclusive")
    with connect(cluster[A]) as owner, connect(cluster[B]) as other:
        owner.channel().queue_declare(name, exclusive=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as locked:
            other.channel().basic_consume(name, lambda *delivery: None)
        assert locked.value.reply_code == 405
        publish_confirmed(other.channel(), name, [b"to the owner"])
        assert counts(owner, name) == (1, 0)
    with connect(cluster[C]) as third:   # gone with its owner, on every node
        wait_queue_gone(third, name, timeout=10)


def test_a_transient_exchange_and_its_binding_route_publishes_from_every_node(cluster):
    exchange, queue = unique("fanout"), unique("bound")
    with connect(cluster[A]) as home, connect(cluster[B]) as binder, connect(cluster[C]) as publisher:
        home.channel().exchange_declare(exchange, "fanout", durable=False)
        binder.channel().queue_declare(queue)
        binder.channel().queue_bind(queue, exchange)
        channel = publisher.channel()
        channel.confirm_delivery()
        channel.basic_publish(exchange, "", b"routed", mandatory=True)
        assert counts(home, queue) == (1, 0)
        home.channel().exchange_delete(exchange)
        binder.channel().queue_delete(queue)


def test_direct_reply_to_answers_a_requester_on_another_node(cluster):
    service = unique("rpc")
    with connect(cluster[A]) as server, connect(cluster[B]) as client:
        server_channel = server.channel()
        server_channel.queue_declare(service)

        def answer(channel, method, properties, body):
            channel.basic_publish("", properties.reply_to, b"re:" + body,
                                  pika.BasicProperties(correlation_id=properties.correlation_id))
        server_channel.basic_consume(service, answer, auto_ack=True)
        replies: list[bytes] = []
        client_channel = client.channel()
        client_channel.basic_consume("amq.rabbitmq.reply-to", lambda ch, m, p, body: replies.append(body),
                                     auto_ack=True)
        for call in range(5):
            client_channel.basic_publish("", service, b"%d" % call,
                                         pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
            deadline = time.monotonic() + 10
            while len(replies) <= call and time.monotonic() < deadline:
                server.process_data_events(time_limit=0.02)
                client.process_data_events(time_limit=0.02)
        assert replies == [b"re:%d" % call for call in range(5)], "a reply through another node was lost"
        server_channel.queue_delete(service)


def test_an_auto_delete_queue_goes_when_its_consumers_connection_drops(cluster):
    """No cancel, no channel.close: the consumer's socket just goes, a message unacked; as on
    RabbitMQ the queue goes with it, from every node."""
    name = unique("auto-dropped")
    consumer = RawClient(cluster[A].amqp_port)
    consumer.consume_new_queue(name, auto_delete=True)
    with connect(cluster[B]) as other, connect(cluster[A]) as home:
        other.channel().basic_publish("", name, b"held")
        consumer.expect(commands.Basic.Deliver)
        consumer.close()
        wait_queue_gone(home, name)
        wait_queue_gone(other, name)
