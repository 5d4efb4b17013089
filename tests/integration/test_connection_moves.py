"""A node over two processes moves a connection to its queue's process at its first
publish or consume (docs/multi-process.md section 11), and the client sees nothing
of it: real shards, real sockets, pika and aio-pika."""
from __future__ import annotations

import asyncio
import time

import aio_pika
import pika
import pytest

from tests.integration.pika_support import publish_confirmed
from tests.integration.quorum_cluster import wait_for
from tests.integration.test_node_processes import (
    LANDING_SECONDS,
    ShardedServer,
    assert_no_shards_left,
    connections_per_shard,
    node_metrics,
    shard_api,
    shard_of,
    sharded_server,
)
from warren.broker.queues.queue_factory import split_shard

pytestmark = pytest.mark.timeout(120)

QUORUM = {"x-queue-type": "quorum"}


@pytest.fixture
def node(tmp_path):
    server = sharded_server(tmp_path, move_connections=True).start()
    yield server
    server.stop()
    assert_no_shards_left(server)


def connection_on(server: ShardedServer, shard: int) -> pika.BlockingConnection:
    """A pika connection the shard `shard` accepted (the others opened on the way are closed)."""
    deadline, tries = time.monotonic() + LANDING_SECONDS, 0
    while time.monotonic() < deadline:
        tries += 1
        connection = pika.BlockingConnection(pika.URLParameters(server.url))
        if shard_of(connection) == shard:
            return connection
        connection.close()
    raise AssertionError(f"no connection of {tries} in {LANDING_SECONDS} s landed on shard {shard}")


def wait_connections(server: ShardedServer, expected: list[int], what: str) -> None:
    wait_for(lambda: connections_per_shard(server) == expected,
             f"{what}: connections per shard {expected} (they are {connections_per_shard(server)})", 10)


def home_queue(server: ShardedServer, name: str, shard: int) -> pika.BlockingConnection:
    """A quorum queue placed on `shard` (declared from a connection there, which stays open)."""
    owner = connection_on(server, shard)
    owner.channel().queue_declare(name, durable=True, arguments=QUORUM)
    members = next(q["member_shards"] for q in shard_api(server.metrics_port, "/api/queues") if q["name"] == name)
    assert members == [f"warren@localhost#{shard}"], f"{name} placed on {members}, not shard {shard}"
    return owner


def test_publisher_and_consumer_move_to_the_queues_shard_and_see_nothing_of_it(node):
    owner = home_queue(node, "moving", 0)
    publisher = connection_on(node, 1)
    consumer = connection_on(node, 1)
    wait_connections(node, [1, 2], "before any publish")
    bodies = [b"m-%d" % i for i in range(200)]
    channel = publisher.channel()
    channel.queue_declare("moving", durable=True, arguments=QUORUM)   # replayed on shard 0 as it was
    publish_confirmed(channel, "moving", bodies)   # each confirmed, the first from shard 1's socket
    wait_connections(node, [2, 1], "the publisher moved to the queue's shard")
    consuming = consumer.channel()
    consuming.basic_qos(prefetch_count=16)
    got = []
    for method, _, body in consuming.consume("moving", inactivity_timeout=10):
        assert method is not None, f"only {len(got)} of {len(bodies)} messages came to the moved consumer"
        got.append(body)
        consuming.basic_ack(method.delivery_tag)
        if len(got) == len(bodies):
            break
    consuming.cancel()
    assert got == bodies, "the moved consumer got the messages out of order or changed"
    wait_connections(node, [3, 0], "the consumer moved too")
    channel.basic_publish("", "moving", b"after", mandatory=True)   # confirmed: the numbering went on
    assert channel.basic_get("moving", auto_ack=True)[2] == b"after"
    log = node.log()
    assert log.count('"connection.moved"') == 2 and log.count('"connection.moved_in"') == 2, log[-3000:]
    metrics = node_metrics(node)   # the node's, summed over its shards
    assert (metrics["warren_connections_moved_out_total"], metrics["warren_connections_moved_in_total"]) == (2, 2)
    for connection in (publisher, consumer, owner):
        connection.close()
    wait_connections(node, [0, 0], "every connection closed")


