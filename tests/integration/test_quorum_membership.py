"""Quorum queue membership on three real nodes, through warrenctl: add_member,
delete_member, shrink, grow, rebalance, and the errors they answer."""
from __future__ import annotations

import base64
import json
import subprocess
import sys
import urllib.error
import urllib.request

import pika

from tests.integration.quorum_cluster import (
    NAMES,
    api,
    connect,
    declare_everywhere,
    queue_view,
    start_cluster,
    stop_all,
    wait_for,
)

A, B, C = NAMES
CTL_TIMEOUT_SECONDS = 60


def ctl(server, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "warren.broker.admin.ctl", "--port", str(server.metrics_port), *args],
        capture_output=True, text=True, timeout=CTL_TIMEOUT_SECONDS)


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result.stdout


def raft_metric(server, metric: str, queue: str) -> float | None:
    """A per-queue Raft gauge on /metrics; None when the node holds no replica of the queue."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(metric + "{") and f'queue="{queue}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def members_everywhere(servers, queue: str, members: list[str]) -> bool:
    return all(sorted((queue_view(s, queue) or {}).get("members", [])) == sorted(members) for s in servers.values())


def publish_confirmed(server, queue: str, count: int, tag: str = "m") -> None:
    with connect(server) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for number in range(count):
            channel.basic_publish("", queue, f"{tag}:{number}".encode(), pika.BasicProperties(delivery_mode=2))


def consume_all(server, queue: str, count: int) -> list[bytes]:
    bodies = []
    with connect(server) as connection:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=50)
        for method, _, body in channel.consume(queue, inactivity_timeout=20):
            assert method is not None, f"only {len(bodies)} of {count} messages arrived"
            bodies.append(body)
            channel.basic_ack(method.delivery_tag)
            if len(bodies) == count:
                break
        channel.cancel()
    return bodies


def restart(servers, node: str) -> None:
    servers[node].stop()
    servers[node].start()
    for name, server in servers.items():
        wait_for(lambda s=server: api(s, "/api/overview")["running_nodes"] == NAMES, f"{name} to see all nodes")


def leader_seen_by(server, queue: str) -> str | None:
    return (queue_view(server, queue) or {}).get("leader")


def test_add_member_catches_up_then_delete_member(tmp_path):
    servers = start_cluster(tmp_path)
    try:
        queue = "grown"
        declare_everywhere(servers, A, queue, **{"x-quorum-initial-group-size": 2})
        assert sorted(queue_view(servers[A], queue)["members"]) == [A, B]
        assert raft_metric(servers[C], "warren_raft_members", queue) is None
        publish_confirmed(servers[A], queue, 100)

        out = ok(ctl(servers[B], "add_member", queue, C))
        assert C in out and "members: [" in out, out
        wait_for(lambda: members_everywhere(servers, queue, NAMES), "every node to list three members")
        # The new replica caught up: same messages and same applied index as the leader's.
        wait_for(lambda: (queue_view(servers[C], queue) or {}).get("messages_ready") == 100,
                 f"{C}'s replica to hold the 100 messages")
        leader = leader_seen_by(servers[A], queue)
        assert leader in (A, B), leader
        wait_for(lambda: raft_metric(servers[C], "warren_raft_last_applied", queue)
                 == raft_metric(servers[leader], "warren_raft_last_applied", queue),
                 f"{C}'s last_applied to match the leader's")
        wait_for(lambda: all(raft_metric(s, "warren_raft_members", queue) == 3 for s in servers.values()),
                 "the Raft configuration to have three voters on every node")
        restart(servers, C)   # the new member and its replica come back from its metadata log and WAL
        assert sorted(queue_view(servers[C], queue)["members"]) == NAMES
        wait_for(lambda: (queue_view(servers[C], queue) or {}).get("messages_ready") == 100,
                 f"{C}'s replica to hold the 100 messages after its restart")

        out = ok(ctl(servers[C], "delete_member", "--vhost", "/", queue, B))
        assert B in out, out
        wait_for(lambda: members_everywhere(servers, queue, [A, C]), "every node to list two members")
        wait_for(lambda: raft_metric(servers[B], "warren_raft_members", queue) is None,
                 f"{B} to drop its replica once its removal committed")
        wait_for(lambda: all(raft_metric(servers[n], "warren_raft_members", queue) == 2 for n in (A, C)),
                 "the Raft configuration to have two voters")
        restart(servers, B)   # not a member any more, and no replica
        assert sorted(queue_view(servers[B], queue)["members"]) == [A, C]
        assert raft_metric(servers[B], "warren_raft_members", queue) is None
        bodies = consume_all(servers[B], queue, 100)
        assert sorted(bodies) == sorted(f"m:{n}".encode() for n in range(100))
    finally:
        stop_all(servers)


def test_a_member_added_after_compaction_catches_up_from_a_snapshot(tmp_path):
    servers = start_cluster(tmp_path)
    try:
        queue = "compacted"
        declare_everywhere(servers, A, queue, **{"x-quorum-initial-group-size": 2})
        with connect(servers[A]) as connection:   # more enqueues than SNAPSHOT_ENTRIES_MIN: the leader compacts
            channel = connection.channel()
            for number in range(5000):
                channel.basic_publish("", queue, f"old:{number}".encode())
        assert len(consume_all(servers[A], queue, 5000)) == 5000
        publish_confirmed(servers[A], queue, 50, tag="new")
        leader = leader_seen_by(servers[A], queue)
        wait_for(lambda: raft_metric(servers[leader], "warren_raft_log_entries", queue)
                 < raft_metric(servers[leader], "warren_raft_last_applied", queue) - 1000,
                 "the leader to compact its log")

        ok(ctl(servers[A], "add_member", queue, C))
        wait_for(lambda: (queue_view(servers[C], queue) or {}).get("messages_ready") == 50,
                 f"{C}'s replica to hold the 50 messages")
        wait_for(lambda: raft_metric(servers[C], "warren_raft_last_applied", queue)
                 == raft_metric(servers[leader], "warren_raft_last_applied", queue),
                 f"{C}'s last_applied to match the leader's")
        ok(ctl(servers[A], "delete_member", queue, leader))   # C may now lead it
        wait_for(lambda: leader_seen_by(servers[C], queue) not in (None, leader), f"a leader other than {leader}")
        assert sorted(consume_all(servers[B], queue, 50)) == sorted(f"new:{n}".encode() for n in range(50))
    finally:
        stop_all(servers)


def test_shrink_the_leaders_node_then_grow_it_back(tmp_path):
    servers = start_cluster(tmp_path)
    try:
        queues = ["sg-1", "sg-2", "sg-3"]
        for queue in queues:
            declare_everywhere(servers, A, queue)   # three members
            publish_confirmed(servers[A], queue, 10)
        leader = leader_seen_by(servers[A], queues[0])   # the node shrunk: it leads sg-1 at least
        x, y = [n for n in NAMES if n != leader]
        declare_everywhere(servers, leader, "sg-single", **{"x-quorum-initial-group-size": 1})
        declare_everywhere(servers, x, "sg-x-single", **{"x-quorum-initial-group-size": 1})

        rows = [line.split("\t") for line in ok(ctl(servers[x], "shrink", leader)).splitlines()]
        assert rows[0] == ["vhost", "name", "size", "result"], rows
        by_name = {row[1]: row for row in rows[1:]}
        assert set(by_name) == {*queues, "sg-single"}, rows
        assert all(by_name[q][2:] == ["2", "ok"] for q in queues), rows
        assert "last member" in by_name["sg-single"][3], rows
        for queue in queues:
            wait_for(lambda q=queue: members_everywhere(servers, q, [x, y]), f"{queue} to lose {leader}")
            wait_for(lambda q=queue: raft_metric(servers[leader], "warren_raft_members", q) is None,
                     f"{leader} to drop its replica of {queue}")
            wait_for(lambda q=queue: leader_seen_by(servers[x], q) in (x, y), f"{queue} to be led by {x} or {y}")
            wait_for(lambda q=queue: all(raft_metric(servers[n], "warren_raft_members", q) == 2 for n in (x, y)),
                     f"{queue}'s Raft configuration to have two voters")
        assert queue_view(servers[y], "sg-single")["members"] == [leader]

        rows = [line.split("\t") for line in ok(ctl(servers[y], "grow", leader, "even")).splitlines()]
        assert {row[1] for row in rows[1:]} == set(queues), rows   # not the one-member queues
        assert all(row[2:] == ["3", "ok"] for row in rows[1:]), rows
        for queue in queues:
            wait_for(lambda q=queue: members_everywhere(servers, q, NAMES), f"{queue} to have {leader} again")
            wait_for(lambda q=queue: (queue_view(servers[leader], q) or {}).get("messages_ready") == 10,
                     f"{leader}'s new replica of {queue} to catch up")
        assert queue_view(servers[leader], "sg-x-single")["members"] == [x]
        # Its new replicas are new voters (raft/member_ids.py): a restart brings them back as such,
        # and they lead and replicate again.
        restart(servers, leader)
        for queue in queues:
            wait_for(lambda q=queue: raft_metric(servers[leader], "warren_raft_members", q) == 3,
                     f"{leader}'s replica of {queue} to come back with three voters")
        servers[y].stop()   # a majority is now x and the restarted replica: it must vote and acknowledge
        for queue in queues:
            publish_confirmed(servers[x], queue, 5, tag="after")
        servers[y].start()
        for name, server in servers.items():
            wait_for(lambda s=server: api(s, "/api/overview")["running_nodes"] == NAMES, f"{name} to see all nodes")
        for queue in queues:
            wait_for(lambda q=queue: all((queue_view(s, q) or {}).get("messages_ready") == 15
                                         for s in servers.values()), f"{queue} to hold 15 on every node")
        # An odd-sized queue is grown with `all`.
        ok(ctl(servers[leader], "grow", y, "all"))
        wait_for(lambda: members_everywhere(servers, "sg-x-single", [x, y]), "sg-x-single to have two members")
        for queue in queues:
            assert len(consume_all(servers[leader], queue, 15)) == 15
    finally:
        stop_all(servers)


def test_rebalance_spreads_leaders_over_the_nodes(tmp_path):
    servers = start_cluster(tmp_path)
    try:
        queues = [f"rb-{n}" for n in range(6)]
        for queue in queues:
            declare_everywhere(servers, A, queue)
        assert {leader_seen_by(servers[A], q) for q in queues} == {A}

        rows = [line.split("\t") for line in ok(ctl(servers[B], "rebalance", "quorum")).splitlines()]
        assert rows[0] == ["node", "quorum_leaders"], rows
        assert sorted(int(row[1]) for row in rows[1:]) == [2, 2, 2], rows

        def leaders() -> set[str]:
            return {leader_seen_by(servers[A], q) for q in queues}
        wait_for(lambda: len(leaders() - {None}) >= 2, "leaders on at least two nodes")
        wait_for(lambda: leaders() == set(NAMES), "leaders on every node")
        publish_confirmed(servers[C], queues[0], 5)
        assert len(consume_all(servers[A], queues[0], 5)) == 5
    finally:
        stop_all(servers)


def test_refused_changes_say_why_and_exit_non_zero(tmp_path):
    servers = start_cluster(tmp_path)
    try:
        declare_everywhere(servers, A, "err-q", **{"x-quorum-initial-group-size": 2})
        declare_everywhere(servers, A, "err-single", **{"x-quorum-initial-group-size": 1})
        with connect(servers[A]) as connection:
            connection.channel().queue_declare("err-classic", durable=True)
        cases = [
            (("add_member", "err-q", "z@local"), "not a cluster node"),
            (("add_member", "no-such-queue", C), "queue 'no-such-queue' in vhost '/' not found"),
            (("add_member", "--vhost", "/nope", "err-q", C), "vhost '/nope' not found"),
            (("add_member", "err-classic", C), "is not a quorum queue"),   # classic queues stay on A
            (("add_member", "err-q", B), "already a member"),
            (("delete_member", "err-q", C), "is not a member"),
            (("delete_member", "err-single", A), "last member"),
            (("grow", "z@local", "all"), "not a cluster node"),
            (("grow", C, "odd"), "'selector' must be 'all' or 'even'"),
            (("shrink", "z@local"), "not a cluster node"),
            (("rebalance", "streams"), "'type' must be 'all' or 'quorum'"),
        ]
        for args, reason in cases:
            result = ctl(servers[A], *args)
            assert result.returncode == 1, (args, result)
            assert reason in result.stderr and result.stderr.count("\n") == 1, (args, result.stderr)
        usage = ctl(servers[B], "add_member", "err-q")
        assert usage.returncode == 64 and "usage: warrenctl add_member <queue> <node>" in usage.stderr, usage
        assert members_everywhere(servers, "err-q", [A, B])

        # The HTTP endpoint itself: POST only, with credentials, a JSON object body.
        url = f"http://127.0.0.1:{servers[A].metrics_port}/api/queues/members"
        body = json.dumps({"op": "add", "queue": "err-q", "node": C}).encode()
        for request, status in [
            (urllib.request.Request(url, data=body, method="POST"), 401),
            (urllib.request.Request(url), 405),
        ]:
            try:
                urllib.request.urlopen(request, timeout=10)
            except urllib.error.HTTPError as error:
                assert error.code == status, (request.get_method(), error.code)
            else:
                raise AssertionError(f"{request.get_method()} {url} was accepted")
        request = urllib.request.Request(url, data=b"[1]", method="POST")
        request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        try:
            urllib.request.urlopen(request, timeout=10)
        except urllib.error.HTTPError as error:
            assert error.code == 400 and "JSON object" in json.loads(error.read())["error"]
        else:
            raise AssertionError("a non-object body was accepted")
        assert api(servers[A], "/api/overview")["running_nodes"] == NAMES
    finally:
        stop_all(servers)
