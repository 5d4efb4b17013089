"""A node whose disk is filled to its last byte still lets its consumers drain, and gets its space back.

A real warren-server on a tmpfs of the test's own (root only, as CI runs). A quorum
queue holds confirmed messages; then something else takes every byte of the disk.
The consumer's gets and acks are log entries too: with no room for them, nothing
moved again, and the space of the consumed messages, which only those entries let
go, never came back (chaos seed 4602: the node's own queue logs filled the disk,
and a WAL batch waited for good for room that only the entries behind it would
free). The node holds back a reserve on its disk for that moment.
"""
from __future__ import annotations

import shutil

import aio_pika

from tests.integration.test_disk_full import (
    WAIT_SECONDS,
    disk_alarm,
    fill,
    node_on_a_small_disk,
    take_in_order,
    tmpfs,
    wait_until,
)
from tests.serverproc import make_server

DISK_BYTES = 64 * 1024 * 1024
LIMIT_BYTES = 16 * 1000 * 1000
BODY = b"r" * 300_000
COUNT = 40


async def test_consumers_drain_a_queue_and_its_space_comes_back_on_a_disk_filled_to_its_last_byte(tmp_path):
    async with node_on_a_small_disk(tmp_path, DISK_BYTES, LIMIT_BYTES,
                                    WARREN_ALARM_CHECK_INTERVAL_SECONDS="0.05") as (server, disk, publisher, consumer):
        channel = await publisher.channel(publisher_confirms=True)
        await channel.declare_queue("kept", durable=True, arguments={"x-queue-type": "quorum"})
        for n in range(COUNT):
            await channel.default_exchange.publish(aio_pika.Message(BODY, delivery_mode=2, message_id=str(n)),
                                                   routing_key="kept", timeout=WAIT_SECONDS)
        filler = fill(disk)
        await wait_until(lambda: disk_alarm(server), "the disk alarm, the disk filled to its last byte")

        queue = await (await consumer.channel()).declare_queue("kept", passive=True)
        await take_in_order(queue, COUNT, lambda: f"on a full disk:\n{server.log()[-3000:]}")
        await wait_until(lambda: shutil.disk_usage(disk).free >= COUNT * len(BODY) // 2,
                         "the consumed messages' space back on the disk (the filler still there)")

        filler.unlink()
        await wait_until(lambda: not disk_alarm(server), "the disk alarm to clear once the filler went")
        await wait_until(lambda: server.log().count("wal.reserve_made") >= 2,
                         "the reserve held back again once there was room")
        await channel.default_exchange.publish(aio_pika.Message(b"after", delivery_mode=2), routing_key="kept",
                                               timeout=WAIT_SECONDS)
        assert (await queue.get(timeout=WAIT_SECONDS)).body == b"after"


async def test_a_node_restarted_on_a_disk_full_to_its_last_byte_starts_on_its_reserve(tmp_path):
    """The reserve an earlier run left is the room a start needs (its new WAL file's header)
    and its consumers' acks after it: without it the node could not start until something
    else freed a page, and no consumer could take the messages whose space would come back."""
    with tmpfs(tmp_path, DISK_BYTES) as disk:
        server = make_server(disk, WARREN_DISK_FREE_LIMIT_BYTES=str(LIMIT_BYTES))
        server.log_path = disk.parent / "server.log"
        server.start()
        try:
            await wait_until(lambda: "wal.reserve_made" in server.log(), "the reserve held back at start")
            connection = await aio_pika.connect(server.url)
            channel = await connection.channel(publisher_confirms=True)
            await channel.declare_queue("kept", durable=True, arguments={"x-queue-type": "quorum"})
            for n in range(COUNT):
                await channel.default_exchange.publish(aio_pika.Message(BODY, delivery_mode=2, message_id=str(n)),
                                                       routing_key="kept", timeout=WAIT_SECONDS)
            await connection.close()
        finally:
            assert server.stop() == 0, server.log()
        filler = fill(disk)

        server.start()
        try:
            assert "wal.reserve_released" in server.log(), server.log()
            connection = await aio_pika.connect(server.url)
            queue = await (await connection.channel()).declare_queue("kept", passive=True)
            await take_in_order(queue, COUNT, lambda: f"after a start on a full disk:\n{server.log()[-3000:]}")
            await wait_until(lambda: shutil.disk_usage(disk).free >= COUNT * len(BODY) // 2,
                             "the consumed messages' space back on the disk (the filler still there)")
            await connection.close()
        finally:
            filler.unlink()
            assert server.stop() == 0, server.log()
