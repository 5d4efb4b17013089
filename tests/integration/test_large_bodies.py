"""Large published bodies are not copied into their quorum queue's command: the Raft
entry holds them as they are and the WAL writes them as pieces (queue_codec.encode_publishes,
raft/packing.py `Pieces`). What a client sees must not change: every body, small or large,
single-frame or not, published in one read beside others, comes back byte for byte and in
order after a kill -9 of a single node, and from a surviving node of a cluster whose leader
was killed (replicated as whole bytes)."""
from __future__ import annotations

import asyncio
import hashlib
import signal

import aio_pika
import pika
import pytest

from tests.integration.quorum_cluster import connect, declare_everywhere, leader_of, start_cluster, stop_all, wait_for
from tests.serverproc import make_server

pytestmark = pytest.mark.timeout(120)

# around the piece threshold (16 KiB), msgpack's bin header sizes, and the frame size (128 KiB)
SIZES = (0, 7, 16_383, 16_384, 20_000, 65_535, 65_536, 131_000, 300_000, 1_000_000)
ROUNDS = 3


def body(number: int) -> bytes:
    size = SIZES[number % len(SIZES)]
    seed = hashlib.sha256(number.to_bytes(4, "big")).digest()
    return (seed * (size // len(seed) + 1))[:size]


async def publish_in_bursts(url: str, queue: str) -> int:
    """Each round's messages published at once (one write: one command holding small and large
    bodies), every one confirmed; returns how many."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(queue, durable=True, arguments={"x-queue-type": "quorum"})
        number = 0
        for _ in range(ROUNDS):
            burst = range(number, number + len(SIZES) * 2)
            await asyncio.wait_for(asyncio.gather(*(
                channel.default_exchange.publish(
                    aio_pika.Message(body(n), delivery_mode=aio_pika.DeliveryMode.PERSISTENT, message_id=str(n)),
                    routing_key=queue)
                for n in burst)), 30)
            number = burst.stop
        return number


def consume_all(url: str, queue: str, count: int) -> None:
    with pika.BlockingConnection(pika.URLParameters(url + "?heartbeat=0")) as connection:
        channel = connection.channel()
        for n in range(count):
            method, properties, got = channel.basic_get(queue, auto_ack=True)
            assert method is not None, f"message {n} of {count} missing"
            assert properties.message_id == str(n), f"message {properties.message_id} where {n} was next"
            assert got == body(n), f"message {n} ({len(body(n))} bytes) came back as {len(got)} other bytes"
        assert channel.basic_get(queue, auto_ack=True)[0] is None, "more messages than were published"


def test_large_and_small_bodies_published_together_survive_kill_9(tmp_path):
    server = make_server(tmp_path).start()
    try:
        published = asyncio.run(publish_in_bursts(server.url, "large"))
        assert server.stop(signal.SIGKILL) == -signal.SIGKILL
        server.start()
        consume_all(server.url, "large", published)
    finally:
        server.stop()


def test_large_bodies_reach_a_surviving_node_after_the_leader_is_killed(tmp_path):
    servers = start_cluster(tmp_path)
    try:
        declare_everywhere(servers, "a@local", "large-3")
        leader = leader_of(servers, "large-3")
        published = asyncio.run(publish_in_bursts(servers[leader].url, "large-3"))
        servers[leader].stop(signal.SIGKILL)
        survivor = next(name for name in servers if name != leader)
        wait_for(lambda: _ready(servers[survivor], "large-3") == published,
                 f"{survivor} to hold all {published} messages under a new leader")
        consume_all(servers[survivor].url, "large-3", published)
    finally:
        stop_all(servers)


def _ready(server, queue: str) -> int | None:
    try:
        with connect(server) as connection:
            return connection.channel().queue_declare(queue, passive=True).method.message_count
    except pika.exceptions.AMQPError:
        return None
