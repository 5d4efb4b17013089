"""Three real warren-server processes form a cluster over the shared-secret links."""
from __future__ import annotations

import json
import signal

from tests.integration.quorum_cluster import api, start_nodes
from tests.integration.quorum_cluster import wait_for as shared_wait_for
from tests.serverproc import free_port, make_server

WAIT_SECONDS = 20.0
SECRET = "correct horse battery staple"


def running_nodes(server) -> list[str]:
    return api(server, "/api/overview")["running_nodes"]


def wait_for(predicate, what: str) -> None:
    shared_wait_for(predicate, what, WAIT_SECONDS)


def start_cluster(tmp_path, names: list[str], secrets: dict[str, str]):
    return start_nodes(tmp_path, names, secrets, WARREN_CLUSTER_HEARTBEAT_SECONDS="0.2")


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
    # c never reaches the metadata group: it opens its port after a short catch-up wait
    servers = start_nodes(tmp_path, names, secrets, WARREN_CLUSTER_HEARTBEAT_SECONDS="0.2",
                          WARREN_CLUSTER_STARTUP_CATCH_UP_SECONDS="1")
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
