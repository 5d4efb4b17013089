"""One simulated node: the production node shell and core over the simulation's loop, network and disk.

Theory of operation. A `SimNode` builds what `broker.broker.Broker` builds
for the cluster, from the same classes: the `Cluster` shell (its `NodeCore`,
its `NodeRuntime` with the real `RaftSystem`, persistence and entry
locations), the `Metadata` shell with the real metadata machine, and the real
`QuorumQueue`s in a real `VirtualHost`; only the things around them are the
simulation's: the loop (tests/sim/loop.py), the WAL's writer and files
(tests/sim/disk.py), the transport (`SimTransport`, into tests/sim/network.py)
and a broker object holding the few attributes these classes read.

The node's metadata journal (broker/durability.py in production, which
journals the read model's queues and the metadata index applied beside the
WAL) is `SimJournal`, kept across crashes as if synced with each change.
A restart recovers the WAL through `LogStore.recover` into the runtime, as
the server does, restores the journaled queues, and starts the shell.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.sim.disk import WAL_MAX_BYTES, SimCommitter
from tests.sim.loop import SimLoop
from tests.unit.faultyfiles import FaultyFiles
from warren.broker.admin.auth import AccessControl
from warren.broker.node.cluster import Cluster
from warren.broker.node.metadata import Metadata
from warren.broker.routing.vhost import VirtualHost
from warren.config.settings import ClusterNode, Settings
from warren.raft.raft_storage import is_raft_log_id
from warren.storage.wal import LogStore

VHOST = "/"
NODE_GONE_SECONDS = 6.0


@dataclass
class SimJournal:
    """The node's metadata journal: its replicated queues and how far it applied the metadata group."""

    queues: dict[str, tuple[dict, str, list[str]]] = field(default_factory=dict)   # name -> (args, group, members)
    meta_applied_index: int = 0

    def queue_declared(self, vhost: VirtualHost, queue: Any) -> None:
        if getattr(queue, "replicated", False):
            self.queues[queue.name] = (dict(queue.arguments), queue.group, list(queue.members))

    def queue_deleted(self, vhost: VirtualHost, queue: Any) -> None:
        self.queues.pop(queue.name, None)

    def exchange_declared(self, *args: Any) -> None:
        pass

    def exchange_deleted(self, *args: Any) -> None:
        pass

    def binding_changed(self, *args: Any) -> None:
        pass


class SimDurability:
    def __init__(self, committer: SimCommitter, journal: SimJournal) -> None:
        self.committer = committer
        self.journal = journal

    @property
    def meta_applied_index(self) -> int:
        return self.journal.meta_applied_index

    def meta_applied(self, index: int) -> None:
        self.journal.meta_applied_index = index


class NoDefinitions:
    """Users and vhosts do not change in the simulation."""

    def perform(self, effect: Any) -> None:
        pass


class SimBroker:
    """The attributes of `broker.broker.Broker` that the cluster's classes read."""

    def __init__(self, settings: Settings, committer: SimCommitter, journal: SimJournal) -> None:
        self.settings = settings
        self.durability = SimDurability(committer, journal)
        self.vhosts = {VHOST: VirtualHost(VHOST, journal)}
        self.access = AccessControl([])
        self.definitions = NoDefinitions()
        self.peers_up: set[str] = set()

    def peer_up(self, name: str) -> None:
        self.peers_up.add(name)

    def peer_down(self, name: str) -> None:
        self.peers_up.discard(name)


class SimTransport:
    """What the runtime uses of `ClusterTransport`: frames go into the world's network."""

    def __init__(self, network: Any, node: str, peers: list[str]) -> None:
        self.network = network
        self.node = node
        self.peers = set(peers)

    def send(self, peer: str, frame: Any) -> bool:
        return self.network.send(self.node, peer, frame)

    def connected_peers(self) -> list[str]:
        return [peer for peer in sorted(self.peers) if self.network.linked(self.node, peer)]

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
        self.journal = SimJournal()
        self.incarnations = 0
        self.cluster: Cluster | None = None
        self.loop: SimLoop | None = None
        self.committer: SimCommitter | None = None
        self.paused_until = 0.0

    @property
    def up(self) -> bool:
        return self.cluster is not None

    def start(self) -> None:
        world = self.world
        self.incarnations += 1
        self.loop = SimLoop(world.clock)
        store = LogStore(Path(f"/sim/{self.name}/log"), WAL_MAX_BYTES, 4096, files=self.files)
        self.committer = SimCommitter(store, self.loop)
        broker = SimBroker(settings_for(self.name, self.names), self.committer, self.journal)
        rng = random.Random(world.rng.random())
        cluster = Cluster(broker, rng=rng, incarnation=f"{self.name}i{self.incarnations}")
        broker.cluster = cluster
        broker.metadata = Metadata(broker, cluster)
        world.watch(self, cluster)
        store.recover(lambda record, location: cluster.runtime.recover_visit(record, location)
                      if is_raft_log_id(record.log_id) else None)
        vhost = broker.vhosts[VHOST]
        for name, (arguments, group, members) in sorted(self.journal.queues.items()):
            cluster.restore_queue(vhost, name, arguments, group, members)
        cluster.before_start()
        peers = [peer for peer in self.names if peer != self.name]
        cluster.runtime.begin(self.loop, SimTransport(world.network, self.name, peers))
        self.cluster = cluster
        self.loop.call_soon(cluster.host_groups)

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
