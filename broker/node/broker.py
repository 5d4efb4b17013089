"""The node's broker state: vhosts, live connections, counters, reply-to routes."""
from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from warren.broker.admin.auth import AccessControl
from warren.broker.admin.definitions import Definitions
from warren.broker.admin.wal_stats import WalStats
from warren.broker.node import metadata_commands as mc
from warren.broker.node.cluster import Cluster
from warren.broker.node.disk_watch import DiskWatch
from warren.broker.node.local_topology import LocalTopology
from warren.broker.node.metadata import Metadata
from warren.broker.node.shard_link import REPLY, ShardLink
from warren.broker.node.shard_queues import local_queue_factory
from warren.broker.queues.queue_factory import split_shard
from warren.broker.routing.vhost import VirtualHost
from warren.config import Settings
from warren.protocol.constants import CONNECTION_FORCED
from warren.raft.node_log import NodeLog

if TYPE_CHECKING:
    from warren.broker.amqp.channel import Channel
    from warren.broker.amqp.connection import AMQPConnection
    from warren.broker.node.cluster_alarms import ClusterAlarms
    from warren.broker.node.connection_handoff import ConnectionHandoff

VERSION = "0.1.0"
log = structlog.get_logger("warren.broker")


@dataclass(slots=True)
class Counters:
    """Plain integers bumped on the hot path; the metrics collector reads them."""

    published: int = 0
    delivered: int = 0
    acknowledged: int = 0
    unroutable: int = 0
    channel_errors: int = 0
    connections_opened: int = 0
    connections_closed: int = 0
    connections_moved_out: int = 0   # to their queue's shard (broker/amqp/connection_move.py)
    connections_moved_in: int = 0


