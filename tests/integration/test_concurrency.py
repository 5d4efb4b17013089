"""Many concurrent aio-pika clients: no message lost, none delivered twice.

200 connections, each with a publishing channel (publisher confirms) and one
or two consuming channels (manual ack, prefetch) on a set of shared queues.
Every message carries a unique id; across all consumers each id must be seen
exactly once, and the queues must be empty afterwards.
"""
from __future__ import annotations

import asyncio
import collections
import random
import urllib.request
import zlib

import aio_pika
import aiormq
import pytest
from aio_pika.abc import AbstractIncomingMessage

CONNECTIONS = 200
QUEUES = 8
MESSAGES_PER_CONNECTION = 25
PREFETCH_COUNT = 20
WHOLE_TEST_SECONDS = 60.0
SEED = 20240601

pytestmark = pytest.mark.timeout(WHOLE_TEST_SECONDS + 30)  # per test


class Tally:
    """What the consumers saw, by message id."""

    def __init__(self, expected_total: int, requeue_every: int):
        self.expected_total = expected_total
        # Every requeue_every-th id (0: none) is rejected with requeue on its first delivery.
        self.requeue_every = requeue_every
        self.seen: collections.Counter[str] = collections.Counter()
        self.rejected: set[str] = set()
        self.redelivered: list[str] = []
        self.not_flagged_redelivered: list[str] = []
        self.all_seen = asyncio.Event()

    def should_requeue(self, message_id: str) -> bool:
        return bool(self.requeue_every) and zlib.crc32(message_id.encode()) % self.requeue_every == 0 \
            and message_id not in self.rejected

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        message_id = message.message_id
        if self.should_requeue(message_id):
            self.rejected.add(message_id)
            await message.reject(requeue=True)
            return
        if message.redelivered:
            self.redelivered.append(message_id)
        elif message_id in self.rejected:
            self.not_flagged_redelivered.append(message_id)
        self.seen[message_id] += 1
        await message.ack()
        if sum(self.seen.values()) >= self.expected_total:
            self.all_seen.set()

    def report(self, expected_ids: set[str]) -> str:
        missing = sorted(expected_ids - set(self.seen))
        duplicated = {mid: count for mid, count in self.seen.items() if count > 1}
        unexpected = sorted(set(self.seen) - expected_ids)
        return (f"expected {len(expected_ids)} messages, consumed {sum(self.seen.values())} deliveries of "
                f"{len(self.seen)} distinct ids; missing {len(missing)}: {missing[:20]}; "
                f"duplicated {len(duplicated)}: {dict(list(duplicated.items())[:20])}; "
                f"unexpected {len(unexpected)}: {unexpected[:20]}; rejected+requeued {len(self.rejected)}")


async def open_client(url: str, index: int, queue_names: list[str], tally: Tally, rng: random.Random):
    """One connection: a confirm channel to publish on, 1-2 consumer channels."""
    connection = await aio_pika.connect(url, client_properties={"connection_name": f"client-{index}"})
    publish_channel = await connection.channel(publisher_confirms=True)
    consumer_count = 1 + index % 2
    for _ in range(consumer_count):
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=PREFETCH_COUNT)
        queue = await channel.get_queue(rng.choice(queue_names), ensure=False)
        await queue.consume(tally.on_message)
    return connection, publish_channel


async def publish_all(publish_channel, index: int, queue_names: list[str]) -> list[str]:
    ids = [f"c{index}-m{n}" for n in range(MESSAGES_PER_CONNECTION)]
    confirmations = await asyncio.gather(*(
        publish_channel.default_exchange.publish(
            aio_pika.Message(message_id.encode(), message_id=message_id),
            routing_key=queue_names[(index + n) % len(queue_names)])
        for n, message_id in enumerate(ids)))
    for message_id, confirmation in zip(ids, confirmations):
        assert isinstance(confirmation, aiormq.spec.Basic.Ack), \
            f"publish of {message_id} was not acked by the broker: {confirmation!r}"
    return ids


