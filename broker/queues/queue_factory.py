"""Where queue objects are made, so a queue's kind and its members are decided in one place.

A queue is replicated (a `QuorumQueue` on a Raft group, broker/queues/quorum.py)
when it is a quorum queue or durable and not exclusive: nothing durable lives
outside a Raft group. Every other queue (exclusive, transient) is a local
`Queue` (broker/queues/queue.py) of the node that declared it. The declaring
node chooses a replicated queue's members (`place_members`) and the metadata
group records them with the queue.
"""
from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from warren.broker.queues.queue import Queue
from warren.broker.queues.quorum import QuorumQueue

if TYPE_CHECKING:
    from warren.broker.node.cluster import Cluster
    from warren.broker.routing.vhost import VirtualHost


@dataclass(frozen=True)
class Placement:
    """The Raft group a replicated queue lives on, as the metadata group placed it."""
    cluster: "Cluster"
    group: str
    members: tuple[str, ...]


def is_replicated(durable: bool, exclusive: bool, arguments: dict) -> bool:
    return arguments.get("x-queue-type") == "quorum" or (durable and not exclusive)


def place_members(arguments: dict, node: str, nodes: Sequence[str], default_size: int) -> list[str]:
    """The Raft group of a new replicated queue declared on `node`: for a quorum
    queue `node` plus the next of the cluster's sorted `nodes` (wrapping),
    x-quorum-initial-group-size or `default_size` of them, at most the cluster;
    any other durable queue is a group of one on `node`, reachable from every node."""
    if arguments.get("x-queue-type") != "quorum":
        return [node]
    wanted = min(arguments.get("x-quorum-initial-group-size") or default_size, len(nodes))
    start = nodes.index(node)
    return [nodes[(start + i) % len(nodes)] for i in range(wanted)]


def least_loaded_shard(node: str, shards: Sequence[str], hosted: Mapping[str, int]) -> str:
    """Where a node over several processes puts a new queue's one member: the shard
    hosting the fewest replicated queues (`hosted`, by shard name), the declaring
    `node` among equals. Connections move to their queue's shard (docs/multi-process.md
    section 11), so the queues' spread is the work's."""
    fewest = min(hosted.get(shard, 0) for shard in shards)
    if hosted.get(node, 0) == fewest:
        return node
    return next(shard for shard in shards if hosted.get(shard, 0) == fewest)


def make_queue(vhost: "VirtualHost", name: str, arguments: dict, *, durable: bool,
               exclusive_owner: Hashable | None, auto_delete: bool,
               placement: Placement | None = None) -> Queue:
    """A replicated queue when it has a placement (it must then be one), else a local one."""
    if placement is None:
        return Queue(vhost, name, durable, exclusive_owner, auto_delete, arguments)
    if not is_replicated(durable, exclusive_owner is not None, arguments):
        raise ValueError(f"queue '{name}' is placed on group {placement.group} but is not replicable")
    return QuorumQueue(vhost, name, arguments, placement.cluster, placement.group, list(placement.members),
                       auto_delete)
