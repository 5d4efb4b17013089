"""Topology changes that go through the metadata Raft group (see broker/cluster.py).

The channel checks a change against its node's vhost first (so that mistakes
get RabbitMQ's reply at once), then submits it; every node applies the
committed change to its own vhost, the asking channel replies when its node
has. What goes through the group: quorum queue declarations and deletions
(always: the queue is a Raft group whose members every node must know) and,
in a cluster of several nodes, durable exchanges and the bindings between
durable exchanges and quorum queues. Everything else (classic queues, their
bindings, transient exchanges) stays on the node where it was made.

Commands: ["qdecl", vhost, name, arguments, members, origin], ["qdel", vhost,
name], ["xdecl", vhost, name, type, auto_delete, internal, arguments],
["xdel", vhost, name, if_unused], ["bind" | "unbind", vhost, source,
destination kind, destination, routing_key, arguments, class_id, method_id].
An apply that fails answers [reply_code, reply_text, class_id, method_id].
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import msgpack
import structlog
from pamqp import commands as spec

from broker.quorum import QuorumQueue
from protocol.errors import ChannelError

if TYPE_CHECKING:
    from broker.broker import Broker
    from broker.cluster import Cluster
    from broker.vhost import VirtualHost

log = structlog.get_logger("warren.metadata")


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True, default=str)


def error_reply(error: ChannelError) -> list:
    return [error.reply_code, error.text, error.class_id, error.method_id]


def raise_if_error(result: Any) -> None:
    if isinstance(result, list) and len(result) == 4:
        code, text, class_id, method_id = result
        raise ChannelError(code, text, class_id, method_id)


class Metadata:
    def __init__(self, broker: "Broker", cluster: "Cluster") -> None:
        self.broker = broker
        self.cluster = cluster
        cluster.meta_handlers.update({
            "qdecl": self._apply_queue_declare, "qdel": self._apply_queue_delete,
            "xdecl": self._apply_exchange_declare, "xdel": self._apply_exchange_delete,
            "bind": self._apply_binding, "unbind": self._apply_binding,
        })

    # -- asked by channels ---------------------------------------------------------
    def submit(self, command: list, on_done: Callable[[Any], None]) -> None:
        from broker.cluster import META
        self.cluster.submit(META, _pack(command), on_done)

    def replicates_exchange(self, durable: bool) -> bool:
        return self.cluster.multi_node and durable

    def replicates_binding(self, vhost: "VirtualHost", source: str, kind: str, destination: str) -> bool:
        if kind == "queue":
            return isinstance(vhost.queues.get(destination), QuorumQueue)
        exchange = vhost.exchanges.get(source)
        target = vhost.exchanges.get(destination)
        return (self.cluster.multi_node and exchange is not None and exchange.durable
                and target is not None and target.durable)

    # -- applied on every node -------------------------------------------------------
    def _vhost(self, name: str) -> "VirtualHost | None":
        return self.broker.vhosts.get(name)

    def _apply_queue_declare(self, command: list, index: int) -> Any:
        _, vhost_name, name, arguments, members, origin = command
        vhost = self._vhost(vhost_name)
        if vhost is None or name in vhost.queues:
            return None
        cluster = self.cluster
        group = f"q:{vhost_name}:{name}:{index}"
        queue = QuorumQueue(vhost, name, arguments, cluster, group, members)
        cluster.queues[group] = queue
        vhost.add_queue(queue)
        vhost.journal.queue_declared(vhost, queue)
        if cluster.node in members and cluster.runtime.add_group(group, members):
            locator = arguments.get("x-queue-leader-locator", "client-local")
            leader = origin if locator == "client-local" and origin in members else \
                members[index % len(members)]
            if leader == cluster.node:
                cluster.runtime.campaign(group)
        return None

    def _apply_queue_delete(self, command: list, index: int) -> Any:
        _, vhost_name, name = command
        vhost = self._vhost(vhost_name)
        queue = vhost.queues.get(name) if vhost is not None else None
        if not isinstance(queue, QuorumQueue):
            return None
        count = queue.message_count
        vhost.delete_queue_now(queue)
        self.cluster.queues.pop(queue.group, None)
        if queue.group in self.cluster.runtime.groups:
            self.cluster.runtime.remove_group(queue.group)
        return count

    def _apply_exchange_declare(self, command: list, index: int) -> Any:
        _, vhost_name, name, type_, auto_delete, internal, arguments = command
        vhost = self._vhost(vhost_name)
        if vhost is None:
            return None
        try:
            vhost.declare_exchange(spec.Exchange.Declare(
                exchange=name, exchange_type=type_, durable=True, auto_delete=auto_delete, internal=internal,
                arguments=arguments))
        except ChannelError as error:
            return error_reply(error)
        return None

    def _apply_exchange_delete(self, command: list, index: int) -> Any:
        _, vhost_name, name, if_unused = command
        vhost = self._vhost(vhost_name)
        if vhost is None:
            return None
        try:
            vhost.delete_exchange(name, if_unused)
        except ChannelError as error:
            return error_reply(error)
        return None

    def _apply_binding(self, command: list, index: int) -> Any:
        kind, vhost_name, source, destination_kind, destination, routing_key, arguments, class_id, method_id = command
        vhost = self._vhost(vhost_name)
        if vhost is None:
            return None
        try:
            if kind == "bind":
                vhost.bind(source, (destination_kind, destination), routing_key, arguments, None, class_id, method_id)
            else:
                vhost.unbind(source, (destination_kind, destination), routing_key, arguments, None,
                             class_id, method_id)
        except ChannelError as error:
            return error_reply(error)
        return None
