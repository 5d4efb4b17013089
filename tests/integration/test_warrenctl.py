"""warrenctl against a real node: cluster_status, list_queues and friends."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import pika

CTL_TIMEOUT_SECONDS = 30


def ctl(server, *args: str, password: str = "guest") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "broker.ctl", "--port", str(server.metrics_port), "--password", password, *args],
        capture_output=True, text=True, timeout=CTL_TIMEOUT_SECONDS)


def test_list_queues_shows_type_leader_members_and_counts(server, name):
    connection = pika.BlockingConnection(pika.URLParameters(server.url))
    channel = connection.channel()
    channel.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    for _ in range(3):
        channel.basic_publish("", name, b"m")
    channel.basic_get(name, auto_ack=False)  # one unacked
    result = ctl(server, "list_queues", "name", "type", "leader", "members", "messages_ready", "messages_unacked")
    assert result.returncode == 0, result.stderr
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    assert rows[0] == ["name", "type", "leader", "members", "messages_ready", "messages_unacked"]
    row = next((r for r in rows[1:] if r[0] == name), None)
    assert row is not None, f"{name} missing from {result.stdout}"
    assert row == [name, "quorum", "warren@localhost", "[warren@localhost]", "2", "1"], row
    connection.close()


def test_cluster_status_and_json_formatter(server):
    result = ctl(server, "cluster_status")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["running_nodes"] == ["warren@localhost"] and status["alarms"] == []
    exchanges = json.loads(ctl(server, "list_exchanges", "--formatter", "json").stdout)
    assert {"amq.direct", "amq.topic", ""} <= {e["name"] for e in exchanges}


def test_wrong_password_is_refused_and_api_needs_auth(server):
    result = ctl(server, "list_queues", password="wrong")
    assert result.returncode == 2 and "authentication failed" in result.stderr, result
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/api/queues", timeout=10)
    except urllib.error.HTTPError as error:
        assert error.code == 401
    else:
        raise AssertionError("/api/queues answered without credentials")


def test_unreachable_node_exits_69(tmp_path):
    from tests.serverproc import free_port
    result = subprocess.run([sys.executable, "-m", "broker.ctl", "--port", str(free_port()), "status"],
                            capture_output=True, text=True, timeout=CTL_TIMEOUT_SECONDS)
    assert result.returncode == 69 and "cannot reach" in result.stderr, result
