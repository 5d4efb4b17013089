"""A virtual host: its exchanges, queues and bindings, and routing between them.

Every operation raises ``ChannelError`` with the reply code and text RabbitMQ
sends for the same mistake. No I/O here: the channel calls in, queues call
back for dead-lettering and auto-delete.

Two halves: the checks a channel's method meets here, against every object
the node routes to (its own and the shared ones), and the routing read model
(`add_*`, `remove_*`) that the metadata machine's effects update, the
metadata group's and the node's own alike (broker/routing/metadata_read_model.py).
A change that passes the checks is handed to the channel's `change` callback,
the one place that decides whether the metadata group or the node's own
machine (broker/node/local_topology.py) makes it.
"""
from __future__ import annotations

import secrets
from collections.abc import Callable, Hashable
from datetime import UTC, datetime
from typing import Any

from pamqp import commands as spec

from warren.broker.queues.queue import Queue
from warren.broker.queues.queue_factory import make_queue
from warren.broker.routing import arguments as queue_arguments
from warren.broker.routing.exchanges import (
    DEFAULT_EXCHANGES,
    EXCHANGE_TYPES,
    Binding,
    Destination,
    Exchange,
    make_exchange,
)
from warren.protocol import codec
from warren.protocol.constants import (
    ACCESS_REFUSED,
    NOT_FOUND,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
)
from warren.protocol.errors import ChannelError

QUEUE_TYPES_DURABLE_ONLY = ("quorum", "stream")
# Longest path through exchange-to-exchange bindings we follow; cycles are cut by a visited set.
E2E_HOPS_MAX = 64


