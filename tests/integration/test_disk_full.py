"""A node whose disk fills up stays up, and confirms what it could not write once there is room.

A real warren-server on a small filesystem of the test's own (a tmpfs mounted in
the test's temporary folder: root only, as CI runs), its disk alarm off so that
a publish reaches the WAL with the disk full. The WAL write of that publish
finds no space; the node must not stop (it used to: `raft.fatal`, exit 1, for
its supervisor to restart it into the same full disk) and must not confirm the
message until it is written. Once the filler is removed the same publish is
confirmed (an ack, not a nack), the node stops cleanly, and after a restart
both messages are in the queue. `warren_wal_waiting_for_space` says 1 meanwhile.
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import aio_pika
import pytest

from tests.serverproc import make_server

DISK_BYTES = 32 * 1024 * 1024
# larger than the WAL allocates ahead of its writes (storage/files.py), so its write needs new space
BIG_BODY = b"b" * (6 * 1024 * 1024)
WAIT_SECONDS = 20.0


@contextlib.contextmanager
def tmpfs(tmp_path: Path, size: int, name: str = "disk"):
    """A tmpfs of `size` bytes mounted at `tmp_path / name`, for the block."""
    if os.geteuid() != 0:
        pytest.skip(f"mounting a small filesystem needs root; running as uid {os.geteuid()} (CI runs as root)")
    mount = tmp_path / name
    mount.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], check=True,
                   capture_output=True, timeout=30)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30)


@pytest.fixture
def small_disk(tmp_path: Path):
    with tmpfs(tmp_path, DISK_BYTES) as mount:
        yield mount


def fill(mount: Path) -> Path:
    """Fill the filesystem up to its last byte with one file."""
    filler = mount / "filler"
    chunk = b"\0" * (1024 * 1024)
    with open(filler, "wb", buffering=0) as file:
        while True:
            try:
                file.write(chunk)
            except OSError as error:
                assert error.errno == errno.ENOSPC, error
                break
        with contextlib.suppress(OSError):
            while file.write(b"\0" * 4096):
                pass
    return filler


def wait_for_log(server, event: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while event not in server.log():
        assert server.process.poll() is None, (
            f"the node exited with {server.process.returncode} when its disk filled up:\n{server.log()}")
        assert time.monotonic() < deadline, f"no {event} in the node's log after {WAIT_SECONDS} s:\n{server.log()}"
        time.sleep(0.05)   # polling the log for the event, not synchronising with the node


def waiting_for_space(server) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
    found = re.search(r"^warren_wal_waiting_for_space ([0-9.]+)$", text, re.M)
    assert found, f"no warren_wal_waiting_for_space in the metrics:\n{text[:2000]}"
    return float(found.group(1))


async def publish_into_a_full_disk(server, disk: Path, queue_name: str):
    """A quorum queue with one confirmed message, the disk filled up, then a publish the node
    cannot write, once the node logs that it waits for space: (connection, filler, publish)."""
    connection = await aio_pika.connect(server.url)
    channel = await connection.channel(publisher_confirms=True)
    await channel.declare_queue(queue_name, durable=True, arguments={"x-queue-type": "quorum"})
    await channel.default_exchange.publish(aio_pika.Message(b"before", delivery_mode=2), routing_key=queue_name)
    filler = fill(disk)
    publish = asyncio.ensure_future(
        channel.default_exchange.publish(aio_pika.Message(BIG_BODY, delivery_mode=2), routing_key=queue_name))
    await asyncio.get_running_loop().run_in_executor(None, wait_for_log, server, "wal.no_space")
    return connection, filler, publish


async def test_a_node_whose_disk_fills_up_stays_up_and_confirms_once_there_is_room(small_disk):
    server = make_server(small_disk, WARREN_DISK_FREE_LIMIT_BYTES="0")
    server.log_path = small_disk.parent / "server.log"
    server.start()
    try:
        connection, filler, second = await publish_into_a_full_disk(server, small_disk, "filled")
        assert not second.done(), f"a publish the node could not write was answered: {second!r}"
        assert server.process.poll() is None
        assert waiting_for_space(server) == 1.0

        filler.unlink()
        await asyncio.wait_for(second, WAIT_SECONDS)   # raises if it was nacked
        assert "wal.space_found" in server.log()
        assert waiting_for_space(server) == 0.0
        await connection.close()
    finally:
        status = server.stop()
    assert status == 0, f"warren-server exited with {status}:\n{server.log()}"

    server.start()
    try:
        connection = await aio_pika.connect(server.url)
        channel = await connection.channel()
        queue = await channel.declare_queue("filled", passive=True)
        bodies = []
        for _ in range(2):
            message = await queue.get(timeout=WAIT_SECONDS)
            bodies.append(message.body)
            await message.ack()
        assert bodies == [b"before", BIG_BODY]
        await connection.close()
    finally:
        server.stop()


async def test_a_node_stopped_while_its_disk_is_full_stops_cleanly(small_disk):
    """SIGTERM while a batch waits for space: the node gives up on it and exits 0 within the
    stop timeout; what it had confirmed is there after a restart, the unconfirmed publish not."""
    server = make_server(small_disk, WARREN_DISK_FREE_LIMIT_BYTES="0")
    server.log_path = small_disk.parent / "server.log"
    server.start()
    try:
        connection, filler, second = await publish_into_a_full_disk(server, small_disk, "stopped-full")
        status = await asyncio.get_running_loop().run_in_executor(None, server.stop)
        assert status == 0, f"warren-server exited with {status} when stopped with its disk full:\n{server.log()}"
        assert not second.done() or second.exception() is not None, "the unwritten publish was confirmed"
        second.cancel()
        with contextlib.suppress(Exception):
            await connection.close()
    finally:
        server.stop()
    filler.unlink()

    server.start()
    try:
        connection = await aio_pika.connect(server.url)
        channel = await connection.channel()
        queue = await channel.declare_queue("stopped-full", passive=True)
        assert queue.declaration_result.message_count == 1
        message = await queue.get(timeout=WAIT_SECONDS)
        assert message.body == b"before"
        await connection.close()
    finally:
        server.stop()


# The disk alarm's own case: the queue's data itself takes the free space below the limit.
ALARM_DISK_BYTES = 96 * 1024 * 1024
ALARM_LIMIT_BYTES = 40 * 1024 * 1024
ALARM_BODY = b"m" * 20_000


def disk_alarm(server) -> bool:
    request = urllib.request.Request(f"http://127.0.0.1:{server.metrics_port}/api/overview")
    request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")   # guest:guest
    with urllib.request.urlopen(request, timeout=10) as response:
        return "disk" in json.loads(response.read())["alarms"]


async def wait_until(predicate, what: str, seconds: float = WAIT_SECONDS) -> None:
    deadline = time.monotonic() + seconds
    while not await asyncio.get_running_loop().run_in_executor(None, predicate):
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        await asyncio.sleep(0.1)   # polling the node's state, not synchronising with it


async def take_in_order(queue, count: int, where) -> None:
    """Messages "0" to count - 1 (their message ids), each taken by basic.get and acked; `where()`
    says what the node's state was, if one is not answered."""
    for n in range(count):
        try:
            message = await queue.get(timeout=WAIT_SECONDS)
        except TimeoutError:
            raise AssertionError(f"basic.get of message {n} of {count} not answered within {WAIT_SECONDS} s "
                                 f"{where()}") from None
        assert message.message_id == str(n), f"message {message.message_id} where {n} was next"
        await message.ack()


