"""Each node's routing read model (`VirtualHost`), fed from the metadata machine.

Why effects and not a diff of the machine's state: the machine already knows
what changed (an exchange, a binding, the auto-delete exchanges a removal
took with it), so it says so in effect records; a diff would copy the whole
state at every entry to find what the machine had in hand. The updates here
do no checks (the machine made them) and journal what they change in the
node's metadata log (broker/node/durability.py) through the vhost's journal, as
before. They are idempotent: the vhost's own cascades (a deleted queue's
bindings, an auto-delete source) may have done part of it already.

What the machine owns: durable exchanges (built-ins included), replicated
queues (`QuorumQueue`: quorum, and durable classic queues on a group of
one), and the bindings whose two ends are such. Exclusive, auto-delete and
transient objects, and bindings with such an end, stay local to the node
that made them, in the same `VirtualHost`.

At start the node rebuilds the machine's state from this read model as
recovery left it (`state_from_read_model`): the metadata log holds the
group's changes up to `meta_applied`, and the group re-applies only later
entries. The metadata group has no Raft snapshot yet, and the journal's
seed of users and vhosts is not in the group's log, so the state cannot be
rebuilt by folding the group's log alone.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from warren.broker.node import metadata_effects as fx
from warren.broker.node.metadata_state import ExchangeRecord, MetaState, QueueRecord, UserRecord, VhostRecord
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


def state_from_read_model(broker: "Broker") -> MetaState:
    state = MetaState()
    for name, vhost in broker.vhosts.items():
        state.vhosts[name] = _vhost_record(vhost)
    state.users = {name: UserRecord(user.password_hash, tuple(user.tags)) for name, user in broker.access.users.items()}
    state.permissions = {key: (p.configure, p.write, p.read) for key, p in broker.access.permissions.items()}
    return state


def _vhost_record(vhost: "VirtualHost") -> VhostRecord:
    record = VhostRecord()
    for exchange in vhost.exchanges.values():
        if owns_exchange(exchange):
            record.exchanges[exchange.name] = ExchangeRecord(exchange.type, exchange.auto_delete, exchange.internal,
                                                             dict(exchange.arguments))
    for queue in vhost.queues.values():
        if queue.replicated:
            record.queues[queue.name] = QueueRecord(dict(queue.arguments), queue.group, list(queue.members))
    for name in record.exchanges:
        for binding in vhost.exchanges[name].bindings:
            kind, destination = binding.destination
            if owns_binding(vhost, name, kind, destination):
                record.bindings.add(binding)
    return record


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
