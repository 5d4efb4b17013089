"""The effects that take a node from one metadata state to another: how a
snapshot of the metadata group is installed.

Why: a node installs a snapshot at start (from nothing: its read model is
empty) and, in a cluster, when it lagged behind the leader's compacted log
(Raft §7) while its read model, queues and groups are live. Both are the same
question, "what changed between the state I performed and this one", and
the answer is in the effect records every node already performs
(broker/node/metadata_effects.py), so the snapshot path reuses the apply path's
shell code. What went comes first (queues, then bindings, exchanges, vhosts,
users, permissions), then what came, in the order the machine itself orders
effects. Pure: no I/O, no clock.
"""
from __future__ import annotations

from warren.broker.node import metadata_effects as fx
from warren.broker.node.metadata_state import MetaState, VhostRecord
from warren.broker.routing.exchanges import Binding
from warren.protocol.constants import CONNECTION_FORCED

_NO_VHOST = VhostRecord()


def changes(old: MetaState, new: MetaState) -> list:
    return [*_gone(old, new), *_come(old, new)]


def _gone(old: MetaState, new: MetaState) -> list:
    effects: list = []
    for name, vhost in sorted(old.vhosts.items()):
        kept = new.vhosts.get(name)
        for queue_name, queue in sorted(vhost.queues.items()):
            now = kept.queues.get(queue_name) if kept is not None else None
            if now is None or now.group != queue.group:
                effects.append(fx.QueueDeleted(name, queue_name, queue.group))
        if kept is None:
            effects += [fx.CloseConnections(CONNECTION_FORCED, f"CONNECTION_FORCED - vhost '{name}' is deleted",
                                            vhost=name),
                        fx.VhostDeleted(name)]
            continue
        effects += [_binding(name, binding, False) for binding in _sorted(vhost.bindings - kept.bindings)]
        effects += [fx.ExchangeDeleted(name, exchange) for exchange in sorted(vhost.exchanges)
                    if exchange not in kept.exchanges]
    for user in sorted(set(old.users) - set(new.users)):
        effects += [fx.UserDeleted(user),
                    fx.CloseConnections(CONNECTION_FORCED, f"CONNECTION_FORCED - user '{user}' is deleted", user=user)]
    effects += [fx.PermissionCleared(user, vhost) for user, vhost in sorted(set(old.permissions) - set(new.permissions))
                if vhost in new.vhosts and user in new.users]
    return effects


def _come(old: MetaState, new: MetaState) -> list:
    effects: list = [fx.VhostAdded(name) for name in sorted(new.vhosts) if name not in old.vhosts]
    for name, user in sorted(new.users.items()):
        before = old.users.get(name)
        if before != user:
            effects.append(fx.UserSet(name, user.password_hash, user.tags,
                                      "added" if before is None else "password_changed"))
    for (user, vhost), expressions in sorted(new.permissions.items()):
        if old.permissions.get((user, vhost)) != expressions:
            effects.append(fx.PermissionSet(user, vhost, *expressions))
    for name, vhost in sorted(new.vhosts.items()):
        effects += _vhost_come(name, old.vhosts.get(name, _NO_VHOST), vhost, new)
    for group, nodes in sorted(new.leaving.items()):
        effects += [fx.LeavingNoted(group, node) for node in sorted(nodes - old.leaving.get(group, set()))]
    return effects


def _vhost_come(name: str, old: VhostRecord, new: VhostRecord, new_state: MetaState) -> list:
    effects: list = []
    for exchange_name, exchange in sorted(new.exchanges.items()):
        if old.exchanges.get(exchange_name) != exchange:
            effects.append(fx.ExchangeDeclared(name, exchange_name, exchange.type, exchange.auto_delete,
                                               exchange.internal, exchange.arguments))
    for queue_name, queue in sorted(new.queues.items()):
        before = old.queues.get(queue_name)
        if before is None or before.group != queue.group:
            effects.append(fx.QueueDeclared(name, queue_name, queue.arguments, queue.group, tuple(queue.members),
                                            queue.auto_delete, tuple(queue.member_ids())))
        elif before.members != queue.members:
            effects += [fx.MembersChanged(name, queue_name, queue.group, tuple(queue.members), "snapshot", ""),
                        fx.HostIfMember(name, queue_name, queue.group, None, tuple(queue.member_ids()))]
            leaving = new_state.leaving.get(queue.group, set())
            effects += [fx.ReplicaReleased(name, queue_name, queue.group, node) for node in before.members
                        if node not in queue.members and node not in leaving]
    effects += [_binding(name, binding, True) for binding in _sorted(new.bindings - old.bindings)]
    return effects


def _binding(vhost: str, binding: Binding, bound: bool) -> fx.BindingChanged:
    kind, destination = binding.destination
    return fx.BindingChanged(vhost, binding.source, kind, destination, binding.routing_key, dict(binding.table or {}),
                             bound)


def _sorted(bindings: set[Binding]) -> list[Binding]:
    return sorted(bindings, key=repr)
