"""The node's numbers when it runs over several processes (docs/multi-process.md):
shard 0 serves the node's HTTP port and, for `/metrics` and the views in
`MERGED`, asks every other shard for its own answer over the shard's loopback
HTTP port (the same request, the same credentials) and merges them.

Merging: counters, histograms and per-node gauges are summed; a series
labelled with a queue is taken at its largest (every shard knows every
replicated queue, but only its member holds the messages, and a member's
consumer count includes the consumers on other shards); `warren_queues` counts
the distinct queues. Connections are listed with their shard; a queue is
listed from its member shard, its `leader` and `members` named by node as
RabbitMQ names them (its shards beside: `leader_shard`, `member_shards`). A
shard that does not answer (restarting) is left out and shown as not running
in `/api/overview`'s `shards`.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from warren.broker.admin import management
from warren.broker.queues.queue_factory import split_shard

if TYPE_CHECKING:
    from warren.broker.node.broker import Broker

GATHER_TIMEOUT_SECONDS = 3.0
SUMMED_OVERVIEW = ("connections", "channels", "quorum_enqueues_pending")
SUMMED_WAL = ("size_bytes", "segments", "segment_bytes", "fsyncs", "rollovers")
# Series merged at their largest rather than summed: the shards recover at the same time.
LARGEST = frozenset({"warren_recovery_seconds"})
# The node's links to other nodes: counted by node (`ShardGatherer.peer_nodes_up`), not by shard.
PEERS_UP = "warren_cluster_peers_up"


class ShardGatherer:
    def __init__(self, node_name: str, ports: dict[int, int]) -> None:
        self.node_name = node_name        # the node's own name, without `#k`
        self.ports = ports                # shard -> its loopback HTTP port (shards 1..S-1)
        self.peer_nodes_up = 0            # other nodes of a cluster with a shard linked to shard 0

    def nodes(self, shards: list[str]) -> list[str]:
        """The nodes that shards (`<node>#k`) are of, in their order."""
        return list(dict.fromkeys(split_shard(shard)[0] for shard in shards))

    async def merge(self, broker: "Broker", path: str, head: bytes, body: bytes) -> bytes:
        """Shard 0's answer to `path`, made the node's (unchanged for other paths)."""
        merge = MERGED.get(path)
        if merge is None and path != "/api/overview":
            return body
        authorization = _header(head, b"authorization")
        self.peer_nodes_up = len(set(self.nodes(sorted(broker.peers_up))) - {self.node_name})
        others = await self._gather(path, authorization)
        if path == "/api/overview":   # its queue numbers come from the merged queue list
            queues = merge_queues(self, json.dumps(management.queues(broker), default=str).encode(),
                                  await self._gather("/api/queues", authorization))
            return merge_overview(self, body, others, json.loads(queues))
        return merge(self, body, others)

    async def _gather(self, path: str, authorization: bytes | None) -> dict[int, bytes | None]:
        answers = await asyncio.gather(*(self._fetch(port, path, authorization) for port in self.ports.values()))
        return dict(zip(self.ports, answers))

    async def _fetch(self, port: int, path: str, authorization: bytes | None) -> bytes | None:
        request = b"GET " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        if authorization is not None:
            request += b"Authorization: " + authorization + b"\r\n"
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port),
                                                    GATHER_TIMEOUT_SECONDS)
            try:
                writer.write(request + b"Connection: close\r\n\r\n")
                response = await asyncio.wait_for(reader.read(), GATHER_TIMEOUT_SECONDS)
            finally:
                writer.close()
        except (OSError, TimeoutError):
            return None
        head, _, body = response.partition(b"\r\n\r\n")
        return body if head.startswith(b"HTTP/1.1 200") else None

    def shard_node(self, shard: int) -> str:
        return f"{self.node_name}#{shard}"


def _header(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return None


def _json_answers(own: bytes, others: dict[int, bytes | None]) -> dict[int, Any]:
    return {0: json.loads(own), **{shard: json.loads(body) for shard, body in others.items() if body is not None}}


def merge_connections(gatherer: ShardGatherer, own: bytes, others: dict[int, bytes | None]) -> bytes:
    rows = [{**row, "shard": shard} for shard, answer in sorted(_json_answers(own, others).items()) for row in answer]
    return json.dumps(rows, default=str).encode()


def _merged_queue_rows(answers: dict[int, Any], gatherer: ShardGatherer) -> list[dict]:
    """One row per queue, from its member shard."""
    rows: dict[tuple[str, str], dict] = {}
    for shard, answer in sorted(answers.items()):
        for row in answer:
            key = (row["vhost"], row["name"])
            if key not in rows or gatherer.shard_node(shard) in row.get("members", ()):
                rows[key] = row
    return list(rows.values())


def merge_queues(gatherer: ShardGatherer, own: bytes, others: dict[int, bytes | None]) -> bytes:
    rows = [_named_by_node(row) for row in _merged_queue_rows(_json_answers(own, others), gatherer)]
    return json.dumps(rows, default=str).encode()


def _named_by_node(row: dict) -> dict:
    leader, members = row.get("leader"), row.get("members", [])
    return {**row, "leader": management.member_node(leader) if leader else leader,
            "members": [management.member_node(member) for member in members],
            "leader_shard": leader, "member_shards": members}


def merge_overview(gatherer: ShardGatherer, own: bytes, others: dict[int, bytes | None],
                   queues: list[dict]) -> bytes:
    answers = _json_answers(own, others)
    node = dict(answers[0])
    node["queues"] = len(queues)
    node["messages_ready"] = sum(queue["messages_ready"] for queue in queues)
    node["messages_unacked"] = sum(queue["messages_unacked"] for queue in queues)
    for key in SUMMED_OVERVIEW:
        node[key] = sum(answer[key] for answer in answers.values())
    node["wal"] = {key: sum(answer["wal"][key] for answer in answers.values()) for key in SUMMED_WAL}
    node["alarms"] = sorted({alarm for answer in answers.values() for alarm in answer["alarms"]})
    node["node"] = gatherer.node_name
    node["cluster_nodes"] = gatherer.nodes(node["cluster_nodes"])
    node["running_nodes"] = gatherer.nodes(node["running_nodes"])
    node["shards"] = [{"shard": shard, "node": gatherer.shard_node(shard), "running": shard in answers,
                       **({key: answers[shard][key] for key in SUMMED_OVERVIEW} if shard in answers else {})}
                      for shard in [0, *gatherer.ports]]
    return json.dumps(node, default=str).encode()


def merge_metrics(gatherer: ShardGatherer, own: bytes, others: dict[int, bytes | None]) -> bytes:
    texts = [own.decode(), *(body.decode() for body in others.values() if body is not None)]
    families: dict[str, tuple[str, str, dict[tuple, Sample]]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            kind, help_text, samples = families.setdefault(family.name, (family.type, family.documentation, {}))
            name = family.name
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                before = samples.get(key)
                if before is None:
                    samples[key] = sample
                else:
                    combine = max if "queue" in sample.labels or name in LARGEST else _add
                    samples[key] = before._replace(value=combine(before.value, sample.value))
    queues = {(labels.get("vhost"), labels["queue"]) for _, _, merged in families.values()
              for labels in (sample.labels for sample in merged.values()) if "queue" in labels}
    lines = []
    for name, (kind, help_text, samples) in families.items():
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for sample in samples.values():
            value = sample.value
            if name == "warren_queues":
                value = len(queues)
            elif name == PEERS_UP:
                value = gatherer.peer_nodes_up
            lines.append(_sample_line(sample, value))
    return ("\n".join(lines) + "\n").encode()


def _add(a: float, b: float) -> float:
    return a + b


def _sample_line(sample: Sample, value: float) -> str:
    labels = ",".join(f'{key}="{_escape(text)}"' for key, text in sample.labels.items())
    number = floatToGoString(value)
    return f"{sample.name}{{{labels}}} {number}" if labels else f"{sample.name} {number}"


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


MERGED: dict[str, Callable[[ShardGatherer, bytes, dict[int, bytes | None]], bytes]] = {
    "/metrics": merge_metrics,
    "/": merge_metrics,
    "/api/connections": merge_connections,
    "/api/queues": merge_queues,
}
