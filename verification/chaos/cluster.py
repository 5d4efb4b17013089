"""A local Warren cluster: real warren-server processes on loopback, each with its
own data dir under the run dir, their cluster links through LinkProxy.

With `processes` > 1 each node runs that many shards (docs/multi-process.md section
12), all of them at the node's one cluster port: a pair of nodes has one proxy, which
carries the links of all their shards, and a fault on it is on all of them. A node's
signals go to its process group (the supervisor and its shards)."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from warren.verification.chaos.proxy import LinkProxy
from warren.verification.ports import listen_port

SECRET = "warren-chaos local secret"
LISTEN_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 10.0


@dataclass
class Node:
    name: str
    directory: Path
    amqp_port: int = field(default_factory=listen_port)
    metrics_port: int = field(default_factory=listen_port)
    cluster_port: int = field(default_factory=listen_port)
    process: asyncio.subprocess.Process | None = None
    paused: bool = False

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F?heartbeat=5"

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None


class LocalCluster:
    def __init__(self, run_dir: Path, size: int, heartbeat_seconds: float, extra_env: dict[str, str] | None = None,
                 processes: int = 1):
        self.run_dir = run_dir
        self.processes = processes
        self.nodes = {f"n{i}@chaos": Node(f"n{i}@chaos", run_dir / f"n{i}") for i in range(1, size + 1)}
        self.heartbeat_seconds = heartbeat_seconds
        self.extra_env = extra_env or {}
        self.proxies: dict[frozenset, LinkProxy] = {}   # pair of nodes -> its proxy

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes.values()]

    def links(self, a: str, b: str) -> list[LinkProxy]:
        """The proxies between nodes a and b (one, whatever their processes)."""
        return [self.proxies[frozenset((a, b))]]

    async def start(self) -> None:
        for dialer in self.nodes:
            for acceptor in self.nodes:
                if dialer < acceptor:  # the lower name dials (raft/transport.py), its shards too
                    proxy = LinkProxy(dialer, acceptor, self.nodes[acceptor].cluster_port)
                    self.proxies[frozenset((dialer, acceptor))] = await proxy.start(listen_port())
        for node in self.nodes.values():
            node.directory.mkdir(parents=True, exist_ok=True)
            await self.launch(node.name)
        await asyncio.gather(*(self.wait_listening(name) for name in self.nodes))

    def _environment(self, node: Node) -> dict[str, str]:
        members = [{"name": other.name, "host": "127.0.0.1",
                    "port": self.links(node.name, other.name)[0].port if node.name < other.name else other.cluster_port}
                   for other in self.nodes.values()]
        env = {k: v for k, v in os.environ.items() if not k.startswith("WARREN_")}
        env.update({
            "WARREN_NODE_NAME": node.name, "WARREN_CLUSTER_NODES": json.dumps(members),
            "WARREN_CLUSTER_HOST": "127.0.0.1", "WARREN_CLUSTER_PORT": str(node.cluster_port),
            "WARREN_CLUSTER_SECRET": SECRET, "WARREN_CLUSTER_HEARTBEAT_SECONDS": str(self.heartbeat_seconds),
            "WARREN_AMQP_HOST": "127.0.0.1", "WARREN_AMQP_PORT": str(node.amqp_port),
            "WARREN_METRICS_HOST": "127.0.0.1", "WARREN_METRICS_PORT": str(node.metrics_port),
            "WARREN_DATA_DIR": str(node.data_dir), "WARREN_LOG_LEVEL": "info",
            "WARREN_NODE_PROCESSES": str(self.processes),
        })
        env.update(self.extra_env)
        return env

    async def launch(self, name: str) -> None:
        node = self.nodes[name]
        log = open(node.directory / "server.log", "ab")
        node.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "warren.broker", env=self._environment(node), stdout=log, stderr=log,
            start_new_session=True)  # a Ctrl-C on the terminal reaches warren-chaos only, which stops the nodes
        log.close()
        node.paused = False

    async def wait_listening(self, name: str, seconds: float = LISTEN_TIMEOUT_SECONDS) -> bool:
        node = self.nodes[name]
        deadline = asyncio.get_running_loop().time() + seconds
        while asyncio.get_running_loop().time() < deadline and node.running:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", node.amqp_port)
                writer.close()
                return True
            except OSError:
                await asyncio.sleep(0.1)  # polling for the listener, with a deadline
        return False

    async def restart_exited(self) -> list[str]:
        """As a supervisor would: nodes that stopped on their own (a full disk makes a
        node's WAL fail, and a node whose Raft cannot write exits non-zero) start again.
        The names restarted."""
        exited = [name for name, node in self.nodes.items() if node.process is not None and not node.running]
        for name in exited:
            print(f"warren-chaos: {name} exited with {self.nodes[name].process.returncode}: restarting it",
                  flush=True)
            await self.launch(name)
            await self.wait_listening(name)
        return exited

    def signal(self, name: str, sig: int) -> None:
        node = self.nodes[name]
        if node.running:
            try:
                os.killpg(node.process.pid, sig)   # its own session: the node and its shards
            except ProcessLookupError:
                return
            node.paused = sig == signal.SIGSTOP or (node.paused and sig != signal.SIGCONT)

    async def kill(self, name: str) -> None:
        self.signal(name, signal.SIGKILL)
        await self.nodes[name].process.wait()

    async def stop_all(self) -> None:
        for node in self.nodes.values():
            if node.running:
                if node.paused:
                    self.signal(node.name, signal.SIGCONT)
                node.process.terminate()
        for node in self.nodes.values():
            if node.process is not None:
                try:
                    await asyncio.wait_for(node.process.wait(), STOP_TIMEOUT_SECONDS)
                except TimeoutError:
                    self.signal(node.name, signal.SIGKILL)
                    await node.process.wait()
        for proxy in self.proxies.values():
            await proxy.close()

    async def api(self, name: str, path: str):
        """GET a node's HTTP API (None when it does not answer)."""
        node = self.nodes[name]
        request = urllib.request.Request(f"http://127.0.0.1:{node.metrics_port}{path}")
        request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())

        def get():
            with urllib.request.urlopen(request, timeout=3) as response:
                return json.loads(response.read())
        try:
            return await asyncio.get_running_loop().run_in_executor(None, get)
        except (OSError, ValueError):
            return None

    async def queue_placement(self, queue: str) -> tuple[str | None, list[str]]:
        """(leader, members) of a queue, as the first answering unpaused node sees it."""
        for name, node in self.nodes.items():
            if node.running and not node.paused:
                for row in await self.api(name, "/api/queues") or []:
                    if row["name"] == queue and row.get("leader"):   # shards `<node>#k`: their nodes
                        return node_of(row["leader"]), [node_of(member) for member in row["members"]]
        return None, []

    async def all_see_each_other(self) -> bool:
        for name in self.nodes:
            overview = await self.api(name, "/api/overview")
            if not overview or sorted(overview.get("running_nodes", [])) != sorted(self.nodes):
                return False
        return True


def node_of(member: str) -> str:
    """The node a queue's member is on: a shard's name is `<node>#k`."""
    node, separator, shard = member.rpartition("#")
    return node if separator and shard.isdigit() else member