class Broker:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.version = VERSION
        # The node's WAL, for the Raft runtime alone (raft/node_log.py): every durable
        # thing is a Raft group's, the metadata group's or a queue's.
        self.node_log = NodeLog(settings.data_dir / "log", settings.wal_max_size_bytes,
                                settings.segment_max_entries, settings.wal_no_space_give_up_seconds)
        self.wal_stats = WalStats()
        self.node_log.committer.subscribe(self.wal_stats.on_batch_written)
        # when free space is looked at (sooner near the limit, and after what this node wrote)
        base = split_shard(settings.node_name)[0]
        self.disk_watch = DiskWatch(settings.disk_free_limit_bytes, settings.alarm_check_interval_seconds,
                                    sum(split_shard(node.name)[0] == base for node in settings.cluster_nodes))
        self.node_log.on_bytes_written(self._on_bytes_written)
        # The config's vhosts, users and permissions, provisionally: on an empty metadata
        # log they are the first entry proposed, and once the node's metadata state is
        # seeded (that entry, or the group's snapshot) the log's replace them
        # (broker/node/metadata_log.py). Until then a node that cannot reach the group
        # still lets its administrator in.
        # what connections share with the other shards of a node over several processes, or with the
        # other nodes of a cluster: transient queues and exchanges, direct reply-to (shard_link.py)
        shared = settings.node_shard is not None or len(settings.cluster_nodes) > 1
        # shards of a cluster's nodes number reply addresses as a cluster's nodes do
        one_node = len({split_shard(node.name)[0] for node in settings.cluster_nodes}) <= 1
        self.shard_link = ShardLink(self, settings.node_shard if one_node else None) if shared else None
        # where its connections move to their queues' shards (set by the server, connection_handoff.py)
        self.handoff: ConnectionHandoff | None = None
        self.vhosts = {name: self._new_vhost(name) for name in settings.vhosts}
        self.access = AccessControl.from_settings(settings)
        self.cluster = Cluster(self)
        self.node_log.rollover_source = self.cluster.runtime.prepare_rollover
        self.metadata = Metadata(self, self.cluster)
        # transient and exclusive objects: the metadata machine, applied here alone; it deletes
        # a shared auto-delete exchange only where no other node or shard may bind from it
        alone = len(settings.cluster_nodes) <= 1 and settings.node_shard is None
        self.local_topology = LocalTopology(self.vhosts, lambda: self.metadata.state,
                                            self._propose if alone else None)
        self.definitions = Definitions(self, self.metadata)
        self.recovery_seconds = 0.0   # WAL replay to every group re-applied (`start`)
        self.connections: set["AMQPConnection"] = set()
        self.counters = Counters()
        self._reply_channels: dict[str, "Channel"] = {}
        self.started_monotonic = time.monotonic()
        self.listeners: dict[str, list[str]] = {}   # what the server bound, by listener (broker/node/server.py)
        self.memory_alarm = False   # this node's own
        self.disk_alarm = False
        self.cluster_alarms: frozenset[str] = frozenset()   # this node's and its running peers' (cluster_alarms.py)
        # cluster peers whose authenticated link is up (node-pair failure detection)
        self.peers_up: set[str] = set()

    async def start(self) -> None:
        """Recovery is Raft recovery: replay the WAL into the groups, then host them
        and re-apply what they committed (the metadata group first: it makes the
        read model and the queues), before clients connect."""
        started = time.perf_counter()
        records = self.cluster.runtime.recover()
        await self.cluster.start()
        self.recovery_seconds = time.perf_counter() - started
        log.info("recovery.done", seconds=round(self.recovery_seconds, 3), wal_records=records,
                 queues=sum(len(v.queues) for v in self.vhosts.values()))

    def connection_opened(self, connection: "AMQPConnection") -> None:
        self.connections.add(connection)
        self.counters.connections_opened += 1

    def connection_closed(self, connection: "AMQPConnection") -> None:
        if connection in self.connections:
            self.connections.discard(connection)
            self.counters.connections_closed += 1

    def add_vhost(self, name: str) -> VirtualHost:
        """A new vhost with the default exchanges (amq.direct, ...), as the config's."""
        assert name not in self.vhosts, f"vhost {name} exists"
        vhost = self.vhosts[name] = self._new_vhost(name)
        return vhost

    def _new_vhost(self, name: str) -> VirtualHost:
        vhost = VirtualHost(name)
        if self.shard_link is not None:
            vhost.make_local_queue = local_queue_factory(self.shard_link)
        vhost.drop_own_queue = lambda queue_name: self.local_topology.apply(mc.DeleteQueue(name, queue_name))
        return vhost

    def _propose(self, command: mc.Command) -> None:
        """A change the node's own machine hands to the metadata group; no one waits for its reply."""
        self.metadata.submit(command, lambda _: None)

    def remove_vhost(self, name: str) -> None:
        """Forget a vhost and its permissions (its queues were deleted first)."""
        self.vhosts.pop(name, None)
        self.local_topology.forget_vhost(name)
        self.access.delete_vhost(name)

    def close_connections(self, which: Callable[["AMQPConnection"], bool], reply_text: str,
                          reply_code: int = CONNECTION_FORCED) -> int:
        """Close the matching connections (320 CONNECTION_FORCED by default); how many."""
        closing = [connection for connection in self.connections if which(connection)]
        for connection in closing:
            connection.close(reply_code, reply_text)
        return len(closing)

    @property
    def channel_count(self) -> int:
        return sum(len(c.channels) for c in self.connections)

    # -- direct reply-to ---------------------------------------------------
    def register_reply_channel(self, channel: "Channel") -> str:
        token = secrets.token_urlsafe(18) if self.shard_link is None else self.shard_link.reply_token()
        self._reply_channels[token] = channel
        return token

    def unregister_reply_channel(self, token: str | None) -> None:
        self._reply_channels.pop(token or "", None)

    def deliver_reply(self, routing_key: str, properties: bytes, body: bytes) -> bool:
        """Route a publish to amq.rabbitmq.reply-to.<token>; False if no one waits."""
        token = routing_key.rsplit(".", 1)[-1]
        peer = self.shard_link.reply_peer(token) if self.shard_link is not None else None
        if peer is not None:   # another shard's channel's address: forwarded there
            self.shard_link.send(peer, [REPLY, routing_key, properties, body])
            return True
        channel = self._reply_channels.get(token)
        if channel is None or channel.closed:
            return False
        channel.deliver_reply(properties, body, routing_key)
        return True

    @property
    def queued_message_bytes(self) -> int:
        return sum(q.bytes_in_memory for v in self.vhosts.values() for q in v.queues.values())

    def check_consumer_timeouts(self) -> None:
        timeout_ms = self.settings.consumer_timeout_ms
        if not timeout_ms:
            return
        now = time.monotonic()
        for connection in list(self.connections):
            connection.check_consumer_timeout(now, timeout_ms / 1000)

    def tick_queues(self) -> None:
        """Expire messages past their TTL and queues past x-expires (periodic)."""
        for vhost in self.vhosts.values():
            for queue in list(vhost.queues.values()):
                if queue.state.expiries or queue.expires_ms is not None:
                    queue.tick()

    def _on_bytes_written(self, size: int) -> None:
        if self.disk_watch.wrote(size) and not self.cluster.runtime.stopped:
            asyncio.get_running_loop().call_soon(self.check_alarms)

    def check_alarms(self) -> None:
        """Raise or clear the memory and disk alarms; called periodically (the cluster
        shell, on the node core's clock), and once this node wrote what `disk_watch`
        allows between two looks. Free space is looked at when `disk_watch` says, not on
        every call."""
        memory = self.queued_message_bytes > self.settings.memory_high_watermark_bytes
        disk = self.disk_alarm
        now = time.monotonic()
        if self.disk_watch.due(now):
            try:
                free = self.node_log.free_bytes(self.settings.data_dir)
            except OSError:
                free = 0
            disk = free < self.settings.disk_free_limit_bytes
            self.node_log.roll_over_within(self.disk_watch.looked(free, now))
            if self.disk_watch.may_reserve(free):
                self.node_log.hold_reserve(self.disk_watch.reserve_bytes)
            if disk and not self.cluster.runtime.stopped:
                # what the queues' logs let go leaves the disk now, not at the next WAL rollover
                self.cluster.runtime.persistence.release_space()
        if (memory, disk) == (self.memory_alarm, self.disk_alarm):
            return
        for resource, was, now_on in (("memory", self.memory_alarm, memory), ("disk", self.disk_alarm, disk)):
            if was != now_on:   # RabbitMQ: "disk resource limit alarm set on node ..."
                log.warning("alarm.set" if now_on else "alarm.cleared", resource=resource,
                            node=self.settings.node_name)
        self.memory_alarm, self.disk_alarm = memory, disk
        # the cluster shell tells the peers, and calls on_cluster_alarms back if that changes what blocks
        self.cluster.set_local_alarms([name for name, on in (("memory", memory), ("disk", disk)) if on])

    def on_cluster_alarms(self, alarms: ClusterAlarms) -> None:
        """The resources in alarm on this node or a running peer changed: publishers are
        blocked, or unblocked, on this node too (RabbitMQ's alarms are cluster-wide)."""
        self.cluster_alarms = alarms.take_resources()
        log.info("alarm.cluster", resources=sorted(self.cluster_alarms), peers=alarms.nodes_in_alarm())
        for connection in list(self.connections):
            connection.update_blocked()

    @property
    def alarm(self) -> str | None:
        """The reason publishers are blocked, as RabbitMQ words it, or None: an alarm of
        this node's or of a running peer's."""
        if "disk" in self.cluster_alarms:
            return "low on disk"
        if "memory" in self.cluster_alarms:
            return "low on memory"
        return None

    def peer_up(self, name: str) -> None:
        self.peers_up.add(name)
        if self.shard_link is not None:
            self.shard_link.peer_up(name)
        log.info("cluster.peer_up", peer=name, running=sorted(self.peers_up | {self.settings.node_name}))

    def peer_down(self, name: str) -> None:
        self.peers_up.discard(name)
        if self.shard_link is not None:
            self.shard_link.peer_down(name)
        log.warning("cluster.peer_down", peer=name, running=sorted(self.peers_up | {self.settings.node_name}))

    def shutdown_connections(self) -> None:
        for connection in list(self.connections):
            connection.shutdown()