@contextlib.asynccontextmanager
async def node_on_a_small_disk(tmp_path: Path, disk_bytes: int, limit_bytes: int, **env: str):
    """A node on a tmpfs of `disk_bytes`, its disk alarm at `limit_bytes`, and a publisher's
    and a consumer's connection to it: (server, disk, publisher, consumer)."""
    with tmpfs(tmp_path, disk_bytes) as disk:
        server = make_server(disk, WARREN_DISK_FREE_LIMIT_BYTES=str(limit_bytes), **env)
        server.log_path = disk.parent / "server.log"
        server.start()
        connections = []
        try:
            connections += [await aio_pika.connect(server.url), await aio_pika.connect(server.url)]
            yield server, disk, *connections
        finally:
            server.stop()   # first: a client's close waits for the node, which reads no blocked connection
            for connection in connections:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(connection.close(), WAIT_SECONDS)


async def test_a_disk_alarm_raised_by_queued_messages_clears_once_they_are_consumed(tmp_path):
    """Publishers fill the disk with a quorum queue's messages until the disk alarm blocks them
    (RabbitMQ's rule); a consumer then takes every message. What the queue's log no longer
    needs must leave the disk although nothing is written any more (the publishers are
    blocked): else the alarm never clears and the publishers stay blocked for good."""
    async with node_on_a_small_disk(tmp_path, ALARM_DISK_BYTES, ALARM_LIMIT_BYTES,
                                    WARREN_WAL_MAX_SIZE_BYTES=str(4 * 1024 * 1024),
                                    WARREN_ALARM_CHECK_INTERVAL_SECONDS="0.05") as (server, _, publisher, consumer):
        channel = await publisher.channel(publisher_confirms=True)
        await channel.declare_queue("fills", durable=True, arguments={"x-queue-type": "quorum"})

        async def publish_on() -> None:
            while True:
                await channel.default_exchange.publish(aio_pika.Message(ALARM_BODY, delivery_mode=2),
                                                       routing_key="fills")
        publishing = asyncio.ensure_future(publish_on())
        await wait_until(lambda: disk_alarm(server), "the disk alarm, the queue's messages filling the disk",
                         seconds=60)
        assert not publishing.done(), publishing

        queue = await (await consumer.channel()).declare_queue("fills", passive=True)
        while (message := await queue.get(fail=False)) is not None:
            await message.ack()
        await wait_until(lambda: not disk_alarm(server),
                         "the disk alarm to clear once every queued message was consumed")
        publishing.cancel()