class VirtualHost:
    def __init__(self, name: str):
        self.name = name
        self.exchanges: dict[str, Exchange] = {"": make_exchange("", "direct")}
        for exchange_name, exchange_type in DEFAULT_EXCHANGES:
            self.exchanges[exchange_name] = make_exchange(exchange_name, exchange_type)
        self.queues: dict[str, Queue] = {}
        # owner -> its exclusive queues: a connection's close finds them without a scan
        self.exclusive_queues: dict[Hashable, dict[str, Queue]] = {}
        # makes a queue without a log (a shard's: broker/node/shard_queues.py); else a local one
        self.make_local_queue: Callable[..., Queue] = make_queue
        # a queue without a log goes through the node's own machine (set by the broker)
        self.drop_own_queue: Callable[[str], None] | None = None

    # -- exchanges --------------------------------------------------------
    def exchange(self, name: str, class_id: int = 40, method_id: int = 10) -> Exchange:
        found = self.exchanges.get(name)
        if found is None:
            raise ChannelError(NOT_FOUND, f"no exchange '{name}' in vhost '{self.name}'", class_id, method_id)
        return found

    def declare_exchange(self, method: spec.Exchange.Declare, change: Callable[[], None]) -> Exchange | None:
        """The exchange; a new one is `change()`d: made at once by the node's own
        machine, or None while the metadata group makes it."""
        name = method.exchange
        if method.passive:
            _check_not_default_exchange(name, 40, 10)  # as RabbitMQ: a passive declare too
            return self.exchange(name)
        if method.exchange_type not in EXCHANGE_TYPES:
            # a channel refuses it before (503); other callers get the 406 of RabbitMQ 3.12+
            raise ChannelError(PRECONDITION_FAILED, f"unknown exchange type '{method.exchange_type}'", 40, 10)
        existing = self.exchanges.get(name)
        _check_not_default_exchange(name, 40, 10)
        if name.startswith("amq.") and existing is None:
            raise ChannelError(
                ACCESS_REFUSED, f"exchange name '{name}' contains reserved prefix 'amq.*'", 40, 10)
        if existing is not None:
            self._check_exchange_equivalent(existing, method)
            return existing
        change()
        return self.exchanges.get(name)

    def add_exchange(self, exchange: Exchange) -> None:
        """The read model's update: no checks (made where asked, or by the metadata machine)."""
        self.exchanges[exchange.name] = exchange

    def _check_exchange_equivalent(self, existing: Exchange, method: spec.Exchange.Declare) -> None:
        for field, received, current in (
            ("type", method.exchange_type, existing.type),
            ("durable", method.durable, existing.durable),
            ("auto_delete", method.auto_delete, existing.auto_delete),
            ("internal", method.internal, existing.internal),
        ):
            if received != current:
                raise ChannelError(
                    PRECONDITION_FAILED,
                    f"inequivalent arg '{field}' for exchange '{existing.name}' in vhost '{self.name}': "
                    f"received '{_erl(received)}' but current is '{_erl(current)}'", 40, 10)
        queue_arguments.check_exchange_equivalent(existing.arguments, method.arguments or {}, existing.name, self.name)

    def delete_exchange(self, name: str, if_unused: bool, change: Callable[[Exchange], None]) -> None:
        if name == "" or name.startswith("amq."):
            raise ChannelError(ACCESS_REFUSED, "operation not permitted on the default exchange" if name == ""
                               else f"deletion of system exchange '{name}' in vhost '{self.name}' not allowed", 40, 20)
        exchange = self.exchanges.get(name)
        if exchange is None:
            return  # deleting what does not exist succeeds, as in RabbitMQ 3.x
        if if_unused and exchange.bindings:  # as RabbitMQ: only bindings with it as source count
            raise ChannelError(PRECONDITION_FAILED, f"exchange '{name}' in vhost '{self.name}' in use", 40, 20)
        change(exchange)

    def remove_exchange(self, exchange: Exchange) -> None:
        del self.exchanges[exchange.name]
        for other in list(self.exchanges.values()):
            if other.unbind_destination(("exchange", exchange.name)):
                self._maybe_auto_delete_exchange(other)

    def _maybe_auto_delete_exchange(self, exchange: Exchange) -> None:
        """A transient auto-delete exchange goes with its last binding here; a durable one
        only by the metadata group's effect (its machine decides, knowing every node's
        shared bindings: removed here alone, it would come back at restart)."""
        if exchange.auto_delete and not exchange.durable and not exchange.bindings and exchange.name in self.exchanges:
            self.remove_exchange(exchange)

    # -- queues -----------------------------------------------------------
    def queue(self, name: str, owner: Hashable | None, class_id: int = 50, method_id: int = 10) -> Queue:
        found = self.queues.get(name)
        if found is None:
            raise ChannelError(NOT_FOUND, f"no queue '{name}' in vhost '{self.name}'", class_id, method_id)
        self._check_exclusive(found, owner, class_id, method_id)
        return found

    def _check_exclusive(self, queue: Queue, owner: Hashable | None, class_id: int, method_id: int) -> None:
        if queue.exclusive_owner is not None and queue.exclusive_owner != owner:
            raise ChannelError(RESOURCE_LOCKED, self.locked_text(queue.name), class_id, method_id)

    def locked_text(self, name: str) -> str:
        return (f"cannot obtain exclusive access to locked queue '{name}' in vhost '{self.name}'. "
                "It could be originally declared on another connection or the exclusive property value "
                "does not match that of the original declaration.")

    def declare_queue(self, method: spec.Queue.Declare, owner: Hashable,
                      change: Callable[[str, dict], Queue | None],
                      authorize: Callable[[str], None] | None = None) -> Queue | None:
        """The queue; a new one is `change(name, arguments)`d: made at once by the
        node's own machine, or None while the metadata group makes it.
        `authorize(name)` raises if the user may not configure the queue (called,
        as RabbitMQ does, once a server-named queue has its name)."""
        name = method.queue
        arguments = dict(method.arguments or {})
        if method.passive:
            return self.queue(name, owner)
        if name.startswith("amq."):
            raise ChannelError(ACCESS_REFUSED, f"queue name '{name}' contains reserved prefix 'amq.*'", 50, 10)
        if not name:
            name = "amq.gen-" + secrets.token_urlsafe(16)
        if authorize is not None:
            authorize(name)
        existing = self.queues.get(name)
        if existing is None:
            queue_arguments.check_type_arguments(arguments, name, self.name)
        queue_arguments.validate_queue_arguments(arguments, name, self.name)
        if existing is not None:
            self._check_queue_equivalent(existing, method, arguments, owner)
            existing.touch()
            return existing
        self._check_queue_type_properties(method, arguments, name)
        return change(name, arguments)

    def _check_queue_equivalent(self, existing: Queue, method: spec.Queue.Declare, arguments: dict,
                                owner: Hashable) -> None:
        """RabbitMQ's rabbit_amqqueue:assert_equivalence, in its order: durable,
        auto_delete, arguments, then exclusivity (strict: a redeclare must say
        exclusive exactly when the queue is, else 405, from the owner too)."""
        for field, received, current in (("durable", method.durable, existing.durable),
                                         ("auto_delete", method.auto_delete, existing.auto_delete)):
            if received != current:
                raise ChannelError(
                    PRECONDITION_FAILED,
                    f"inequivalent arg '{field}' for queue '{existing.name}' in vhost '{self.name}': "
                    f"received '{_erl(received)}' but current is '{_erl(current)}'", 50, 10)
        queue_arguments.check_equivalent(existing.arguments, arguments, existing.name, self.name)
        if existing.exclusive_owner != (owner if method.exclusive else None):
            raise ChannelError(RESOURCE_LOCKED, self.locked_text(existing.name), 50, 10)

    def add_queue(self, queue: Queue) -> None:
        self.queues[queue.name] = queue
        if queue.exclusive_owner is not None:
            self.exclusive_queues.setdefault(queue.exclusive_owner, {})[queue.name] = queue
        self.exchanges[""].bind(Binding.make("", ("queue", queue.name), queue.name, None))

    def _check_queue_type_properties(self, method: spec.Queue.Declare, arguments: dict, name: str) -> None:
        if arguments.get("x-queue-type") not in QUEUE_TYPES_DURABLE_ONLY:
            return
        for prop, bad in (("exclusive", method.exclusive), ("non-durable", not method.durable),
                          ("auto-delete", method.auto_delete)):
            if bad:
                raise ChannelError(
                    PRECONDITION_FAILED, f"invalid property '{prop}' for queue '{name}' in vhost '{self.name}'",
                    50, 10)

    def delete_queue(self, name: str, owner: Hashable, if_unused: bool, if_empty: bool,
                     replicate: Callable[[str], None] | None = None,
                     forward: Callable[[Queue], None] | None = None,
                     judge: Callable[[Queue], None] | None = None) -> int | None:
        # a queue without a log goes through the node's own machine (`delete_queue_now`)
        """The message count; None when a replicated queue was handed to `replicate(name)`,
        another shard's queue to `forward(queue)` (its home checks and deletes it), or a
        replicated queue with if-unused or if-empty to `judge(queue)`: this node's view of
        it may have neither its messages nor the other nodes' consumers."""
        queue = self.queues.get(name)
        if queue is None:
            return 0  # as RabbitMQ 3.x: deleting a missing queue succeeds
        self._check_exclusive(queue, owner, 50, 40)
        if forward is not None and queue.forwarded:
            forward(queue)
            return None
        if judge is not None and queue.replicated and (if_unused or if_empty):
            judge(queue)
            return None
        self.check_delete_conditions(name, if_unused, if_empty, queue.consumer_count, queue.message_count)
        if queue.replicated and replicate is not None:
            replicate(name)
            return None
        count = queue.message_count
        self.delete_queue_now(queue)
        return count

    def check_delete_conditions(self, name: str, if_unused: bool, if_empty: bool, consumers: int, ready: int) -> None:
        """rabbit_amqqueue:delete's checks, on the queue's own counts."""
        if if_unused and consumers:
            raise ChannelError(PRECONDITION_FAILED, f"queue '{name}' in vhost '{self.name}' in use", 50, 40)
        if if_empty and ready:
            raise ChannelError(PRECONDITION_FAILED, f"queue '{name}' in vhost '{self.name}' is not empty", 50, 40)

    def delete_queue_now(self, queue: Queue) -> None:
        """The queue goes (deleted, auto-deleted, expired, its exclusive owner gone):
        one without a log through the node's own machine."""
        if self.queues.get(queue.name) is not queue:
            return
        if not queue.replicated and self.drop_own_queue is not None:
            self.drop_own_queue(queue.name)
        self.remove_queue(queue)

    def remove_queue(self, queue: Queue) -> None:
        """The read model's update; the bindings to it go, and an auto-delete source left without any."""
        if self.queues.get(queue.name) is not queue:
            return
        del self.queues[queue.name]
        owned = self.exclusive_queues.get(queue.exclusive_owner) if queue.exclusive_owner is not None else None
        if owned is not None:
            owned.pop(queue.name, None)
            if not owned:
                del self.exclusive_queues[queue.exclusive_owner]
        for exchange in list(self.exchanges.values()):
            if exchange.unbind_destination(("queue", queue.name)):
                self._maybe_auto_delete_exchange(exchange)
        queue.notify_deleted()

    def delete_exclusive_queues(self, owner: Hashable) -> None:
        for queue in list(self.exclusive_queues.get(owner, {}).values()):
            self.delete_queue_now(queue)

    # -- bindings ---------------------------------------------------------
    def bind(self, source: str, destination: Destination, owner: Hashable, class_id: int, method_id: int,
             change: Callable[[], None]) -> None:
        self._binding_source(source, class_id, method_id)
        self._binding_destination(destination, owner, class_id, method_id)
        change()

    def add_binding(self, exchange: Exchange, binding: Binding) -> None:
        """The read model's update: no checks."""
        if binding not in exchange.bindings:
            exchange.bind(binding)

    def remove_binding(self, exchange: Exchange, binding: Binding) -> bool:
        """The read model's update: no checks, no auto-delete (the caller decides)."""
        if not exchange.unbind(binding):
            return False
        return True

    def unbind(self, source: str, destination: Destination, owner: Hashable, class_id: int, method_id: int,
               change: Callable[[], None]) -> None:
        _check_not_default_exchange(source, class_id, method_id)
        exchange = self.exchanges.get(source)
        kind, name = destination
        target = self.queues.get(name) if kind == "queue" else self.exchanges.get(name)
        if exchange is None or target is None:
            return  # as RabbitMQ: unbinding what is already gone succeeds
        if kind == "queue":
            self._check_exclusive(target, owner, class_id, method_id)
        change()

    def _binding_source(self, source: str, class_id: int, method_id: int) -> Exchange:
        _check_not_default_exchange(source, class_id, method_id)
        return self.exchange(source, class_id, method_id)

    def _binding_destination(self, destination: Destination, owner: Hashable, class_id: int, method_id: int) -> None:
        kind, name = destination
        if kind == "queue":
            self.queue(name, owner, class_id, method_id)
        else:
            _check_not_default_exchange(name, class_id, method_id)
            self.exchange(name, class_id, method_id)

    # -- routing ----------------------------------------------------------
    def route(self, exchange: Exchange, routing_key: str, properties: bytes) -> list[Queue]:
        """Queues a message reaches, following e2e bindings and alternate exchanges."""
        if exchange.name == "":
            queue = self.queues.get(routing_key)
            return [queue] if queue is not None else []
        headers: Any = _UNDECODED
        found: dict[str, Queue] = {}
        pending = [exchange]
        visited = {exchange.name}
        while pending and len(visited) <= E2E_HOPS_MAX:
            current = pending.pop()
            if current.type == "headers" and headers is _UNDECODED:
                headers = codec.headers_of(properties)
            destinations = current.route(routing_key, None if headers is _UNDECODED else headers)
            if not destinations:
                alternate = self.exchanges.get(current.alternate_exchange or "")
                if alternate is not None and alternate.name and alternate.name not in visited:
                    visited.add(alternate.name)
                    pending.append(alternate)
                continue
            for kind, name in destinations:
                if kind == "queue":
                    queue = self.queues.get(name)
                    if queue is not None:
                        found[name] = queue
                elif name not in visited:
                    target = self.exchanges.get(name)
                    if target is not None:
                        visited.add(name)
                        pending.append(target)
        return list(found.values())

    def dead_letter(self, queue: Queue, reason: str, payloads: tuple, time_ms: int) -> None:
        """Republish dead messages to the queue's x-dead-letter-exchange, if any."""
        exchange_name = queue.arguments.get("x-dead-letter-exchange")
        if exchange_name is None:
            return
        exchange = self.exchanges.get(exchange_name)
        if exchange is None:
            return  # RabbitMQ drops silently when the DLX does not exist
        override_key = queue.arguments.get("x-dead-letter-routing-key")
        for original_exchange, routing_key, properties, body in payloads:
            key = override_key if override_key is not None else routing_key
            properties = _with_death(properties, queue, reason, original_exchange, routing_key, time_ms)
            payload = (exchange_name, key, properties, body)
            for target in self.route(exchange, key, properties):
                # A message dead-lettered back into its own queue is dropped unless a
                # client rejected it (RabbitMQ's cycle rule).
                if target is not queue or reason == "rejected":
                    target.enqueue(payload, len(body))