async def scenario(server, queue_names: list[str], requeue_every: int) -> None:
    rng = random.Random(SEED)
    tally = Tally(CONNECTIONS * MESSAGES_PER_CONNECTION, requeue_every)
    admin = await aio_pika.connect(server.url)
    admin_channel = await admin.channel()
    for queue_name in queue_names:
        await admin_channel.declare_queue(queue_name)
    clients: list = []
    try:
        results = await asyncio.gather(
            *(open_client(server.url, i, queue_names, tally, rng) for i in range(CONNECTIONS)),
            return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        clients = [r for r in results if not isinstance(r, BaseException)]
        assert not errors, f"{len(errors)} of {CONNECTIONS} clients failed to connect: {errors[:5]!r}"

        # Every queue has at least one consumer, or its messages would never be consumed.
        for queue_name in queue_names:
            underlay = await admin_channel.get_underlay_channel()
            declare_ok = await underlay.queue_declare(queue_name, passive=True)
            if declare_ok.consumer_count == 0:
                queue = await admin_channel.get_queue(queue_name, ensure=False)
                await queue.consume(tally.on_message)

        published = await asyncio.gather(
            *(publish_all(channel, i, queue_names) for i, (_, channel) in enumerate(clients)))
        expected_ids = {message_id for ids in published for message_id in ids}
        assert len(expected_ids) == CONNECTIONS * MESSAGES_PER_CONNECTION

        try:
            await asyncio.wait_for(tally.all_seen.wait(), timeout=20)
        except TimeoutError:
            pytest.fail("not every message was consumed within 20 s: " + tally.report(expected_ids))
        # Duplicates would arrive after the count is reached: round-trip every
        # consumer connection so any delivery already sent has been read.
        await asyncio.gather(*(connection.channel() for connection, _ in clients))
        assert all(count == 1 for count in tally.seen.values()) and set(tally.seen) == expected_ids, \
            tally.report(expected_ids)
        unexplained = sorted(set(tally.redelivered) - tally.rejected)
        assert not unexplained, f"messages flagged redelivered though never rejected: {unexplained[:20]}"
        assert not tally.not_flagged_redelivered, \
            f"requeued messages came back with redelivered=False: {tally.not_flagged_redelivered[:20]}"
        if requeue_every:
            assert tally.rejected, "the scenario meant to requeue some messages but none were picked"
    finally:
        await asyncio.gather(*(connection.close() for connection, _ in clients), return_exceptions=True)

    # All acks were written before the closes: nothing may come back.
    underlay = await admin_channel.get_underlay_channel()
    for queue_name in queue_names:
        declare_ok = await underlay.queue_declare(queue_name, passive=True)
        assert declare_ok.message_count == 0, \
            f"queue {queue_name} holds {declare_ok.message_count} messages after all were consumed and acked"
        assert declare_ok.consumer_count == 0, \
            f"queue {queue_name} still has {declare_ok.consumer_count} consumers after every client closed"
        await underlay.queue_delete(queue_name)
    await admin.close()


def scrape_metric(server, metric: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(metric + " "):
                return float(line.split()[1])
    raise AssertionError(f"metric {metric} not found")


@pytest.mark.parametrize("requeue_every", [0, 7], ids=["ack-all", "requeue-one-in-7"])
async def test_many_connections_publish_and_consume_exactly_once(fresh_server, name, requeue_every):
    queue_names = [f"{name}-{i}" for i in range(QUEUES)]
    try:
        await asyncio.wait_for(scenario(fresh_server, queue_names, requeue_every), timeout=WHOLE_TEST_SECONDS)
    except TimeoutError:
        pytest.fail(f"{CONNECTIONS} connections did not finish within {WHOLE_TEST_SECONDS}s; "
                    f"server log tail:\n{fresh_server.log()[-2000:]}")
    assert fresh_server.process.poll() is None, f"the server died:\n{fresh_server.log()}"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while await loop.run_in_executor(None, scrape_metric, fresh_server, "warren_connections") != 0:
        assert loop.time() < deadline, "warren_connections did not drop back to 0 after every client closed"
        await asyncio.sleep(0.05)  # polling a condition with a deadline
