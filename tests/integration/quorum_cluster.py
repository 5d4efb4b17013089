"""Three real warren-server processes in one cluster, for the quorum-queue tests."""
from __future__ import annotations

import base64
import json
import signal
import threading
import time
import urllib.request

import pika

from tests.serverproc import ServerProcess, free_port, make_server, start_together

WAIT_SECONDS = 30.0
SECRET = "quorum test secret"
NAMES = ["a@local", "b@local", "c@local"]


def wait_for(predicate, what: str, seconds: float = WAIT_SECONDS):
    deadline = time.monotonic() + seconds
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {seconds}s waiting for {what}"
        time.sleep(0.05)  # polling a condition with a deadline, not synchronising on time


def api(server: ServerProcess, path: str):
    request = urllib.request.Request(f"http://127.0.0.1:{server.metrics_port}{path}")
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def queue_view(server: ServerProcess, name: str) -> dict | None:
    try:
        return next((q for q in api(server, "/api/queues") if q["name"] == name), None)
    except OSError:
        return None


def start_nodes(tmp_path, names: list[str], secrets: dict[str, str], ports: dict[str, int] | None = None,
                peer_port=None, node_env: dict[str, dict[str, str]] | None = None,
                **env: str) -> dict[str, ServerProcess]:
    """One server per name, each listing all of them as its cluster, with its own secret;
    `ports`: each node's cluster port (free ones if None); `peer_port(node, peer)`: the
    port `node` dials `peer` at (a proxy's: tests/integration/partition.py); `node_env`:
    settings of some nodes only, beside `env` for all."""
    ports = ports or {name: free_port() for name in names}

    def cluster_nodes(node: str) -> str:
        return json.dumps([{"name": n, "host": "127.0.0.1", "port": p if peer_port is None else peer_port(node, n)}
                           for n, p in ports.items()])
    servers = {name: make_server(
        tmp_path / name, WARREN_NODE_NAME=name, WARREN_CLUSTER_NODES=cluster_nodes(name),
        WARREN_CLUSTER_HOST="127.0.0.1", WARREN_CLUSTER_PORT=str(ports[name]), WARREN_CLUSTER_SECRET=secrets[name],
        **{**env, **(node_env or {}).get(name, {})})
        for name in names}
    start_together(servers.values())
    return servers


def start_cluster(tmp_path, gone_seconds: float = 3.0, network=None,
                  names: list[str] = NAMES) -> dict[str, ServerProcess]:
    """Three nodes (or `names`); with `network` (a partition.Network over them) they dial each other
    through its proxies."""
    servers = start_nodes(tmp_path, names, {name: SECRET for name in names},
                          ports=network.real_ports if network is not None else None,
                          peer_port=network.peer_port if network is not None else None,
                          WARREN_CLUSTER_NODE_GONE_SECONDS=str(gone_seconds))
    for name, server in servers.items():
        wait_for(lambda s=server: api(s, "/api/overview")["running_nodes"] == names, f"{name} to see all nodes")
    return servers


def stop_all(servers: dict[str, ServerProcess]) -> None:
    for server in servers.values():
        server.stop()


def connect(server: ServerProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(server.url + "?heartbeat=0"))


def declare_everywhere(servers: dict[str, ServerProcess], via: str, name: str, **arguments) -> None:
    """Declare on `via`; wait until every node knows the queue and it has a leader."""
    with connect(servers[via]) as connection:
        connection.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "quorum", **arguments})
    for node, server in servers.items():
        wait_for(lambda s=server: (queue_view(s, name) or {}).get("leader"), f"{node} to know {name}'s leader")


def leader_of(servers: dict[str, ServerProcess], name: str, among: list[str] | None = None) -> str:
    for node in among or list(servers):
        view = queue_view(servers[node], name)
        if view and view.get("leader"):
            return view["leader"]
    raise AssertionError(f"no node knows the leader of {name}")


# A queue's arguments for `freeze_queue_follower`: two of the three nodes, so the third
# keeps the metadata group's majority.
FREEZABLE_QUEUE = {"x-quorum-initial-group-size": 2}


def freeze_queue_follower(servers: dict[str, ServerProcess], queue: str,
                          keep: str | None = None) -> tuple[str, list[str]]:
    """Stop (SIGSTOP) the one follower of `queue`'s two-member group: the queue cannot commit,
    while the leader's node, with the third node, still has the metadata group's majority, so
    the fence it raises when it counts the follower down is lowered (broker/node/metadata_fence.py)
    and its clients' publishes reach the queue. (With every other node frozen the fence stays
    up and holds them before the queue: a test would race the failure detector.) `keep`: the
    member left running (the one a test's clients use), else the leader. Returns it and the
    frozen nodes, for `thaw`."""
    leader = keep or leader_of(servers, queue)
    members = queue_view(servers[leader], queue)["members"]
    wanted = FREEZABLE_QUEUE["x-quorum-initial-group-size"]
    assert len(members) == wanted and leader in members, f"{queue} has members {members}"
    frozen = [node for node in members if node != leader]
    for node in frozen:
        servers[node].process.send_signal(signal.SIGSTOP)
    return leader, frozen


def thaw(servers: dict[str, ServerProcess], frozen: list[str]) -> None:
    """SIGCONT every node in `frozen` and empty it (so a `finally` may call it again)."""
    while frozen:
        servers[frozen.pop()].process.send_signal(signal.SIGCONT)


class Publisher(threading.Thread):
    """Publishes `count` numbered messages with confirms on a connection of its own."""

    def __init__(self, server, queue: str, count: int, tag: str):
        super().__init__(daemon=True, name=f"publisher-{tag}")
        self.server, self.queue, self.count, self.tag = server, queue, count, tag
        self.confirmed: list[int] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with connect(self.server) as connection:
                channel = connection.channel()
                channel.confirm_delivery()
                for number in range(self.count):
                    channel.basic_publish("", self.queue, f"{self.tag}:{number}".encode(),
                                          pika.BasicProperties(delivery_mode=2), mandatory=True)
                    self.confirmed.append(number)
        except BaseException as error:  # noqa: BLE001 -- reported by the test
            self.error = error
