"""A lone publish costs one WAL batch (issue 11, item 8), and what was confirmed
survives kill -9 right after its confirm.

A durable queue on a single node is a Raft group of one. Its publish is one
entry: appended and fsynced in one batch, committed once durable (a sole voter
is its own majority). The new commit index alone is not written in a batch of
its own: it is volatile state (Raft §5, Figure 2), carried by the next batch
that has something else to write (`RaftSystem.carry_commit`), and recovered
after a crash (the sole voter's durable log is committed once it leads again;
a member of a larger group learns it from its leader).
"""
from __future__ import annotations

import signal
import time

import pika
import pytest

from tests.integration.quorum_cluster import connect as cluster_connect
from tests.integration.quorum_cluster import declare_everywhere, leader_of, start_cluster, stop_all, wait_for
from tests.integration.test_durability import running, scrape
from tests.serverproc import make_server

PERSISTENT = pika.BasicProperties(delivery_mode=2)
# time for a batch that would follow the confirm to reach the disk and the counter
SETTLE_SECONDS = 0.5
QUEUE_TYPES = ["classic", "quorum"]


def declare(channel, name: str, queue_type: str) -> None:
    channel.queue_declare(name, durable=True, arguments={"x-queue-type": queue_type})


def fsyncs(server) -> int:
    return int(scrape(server)["warren_wal_fsyncs_total"])


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
def test_a_lone_publish_costs_one_wal_batch(tmp_path, queue_type):
    with running(tmp_path) as server:
        with pika.BlockingConnection(pika.URLParameters(server.url)) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            declare(channel, "q", queue_type)
            channel.basic_publish("", "q", b"warm-up", PERSISTENT, mandatory=True)
            time.sleep(SETTLE_SECONDS)   # whatever the declare and the warm-up left to write is written
            counts = []
            for body in (b"one", b"two", b"three"):
                before = fsyncs(server)
                channel.basic_publish("", "q", body, PERSISTENT, mandatory=True)   # returns on its confirm
                time.sleep(SETTLE_SECONDS)
                counts.append(fsyncs(server) - before)
            assert channel.queue_declare("q", passive=True).method.message_count == 4
    assert counts == [1, 1, 1], f"WAL batches (fsyncs) per lone publish to a durable {queue_type} queue: {counts}"


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
def test_a_message_confirmed_just_before_kill_9_is_there_after_restart(tmp_path, queue_type):
    server = make_server(tmp_path).start()
    try:
        connection = pika.BlockingConnection(pika.URLParameters(server.url))
        channel = connection.channel()
        channel.confirm_delivery()
        declare(channel, "q", queue_type)
        for body in (b"first", b"last"):
            channel.basic_publish("", "q", body, PERSISTENT, mandatory=True)
        # the commit index of "last" was never written on its own: kill at once
        assert server.stop(signal.SIGKILL) == -signal.SIGKILL
        server.start()
        with pika.BlockingConnection(pika.URLParameters(server.url)) as connection:
            channel = connection.channel()
            assert channel.queue_declare("q", passive=True).method.message_count == 2
            got = [channel.basic_get("q", auto_ack=True)[2] for _ in range(2)]
        assert got == [b"first", b"last"]
    finally:
        server.stop()


def test_a_quorum_message_confirmed_just_before_kill_9_of_the_whole_cluster_is_there(tmp_path):
    servers = start_cluster(tmp_path)
    try:
        declare_everywhere(servers, "a@local", "q3")
        leader = leader_of(servers, "q3")
        connection = cluster_connect(servers[leader])
        channel = connection.channel()
        channel.confirm_delivery()
        for body in (b"first", b"last"):
            channel.basic_publish("", "q3", body, PERSISTENT, mandatory=True)
        for server in servers.values():
            assert server.stop(signal.SIGKILL) == -signal.SIGKILL
        for server in servers.values():
            server.launch()
        for server in servers.values():
            server.wait_listening()
        via = servers[leader]

        def counted():
            try:
                with cluster_connect(via) as connection:
                    return connection.channel().queue_declare("q3", passive=True).method.message_count == 2
            except pika.exceptions.AMQPError:
                return False
        wait_for(counted, "both confirmed messages back after kill -9 of every node")
        with cluster_connect(via) as connection:
            channel = connection.channel()
            got = [channel.basic_get("q3", auto_ack=True)[2] for _ in range(2)]
        assert got == [b"first", b"last"]
    finally:
        stop_all(servers)

