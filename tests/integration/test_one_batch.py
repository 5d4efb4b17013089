"""A lone publish costs one WAL batch (issue 11, item 8), and what was confirmed
survives kill -9 right after its confirm.

A durable queue on a single node is a Raft group of one. Its publish is one
entry: appended and fsynced in one batch, committed once durable (a sole voter
is its own majority). The new commit index alone is not written in a batch of
its own: it is volatile state (Raft §5, Figure 2), carried by the next batch
that has something else to write (`CarriedCommits.carry`, raft/carried_commits.py), and recovered
after a crash (the sole voter's durable log is committed once it leads again;
a member of a larger group learns it from its leader).
"""
from __future__ import annotations

import json
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



# Event-loop hops of a lone publish (tests/looptrace.py): socket read -> WAL batch handed
# to the writer thread, and fsync done -> basic.ack written to the socket.
TRACED_SERVER = "from tests.looptrace import main; main()"
HOPS_TO_FSYNC_MAX = 1
HOPS_TO_CONFIRM_MAX = 1


def lone_publish_hops(tmp_path, queue_type: str) -> list[dict]:
    hops_file = tmp_path / "hops.jsonl"
    server = make_server(tmp_path, WARREN_HOPS_FILE=str(hops_file))
    server.command = ("-c", TRACED_SERVER)
    server.start()
    try:
        with pika.BlockingConnection(pika.URLParameters(server.url)) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            declare(channel, "q", queue_type)
            channel.basic_publish("", "q", b"warm-up", PERSISTENT, mandatory=True)
            time.sleep(SETTLE_SECONDS)
            per_publish = []
            for body in (b"one", b"two", b"three"):
                hops_file.write_text("")
                channel.basic_publish("", "q", body, PERSISTENT, mandatory=True)
                time.sleep(SETTLE_SECONDS)
                events: dict[str, list[int]] = {}
                for line in hops_file.read_text().splitlines():
                    (event, hops), = json.loads(line).items()
                    events.setdefault(event, []).append(hops)
                per_publish.append(events)
        return per_publish
    finally:
        server.stop()


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
def test_a_lone_publish_takes_few_loop_hops_to_its_fsync_and_from_it_to_its_confirm(tmp_path, queue_type):
    per_publish = lone_publish_hops(tmp_path, queue_type)
    print(f"{queue_type}: {per_publish}")
    for events in per_publish:
        assert len(events.get("to_fsync", [])) == 1 and len(events.get("to_confirm", [])) == 1, per_publish
        assert events["to_fsync"][0] <= HOPS_TO_FSYNC_MAX, per_publish
        assert events["to_confirm"][0] <= HOPS_TO_CONFIRM_MAX, per_publish