_UNDECODED = object()


def _with_death(properties: bytes, queue: Queue, reason: str, exchange: str, routing_key: str,
                time_ms: int) -> bytes:
    """Add RabbitMQ's x-death record (and x-first-death-*) to the headers."""
    decoded = codec.decode_properties(properties)
    headers = dict(decoded.headers or {})
    deaths = list(headers.get("x-death") or [])
    for death in deaths:
        if death.get("queue") == queue.name and death.get("reason") == reason:
            death["count"] = death.get("count", 1) + 1
            break
    else:
        death = {"count": 1, "reason": reason, "queue": queue.name, "exchange": exchange,
                 "routing-keys": [routing_key], "time": datetime.fromtimestamp(time_ms // 1000, tz=UTC)}
        if decoded.expiration is not None:
            # RabbitMQ keeps the per-message TTL it removes below here (rabbit_dead_letter)
            death["original-expiration"] = decoded.expiration
        deaths.insert(0, death)
        headers.setdefault("x-first-death-reason", reason)
        headers.setdefault("x-first-death-queue", queue.name)
        headers.setdefault("x-first-death-exchange", exchange)
    headers["x-death"] = deaths
    decoded.headers = headers
    decoded.expiration = None  # as RabbitMQ: the dead-lettered copy does not expire again by the same TTL
    return codec.encode_properties(decoded)


def _check_not_default_exchange(name: str, class_id: int, method_id: int) -> None:
    """RabbitMQ's rabbit_channel:check_not_default_exchange."""
    if name == "":
        raise ChannelError(ACCESS_REFUSED, "operation not permitted on the default exchange", class_id, method_id)


def _erl(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
