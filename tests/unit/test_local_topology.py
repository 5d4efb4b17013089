"""A node's own objects through the metadata machine (broker/node/local_topology.py): the same
commands and checks as the replicated ones, applied here to a state of the node's own that the
shared state never sees, over the shared objects (a binding finds its durable end), with the
machine's cascades, and the two crossings (a shared auto-delete exchange, a shared end gone)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warren.broker.node import metadata_commands as mc
from warren.broker.node import metadata_machine as machine
from warren.broker.node.local_topology import LocalTopology
from warren.broker.node.metadata_state import BindingSet, MetaState, VhostRecord, initial_state, restore, snapshot
from warren.broker.routing import metadata_read_model as read_model
from warren.broker.routing.exchanges import Binding
from warren.broker.routing.vhost import VirtualHost
from warren.protocol.constants import NOT_FOUND, PRECONDITION_FAILED

V = "/"


class Node:
    """The shared state as the metadata group made it, the read model, and the node's own machine."""

    def __init__(self) -> None:
        self.shared = initial_state([V])
        self.vhosts = {V: VirtualHost(V)}
        self.proposed: list[mc.Command] = []
        self.own = LocalTopology(self.vhosts, lambda: self.shared, self.proposed.append)
        self.vhosts[V].drop_own_queue = lambda name: self.own.apply(mc.DeleteQueue(V, name))
        for name, record in self.shared.vhosts[V].exchanges.items():   # the built-ins, as the group's effects
            read_model.exchange_declared(self.vhosts, _declared(name, record))

    @property
    def vhost(self) -> VirtualHost:
        return self.vhosts[V]

    def shared_apply(self, command: mc.Command, index: int = 1) -> None:
        """What broker/node/metadata.py does for a committed entry, on the effects that matter here."""
        self.shared, _, effects = machine.apply(machine.Meta(index, ("a",)), command, self.shared)
        for effect in effects:
            name = type(effect).__name__
            if name == "ExchangeDeclared":
                read_model.exchange_declared(self.vhosts, effect)
            elif name == "ExchangeDeleted":
                read_model.exchange_deleted(self.vhosts, effect)
                self.own.forget(effect.vhost, "exchange", effect.name)
            elif name == "BindingChanged":
                read_model.binding_changed(self.vhosts, effect)
            elif name == "QueueDeclared":
                read_model.own_queue_declared(self.vhosts, effect)   # a stand-in queue object for routing
            elif name == "QueueDeleted":
                queue = self.vhost.queues.get(effect.name)
                if queue is not None:
                    self.vhost.remove_queue(queue)
                self.own.forget(effect.vhost, "queue", effect.name)

    def routed(self, exchange: str, key: str) -> list[str]:
        return sorted(q.name for q in self.vhost.route(self.vhost.exchanges[exchange], key, b""))


def _declared(name, record):
    from warren.broker.node import metadata_effects as fx
    return fx.ExchangeDeclared(V, name, record.type, record.auto_delete, record.internal, record.arguments)


def transient_exchange(name="tx", type_="direct", auto_delete=False):
    return mc.DeclareExchange(V, name, type_, auto_delete, False, {}, durable=False)


def own_queue(name="tq", owner=None, auto_delete=False):
    return mc.DeclareQueue(V, name, {}, (), "a", auto_delete, durable=False, exclusive_owner=owner)


def bind(source, queue, key="k"):
    return mc.Bind(V, source, "queue", queue, key, {}, 50, 20)


def test_a_transient_exchange_and_queue_are_made_in_the_read_model_and_the_node_state_only():
    node = Node()
    before = snapshot(node.shared)
    assert node.own.apply(transient_exchange()) is None
    assert node.own.apply(own_queue(owner="conn-1")) is None
    assert node.own.apply(bind("tx", "tq")) is None
    exchange, queue = node.vhost.exchanges["tx"], node.vhost.queues["tq"]
    assert not exchange.durable and not queue.durable and queue.exclusive_owner == "conn-1"
    assert not queue.replicated, "a transient queue is one without a log"
    assert node.routed("tx", "k") == ["tq"]
    assert snapshot(node.shared) == before, "a node's own objects reached the shared state"
    own = node.own.own[V]
    assert not own.exchanges["tx"].durable and own.queues["tq"].exclusive_owner == "conn-1"
    assert len(own.bindings) == 1


