"""warrenctl against a real node: cluster_status, list_queues and friends."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pika
import pytest

CTL_TIMEOUT_SECONDS = 30


def ctl(server, *args: str, password: str = "guest") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "warren.broker.admin.ctl", "--port", str(server.metrics_port),
         "--password", password, *args],
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
    result = subprocess.run([sys.executable, "-m", "warren.broker.admin.ctl", "--port", str(free_port()), "status"],
                            capture_output=True, text=True, timeout=CTL_TIMEOUT_SECONDS)
    assert result.returncode == 69 and "cannot reach" in result.stderr, result


class OneAnswerServer:
    """A loopback TCP server that answers every connection with `reply` (None: reads and never answers)."""

    def __init__(self, reply: bytes | None):
        self.reply = reply
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            self.held.append(client)
            if self.reply is not None:
                client.sendall(self.reply)
                client.close()

    def close(self) -> None:
        self.listener.close()
        for client in self.held:
            client.close()


def assert_one_line_failure(result: subprocess.CompletedProcess, expected: str) -> None:
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warrenctl: ") and expected in lines[0], result.stderr


def ctl_at(port: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "warren.broker.admin.ctl", "--port", str(port), *args],
                          capture_output=True, text=True, timeout=CTL_TIMEOUT_SECONDS)


def test_pointed_at_the_amqp_port_is_a_one_line_error(server):
    assert_one_line_failure(ctl_at(server.amqp_port, "status"), "not an HTTP endpoint")


@pytest.mark.parametrize("reply", [b"HTTP/1.0 200 OK\r\n\r\n<html>not json</html>", b"SSH-2.0-OpenSSH_9.6\r\n"])
def test_a_server_that_is_not_warren_is_a_one_line_error(reply):
    other = OneAnswerServer(reply)
    try:
        assert_one_line_failure(ctl_at(other.port, "list_queues"), f"127.0.0.1:{other.port}")
    finally:
        other.close()


def test_a_silent_server_times_out_with_a_one_line_error():
    silent = OneAnswerServer(None)
    try:
        assert_one_line_failure(ctl_at(silent.port, "--timeout", "1", "status"), "timed out")
        assert_one_line_failure(ctl_at(silent.port, "--timeout", "1", "add_vhost", "v"), "timed out")
    finally:
        silent.close()
