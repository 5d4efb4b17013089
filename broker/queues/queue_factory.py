"""Where queue objects are made, so a queue's kind is decided in one place.

A queue is replicated (a `QuorumQueue` on a Raft group, broker/queues/quorum.py)
when it is a quorum queue or durable and not exclusive: nothing durable lives
outside a Raft group. Every other queue (exclusive, transient) is a local
`Queue` (broker/queues/queue.py) of the node that declared it.
"""
from __future__ import annotations

from collections.abc import Hashable
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
