"""A WAL batch that waits for room longer than `wal_no_space_give_up_seconds` gives way.

A node of two processes on a small filesystem of the test's own (a tmpfs: root only, as CI
runs), its disk alarm off so that a publish reaches the WAL with the disk full. Another
program's file takes all of the disk but 1 MB and stays. A 6 MB publish finds no room and
waits; a consumer's ack waits behind it, though it would fit: room that only the writes
behind a waiting batch would make never comes (chaos seed 4602: two nodes of three waited
so with 11-17 MB batches, on disks their own queue's log had filled, and nothing of the
cluster moved again). Past the give-up the batch fails, the queue's process restarts from
its WAL (its supervisor starts it again), the unwritten publish is not confirmed, and a
consumer takes and acks every message in the 1 MB left, for good (a restart finds the
queue empty). A node that cannot start for want of room (a new WAL file's header) exits
with 75 (EX_TEMPFAIL), which its supervisor takes for "start it again" however often, and
starts once there is room.
"""
from __future__ import annotations

import asyncio
import os

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractConnection

from tests.integration.quorum_cluster import queue_view, wait_for
from tests.integration.test_disk_full import BIG_BODY, WAIT_SECONDS, fill, tmpfs, wait_for_log
from tests.serverproc import make_server
from warren.broker.node.supervisor import NO_SPACE_EXIT_STATUS, RESTARTS_MAX

pytestmark = pytest.mark.timeout(180)

DISK_BYTES = 32 * 1024 * 1024
LEFT_FREE_BYTES = 1024 * 1024
GIVE_UP_SECONDS = 2
QUEUE = "gives-way"
BODIES = [f"m{number}".encode() for number in range(20)]


async def test_a_batch_that_waits_too_long_for_room_gives_way_to_the_consumers(tmp_path):
    with tmpfs(tmp_path, DISK_BYTES) as disk:
        server = make_server(disk, WARREN_DISK_FREE_LIMIT_BYTES="0", WARREN_NODE_PROCESSES="2",
                             WARREN_WAL_NO_SPACE_GIVE_UP_SECONDS=str(GIVE_UP_SECONDS))
        server.log_path = disk.parent / "server.log"
        server.start()
        try:
            publisher, channel = await publish_confirmed(server, BODIES)
            consumer = await aio_pika.connect(server.url)
            held = await (await (await consumer.channel()).get_queue(QUEUE)).get(timeout=WAIT_SECONDS)
            assert held.body == BODIES[0]

            filler = fill(disk)   # another program's file, all but LEFT_FREE_BYTES of it kept
            os.truncate(filler, filler.stat().st_size - LEFT_FREE_BYTES)
            big = asyncio.ensure_future(
                channel.default_exchange.publish(aio_pika.Message(BIG_BODY, delivery_mode=2), routing_key=QUEUE))
            await asyncio.get_running_loop().run_in_executor(None, wait_for_log, server, "wal.no_space")
            await held.ack()   # small, but behind the batch that waits

            await asyncio.get_running_loop().run_in_executor(None, wait_for_log, server, "wal.space_given_up")
            await asyncio.get_running_loop().run_in_executor(None, wait_for_log, server, "supervisor.shard_restarted")
            with pytest.raises(Exception) as failed:   # the connection went with the process: no ack
                await asyncio.wait_for(big, WAIT_SECONDS)
            assert not isinstance(failed.value, asyncio.TimeoutError), "the unwritten publish is still waiting"
            for connection in (publisher, consumer):
                await asyncio.wait_for(connection.close(), WAIT_SECONDS)
            # the held message comes back once the queue hears that its channel closed (the process
            # may have restarted after the close, or the close reached it while it restarted)
            await asyncio.get_running_loop().run_in_executor(None, lambda: wait_for(
                lambda: (queue_view(server, QUEUE) or {}).get("messages_ready") == len(BODIES),
                f"the {len(BODIES)} messages to be ready again after the restart"))
            assert await drain(server) == sorted(BODIES), "the queue's messages after the restart"
        finally:
            status = server.stop()
        assert status == 0, f"warren-server exited with {status}:\n{server.log()}"
        log = server.log_path.read_text(errors="replace")
        gave_way = [line for line in log.splitlines() if '"wal.space_given_up"' in line or '"raft.fatal"' in line]
        assert len(gave_way) == 2 and "shutdown\": false" in gave_way[0], gave_way

        server.start()   # the acks written in the room left are on disk
        try:
            assert await drain(server) == [], "messages acked before the restart came back"
        finally:
            server.stop()


