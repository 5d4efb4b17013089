"""What Warren says of itself in connection.start (RabbitMQ's capabilities table)."""
from __future__ import annotations

from collections.abc import Sequence

from warren.broker.queues.queue_factory import split_shard


def cluster_name(node_name: str, cluster_nodes: Sequence[str]) -> str:
    """RabbitMQ's `cluster_name`: one name for the whole cluster, its first node's (every
    node is configured with the same list); a node alone is its own name. A node's shards,
    `<node>#k`, are that node."""
    return split_shard(cluster_nodes[0] if cluster_nodes else node_name)[0]


def server_properties(version: str, node_name: str, cluster_nodes: Sequence[str]) -> dict:
    """`node` is the process that accepted the connection (`<node>#k` on a node of several
    processes); RabbitMQ sends no such key and clients ignore what they do not know."""
    return {
        "product": "Warren",
        "version": version,
        "platform": "Python",
        "cluster_name": cluster_name(node_name, cluster_nodes),
        "node": node_name,
        "copyright": "Warren developers",
        "information": "An AMQP 0-9-1 broker with Raft quorum queues",
        "capabilities": {
            "publisher_confirms": True,
            "exchange_exchange_bindings": True,
            "basic.nack": True,
            "consumer_cancel_notify": True,
            "connection.blocked": True,
            "consumer_priorities": True,
            "authentication_failure_close": True,
            "per_consumer_qos": True,
            "direct_reply_to": True,
        },
    }

