"""Where queue objects are made, so a queue's kind and its members are decided in one place.

A queue is replicated (a `QuorumQueue` on a Raft group, broker/queues/quorum.py)
when it is a quorum queue or durable and not exclusive: nothing durable lives
outside a Raft group. Every other queue (exclusive, transient) is a local
`Queue` (broker/queues/queue.py) of the node that declared it. The declaring
node chooses a replicated queue's members (`place_members`) and the metadata
group records them with the queue.
"""
from __future__ import annotations

from collections import Counter
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


def split_shard(name: str) -> tuple[str, int | None]:
    """(`node`, k) of a shard's name `<node>#k` (docs/multi-process.md); (name, None) otherwise."""
    node, separator, shard = name.rpartition("#")
    return (node, int(shard)) if separator and shard.isdigit() else (name, None)


def place_members(arguments: dict, node: str, nodes: Sequence[str], default_size: int,
                  hosted: Mapping[str, int] | None = None) -> list[str]:
    """The Raft group of a new replicated queue declared on `node`: for a quorum
    queue `node` plus the next of the cluster's sorted `nodes` (wrapping),
    x-quorum-initial-group-size or `default_size` of them, at most the cluster;
    any other durable queue is a group of one on `node`, reachable from every node.

    On nodes over several processes (`nodes` are shards, `<node>#k`) the members are
    one shard index on distinct nodes (replicas on one disk would buy nothing): the
    index hosting the fewest replicated queues over the cluster when `hosted` (queues
    per shard) is given, the declaring shard's among equals; else the declaring shard's."""
    home, shard = split_shard(node)
    machines, suffix = list(nodes), ""
    if shard is not None:
        machines = list(dict.fromkeys(split_shard(name)[0] for name in nodes))
        if hosted is not None:
            shard = _least_loaded_index(shard, nodes, hosted)
        suffix = f"#{shard}"
    if arguments.get("x-queue-type") != "quorum":
        return [home + suffix]
    wanted = min(arguments.get("x-quorum-initial-group-size") or default_size, len(machines))
    start = machines.index(home)
    return [machines[(start + i) % len(machines)] + suffix for i in range(wanted)]


def _least_loaded_index(declaring: int, shards: Sequence[str], hosted: Mapping[str, int]) -> int:
    """The shard index hosting the fewest replicated queues over the cluster, `declaring` among equals."""
    indexes = sorted({index for _, index in map(split_shard, shards) if index is not None})
    load = Counter[int]()
    for name, count in hosted.items():
        index = split_shard(name)[1]
        if index is not None:
            load[index] += count
    fewest = min(load[index] for index in indexes)
    return declaring if load[declaring] == fewest else next(index for index in indexes if load[index] == fewest)


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
