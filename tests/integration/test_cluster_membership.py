"""Three real warren-server processes form a cluster over the shared-secret links."""
from __future__ import annotations

import base64
import json
import signal
import time
import urllib.request

from tests.serverproc import free_port, make_server

WAIT_SECONDS = 20.0
SECRET = "correct horse battery staple"


def running_nodes(server) -> list[str]:
    request = urllib.request.Request(f"http://127.0.0.1:{server.metrics_port}/api/overview")
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())["running_nodes"]


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {WAIT_SECONDS}s waiting for {what}"
        time.sleep(0.05)  # polling a condition with a deadline, not synchronising on time


def start_cluster(tmp_path, names: list[str], secrets: dict[str, str]):
    ports = {name: free_port() for name in names}
    nodes = json.dumps([{"name": n, "host": "127.0.0.1", "port": p} for n, p in ports.items()])
    servers = {}
    for name in names:
        servers[name] = make_server(
            tmp_path / name, WARREN_NODE_NAME=name, WARREN_CLUSTER_NODES=nodes,
            WARREN_CLUSTER_HOST="127.0.0.1", WARREN_CLUSTER_PORT=str(ports[name]),
            WARREN_CLUSTER_SECRET=secrets[name], WARREN_CLUSTER_HEARTBEAT_SECONDS="0.2").start()
    return servers


def test_nodes_see_each_other_and_a_killed_node_is_reported_down(tmp_path):
    names = ["a@local", "b@local", "c@local"]
    servers = start_cluster(tmp_path, names, {n: SECRET for n in names})
    try:
        for name, server in servers.items():
            wait_for(lambda s=server: running_nodes(s) == names, f"{name} to see all three nodes")
        servers["b@local"].stop(signal.SIGKILL)
        for name in ("a@local", "c@local"):
            wait_for(lambda s=servers[name]: running_nodes(s) == ["a@local", "c@local"],
                     f"{name} to report b@local down")
        log = servers["a@local"].log()
        assert "cluster.peer_down" in log and SECRET not in log, "peer_down not logged, or the secret leaked"
    finally:
        for server in servers.values():
            server.stop()


def test_a_node_with_the_wrong_secret_is_never_admitted(tmp_path):
    names = ["a@local", "b@local", "c@local"]
    secrets = {"a@local": SECRET, "b@local": SECRET, "c@local": "wrong"}
    servers = start_cluster(tmp_path, names, secrets)
    try:
        wait_for(lambda: running_nodes(servers["a@local"]) == ["a@local", "b@local"], "a and b to connect")
        wait_for(lambda: "cluster.handshake_failed" in servers["a@local"].log()
                 or "cluster.handshake_failed" in servers["b@local"].log()
                 or "cluster.handshake_failed" in servers["c@local"].log(),
                 "the wrong secret to be logged as a failed handshake")
        assert running_nodes(servers["c@local"]) == ["c@local"], "the node with the wrong secret got in"
        assert running_nodes(servers["a@local"]) == ["a@local", "b@local"]
    finally:
        for server in servers.values():
            server.stop()


def test_cluster_config_errors_stop_the_start(tmp_path):
    server = make_server(tmp_path, WARREN_NODE_NAME="a@local", WARREN_CLUSTER_NODES=json.dumps(
        [{"name": "a@local", "host": "127.0.0.1", "port": free_port()},
         {"name": "b@local", "host": "127.0.0.1", "port": free_port()}]))
    try:
        server.start()
    except RuntimeError as error:
        assert "cluster_secret" in str(error), error
    else:
        server.stop()
        raise AssertionError("a cluster without a secret started")
