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
def tmpfs(tmp_path: Path, size: int):
    if os.geteuid() != 0:
        pytest.skip(f"mounting a small filesystem needs root; running as uid {os.geteuid()} (CI runs as root)")
    mount = tmp_path / "disk"
    mount.mkdir()
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


async def test_a_disk_alarm_raised_by_queued_messages_clears_once_they_are_consumed(tmp_path):
    """Publishers fill the disk with a quorum queue's messages until the disk alarm blocks them
    (RabbitMQ's rule); a consumer then takes every message. What the queue's log no longer
    needs must leave the disk although nothing is written any more (the publishers are
    blocked): else the alarm never clears and the publishers stay blocked for good."""
    with tmpfs(tmp_path, ALARM_DISK_BYTES) as disk:
        server = make_server(disk, WARREN_DISK_FREE_LIMIT_BYTES=str(ALARM_LIMIT_BYTES),
                             WARREN_WAL_MAX_SIZE_BYTES=str(4 * 1024 * 1024), WARREN_ALARM_CHECK_INTERVAL_SECONDS="0.05")
        server.log_path = disk.parent / "server.log"
        server.start()
        publisher = await aio_pika.connect(server.url)
        consumer = await aio_pika.connect(server.url)
        try:
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
        finally:
            server.stop()   # first: a client's close waits for the node, which reads no blocked connection
            for connection in (publisher, consumer):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(connection.close(), WAIT_SECONDS)