def test_the_machines_checks_hold_for_own_objects_with_rabbitmqs_codes():
    node = Node()
    node.own.apply(transient_exchange())
    again = node.own.apply(mc.DeclareExchange(V, "tx", "fanout", False, False, {}, durable=False))
    assert again[0] == PRECONDITION_FAILED and "inequivalent arg 'type'" in again[1]
    missing = node.own.apply(bind("tx", "nowhere"))
    assert missing[:2] == [NOT_FOUND, "no queue 'nowhere' in vhost '/'"]


def test_an_own_queue_binds_to_a_durable_exchange_of_the_shared_state_and_the_binding_stays_own():
    node = Node()
    node.shared_apply(mc.DeclareExchange(V, "dx", "topic", False, False, {}))
    node.own.apply(own_queue())
    assert node.own.apply(bind("dx", "tq", "a.*")) is None, "the overlay did not find the shared source"
    assert node.routed("dx", "a.b") == ["tq"]
    assert not node.shared.vhosts[V].bindings, "a binding with an own end reached the shared state"


def test_deleting_an_own_queue_takes_its_bindings_and_an_auto_delete_own_source_with_it():
    node = Node()
    node.own.apply(transient_exchange(auto_delete=True))
    node.own.apply(own_queue())
    node.own.apply(bind("tx", "tq"))
    node.vhost.delete_queue_now(node.vhost.queues["tq"])
    assert "tq" not in node.vhost.queues and "tx" not in node.vhost.exchanges
    own = node.own.own[V]
    assert not own.queues and not own.exchanges and not own.bindings
    assert node.proposed == []


def test_a_shared_auto_delete_exchange_that_lost_its_last_binding_to_an_own_queue_is_deleted_through_the_group():
    node = Node()
    node.shared_apply(mc.DeclareExchange(V, "adx", "direct", True, False, {}))
    node.own.apply(own_queue(owner="conn-1"))
    node.own.apply(bind("adx", "tq"))
    node.vhost.delete_exclusive_queues("conn-1")
    assert node.proposed == [mc.DeleteExchange(V, "adx", True)]
    assert "adx" in node.shared.vhosts[V].exchanges, "the node's own machine wrote the shared state"


def test_a_shared_auto_delete_exchange_with_a_shared_binding_left_stays():
    node = Node()
    node.shared_apply(mc.DeclareExchange(V, "adx", "direct", True, False, {}))
    node.shared_apply(mc.DeclareQueue(V, "dq", {}, ("a",), "a"), index=2)
    node.shared_apply(bind("adx", "dq"))
    node.own.apply(own_queue())
    node.own.apply(bind("adx", "tq"))
    node.vhost.delete_queue_now(node.vhost.queues["tq"])
    assert node.proposed == []


def test_a_shared_queue_deleted_takes_the_own_bindings_to_it_and_binding_it_again_routes():
    """Without the forgetting, the node's state kept the old binding: a bind to the queue declared
    again was 'bound already' and routed nothing."""
    node = Node()
    node.own.apply(transient_exchange())
    node.shared_apply(mc.DeclareQueue(V, "dq", {}, ("a",), "a"), index=2)
    node.own.apply(bind("tx", "dq"))
    assert node.routed("tx", "k") == ["dq"]
    node.shared_apply(mc.DeleteQueue(V, "dq"))
    assert not node.own.own[V].bindings
    node.shared_apply(mc.DeclareQueue(V, "dq", {}, ("a",), "a"), index=3)
    node.own.apply(bind("tx", "dq"))
    assert node.routed("tx", "k") == ["dq"]


def test_an_own_exchange_hiding_a_shared_one_keeps_its_bindings_when_the_shared_one_goes():
    node = Node()
    node.own.apply(transient_exchange("x"))
    node.own.apply(own_queue())
    node.own.apply(bind("x", "tq"))
    node.shared_apply(mc.DeclareExchange(V, "x", "direct", False, False, {}))
    assert not node.vhost.exchanges["x"].durable, "the group's exchange replaced the node's own here"
    node.shared_apply(mc.DeleteExchange(V, "x", False))
    assert "x" in node.vhost.exchanges and node.routed("x", "k") == ["tq"]
    assert len(node.own.own[V].bindings) == 1


