"""Followers whose disks another program filled below half the disk limit still take a
quorum queue's consumers' gets and acks: the queue drains, and its space comes back.

Three real warren-servers, each on a tmpfs of the test's own (root only, as CI runs). A
quorum queue holds confirmed messages; then another program's file leaves both of its
followers' disks 4 MB, below half the 16 MB limit. What leaders replicate to a node was
taken in only with room for it twice above half the limit (broker/node/disk_watch.py), so
that a catch-up of tens of megabytes does not fill the disk; but a consumer's gets and acks
are log entries too, a few bytes each, and refused on both followers they never committed:
the consumer waited for good, and the queue's log, the space that would come back, stayed
(RabbitMQ's disk alarm blocks publishers only; its consumers go on). Now half the limit is
the floor only for entries the leader committed without the node; the others are taken in
while they fit twice.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import shutil

import aio_pika

from tests.integration.quorum_cluster import NAMES, SECRET, declare_everywhere, leader_of, start_nodes, stop_all
from tests.integration.test_disk_full import WAIT_SECONDS, disk_alarm, fill, take_in_order, tmpfs, wait_until

DISK_BYTES = 48 * 1024 * 1024
LIMIT_BYTES = 16 * 1000 * 1000
LEFT_FREE_BYTES = 4 * 1024 * 1024
BODY = b"f" * 300_000
COUNT = 30
QUEUE = "low-followers"


async def test_a_queue_drains_on_followers_whose_disks_are_below_half_the_limit(tmp_path):
    with contextlib.ExitStack() as mounts:
        disks = {name: mounts.enter_context(tmpfs(tmp_path / name, DISK_BYTES, "data")) for name in NAMES}
        servers = start_nodes(tmp_path, NAMES, {name: SECRET for name in NAMES},
                              WARREN_DISK_FREE_LIMIT_BYTES=str(LIMIT_BYTES),
                              WARREN_ALARM_CHECK_INTERVAL_SECONDS="0.05")
        fillers, connection, consumer = [], None, None
        try:
            declare_everywhere(servers, NAMES[0], QUEUE)
            leader = leader_of(servers, QUEUE)
            connection = await aio_pika.connect(servers[leader].url)
            channel = await connection.channel(publisher_confirms=True)
            for n in range(COUNT):
                await channel.default_exchange.publish(aio_pika.Message(BODY, delivery_mode=2, message_id=str(n)),
                                                       routing_key=QUEUE, timeout=WAIT_SECONDS)
            followers = [name for name in NAMES if name != leader]
            for name in followers:
                fillers.append(filler := fill(disks[name]))
                os.truncate(filler, filler.stat().st_size - LEFT_FREE_BYTES)
            for name in followers:
                await wait_until(lambda s=servers[name]: disk_alarm(s), f"{name}'s disk alarm")

            consumer = await aio_pika.connect(servers[leader].url)   # the publisher's is blocked by the alarm
            queue = await (await consumer.channel()).declare_queue(QUEUE, passive=True)
            await take_in_order(queue, COUNT, lambda: "with the followers' disks below half the limit")
            for name in followers:
                await wait_until(lambda d=disks[name]: shutil.disk_usage(d).free >= COUNT * len(BODY) // 2,
                                 f"the consumed messages' space back on {name}'s disk (the filler still there)")
        finally:
            for filler in fillers:
                filler.unlink()
            stop_all(servers)   # first: a blocked connection's close waits for the node, which does not read it
            for client in (connection, consumer):
                if client is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(client.close(), WAIT_SECONDS)
