"""A declaration answered on one node is usable at once on every other node
(issue 9, item 2), as RabbitMQ answers a declaration only once every running
node can use it: a client that declares on one node and publishes through
another must never lose a message to that, and a node that has just
restarted opens its AMQP port only once it knows what was declared while it
was away."""
from __future__ import annotations

import uuid

import pika
import pika.exceptions
import pytest

from tests.integration.quorum_cluster import NAMES, connect, start_cluster, stop_all

ROUNDS = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    servers = start_cluster(tmp_path_factory.mktemp("metadata"))
    yield servers
    stop_all(servers)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def channels(servers):
    connections = {name: connect(servers[name]) for name in NAMES}
    opened = {name: connection.channel() for name, connection in connections.items()}
    for channel in opened.values():
        channel.confirm_delivery()
    return connections, opened


def close_all(connections) -> None:
    for connection in connections.values():
        if connection.is_open:
            connection.close()


def reopen(connections, channel, node: str) -> None:
    """A confirming channel on `node` again, after the broker closed the last one."""
    channel[node] = connections[node].channel()
    channel[node].confirm_delivery()


def get_body(connections, channel, node: str, queue: str):
    """basic.get's body, or what went wrong (the channel is opened again after a close)."""
    try:
        return channel[node].basic_get(queue, auto_ack=True)[2]
    except pika.exceptions.ChannelClosedByBroker as error:
        reopen(connections, channel, node)
        return f"{error.reply_code} {error.reply_text}"


def passive_declare_fails(channel, name: str) -> str | None:
    try:
        channel.queue_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as error:
        return f"{error.reply_code} {error.reply_text}"
    return None


def test_a_queue_declared_on_one_node_is_usable_at_once_on_the_others(cluster):
    connections, channel = channels(cluster)
    a, b, c = NAMES
    problems: list[str] = []
    try:
        for round_ in range(ROUNDS):
            for queue_type in ("quorum", "classic"):
                name = unique(f"declared-{queue_type}")
                channel[a].queue_declare(name, durable=True, arguments={"x-queue-type": queue_type})
                refused = passive_declare_fails(channel[b], name)
                if refused:
                    problems.append(f"round {round_}: passive declare of {name} on {b}: {refused}")
                    reopen(connections, channel, b)
                try:
                    channel[b].basic_publish("", name, b"m", pika.BasicProperties(delivery_mode=2), mandatory=True)
                except pika.exceptions.UnroutableError:
                    problems.append(f"round {round_}: a publish to {name} through {b} was unroutable")
                found = get_body(connections, channel, c, name)
                if found != b"m":
                    problems.append(f"round {round_}: basic.get of {name} on {c} found {found!r}")
                channel[a].queue_delete(name)
    finally:
        close_all(connections)
    assert not problems, f"{len(problems)} failures in {ROUNDS * 2} declarations:\n" + "\n".join(problems[:20])


def test_an_exchange_and_binding_made_on_one_node_route_at_once_on_the_others(cluster):
    connections, channel = channels(cluster)
    a, b, c = NAMES
    problems: list[str] = []
    try:
        for round_ in range(ROUNDS):
            exchange, queue = unique("x"), unique("bound")
            channel[a].exchange_declare(exchange, "direct", durable=True)
            channel[a].queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
            channel[a].queue_bind(queue, exchange, routing_key="key")
            try:
                channel[b].basic_publish(exchange, "key", b"m", pika.BasicProperties(delivery_mode=2),
                                         mandatory=True)
            except pika.exceptions.UnroutableError:
                problems.append(f"round {round_}: {exchange} -> {queue} unroutable through {b}")
            except pika.exceptions.ChannelClosedByBroker as error:
                problems.append(f"round {round_}: publish to {exchange} through {b}: {error}")
                reopen(connections, channel, b)
            found = get_body(connections, channel, c, queue)
            if found != b"m":
                problems.append(f"round {round_}: basic.get of {queue} on {c} found {found!r}")
            channel[a].queue_delete(queue)
            channel[a].exchange_delete(exchange)
    finally:
        close_all(connections)
    assert not problems, f"{len(problems)} failures in {ROUNDS} rounds:\n" + "\n".join(problems[:20])


def test_a_restarted_node_knows_what_was_declared_while_it_was_away(cluster):
    a, _, c = NAMES
    names = [unique("while-away") for _ in range(5)]
    cluster[c].stop()
    with connect(cluster[a]) as connection:
        declaring = connection.channel()
        for name in names:
            declaring.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    cluster[c].start()   # returns once the AMQP port accepts connections
    with connect(cluster[c]) as connection:
        unknown = [name for name in names if passive_declare_fails(connection.channel(), name)]
    assert not unknown, f"{c} accepted clients before it knew {unknown}:\n{cluster[c].log()}"
