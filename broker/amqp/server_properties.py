"""What Warren says of itself in connection.start (RabbitMQ's capabilities table)."""
from __future__ import annotations


def server_properties(version: str, node_name: str) -> dict:
    return {
        "product": "Warren",
        "version": version,
        "platform": "Python",
        "cluster_name": node_name,
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

