"""One simulated node: the production node shell and core over the simulation's loop, network and disk.

Theory of operation. A `SimNode` builds what `broker.broker.Broker` builds
for the cluster, from the same classes: the `Cluster` shell (its `NodeCore`,
its `NodeRuntime` with the real `RaftSystem`, persistence and entry
locations), the `Metadata` shell with the real metadata machine, and the real
`QuorumQueue`s in a real `VirtualHost`; only the things around them are the
simulation's: the loop (tests/sim/loop.py), the WAL's writer and files
(tests/sim/disk.py), the transport (`SimTransport`, into tests/sim/network.py)
and a broker object holding the few attributes these classes read.

As in production the WAL is the node's only record (raft/node_log.py): a
restart is Raft recovery (`RaftRuntime.recover`), which installs the
metadata group's snapshot (the read model and its queues) and re-applies
the committed entries after it; on an empty metadata log the node proposes
the config's definitions as its first entry, as `Cluster.start` does.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from tests.sim.disk import WAL_MAX_BYTES, SimCommitter
from tests.sim.loop import SimLoop
from tests.unit.faultyfiles import FaultyFiles
from warren.broker.admin.auth import AccessControl
from warren.broker.node.cluster import Cluster
from warren.broker.node.disk_watch import DiskWatch
from warren.broker.node.local_topology import LocalTopology
from warren.broker.node.metadata import Metadata
from warren.broker.routing.vhost import VirtualHost
from warren.config.settings import ClusterNode, Settings
from warren.storage.wal import LogStore

VHOST = "/"
NODE_GONE_SECONDS = 6.0


class SimNodeLog:
    """What the node shell uses of raft/node_log.py's `NodeLog`: the committer over the node's WAL."""

    def __init__(self, committer: SimCommitter) -> None:
        self.committer = committer


class NoDefinitions:
    """Users and vhosts do not change in the simulation."""

    def perform(self, effect: Any) -> None:
        pass

    def take(self, state: Any) -> None:
        pass


class SimBroker:
    """The attributes of `broker.broker.Broker` that the cluster's classes read."""

    def __init__(self, settings: Settings, committer: SimCommitter) -> None:
        self.settings = settings
        self.node_log = SimNodeLog(committer)
        self.vhosts = {VHOST: VirtualHost(VHOST)}
        self.access = AccessControl([])
        self.definitions = NoDefinitions()
        self.peers_up: set[str] = set()
        self.shard_link = None   # a node on one process
        self.connections: set = set()   # clients call the queues directly: no AMQP connection (the metadata fence)
        # never told of a look at free space: takes in whatever leaders replicate (no resource limits here)
        self.disk_watch = DiskWatch(settings.disk_free_limit_bytes, settings.alarm_check_interval_seconds)

    def peer_up(self, name: str) -> None:
        self.peers_up.add(name)

    def peer_down(self, name: str) -> None:
        self.peers_up.discard(name)

    def check_alarms(self) -> None:
        pass   # no resource limits in the simulation

    def tick_queues(self) -> None:
        pass   # no message TTL or x-expires in the simulation

    def check_consumer_timeouts(self) -> None:
        pass


class SimTransport:
    """What the runtime uses of `ClusterTransport`: frames go into the world's network."""

    def __init__(self, network: Any, node: str, peers: list[str]) -> None:
        self.network = network
        self.node = node
        self.peers = set(peers)

    def send(self, peer: str, frame: Any, now: bool = False) -> bool:
        return self.network.send(self.node, peer, frame)   # `now`: the simulated network has no loop turn to wait for

    def connected_peers(self) -> list[str]:
        return [peer for peer in sorted(self.peers) if self.network.linked(self.node, peer)]

    def drop_links(self, reason: str) -> None:
        self.network.drop_links(self.node)

    async def stop(self) -> None:
        pass


def settings_for(name: str, names: list[str]) -> Settings:
    return Settings(node_name=name, cluster_nodes=[ClusterNode(name=n, host="sim") for n in names],
                    data_dir=Path(f"/sim/{name}"), cluster_node_gone_seconds=NODE_GONE_SECONDS,
                    quorum_cluster_size=3, wal_max_size_bytes=WAL_MAX_BYTES, users=[], vhosts=[VHOST])


class SimNode:
    """A node's life: started from its disk, run, crashed (its memory lost), started again."""

    def __init__(self, name: str, names: list[str], world: Any) -> None:
        self.name = name
        self.names = names
        self.world = world
        self.files = FaultyFiles(world.rng.randrange(1 << 30), mkdir_durable=True)
        self.incarnations = 0
        self.cluster: Cluster | None = None
        self.loop: SimLoop | None = None
        self.committer: SimCommitter | None = None
        self.paused_until = 0.0
        # as the server: clients are let in once the metadata catch-up barrier applied, or
        # after cluster_startup_catch_up_seconds without it (Cluster.start)
        self.caught_up = False
        self.catch_up_deadline = 0.0

    @property
    def up(self) -> bool:
        return self.cluster is not None

    def start(self) -> None:
        world = self.world
        self.incarnations += 1
        self.loop = SimLoop(world.clock)
        store = LogStore(Path(f"/sim/{self.name}/log"), WAL_MAX_BYTES, 4096, files=self.files)
        self.committer = SimCommitter(store, self.loop)
        broker = SimBroker(settings_for(self.name, self.names), self.committer)
        rng = random.Random(world.rng.random())
        cluster = Cluster(broker, rng=rng, incarnation=f"{self.name}i{self.incarnations}")
        broker.cluster = cluster
        broker.metadata = Metadata(broker, cluster)
        broker.local_topology = LocalTopology(broker.vhosts, lambda: broker.metadata.state,
                                              lambda command: broker.metadata.submit(command, lambda _: None))
        world.watch(self, cluster)
        cluster.runtime.recover()
        peers = [peer for peer in self.names if peer != self.name]
        cluster.runtime.begin(self.loop, SimTransport(world.network, self.name, peers))
        self.cluster = cluster
        self.caught_up = False
        self.catch_up_deadline = world.clock.now + cluster.settings.cluster_startup_catch_up_seconds
        self.loop.call_soon(self.host_groups, cluster, self.incarnations)

    def host_groups(self, cluster: Cluster, incarnation: int) -> None:
        """`Cluster.start` after the runtime's: the catch-up barrier (an empty metadata
        log's seed, else a no-op entry) is proposed; clients wait for it (`accepting`)."""
        seed = cluster.host_groups()

        def caught_up() -> None:
            if self.incarnations == incarnation:
                self.caught_up = True
        cluster.metadata.barrier(caught_up, seed)

    @property
    def accepting(self) -> bool:
        """Clients may connect: up, and past the start-up catch-up (as the server's listeners)."""
        return self.up and (self.caught_up or self.world.clock.now >= self.catch_up_deadline)

    def crash(self) -> None:
        """The process dies and the power goes: memory, unwritten batches and unsynced bytes are lost."""
        self.cluster = None
        self.loop = None
        self.committer = None
        self.files.crash(self.world.rng)

    @property
    def vhost(self) -> VirtualHost:
        assert self.cluster is not None
        return self.cluster.broker.vhosts[VHOST]
