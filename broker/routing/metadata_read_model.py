"""Each node's routing read model (`VirtualHost`), fed from the metadata machine.

Why effects and not a diff of the machine's state: the machine already knows
what changed (an exchange, a binding, the auto-delete exchanges a removal
took with it), so it says so in effect records; a diff would copy the whole
state at every entry to find what the machine had in hand. The updates here
do no checks (the machine made them) and write nothing: the metadata group's
log is the record. They are idempotent: the vhost's own cascades (a deleted
queue's bindings, an auto-delete source) may have done part of it already.

What the metadata group owns: durable exchanges (built-ins included),
replicated queues (`QuorumQueue`: quorum, and durable classic queues on a
group of one), and the bindings whose two ends are such. Exclusive and
transient objects, and bindings with such an end, are the node's own: the
same machine decides them, applied locally (broker/node/local_topology.py),
and its effects come here too, into the same `VirtualHost`.

At start the read model is empty; the group's snapshot (broker/node/metadata_log.py)
and the entries after it build it through the same effects.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from warren.broker.node import metadata_effects as fx
from warren.broker.routing.exchanges import Binding, Exchange, make_exchange

if TYPE_CHECKING:
    from warren.broker.routing.vhost import VirtualHost


def owns_exchange(exchange: Exchange | None) -> bool:
    """A durable exchange (a built-in too) is the metadata group's, on one node as in a cluster."""
    return exchange is not None and exchange.durable and exchange.name != ""


def owns_binding(vhost: "VirtualHost", source: str, kind: str, destination: str) -> bool:
    """A binding between two of the group's objects is the group's."""
    if not owns_exchange(vhost.exchanges.get(source)):
        return False
    if kind == "queue":
        queue = vhost.queues.get(destination)
        return queue is not None and queue.replicated
    return owns_exchange(vhost.exchanges.get(destination))


# -- effects on the read model ------------------------------------------------------------------
# `vhosts`: the node's read model by name (the broker's); the same effects come from the metadata
# group's machine and from the node's own (broker/node/local_topology.py).
def exchange_declared(vhosts: dict[str, "VirtualHost"], effect: fx.ExchangeDeclared) -> None:
    vhost = vhosts.get(effect.vhost)
    if vhost is None or effect.name in vhost.exchanges:
        return   # a local transient exchange of that name keeps it on this node
    vhost.add_exchange(make_exchange(effect.name, effect.type, effect.durable, effect.auto_delete, effect.internal,
                                     effect.arguments))


def exchange_deleted(vhosts: dict[str, "VirtualHost"], effect: fx.ExchangeDeleted) -> None:
    """The exchange of that name and durability (a transient one may hide a durable one here)."""
    vhost = vhosts.get(effect.vhost)
    exchange = vhost.exchanges.get(effect.name) if vhost is not None else None
    if exchange is not None and exchange.name != "" and exchange.durable == effect.durable:
        vhost.remove_exchange(exchange)


def binding_changed(vhosts: dict[str, "VirtualHost"], effect: fx.BindingChanged) -> None:
    vhost = vhosts.get(effect.vhost)
    source = vhost.exchanges.get(effect.source) if vhost is not None else None
    if source is None:
        return
    binding = Binding.make(effect.source, (effect.destination_kind, effect.destination), effect.routing_key,
                           effect.arguments)
    if effect.bound:
        vhost.add_binding(source, binding)
    else:
        vhost.remove_binding(source, binding)   # an auto-delete source: the machine's ExchangeDeleted follows


def own_queue_declared(vhosts: dict[str, "VirtualHost"], effect: fx.QueueDeclared) -> None:
    """A queue without a log (a shard's: one the other shards see, broker/node/shard_queues.py);
    a name the read model has already is another shard's queue's proxy, made by the shard link."""
    vhost = vhosts.get(effect.vhost)
    if vhost is None or effect.name in vhost.queues:
        return
    vhost.add_queue(vhost.make_local_queue(vhost, effect.name, dict(effect.arguments), durable=effect.durable,
                                           exclusive_owner=effect.exclusive_owner, auto_delete=effect.auto_delete))


def own_queue_deleted(vhosts: dict[str, "VirtualHost"], effect: fx.QueueDeleted) -> int:
    """Its message count; its consumers are cancelled."""
    vhost = vhosts.get(effect.vhost)
    queue = vhost.queues.get(effect.name) if vhost is not None else None
    if queue is None or queue.replicated:
        return 0
    count = queue.message_count
    vhost.remove_queue(queue)
    return count
