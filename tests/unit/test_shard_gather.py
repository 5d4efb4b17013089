"""Shard 0's merge of the shards' HTTP answers into the node's (broker/admin/gather.py)."""
from __future__ import annotations

import json

from prometheus_client.parser import text_string_to_metric_families

from warren.broker.admin.gather import ShardGatherer, merge_connections, merge_metrics, merge_overview, merge_queues

GATHERER = ShardGatherer("warren@h", {1: 40001})

def shard_metrics(connections: int, published: int, consumers: dict[str, int], fast: int, fsyncs: int,
                  fsync_seconds: float) -> bytes:
    """A shard's /metrics, in the families' shapes of broker/admin/metrics.py."""
    queue_lines = "".join(f'warren_queue_consumers{{vhost="/",queue="{name}"}} {count}.0\n'
                          for name, count in consumers.items())
    return (f"# TYPE warren_connections gauge\nwarren_connections {connections}.0\n"
            f"# TYPE warren_queues gauge\nwarren_queues {len(consumers)}.0\n"
            f"# TYPE warren_messages_published counter\nwarren_messages_published_total {published}.0\n"
            f"# TYPE warren_queue_consumers gauge\n{queue_lines}"
            "# TYPE warren_cluster_peers_up gauge\nwarren_cluster_peers_up 1.0\n"
            "# TYPE warren_wal_fsync_seconds histogram\n"
            f'warren_wal_fsync_seconds_bucket{{le="0.001"}} {fast}.0\n'
            f'warren_wal_fsync_seconds_bucket{{le="+Inf"}} {fsyncs}.0\n'
            f"warren_wal_fsync_seconds_count {fsyncs}.0\nwarren_wal_fsync_seconds_sum {fsync_seconds}\n").encode()


SHARD0 = shard_metrics(3, 10, {"a": 2, "b": 1}, 4, 5, 0.01)
SHARD1 = shard_metrics(5, 7, {"a": 1, "b": 0, "c": 4}, 1, 2, 0.02)


def samples(text: bytes) -> dict[tuple, float]:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text.decode()) for sample in family.samples}


def test_metrics_are_summed_per_node_and_taken_at_their_largest_per_queue():
    merged = samples(merge_metrics(GATHERER, SHARD0, {1: SHARD1}))
    assert merged[("warren_connections", ())] == 8
    assert merged[("warren_messages_published_total", ())] == 17
    assert merged[("warren_queues", ())] == 3   # a, b and c: not 2 + 3
    assert merged[("warren_queue_consumers", (("queue", "a"), ("vhost", "/")))] == 2
    assert merged[("warren_queue_consumers", (("queue", "c"), ("vhost", "/")))] == 4
    assert merged[("warren_cluster_peers_up", ())] == 0   # shards are not cluster peers
    assert merged[("warren_wal_fsync_seconds_bucket", (("le", "+Inf"),))] == 7
    assert merged[("warren_wal_fsync_seconds_sum", ())] == 0.03


def test_a_shard_that_did_not_answer_is_left_out():
    merged = samples(merge_metrics(GATHERER, SHARD0, {1: None}))
    assert merged[("warren_connections", ())] == 3


def queue_row(name: str, members: list[str], ready: int) -> dict:
    return {"vhost": "/", "name": name, "members": members, "messages_ready": ready, "messages_unacked": 0}


def test_connections_carry_their_shard_and_queues_come_from_their_member():
    rows = json.loads(merge_connections(GATHERER, json.dumps([{"peer": "p0"}]).encode(),
                                        {1: json.dumps([{"peer": "p1"}, {"peer": "p2"}]).encode()}))
    assert [(row["peer"], row["shard"]) for row in rows] == [("p0", 0), ("p1", 1), ("p2", 1)]
    on_one = [queue_row("q", ["warren@h#1"], 0)]
    queues = json.loads(merge_queues(GATHERER, json.dumps(on_one).encode(),
                                     {1: json.dumps([queue_row("q", ["warren@h#1"], 9)]).encode()}))
    assert queues == [{**queue_row("q", ["warren@h"], 9), "leader": None, "leader_shard": None,
                       "member_shards": ["warren@h#1"]}]


def test_a_queues_leader_and_members_are_named_by_node_as_rabbitmqs_with_their_shards_beside():
    row = {**queue_row("q", ["a@h#1", "b@h#1!12", "c@h#1"], 0), "leader": "b@h#1!12"}
    (named,) = json.loads(merge_queues(GATHERER, json.dumps([row]).encode(), {1: b"[]"}))
    assert (named["leader"], named["members"]) == ("b@h", ["a@h", "b@h", "c@h"])
    assert (named["leader_shard"], named["member_shards"]) == ("b@h#1!12", ["a@h#1", "b@h#1!12", "c@h#1"])


def test_the_overview_is_the_nodes():
    def overview(connections: int) -> bytes:
        return json.dumps({"node": "x", "connections": connections, "channels": 1, "quorum_enqueues_pending": 0,
                           "alarms": [], "cluster_nodes": [], "running_nodes": [],
                           "wal": dict.fromkeys(("size_bytes", "segments", "segment_bytes", "fsyncs", "rollovers"),
                                                1)}).encode()
    merged = json.loads(merge_overview(GATHERER, overview(2), {1: overview(3)}, [queue_row("q", [], 4)]))
    assert (merged["node"], merged["connections"], merged["channels"]) == ("warren@h", 5, 2)
    assert (merged["queues"], merged["messages_ready"], merged["wal"]["fsyncs"]) == (1, 4, 2)
    assert [(shard["shard"], shard["running"]) for shard in merged["shards"]] == [(0, True), (1, True)]
    alone = json.loads(merge_overview(GATHERER, overview(2), {1: None}, []))
    assert [(shard["shard"], shard["running"]) for shard in alone["shards"]] == [(0, True), (1, False)]