async def publish_confirmed(server, bodies: list[bytes]) -> tuple[AbstractConnection, AbstractChannel]:
    """The quorum queue declared and `bodies` published to it, each confirmed: (connection, channel)."""
    connection = await aio_pika.connect(server.url)
    channel = await connection.channel(publisher_confirms=True)
    await channel.declare_queue(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
    for body in bodies:
        await channel.default_exchange.publish(aio_pika.Message(body, delivery_mode=2), routing_key=QUEUE)
    return connection, channel


async def drain(server) -> list[bytes]:
    """Every message of the queue, each taken and acked; sorted."""
    connection = await aio_pika.connect(server.url)
    try:
        queue = await (await connection.channel()).declare_queue(QUEUE, passive=True)
        bodies = []
        while (message := await queue.get(fail=False, timeout=WAIT_SECONDS)) is not None:
            bodies.append(message.body)
            await message.ack()
        return sorted(bodies)
    finally:
        await connection.close()


async def test_a_node_that_cannot_start_on_a_full_disk_exits_75_and_starts_once_there_is_room(tmp_path):
    with tmpfs(tmp_path, DISK_BYTES) as disk:
        server = make_server(disk, WARREN_DISK_FREE_LIMIT_BYTES="0")
        server.log_path = disk.parent / "server.log"
        server.start()
        try:
            await (await publish_confirmed(server, BODIES))[0].close()
        finally:
            assert server.stop() == 0, server.log()
        filler = fill(disk)   # to the last byte: the start's new WAL file finds no room for its header

        server.launch()
        status = server.process.wait(WAIT_SECONDS)
        assert status == NO_SPACE_EXIT_STATUS, f"a start on a full disk exited {status}:\n{server.log()}"
        assert "No space left on device" in server.log(), server.log()

        filler.unlink()
        server.start()
        try:
            assert await drain(server) == sorted(BODIES), "the messages confirmed before the disk filled"
        finally:
            server.stop()


async def test_a_supervisor_starts_shards_again_for_as_long_as_the_disk_is_full(tmp_path):
    """Shards that cannot start on a full disk are not among the restarts that stop the node
    (more than RESTARTS_MAX within a minute do): the node starts once the disk has room."""
    with tmpfs(tmp_path, DISK_BYTES) as disk:
        server = make_server(disk, WARREN_DISK_FREE_LIMIT_BYTES="0", WARREN_NODE_PROCESSES="2")
        server.log_path = disk.parent / "server.log"
        server.start()
        assert server.stop() == 0, server.log()
        filler = fill(disk)

        server.launch()
        try:
            exits = f'"exit_status": {NO_SPACE_EXIT_STATUS}, "event": "supervisor.shard_exited"'
            await asyncio.get_running_loop().run_in_executor(None, lambda: wait_for(
                lambda: server.process.poll() is not None or server.log_path.read_text().count(exits) > RESTARTS_MAX,
                f"more than {RESTARTS_MAX} shard starts to fail for want of space", 60))
            assert server.process.poll() is None, f"the supervisor gave up on a full disk:\n{server.log()}"
            filler.unlink()
            server.wait_listening()
            await (await publish_confirmed(server, [b"after"]))[0].close()
            assert await drain(server) == [b"after"], "a message confirmed once the disk had room"
        finally:
            assert server.stop() == 0, server.log()
