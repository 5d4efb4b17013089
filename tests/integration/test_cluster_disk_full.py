"""A follower whose disk cannot hold what its leader has to send it: the cluster goes on.

Three real nodes, the third on a small filesystem of the test's own (a tmpfs: root only, as
CI runs). The third node is paused while the queue's leader and the second node confirm
more than the third node's disk holds; once it runs again its leader sends it all of that.
It must not take in more than its disk has room for: it used to, its WAL batch of replicated
entries waited for room for good, its disk alarm blocked every publisher of the cluster to
the end, and its disk never came back, though every message was consumed (a chaos run with
300 KB bodies, seed 4602, docs/verification-tools.md). The leader's log lets go of the
consumed messages and sends the third node a snapshot instead; then the third node's alarm
clears and publishers go on.
"""
from __future__ import annotations

import shutil
import signal

import pika
import pytest

from tests.integration.quorum_cluster import (
    NAMES,
    SECRET,
    api,
    connect,
    declare_everywhere,
    leader_of,
    queue_view,
    start_nodes,
    stop_all,
    wait_for,
)
from tests.integration.test_disk_full import disk_alarm, tmpfs

pytestmark = pytest.mark.timeout(240)

QUEUE = "larger-than-a-disk"
DISK_BYTES = 96 * 1024 * 1024
LIMIT_BYTES = 24 * 1000 * 1000
BODY = b"m" * 300_000
COUNT = 400   # 120 MB: more than the small disk holds


def publish_confirmed(channel, count: int, tag: str) -> None:
    for number in range(count):   # mandatory: raises if nacked or returned
        channel.basic_publish("", QUEUE, BODY + f"{tag}{number}".encode(), pika.BasicProperties(delivery_mode=2),
                              mandatory=True)


def test_a_follower_with_too_small_a_disk_neither_fills_it_nor_stops_the_cluster(tmp_path):
    small = NAMES[2]
    with tmpfs(tmp_path, DISK_BYTES) as disk:
        servers = start_nodes(tmp_path, NAMES, {name: SECRET for name in NAMES},
                              node_env={small: {"WARREN_DATA_DIR": str(disk / "data"),
                                                "WARREN_DISK_FREE_LIMIT_BYTES": str(LIMIT_BYTES)}},
                              WARREN_ALARM_CHECK_INTERVAL_SECONDS="0.05")
        try:
            for name, server in servers.items():
                wait_for(lambda s=server: api(s, "/api/overview")["running_nodes"] == NAMES, f"{name} to see all")
            declare_everywhere(servers, NAMES[0], QUEUE)
            leader = leader_of(servers, QUEUE)
            assert leader != small and sorted(queue_view(servers[leader], QUEUE)["members"]) == sorted(NAMES)
            servers[small].process.send_signal(signal.SIGSTOP)
            try:
                with connect(servers[leader]) as connection:
                    channel = connection.channel()
                    channel.confirm_delivery()
                    publish_confirmed(channel, COUNT, "before")
            finally:
                servers[small].process.send_signal(signal.SIGCONT)

            # the third node catches up as far as its disk goes; meanwhile every message is consumed
            with connect(servers[leader]) as connection:
                channel = connection.channel()
                for number in range(COUNT):
                    method, _, body = channel.basic_get(QUEUE)
                    assert method is not None, f"{number} of {COUNT} messages there, then none"
                    assert body == BODY + f"before{number}".encode()
                    channel.basic_ack(method.delivery_tag)
            free = shutil.disk_usage(disk).free
            assert free > 0, "the small node's disk filled up to its last byte"
            wait_for(lambda: not disk_alarm(servers[small]) and not disk_alarm(servers[leader]),
                     f"the small node's disk alarm to clear once every message was consumed (its disk had "
                     f"{free} bytes free when the wait began)", seconds=90)
            with connect(servers[leader]) as connection:
                channel = connection.channel()
                channel.confirm_delivery()
                publish_confirmed(channel, 10, "after")
            with connect(servers[small]) as connection:
                channel = connection.channel()
                for number in range(10):
                    method, _, body = channel.basic_get(QUEUE, auto_ack=True)
                    assert body == BODY + f"after{number}".encode(), (
                        f"after message {number}: {method}; the queue on {small}: {queue_view(servers[small], QUEUE)}, "
                        f"on {leader}: {queue_view(servers[leader], QUEUE)}")
        finally:
            for server in servers.values():
                if server.process is not None and server.process.poll() is None:
                    server.process.send_signal(signal.SIGCONT)
            stop_all(servers)
