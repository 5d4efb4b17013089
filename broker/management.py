"""Read-only management views of the node, as JSON-ready dicts (for warrenctl).

Pure functions over the broker's state; the HTTP shell serves them under
/api/ with HTTP Basic authentication against the configured users.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from broker.broker import Broker


def overview(broker: "Broker") -> dict[str, Any]:
    settings = broker.settings
    queues = [q for v in broker.vhosts.values() for q in v.queues.values()]
    store = broker.durability.store
    return {
        "node": settings.node_name,
        "version": broker.version,
        "uptime_seconds": round(time.monotonic() - broker.started_monotonic, 3),
        "cluster_nodes": broker.cluster.nodes,
        "running_nodes": sorted(broker.peers_up | {settings.node_name}),
        "listeners": {"amqp": f"{settings.amqp_host}:{settings.amqp_port}",
                      "metrics": f"{settings.metrics_host}:{settings.metrics_port}"},
        "alarms": [a for a, on in (("memory", broker.memory_alarm), ("disk", broker.disk_alarm)) if on],
        "connections": len(broker.connections),
        "channels": broker.channel_count,
        "queues": len(queues),
        "messages_ready": sum(q.state.ready_count for q in queues),
        "messages_unacked": sum(q.state.unacked_count for q in queues),
        "wal": {"size_bytes": store.wal_size_bytes, "segments": store.segment_count,
                "segment_bytes": store.segment_bytes, "fsyncs": store.fsyncs, "rollovers": store.rollovers},
    }


def _placement(broker: "Broker", queue: Any) -> tuple[str | None, list[str]]:
    """(leader, members): a quorum queue's Raft group; a classic queue lives on this node."""
    node = broker.settings.node_name
    if not queue.replicated:
        return node, [node]
    return broker.cluster.leader_hint(queue.group), list(queue.members)


def queues(broker: "Broker") -> list[dict[str, Any]]:
    return [{
        "vhost": vhost.name,
        "name": queue.name,
        "type": queue.queue_type,
        "durable": queue.durable,
        "auto_delete": queue.auto_delete,
        "exclusive": queue.exclusive_owner is not None,
        "leader": _placement(broker, queue)[0],
        "members": _placement(broker, queue)[1],
        "messages_ready": queue.state.ready_count,
        "messages_unacked": queue.state.unacked_count,
        "consumers": queue.consumer_count,
        "arguments": queue.arguments,
    } for vhost in broker.vhosts.values() for queue in vhost.queues.values()]


def exchanges(broker: "Broker") -> list[dict[str, Any]]:
    return [{"vhost": vhost.name, "name": e.name, "type": e.type, "durable": e.durable,
             "auto_delete": e.auto_delete, "internal": e.internal, "arguments": e.arguments}
            for vhost in broker.vhosts.values() for e in vhost.exchanges.values()]


def bindings(broker: "Broker") -> list[dict[str, Any]]:
    return [{"vhost": vhost.name, "source": b.source, "destination_kind": b.destination[0],
             "destination": b.destination[1], "routing_key": b.routing_key, "arguments": b.table}
            for vhost in broker.vhosts.values() for e in vhost.exchanges.values() for b in e.bindings]


def connections(broker: "Broker") -> list[dict[str, Any]]:
    return [{"peer": c.peer, "user": c.user_name, "vhost": c.vhost.name if c.vhost else None,
             "channels": len(c.channels), "blocked": c.blocked,
             "client": str(c.client_properties.get("product", ""))}
            for c in broker.connections]


VIEWS: dict[str, Callable[["Broker"], Any]] = {
    "/api/overview": overview,
    "/api/queues": queues,
    "/api/exchanges": exchanges,
    "/api/bindings": bindings,
    "/api/connections": connections,
}
