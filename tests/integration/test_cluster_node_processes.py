"""A cluster of nodes over two processes each (node_processes = 2, docs/multi-process.md
section 12): every node's shards make one cluster, a quorum queue's members are one shard
index on distinct nodes, and a node's kill -9 loses no confirmed message; real processes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pika
import pytest

from tests.integration.pika_support import publish_confirmed
from tests.integration.quorum_cluster import api, wait_for
from tests.integration.test_node_processes import EXIT_SECONDS, ShardedServer, alive, drain
from tests.serverproc import make_server
from warren.verification.ports import listen_port_block

pytestmark = pytest.mark.timeout(180)

NAMES = ["a@local", "b@local", "c@local"]
SECRET = "sharded cluster secret"
QUORUM = {"x-queue-type": "quorum"}


def sharded_cluster(tmp_path, processes: dict[str, int]) -> dict[str, ShardedServer]:
    """One node per name with its count of processes, the nodes on adjacent cluster ports
    (RabbitMQ's local layout): a node's shards share its one port (shared_cluster_port.py)."""
    base = listen_port_block(len(processes), "0.0.0.0")
    ports = {name: base + i for i, name in enumerate(processes)}
    members = json.dumps([{"name": name, "host": "127.0.0.1", "port": port} for name, port in ports.items()])
    servers = {}
    for name, count in processes.items():
        plain = make_server(tmp_path / name, WARREN_NODE_NAME=name, WARREN_CLUSTER_NODES=members,
                            WARREN_CLUSTER_HOST="127.0.0.1", WARREN_CLUSTER_PORT=str(ports[name]),
                            WARREN_CLUSTER_SECRET=SECRET, WARREN_NODE_PROCESSES=str(count),
                            WARREN_CLUSTER_NODE_GONE_SECONDS="3")
        servers[name] = ShardedServer(plain.amqp_port, plain.metrics_port, plain.data_dir, plain.env)
    return servers


def kill_node(server: ShardedServer) -> None:
    """kill -9 of the node's process group: the supervisor and its shards."""
    pids = [row["pid"] for row in server.shard_rows()]
    os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait(EXIT_SECONDS)
    wait_for(lambda: not any(alive(pid) for pid in pids), "the node's shards to die with it", 10)
    server._log.close()


@pytest.fixture
def cluster(tmp_path):
    servers = sharded_cluster(tmp_path, {name: 2 for name in NAMES})
    for server in servers.values():
        server.launch()
    try:
        for name, server in servers.items():
            server.wait_listening()
            wait_for(lambda s=server: api(s, "/api/overview")["running_nodes"] == NAMES, f"{name} to see every node")
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def declare_quorum_queues(server: ShardedServer, names: list[str]) -> None:
    with pika.BlockingConnection(pika.URLParameters(server.url)) as declaring:
        channel = declaring.channel()
        for name in names:
            channel.queue_declare(name, durable=True, arguments=QUORUM)


def test_queues_spread_over_shards_of_distinct_nodes_and_survive_a_nodes_kill_9(cluster):
    a, b, c = (cluster[name] for name in NAMES)
    declare_quorum_queues(a, [f"q{i}" for i in range(4)])
    rows = api(a, "/api/queues")
    assert all(sorted(row["members"]) == NAMES for row in rows), f"not named by node as RabbitMQ's: {rows}"
    members = {row["name"]: row["member_shards"] for row in rows}
    shards_used = set()
    for i in range(4):
        nodes, indexes = zip(*(member.rsplit("#", 1) for member in members[f"q{i}"]))
        assert sorted(nodes) == NAMES, f"q{i}: members {members[f'q{i}']} are not one on each node"
        assert len(set(indexes)) == 1, f"q{i}: members {members[f'q{i}']} are not one shard index"
        shards_used |= set(indexes)
    assert shards_used == {"0", "1"}, f"the queues did not spread over both shards: {members}"

    def publish_all(server: ShardedServer, round_: str, count: int) -> None:
        for i in range(4):   # a connection per queue: each may move to its queue's shard of that node
            with pika.BlockingConnection(pika.URLParameters(server.url)) as publisher:
                publish_confirmed(publisher.channel(), f"q{i}", [b"%s-%d-%d" % (round_.encode(), i, n)
                                                                 for n in range(count)])

    publish_all(b, "first", 200)
    with pika.BlockingConnection(pika.URLParameters(c.url)) as consumer:
        for i in range(4):
            assert drain(consumer.channel(), f"q{i}", 200) == [b"first-%d-%d" % (i, n) for n in range(200)]
    kill_node(a)   # every queue has a member on a; some had their leader there
    publish_all(b, "second", 100)
    a.start()
    with pika.BlockingConnection(pika.URLParameters(a.url)) as consumer:
        for i in range(4):
            assert drain(consumer.channel(), f"q{i}", 100) == [b"second-%d-%d" % (i, n) for n in range(100)]
    overview = api(a, "/api/overview")
    assert (overview["node"], overview["cluster_nodes"]) == ("a@local", NAMES)


def test_direct_reply_to_between_nodes_of_sharded_nodes(cluster):
    a, c = cluster["a@local"], cluster["c@local"]
    with pika.BlockingConnection(pika.URLParameters(a.url)) as replier, \
            pika.BlockingConnection(pika.URLParameters(c.url)) as requester:
        server = replier.channel()
        server.queue_declare("rpc", durable=True, arguments=QUORUM)
        client = requester.channel()
        replies = []
        client.basic_consume("amq.rabbitmq.reply-to", lambda _ch, _m, props, body: replies.append(body), auto_ack=True)
        for i in range(3):
            client.basic_publish("", "rpc", b"ask-%d" % i, pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
            method, props, body = next(server.consume("rpc", inactivity_timeout=10))
            assert method is not None, "the request did not reach the replier"
            server.basic_publish("", props.reply_to, b"answer-" + body)
            server.basic_ack(method.delivery_tag)
            wait_for(lambda i=i: requester.process_data_events(time_limit=0.05) or len(replies) > i,
                     "the reply to reach the requester's node and shard", seconds=10)
        assert replies == [b"answer-ask-%d" % i for i in range(3)]


def test_a_node_with_another_process_count_does_not_join(tmp_path):
    servers = sharded_cluster(tmp_path, {"a@local": 2, "b@local": 2, "c@local": 3})
    try:
        for server in servers.values():
            server.launch()
        a, c = servers["a@local"], servers["c@local"]
        wait_for(lambda: _running_nodes(a) == ["a@local", "b@local"], "a and b to form the cluster")
        # c's shards count another cluster (nine members, not six): its links fail the handshake
        wait_for(lambda: "another node_processes" in c.log(), "c's handshakes to be refused", seconds=15)
        assert _running_nodes(a) == ["a@local", "b@local"]
    finally:
        for server in servers.values():
            server.stop()


def _running_nodes(server: ShardedServer) -> list[str] | None:
    try:
        return api(server, "/api/overview")["running_nodes"]
    except OSError:
        return None


def test_shrink_and_grow_by_node_name_act_on_each_queues_shard(cluster):
    a, b, c = (cluster[name] for name in NAMES)
    declare_quorum_queues(a, ["m0", "m1"])
    indexes = {row["name"]: row["member_shards"][0].rsplit("#", 1)[1] for row in api(a, "/api/queues")}
    assert set(indexes.values()) == {"0", "1"}, indexes

    def members(server: ShardedServer) -> dict[str, list[str]]:
        return {row["name"]: sorted(row["member_shards"]) for row in api(server, "/api/queues")}

    rows = [line.split("\t") for line in _ok(_ctl(b, "shrink", "c@local")).splitlines()]
    assert sorted(row[1:] for row in rows[1:]) == [["m0", "2", "ok"], ["m1", "2", "ok"]], rows
    wait_for(lambda: members(a) == {q: [f"a@local#{k}", f"b@local#{k}"] for q, k in indexes.items()},
             "c's shards to leave each queue")
    rows = [line.split("\t") for line in _ok(_ctl(a, "grow", "c@local", "even")).splitlines()]
    assert sorted(row[1:] for row in rows[1:]) == [["m0", "3", "ok"], ["m1", "3", "ok"]], rows
    wait_for(lambda: members(b) == {q: sorted(f"{n}#{k}" for n in NAMES) for q, k in indexes.items()},
             "c's shard of each queue's index to join it again")
    # add_member / delete_member by node name answer with node names, as /api/queues lists them
    removed = json.loads(_ok(_ctl(b, "--formatter", "json", "delete_member", "m1", "c@local")))
    assert (removed["node"], sorted(removed["members"])) == ("c@local", ["a@local", "b@local"]), removed
    assert sorted(removed["member_shards"]) == [f"{n}#{indexes['m1']}" for n in ("a@local", "b@local")], removed
    added = json.loads(_ok(_ctl(a, "--formatter", "json", "add_member", "m1", "c@local")))
    assert (added["node"], sorted(added["members"])) == ("c@local", NAMES), added
    refused = _ctl(a, "add_member", "m0", "z@local")
    assert refused.returncode != 0 and "'z@local' is not a cluster node" in refused.stderr, refused


def _ctl(server: ShardedServer, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "warren.broker.admin.ctl", "--port", str(server.metrics_port), *args],
                          capture_output=True, text=True, timeout=60)


def _ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result.stdout