@pytest.mark.parametrize("command", [mc.DeleteQueue(V, "dq"), mc.DeleteExchange(V, "dx", False)])
def test_the_node_own_machine_never_deletes_a_shared_object(command):
    node = Node()
    node.shared_apply(mc.DeclareExchange(V, "dx", "direct", False, False, {}))
    node.shared_apply(mc.DeclareQueue(V, "dq", {}, ("a",), "a"), index=2)
    before = snapshot(node.shared)
    assert node.own.apply(command) is None
    assert snapshot(node.shared) == before and "dq" in node.vhost.queues and "dx" in node.vhost.exchanges


def test_forget_end_is_never_read_from_the_log():
    with pytest.raises(mc.BadCommand):
        mc.from_wire(["forget_end", V, "queue", "q"])


@given(ops=st.lists(st.tuples(st.sampled_from(["add", "discard", "drop_to", "drop_from"]),
                              st.sampled_from(["x", "y"]), st.sampled_from(["q1", "q2", "x", "y"])), max_size=40))
@settings(max_examples=200, deadline=None)
def test_the_binding_set_indexes_agree_with_a_scan(ops):
    """The machine finds a vhost's bindings by source or destination through indexes (no
    scan per deletion): after any changes they must name what a scan finds."""
    bindings = BindingSet()
    for op, source, end in ops:
        destination = ("exchange" if end in ("x", "y") else "queue", end)
        if op == "add":
            bindings.add(Binding.make(source, destination, "k", None))
        elif op == "discard":
            bindings.discard(Binding.make(source, destination, "k", None))
        elif op == "drop_to":
            bindings.difference_update(bindings.to_destination(destination))
        else:
            bindings.difference_update(bindings.from_source(source))
        for name in ("x", "y"):
            assert sorted(map(repr, bindings.from_source(name))) == sorted(repr(b) for b in bindings
                                                                           if b.source == name)
            assert bindings.any_from(name) == any(b.source == name for b in bindings)
        for kind, name in (("queue", "q1"), ("queue", "q2"), ("exchange", "x"), ("exchange", "y")):
            assert set(bindings.to_destination((kind, name))) == {b for b in bindings if b.destination == (kind, name)}


def test_a_binding_set_refuses_changes_that_would_pass_its_indexes():
    bindings = BindingSet([Binding.make("x", ("queue", "q"), "k", None)])
    for change in (bindings.clear, bindings.pop, lambda: bindings.update(set()), lambda: bindings.remove(None)):
        with pytest.raises(TypeError):
            change()
    assert len(bindings) == 1 and restore(snapshot(MetaState({V: VhostRecord(bindings=bindings)}))).vhosts[V].bindings \
        == bindings


def test_closing_a_connection_deletes_its_exclusive_queues_only():
    node = Node()
    for name, owner in (("a1", "conn-a"), ("a2", "conn-a"), ("b1", "conn-b")):
        node.own.apply(own_queue(name, owner=owner))
    node.own.apply(own_queue("shared-transient"))
    node.vhost.delete_exclusive_queues("conn-a")
    assert sorted(node.vhost.queues) == ["b1", "shared-transient"]
    assert sorted(node.own.own[V].queues) == ["b1", "shared-transient"]
    assert list(node.vhost.exclusive_queues) == ["conn-b"]


def test_where_other_nodes_may_bind_from_it_a_shared_auto_delete_exchange_stays():
    """No one state knows the bindings other nodes or shards hold of their own from a shared
    exchange: a node that is not the whole cluster proposes no deletion, and its read model
    keeps the exchange (removed here alone, it came back at restart)."""
    node = Node()
    node.own.propose = None
    node.shared_apply(mc.DeclareExchange(V, "adx", "direct", True, False, {}))
    node.own.apply(own_queue(owner="conn-1"))
    node.own.apply(bind("adx", "tq"))
    node.vhost.delete_exclusive_queues("conn-1")
    assert node.proposed == [] and "adx" in node.vhost.exchanges
