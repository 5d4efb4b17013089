"""Prometheus metrics, read from broker state at scrape time.

A custom collector reads counters and queue sizes when Prometheus scrapes,
so the hot path only bumps plain integers. ``broker.admin.http`` serves it on the
broker's own event loop (no thread reads state the loop is changing).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from warren.broker.node.broker import Broker


class BrokerCollector(Collector):
    def __init__(self, broker: "Broker"):
        self.broker = broker

    def collect(self) -> Iterator:
        broker = self.broker
        counters = broker.counters
        yield _gauge("warren_connections", "Open AMQP connections", len(broker.connections))
        yield _gauge("warren_channels", "Open AMQP channels", broker.channel_count)
        yield _gauge("warren_queues", "Declared queues", sum(len(v.queues) for v in broker.vhosts.values()))
        yield _gauge("warren_cluster_peers_up", "Other cluster nodes with an authenticated link",
                     len(broker.peers_up))
        yield _gauge("warren_quorum_enqueues_pending", "Publishes of this node's channels not yet applied by "
                     "their quorum queues (bounded per channel by commands_soft_limit plus the reader credit)",
                     broker.cluster.enqueues_pending)
        for name, help_text, value in (
            ("warren_messages_published", "Messages published by clients", counters.published),
            ("warren_messages_delivered", "Messages delivered to consumers and basic.get", counters.delivered),
            ("warren_messages_acknowledged", "Deliveries acknowledged by clients", counters.acknowledged),
            ("warren_messages_unroutable", "Published messages that reached no queue", counters.unroutable),
            ("warren_channel_errors", "Channels closed by an error", counters.channel_errors),
            ("warren_connections_opened", "Connections accepted", counters.connections_opened),
            ("warren_connections_closed", "Connections closed", counters.connections_closed),
            ("warren_connections_moved_out", "Connections handed to their queue's process (also counted closed)",
             counters.connections_moved_out),
            ("warren_connections_moved_in", "Connections taken from another process of the node (also counted "
             "opened)", counters.connections_moved_in),
        ):
            counter = CounterMetricFamily(name, help_text)
            counter.add_metric([], value)
            yield counter
        ready = GaugeMetricFamily("warren_queue_messages_ready", "Messages ready for delivery",
                                  labels=["vhost", "queue"])
        unacked = GaugeMetricFamily("warren_queue_messages_unacked", "Messages delivered but not yet acknowledged",
                                    labels=["vhost", "queue"])
        consumers = GaugeMetricFamily("warren_queue_consumers", "Consumers on the queue", labels=["vhost", "queue"])
        for vhost in broker.vhosts.values():
            for queue in list(vhost.queues.values()):
                labels = [vhost.name, queue.name]
                ready.add_metric(labels, queue.state.ready_count)
                unacked.add_metric(labels, queue.state.unacked_count)
                consumers.add_metric(labels, queue.consumer_count)
        yield ready
        yield unacked
        yield consumers
        yield from self._raft_metrics()
        yield from self._storage_metrics()

    def _raft_metrics(self) -> Iterator:
        """Per quorum queue replica on this node, labelled by vhost and queue."""
        cluster = self.broker.cluster
        labels = ["vhost", "queue"]
        families = {
            "term": GaugeMetricFamily("warren_raft_term", "Current Raft term of the replica", labels=labels),
            "commit_index": GaugeMetricFamily("warren_raft_commit_index", "Raft commit index", labels=labels),
            "last_applied": GaugeMetricFamily("warren_raft_last_applied", "Last Raft index applied", labels=labels),
            "log_entries": GaugeMetricFamily("warren_raft_log_entries", "Raft log entries held (after the snapshot)",
                                             labels=labels),
            "leader": GaugeMetricFamily("warren_raft_is_leader", "1 if this replica leads its queue, else 0",
                                        labels=labels),
            "member_count": GaugeMetricFamily("warren_raft_members", "Members of the queue's Raft group",
                                              labels=labels),
        }
        runtime = cluster.runtime
        if runtime.system is not None:
            for queue in list(cluster.queues.values()):
                if queue.group not in runtime.groups:
                    continue
                group = runtime.group_metrics(queue.group)
                values = [queue.vhost.name, queue.name]
                families["term"].add_metric(values, group.term)
                families["commit_index"].add_metric(values, group.commit_index)
                families["last_applied"].add_metric(values, group.last_applied)
                families["log_entries"].add_metric(values, group.log_entries)
                families["leader"].add_metric(values, 1 if group.role == "leader" else 0)
                families["member_count"].add_metric(values, group.member_count)
        yield from families.values()
        refused = CounterMetricFamily("warren_raft_replication_refused",
                                      "Replicated entries or snapshots this node refused: its disk had no room "
                                      "for them (the leaders send them again)")
        refused.add_metric([], runtime.system.counters.messages_refused if runtime.system is not None else 0)
        yield refused

    def _storage_metrics(self) -> Iterator:
        broker = self.broker
        store = broker.node_log.store
        yield _gauge("warren_wal_size_bytes", "Size of the current WAL file", store.wal_size_bytes)
        yield _gauge("warren_segments", "Segment files on disk", store.segment_count)
        yield _gauge("warren_segment_bytes", "Bytes in segment files", store.segment_bytes)
        fsyncs = CounterMetricFamily("warren_wal_fsyncs", "fdatasync calls on the WAL (one per batch)")
        fsyncs.add_metric([], store.fsyncs)
        yield fsyncs
        rollovers = CounterMetricFamily("warren_wal_rollovers", "WAL files rolled over into segments")
        rollovers.add_metric([], store.rollovers)
        yield rollovers
        written = CounterMetricFamily("warren_wal_written_bytes", "Bytes appended to the WAL")
        written.add_metric([], store.bytes_written)
        yield written
        yield _gauge("warren_wal_waiting_for_space", "1 while a WAL batch that found the disk full waits to "
                     "be written again (nothing waiting for it is confirmed meanwhile)",
                     int(broker.node_log.committer.waiting_for_space))
        yield _gauge("warren_recovery_seconds", "Time the last start spent recovering from disk",
                     broker.recovery_seconds)
        yield from broker.wal_stats.collect()


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    gauge = GaugeMetricFamily(name, help_text)
    gauge.add_metric([], value)
    return gauge