# A flood: more than the disk holds, sent at once, with the node's WAL as large as RabbitMQ's
# (512 MiB, larger than this disk) and its free space looked at only every 2 s.
FLOOD_DISK_BYTES = 128 * 1024 * 1024
FLOOD_LIMIT_BYTES = 40 * 1024 * 1024
FLOOD_BODY = b"f" * 100_000
FLOOD_COUNT = 1_500


async def test_a_flood_larger_than_the_disk_is_stopped_before_the_disk_is_full_and_all_of_it_consumed(tmp_path):
    """Publishers send more than the disk can hold, faster than the time between two looks at
    its free space. The node must block them before its disk is full, counting what it writes
    itself: else the disk filled up, the consumer's gets and acks (log entries too) waited
    behind publishes that found no room, and nothing ever moved again. Every message is
    confirmed and consumed in the end, the alarm set and cleared on the way."""
    async with node_on_a_small_disk(tmp_path, FLOOD_DISK_BYTES, FLOOD_LIMIT_BYTES,
                                    WARREN_ALARM_CHECK_INTERVAL_SECONDS="2") as (server, disk, publisher, consumer):
        channel = await publisher.channel(publisher_confirms=True)
        await channel.declare_queue("flood", durable=True, arguments={"x-queue-type": "quorum"})
        confirms = asyncio.gather(*(
            channel.default_exchange.publish(aio_pika.Message(FLOOD_BODY, delivery_mode=2, message_id=str(n)),
                                             routing_key="flood", timeout=120)
            for n in range(FLOOD_COUNT)))
        await wait_until(lambda: disk_alarm(server), "the disk alarm, the flood filling the disk", seconds=60)

        queue = await (await consumer.channel()).declare_queue("flood", passive=True)
        received, last_seen = 0, time.monotonic()
        while received < FLOOD_COUNT:
            message = await queue.get(fail=False, timeout=30)
            if message is None:   # empty while the publisher is blocked: the rest comes once the alarm clears
                assert time.monotonic() - last_seen < 30, (
                    f"{received} of {FLOOD_COUNT} messages consumed, then none for 30 s "
                    f"(the disk's free space: {shutil.disk_usage(disk).free} bytes)")
                await asyncio.sleep(0.05)   # polling the queue, as a consumer of basic.get does
                continue
            last_seen = time.monotonic()
            assert message.message_id == str(received), f"message {message.message_id} where {received} was next"
            await message.ack()
            received += 1
        await asyncio.wait_for(confirms, 60)
        await wait_until(lambda: not disk_alarm(server), "the disk alarm to clear once the flood was consumed")


# The WAL as large as RabbitMQ's (512 MiB), on a disk smaller than that.
ROOM_DISK_BYTES = 128 * 1024 * 1024
ROOM_LIMIT_BYTES = 24 * 1000 * 1000
ROOM_BODY = b"r" * 100_000


async def publish_confirmed(channel, queue: str, count: int) -> None:
    for first in range(0, count, 50):
        await asyncio.wait_for(asyncio.gather(*(
            channel.default_exchange.publish(aio_pika.Message(ROOM_BODY, delivery_mode=2), routing_key=queue)
            for _ in range(first, min(count, first + 50)))), 30)


async def test_consumed_messages_do_not_keep_the_disk_for_a_wal_larger_than_the_disk(tmp_path):
    """60 MB published to a queue and consumed, then 50 MB to another queue, on a 128 MiB
    disk whose node's WAL rolls over at 512 MiB: the consumed 60 MB lie in the WAL until a
    rollover, and a rollover copies what the WAL still holds (the 50 MB) into segments. It
    must come while that still fits, at the latest once the WAL holds half the free space:
    the rollover the disk alarm asked for found no room for the copy, the dead 60 MB stayed,
    and the alarm blocked the publisher for good while the second queue's messages waited
    for their consumer. Here the space comes back and the publisher goes on."""
    async with node_on_a_small_disk(tmp_path, ROOM_DISK_BYTES, ROOM_LIMIT_BYTES,
                                    WARREN_ALARM_CHECK_INTERVAL_SECONDS="0.05") as (server, disk, publisher, consumer):
        channel = await publisher.channel(publisher_confirms=True)
        for name in ("consumed", "kept"):
            await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
        await publish_confirmed(channel, "consumed", 600)
        queue = await (await consumer.channel()).declare_queue("consumed", passive=True)
        for _ in range(600):
            message = await queue.get(timeout=10)
            await message.ack()
        await publish_confirmed(channel, "kept", 500)
        await wait_until(lambda: not disk_alarm(server) and shutil.disk_usage(disk).free > 2 * ROOM_LIMIT_BYTES,
                         "the consumed messages' space back (the disk alarm off, room above the limit)")
        await publish_confirmed(channel, "kept", 100)