def test_a_moved_consumer_keeps_its_prefetch_and_its_unacked_messages_come_back(node):
    owner = home_queue(node, "prefetched", 0)
    publish_confirmed(owner.channel(), "prefetched", [b"p-%d" % i for i in range(10)])
    consumer = connection_on(node, 1)
    channel = consumer.channel()
    channel.basic_qos(prefetch_count=3)
    delivered = []
    for method, _, body in channel.consume("prefetched", inactivity_timeout=1):
        if method is None:
            break
        delivered.append(body)
    assert delivered == [b"p-0", b"p-1", b"p-2"], f"basic.qos 3 before the move, and {delivered} came"
    wait_connections(node, [2, 0], "the consumer moved to the queue's shard")
    consumer.close()   # its 3 unacknowledged messages go back, on the queue's shard
    got = [owner.channel().basic_get("prefetched", auto_ack=True)[2] for _ in range(10)]
    assert got == [b"p-%d" % i for i in range(10)], f"after the moved consumer closed: {got}"
    owner.close()


def test_a_connection_that_did_more_than_a_replay_repeats_stays_and_crosses(node):
    owner = home_queue(node, "crossed", 0)
    stays = connection_on(node, 1)
    channel = stays.channel()
    channel.exchange_declare("crossing", "direct", durable=True)   # not replayed: the connection stays
    channel.queue_bind("crossed", "crossing", "k")
    publish_confirmed(channel, "crossed", [b"a", b"b"])
    wait_connections(node, [1, 1], "the connection stayed on its shard")
    assert "connection.moved" not in node.log()
    assert [owner.channel().basic_get("crossed", auto_ack=True)[2] for _ in range(2)] == [b"a", b"b"]
    stays.close()
    owner.close()


def test_a_queue_on_the_connections_own_shard_does_not_move_it(node):
    owner = home_queue(node, "local", 1)
    publish_confirmed(owner.channel(), "local", [b"here"])
    wait_connections(node, [0, 1], "the connection stayed on the queue's shard")
    assert "connection.moved" not in node.log()
    owner.close()


def test_aio_pika_publisher_and_consumer_move_and_confirm(node):
    owner = home_queue(node, "aio-moving", 0)

    async def on_shard_1() -> aio_pika.abc.AbstractRobustConnection:
        deadline, tries = time.monotonic() + LANDING_SECONDS, 0
        while time.monotonic() < deadline:
            tries += 1
            connection = await aio_pika.connect_robust(node.url)
            if split_shard(connection.transport.connection.server_properties["node"])[1] == 1:
                return connection
            await connection.close()
        raise AssertionError(f"no aio-pika connection of {tries} in {LANDING_SECONDS} s landed on shard 1")

    async def scenario() -> list[bytes]:
        publisher, consumer = await on_shard_1(), await on_shard_1()
        channel = await publisher.channel(publisher_confirms=True)
        for i in range(50):
            await channel.default_exchange.publish(
                aio_pika.Message(b"a-%d" % i, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "aio-moving")
        consuming = await consumer.channel()
        await consuming.set_qos(prefetch_count=8)
        queue = await consuming.get_queue("aio-moving", ensure=False)
        got: list[bytes] = []
        async with queue.iterator() as messages:
            async for message in messages:
                async with message.process():
                    got.append(message.body)
                if len(got) == 50:
                    break
        await publisher.close()
        await consumer.close()
        return got

    got = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert got == [b"a-%d" % i for i in range(50)]
    assert node.log().count('"connection.moved_in"') == 2, "both aio-pika connections should have moved"
    owner.close()



def test_new_queues_spread_over_the_shards_whoever_declares_them(node):
    declaring = connection_on(node, 1)
    channel = declaring.channel()
    names = [f"spread-{i}" for i in range(4)] + ["spread-classic"]
    for name in names:
        channel.queue_declare(name, durable=True, arguments=None if name.endswith("classic") else QUORUM)
    members = {q["name"]: q["member_shards"] for q in shard_api(node.metrics_port, "/api/queues")}
    placed = [members[name] for name in names]
    assert placed == [[f"warren@localhost#{k}"] for k in (1, 0, 1, 0, 1)], (
        f"each new queue should go to the shard with the fewest (the declaring shard 1 among equals): {placed}")
    for name in names:   # each a working queue, whichever shard holds it
        publish_confirmed(declaring.channel(), name, [name.encode()])
        assert channel.basic_get(name, auto_ack=True)[2] == name.encode()
    declaring.close()
