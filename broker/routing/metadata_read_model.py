"""Each node's routing read model (`VirtualHost`), fed from the metadata machine.

Why effects and not a diff of the machine's state: the machine already knows
what changed (an exchange, a binding, the auto-delete exchanges a removal
took with it), so it says so in effect records; a diff would copy the whole
state at every entry to find what the machine had in hand. The updates here
do no checks (the machine made them) and write nothing: the metadata group's
log is the record. They are idempotent: the vhost's own cascades (a deleted
queue's bindings, an auto-delete source) may have done part of it already.

What the machine owns: durable exchanges (built-ins included), replicated
queues (`QuorumQueue`: quorum, and durable classic queues on a group of
one), and the bindings whose two ends are such. Exclusive and transient
objects, and bindings with such an end, stay local to the node that made
them, in the same `VirtualHost`.

At start the read model is empty; the group's snapshot (broker/node/metadata_log.py)
and the entries after it build it through the same effects.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from warren.broker.node import metadata_effects as fx
from warren.broker.routing.exchanges import Binding, Exchange, make_exchange

if TYPE_CHECKING:
    from warren.broker.node.broker import Broker
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
def exchange_declared(broker: "Broker", effect: fx.ExchangeDeclared) -> None:
    vhost = broker.vhosts.get(effect.vhost)
    if vhost is None or effect.name in vhost.exchanges:
        return   # a local transient exchange of that name keeps it on this node
    vhost.add_exchange(make_exchange(effect.name, effect.type, True, effect.auto_delete, effect.internal,
                                     effect.arguments))


def exchange_deleted(broker: "Broker", effect: fx.ExchangeDeleted) -> None:
    vhost = broker.vhosts.get(effect.vhost)
    exchange = vhost.exchanges.get(effect.name) if vhost is not None else None
    if owns_exchange(exchange):
        vhost.remove_exchange(exchange)


def binding_changed(broker: "Broker", effect: fx.BindingChanged) -> None:
    vhost = broker.vhosts.get(effect.vhost)
    source = vhost.exchanges.get(effect.source) if vhost is not None else None
    if source is None:
        return
    binding = Binding.make(effect.source, (effect.destination_kind, effect.destination), effect.routing_key,
                           effect.arguments)
    if effect.bound:
        vhost.add_binding(source, binding)
    else:
        vhost.remove_binding(source, binding)
