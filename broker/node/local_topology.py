"""A node's own objects through the metadata machine, applied here at once.

Transient exchanges, exclusive and transient queues, and the bindings with
such an end are no one else's business, so no Raft group orders them; but
they are decided by the same machine as the replicated ones
(broker/node/metadata_machine.py, `Meta(local=True)`), with its checks and
cascades (a queue's bindings go with it, an auto-delete source goes with
its last binding), over a second `MetaState` of the node's own: never on
disk, never in a snapshot. The effects update the same routing read model
(broker/routing/metadata_read_model.py) at once, so the channel answers at
once.

The two name spaces overlay: the machine sees the node's own objects over
the shared ones (a transient queue bound to a durable exchange finds its
source), and writes only its own. Two things cross over:
* an auto-delete durable exchange that lost its last binding to a node's own
  queue is deleted through the metadata group (`propose`, if unused), on a
  node that is the whole cluster in one process; where other nodes or shards
  may hold bindings of their own from it, which no one state knows, it stays
  (`propose` None): a leftover exchange rather than one taken from under
  another node's queue;
* a shared object the group deleted takes the node's bindings to or from it
  with it (`forget`, from broker/node/metadata.py).
"""
from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from warren.broker.node import metadata_commands as mc
from warren.broker.node import metadata_effects as fx
from warren.broker.node import metadata_machine as machine
from warren.broker.node.metadata_state import BindingSet, MetaState, VhostRecord
from warren.broker.routing import metadata_read_model as read_model
from warren.broker.routing.exchanges import Binding

if TYPE_CHECKING:
    from warren.broker.routing.vhost import VirtualHost

log = structlog.get_logger("warren.metadata")

OWN = machine.Meta(0, local=True)


class _Overlay(ChainMap):
    """The node's own records over the shared ones: writes and removals touch only its own."""

    def __delitem__(self, key: Any) -> None:
        self.maps[0].pop(key, None)

    def pop(self, key: Any, *default: Any) -> Any:
        return self.maps[0].pop(key, *default)


@dataclass(slots=True)
class _OverlayVhost(VhostRecord):
    shared_bindings: BindingSet = field(default_factory=BindingSet)

    def bindings_from(self, source: str) -> list[Binding]:
        """An auto-delete or if-unused check counts the shared bindings too."""
        return self.bindings.from_source(source) + self.shared_bindings.from_source(source)

    def has_bindings_from(self, source: str) -> bool:
        return self.bindings.any_from(source) or self.shared_bindings.any_from(source)


class LocalTopology:
    def __init__(self, vhosts: dict[str, "VirtualHost"], shared: Callable[[], MetaState],
                 propose: Callable[[mc.Command], None] | None) -> None:
        self.vhosts = vhosts                 # the routing read model (the broker's)
        self.shared = shared                 # the metadata group's state as this node applied it
        self.propose = propose               # a change for the metadata group (no reply awaited)
        self.own: dict[str, VhostRecord] = {}

    def owns_queue(self, vhost: str, name: str) -> bool:
        record = self.own.get(vhost)
        return record is not None and name in record.queues

    def owns_exchange(self, vhost: str, name: str) -> bool:
        record = self.own.get(vhost)
        return record is not None and name in record.exchanges

    def apply(self, command: mc.Command) -> Any:
        """Decide `command` over the node's own objects and perform its effects; the
        machine's reply (an error as [code, text, class_id, method_id]), or a deleted
        queue's message count."""
        vhost_name = command.vhost   # type: ignore[union-attr]  # every command here names one
        if vhost_name not in self.vhosts:
            return None
        if isinstance(command, mc.DeleteQueue) and not self.owns_queue(vhost_name, command.name):
            return None   # not ours: a shared queue is deleted through the group
        if isinstance(command, mc.DeleteExchange) and not self.owns_exchange(vhost_name, command.name):
            return None
        own = self.own.setdefault(vhost_name, VhostRecord())
        _, reply, effects = machine.apply(OWN, command, MetaState({vhost_name: self._view(vhost_name, own)}))
        counts = self._perform_all(effects)
        if isinstance(reply, machine.MessageCountOfDeletedQueue):
            return counts.get(command.name, 0)   # type: ignore[union-attr]
        return reply

    def forget(self, vhost: str, kind: str, name: str) -> None:
        """A shared object went: the node's bindings with it as an end go (unless an own
        object of that name hid it here: the bindings are that one's)."""
        owned = self.owns_queue if kind == "queue" else self.owns_exchange
        if vhost in self.own and not owned(vhost, name):
            self.apply(mc.ForgetEnd(vhost, kind, name))

    def forget_vhost(self, vhost: str) -> None:
        self.own.pop(vhost, None)

    def _view(self, vhost_name: str, own: VhostRecord) -> _OverlayVhost:
        shared = self.shared().vhosts.get(vhost_name) or VhostRecord()
        return _OverlayVhost(_Overlay(own.exchanges, shared.exchanges), _Overlay(own.queues, shared.queues),
                             own.bindings, own.policies, shared.bindings)

    def _perform_all(self, effects: list) -> dict[str, int]:
        counts: dict[str, int] = {}
        for effect in effects:
            try:
                count = self._perform(effect)
            except Exception:  # noqa: BLE001 -- a bug: logged; the other effects go on
                log.exception("metadata.own_effect_failed", effect=type(effect).__name__)
                continue
            if isinstance(effect, fx.QueueDeleted):
                counts[effect.name] = count
        return counts

    def _perform(self, effect: fx.Effect) -> int:
        match effect:
            case fx.ExchangeDeclared():
                read_model.exchange_declared(self.vhosts, effect)
            case fx.ExchangeDeleted() if effect.durable:
                # a shared auto-delete exchange whose last binding here was one of ours
                if self.propose is not None:
                    self.propose(mc.DeleteExchange(effect.vhost, effect.name, True))
            case fx.ExchangeDeleted():
                read_model.exchange_deleted(self.vhosts, effect)
            case fx.BindingChanged():
                read_model.binding_changed(self.vhosts, effect)
            case fx.QueueDeclared():
                read_model.own_queue_declared(self.vhosts, effect)
            case fx.QueueDeleted():
                return read_model.own_queue_deleted(self.vhosts, effect)
            case _:
                raise AssertionError(f"not an effect on a node's own objects: {effect!r}")
        return 0
