"""A channel's methods on exchanges, queues and bindings (AMQP 0-9-1 §3.1).

Mixed into ``broker.channel.Channel``. Every change is a metadata command,
decided by the metadata machine; each method has one decision point
(`_change_exchange`, `_change_binding`, `_change_queue`): a durable change
goes through the metadata Raft group and is answered once applied
(broker/node/metadata.py), as RabbitMQ answers only after its metadata store
has committed; a transient or exclusive one is applied by the node's own
machine (broker/node/local_topology.py), in memory, and answered at once
(on a node of several processes, once every shard has it). Until a durable
change is applied the channel takes no further method (the connection holds
them, as RabbitMQ's channel process blocks on its metadata store call): a
publish sent right behind a declare or bind, nowait or not, is routed by it.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Any

from pamqp import commands as spec

from warren.broker.admin.auth import refused_text
from warren.broker.node import metadata_commands as mc
from warren.broker.node.metadata import raise_if_error
from warren.broker.queues.queue import Queue
from warren.broker.queues.queue_factory import is_replicated
from warren.broker.routing.exchanges import EXCHANGE_TYPES, Binding
from warren.protocol.constants import ACCESS_REFUSED, NOT_FOUND, NOT_IMPLEMENTED, PRECONDITION_FAILED, RESOURCE_LOCKED
from warren.protocol.errors import AMQPConnectionError, ChannelError

REPLY_TO_QUEUE = "amq.rabbitmq.reply-to"
# How long a declare's counts wait for the queue's leader (rabbit_quorum_queue:stat waits 250 ms;
# longer here: a commit on a loaded machine may take that, and a fallback may be stale).
STAT_WAIT_SECONDS = 1.0
# what a channel remembers of its permission checks (RabbitMQ keeps a few per channel)
ACCESS_GRANTED_MAX = 1024


class TopologyMethods:
    # -- permissions (RabbitMQ's rabbit_access_control: configure / write / read) ----------
    def check_access(self, permission: str, kind: str, name: str, class_id: int, method_id: int) -> None:
        """403 ACCESS_REFUSED unless the channel's user may `permission` the
        resource; a granted check is remembered for the channel's life."""
        key = (permission, kind, name)
        if key in self.access_granted:
            return
        resource = "amq.default" if kind == "exchange" and name == "" else name
        if self.permission is None or not self.permission.allows(permission, resource):
            raise ChannelError(ACCESS_REFUSED, refused_text(permission, kind, name, self.vhost.name,
                                                            self.connection.user_name), class_id, method_id)
        if len(self.access_granted) >= ACCESS_GRANTED_MAX:
            self.access_granted.clear()
        self.access_granted.add(key)

    def check_publish(self, exchange_name: str) -> None:
        """basic.publish needs write on the exchange; the hot path asks once per exchange."""
        self.check_access("write", "exchange", exchange_name, 60, 40)
        if len(self.publish_permitted) >= ACCESS_GRANTED_MAX:
            self.publish_permitted.clear()
        self.publish_permitted.add(exchange_name)

    def _readable_queue(self, name: str, class_id: int, method_id: int) -> Queue:
        """The queue basic.consume / basic.get / queue.purge use: read permission on it."""
        name = self._queue_name(name, class_id, method_id)
        self.check_access("read", "queue", name, class_id, method_id)
        return self._queue_for(name, class_id, method_id)

    def _reply(self, reply: Any | None) -> None:
        if reply is not None:   # None: nowait
            self.send(reply)

    # -- through the metadata Raft group (broker/node/metadata.py) -----------------------------
    def await_reply(self) -> None:
        """A change later frames depend on was submitted: the connection holds them until it is applied."""
        self.awaiting_replies += 1

    def reply_arrived(self) -> None:
        self.awaiting_replies -= 1
        if not self.awaiting_replies:
            self._release_cancels()
            if not self.closed:
                self.connection.release_held(self.number)

    def _release_cancels(self) -> None:
        held, self.held_cancels = self.held_cancels, None
        if held and not self.closed:
            for cancel in held:
                self.send(cancel)
            self.connection.want_flush(self)

    def _replicate(self, command: mc.Command, reply: Any | None,
                   on_applied: Callable[[Any], Any | None] | None = None) -> Callable[..., None]:
        """A hook for the vhost: submit `command` to the metadata group; reply
        (or close the channel with the error the apply met) once this node applied it."""
        def submit(*_: Any) -> None:
            self.await_reply()
            self.broker.metadata.submit(command, partial(self._on_replicated, reply, on_applied))
        return submit

    def _on_replicated(self, reply: Any | None, on_applied: Callable[[Any], Any | None] | None, result: Any) -> None:
        try:
            if self.closed:
                return
            try:
                raise_if_error(result)
                if on_applied is not None:
                    reply = on_applied(result)
            except ChannelError as error:
                self.fail(error)
                return
            if reply is not None:
                self.send(reply)
        finally:
            self.reply_arrived()

    def _own(self, command: mc.Command) -> Any:
        """A change of the node's own objects: the machine decides it here, at once."""
        result = self.broker.local_topology.apply(command)
        raise_if_error(result)
        return result

    def on_exchange_declare(self, method: spec.Exchange.Declare) -> None:
        if not method.passive and method.exchange_type not in EXCHANGE_TYPES:
            # rabbit_exchange:check_type, before any other check: a channel's 406 since rabbitmq-server#11214
            # (3.12.x, 3.13, 4.x; pika 1.4.4's own tests expect it), 3.10's 503 closed the whole connection
            raise ChannelError(PRECONDITION_FAILED, f"unknown exchange type '{method.exchange_type}'", 40, 10)
        if not method.passive and method.exchange:
            self.check_access("configure", "exchange", method.exchange, 40, 10)
        reply = None if method.nowait else spec.Exchange.DeclareOk()
        command = mc.DeclareExchange(self.vhost.name, method.exchange, method.exchange_type, method.auto_delete,
                                     method.internal, method.arguments or {}, method.durable)
        made = []
        exchange = self.vhost.declare_exchange(method, lambda: made.append(self._change_exchange(command, reply)))
        if exchange is None:
            return   # the metadata group makes it, then answers
        link = self.broker.shard_link
        if link is not None and made and not exchange.durable:   # a transient exchange: once every shard has it
            self.await_reply()
            link.exchange_declared(self.vhost.name, exchange, partial(self._on_replicated, reply, None, None))
            return
        self._reply(reply)

    def _change_exchange(self, command: mc.DeclareExchange | mc.DeleteExchange, reply: Any | None,
                         durable: bool | None = None) -> bool:
        """The decision point for exchanges: a durable one is the metadata group's (True:
        answered once applied), a transient one the node's own (applied now)."""
        durable = command.durable if isinstance(command, mc.DeclareExchange) else durable
        if durable:
            self._replicate(command, reply)()
            return True
        self._own(command)
        return False

    def on_exchange_delete(self, method: spec.Exchange.Delete) -> None:
        if method.exchange:
            self.check_access("configure", "exchange", method.exchange, 40, 20)
        reply = None if method.nowait else spec.Exchange.DeleteOk()
        command = mc.DeleteExchange(self.vhost.name, method.exchange, method.if_unused)
        replicated = []
        self.vhost.delete_exchange(method.exchange, method.if_unused,
                                   lambda exchange: replicated.append(
                                       self._change_exchange(command, reply, exchange.durable)))
        if replicated == [False] and self.broker.shard_link is not None:   # answered once every shard dropped it
            self.await_reply()
            self.broker.shard_link.exchange_deleted(self.vhost.name, method.exchange,
                                                    partial(self._on_replicated, reply, None, None))
            return
        if replicated != [True]:
            self._reply(reply)

    def _bind(self, bound: bool, source: str, kind: str, destination: str, routing_key: str,
              arguments: dict | None, class_id: int, method_id: int, reply: Any | None) -> None:
        # as RabbitMQ's binding_action: write on the destination, read on the source
        self.check_access("write", kind, destination, class_id, method_id)
        self.check_access("read", "exchange", source, class_id, method_id)
        command = (mc.Bind if bound else mc.Unbind)(self.vhost.name, source, kind, destination, routing_key,
                                                     arguments or {}, class_id, method_id)
        change = self.vhost.bind if bound else self.vhost.unbind
        changed: list = []
        change(source, (kind, destination), self.connection.id, class_id, method_id,
               lambda: changed.append(self._change_binding(command, reply)))
        if not changed:   # unbinding what is already gone: nothing to change
            self._reply(reply)

    def _change_binding(self, command: mc.Bind | mc.Unbind, reply: Any | None) -> None:
        """The decision point for bindings: the metadata group's when both ends are its,
        else the node's own (and, on a node of several processes, every shard's)."""
        source, kind, destination = command.source, command.destination_kind, command.destination
        if self.broker.metadata.replicates_binding(self.vhost, source, kind, destination):
            self._replicate(command, reply)()
            return
        self._own(command)
        link = self.broker.shard_link
        if link is not None:   # every shard routes by it: answered once each has it
            self.await_reply()
            binding = Binding.make(source, (kind, destination), command.routing_key, command.arguments)
            link.binding_changed(self.vhost.name, binding, isinstance(command, mc.Bind),
                                 partial(self._on_replicated, reply, None, None))
            return
        self._reply(reply)

    def on_exchange_bind(self, method: spec.Exchange.Bind) -> None:
        self._bind(True, method.source, "exchange", method.destination, method.routing_key, method.arguments,
                   40, 30, None if method.nowait else spec.Exchange.BindOk())

    def on_exchange_unbind(self, method: spec.Exchange.Unbind) -> None:
        self._bind(False, method.source, "exchange", method.destination, method.routing_key, method.arguments,
                   40, 40, None if method.nowait else spec.Exchange.UnbindOk())

    def on_queue_declare(self, method: spec.Queue.Declare) -> None:
        if method.queue.startswith(REPLY_TO_QUEUE):
            self._declare_reply_to_queue(method)
            return
        queue = self.vhost.declare_queue(method, self.connection.id, partial(self._change_queue, method),
                                         partial(self.check_access, "configure", "queue", class_id=50, method_id=10))
        if queue is None:
            return  # a new quorum queue: declare-ok once the metadata group made it
        self.last_queue_name = queue.name
        if queue.forwarded and not method.nowait:   # another shard's queue: counted there
            self.await_reply()
            queue.counts_at_home(lambda messages, consumers: self._on_replicated(
                spec.Queue.DeclareOk(queue.name, messages, consumers), None, None))
            return
        if queue.replicated and not queue.route.leading() and not method.nowait:
            self._declare_ok_from_leader(queue)
            return
        link = self.broker.shard_link
        reply = None if method.nowait else spec.Queue.DeclareOk(queue.name, queue.message_count, queue.consumer_count)
        if link is not None and link.unannounced(queue):   # a new queue of this shard's: once every shard has it
            self.await_reply()
            link.announce(queue, partial(self._on_replicated, reply, None, None))
            return
        self._reply(reply)

    def _declare_ok_from_leader(self, queue: Queue) -> None:
        """Counted by the group's leader, as RabbitMQ's quorum queue stat: a node without a
        replica has none of its messages, and a follower's lag the commits (either would tell
        a client checking its queue's depth that confirmed messages are gone). Without an
        answer in STAT_WAIT_SECONDS (no leader, no quorum) this node's own view answers, as
        RabbitMQ answers its zeros after stat's timeout."""
        self.await_reply()

        def answer(counts: tuple[int, int] | None) -> None:
            ready, consumers = counts if counts is not None else (queue.message_count, queue.consumer_count)
            self._on_replicated(spec.Queue.DeclareOk(queue.name, ready, consumers), None, None)
        self._leader_counts(queue, answer)

    @staticmethod
    def _leader_counts(queue: Queue, on_counts: Callable[[tuple[int, int] | None], None]) -> None:
        """`on_counts((ready, consumers))` as the group's leader counts them (its `Stat`, after
        this node's commands so far), or `on_counts(None)` if it has not answered within
        STAT_WAIT_SECONDS (no leader, no quorum); once."""
        answered: list[bool] = []

        def answer(counts: tuple[int, int] | None) -> None:
            if not answered:
                answered.append(True)
                timer.cancel()
                on_counts(counts)
        timer = asyncio.get_running_loop().call_later(STAT_WAIT_SECONDS, answer, None)
        queue.stat(lambda ready, consumers: answer((ready, consumers)))

    def _declare_reply_to_queue(self, method: spec.Queue.Declare) -> None:
        """rabbit_channel: every declare of the direct reply-to pseudo-queue is
        passive, and one that exists "by definition has one consumer"."""
        name = method.queue
        if not self._reply_to_queue_exists(name):
            raise ChannelError(NOT_FOUND, f"no queue '{name}' in vhost '{self.vhost.name}'", 50, 10)
        self.last_queue_name = name
        if not method.nowait:
            self.send(spec.Queue.DeclareOk(name, 0, 1))

    def _reply_to_queue_exists(self, name: str) -> bool:
        if name == REPLY_TO_QUEUE:
            return True
        if not name.startswith(REPLY_TO_QUEUE + "."):
            return False
        # a channel's reply address: it exists while that channel waits for replies
        token = name[len(REPLY_TO_QUEUE) + 1:]
        if self.broker.shard_link is not None and self.broker.shard_link.reply_peer(token) is not None:
            return True   # another shard's channel's: it answers for it when a reply comes
        replying = self.broker._reply_channels.get(token)
        return replying is not None and not replying.closed

    def _change_queue(self, method: spec.Queue.Declare, name: str, arguments: dict) -> Queue | None:
        """The decision point for a new queue. The metadata group makes a replicated
        one (None: declare-ok once applied): a quorum queue is placed on its members;
        every other durable queue that is not exclusive (classic, auto-delete ones
        too: the group deletes it when unused; a stream, which Warren serves as a
        classic queue) is the same machine on a Raft group of one on this node, on a
        single node too, reachable from every node. Nothing durable lives outside a
        Raft group. A transient or exclusive queue, one without a log, is the
        node's own: made now."""
        if not is_replicated(method.durable, method.exclusive, arguments):
            owner = self.connection.id if method.exclusive else None
            self._own(mc.DeclareQueue(self.vhost.name, name, arguments, (), self.broker.cluster.node,
                                      method.auto_delete, method.durable, owner))
            queue = self.vhost.queues.get(name)
            if queue is None:   # a replicated queue of that name not yet in the read model
                raise ChannelError(RESOURCE_LOCKED, self.vhost.locked_text(name), 50, 10)
            return queue
        cluster = self.broker.cluster
        members = cluster.place_members(arguments)
        self.last_queue_name = name

        def declared(_: Any) -> Any:
            queue = self.vhost.queues.get(name)
            if queue is None:
                raise ChannelError(NOT_FOUND, f"no queue '{name}' in vhost '{self.vhost.name}'", 50, 10)
            return None if method.nowait else spec.Queue.DeclareOk(name, queue.message_count, queue.consumer_count)
        self._replicate(mc.DeclareQueue(self.vhost.name, name, arguments, tuple(members), cluster.node,
                                        method.auto_delete), None, declared)()
        return None

    def on_queue_bind(self, method: spec.Queue.Bind) -> None:
        name = self._queue_name(method.queue, 50, 20)
        self._bind(True, method.exchange, "queue", name, method.routing_key or "", method.arguments,
                   50, 20, None if method.nowait else spec.Queue.BindOk())

    def on_queue_unbind(self, method: spec.Queue.Unbind) -> None:
        name = self._queue_name(method.queue, 50, 50)
        self._bind(False, method.exchange, "queue", name, method.routing_key or "", method.arguments,
                   50, 50, spec.Queue.UnbindOk())

    def on_queue_purge(self, method: spec.Queue.Purge) -> None:
        queue = self._readable_queue(method.queue, 50, 30)
        queue.purge(lambda count: None if method.nowait or self.closed else self.send(spec.Queue.PurgeOk(count)))

    def on_queue_delete(self, method: spec.Queue.Delete) -> None:
        name = self._queue_name(method.queue, 50, 40)
        self.check_access("configure", "queue", name, 50, 40)
        # As RabbitMQ's channel, blocked in the delete while the queue's cancels wait in its
        # mailbox: the delete-ok first, then the cancels of this channel's own consumers
        # (py-amqp fails a delete whose answer comes after a cancel).
        self.held_cancels = []
        try:
            self._delete_queue(method, name)
        finally:
            if not self.awaiting_replies:
                self._release_cancels()

    def _delete_queue(self, method: spec.Queue.Delete, name: str) -> None:
        counted: list[int] = []   # what the queue's leader held before the delete (_count_then_delete)
        replicate = self._replicate(mc.DeleteQueue(self.vhost.name, name), None,
                                    lambda count: None if method.nowait else spec.Queue.DeleteOk(
                                        counted[0] if counted else count or 0))
        count = self.vhost.delete_queue(name, self.connection.id, method.if_unused, method.if_empty,
                                        partial(self._count_then_delete, name, replicate, counted),
                                        partial(self._delete_at_home, method),
                                        partial(self._judge_delete, method, replicate))
        if count is None:
            return
        reply = None if method.nowait else spec.Queue.DeleteOk(count)
        if self.broker.shard_link is not None:   # answered once every shard dropped its proxy
            self.await_reply()
            self.broker.shard_link.synced(partial(self._on_replicated, reply, None, None))
            return
        self._reply(reply)

    def _count_then_delete(self, name: str, replicate: Callable[..., None], counted: list[int], *_: Any) -> None:
        """A replicated queue's delete-ok says what its leader held, as rabbit_quorum_queue:delete
        takes `stat` before it deletes: a follower's replica lags the leader by the commit's way
        here, and its count would miss messages just confirmed (on the leader's node its own
        replica is the leader's, as for a passive declare). Then it is deleted through the
        metadata group. Without the leader's answer in STAT_WAIT_SECONDS (no leader, no quorum)
        it is deleted all the same, and this node's replica counts."""
        queue = self.vhost.queues.get(name)
        if queue is None or queue.route.leading():
            replicate()
            return
        self.await_reply()

        def delete(counts: tuple[int, int] | None) -> None:
            if counts is not None:
                counted.append(counts[0])
            try:
                replicate()   # also if the channel closed meanwhile: the client asked for the delete
            finally:
                self.reply_arrived()
        self._leader_counts(queue, delete)

    def _judge_delete(self, method: spec.Queue.Delete, replicate: Callable[..., None], queue: Queue) -> None:
        """A replicated queue's if-unused or if-empty: a quorum queue refuses them with 540
        (rabbit_quorum_queue:delete); a durable classic queue is judged on its leader's
        counts (this node may hold neither its messages nor the other nodes' consumers),
        then deleted through the metadata group (`replicate`, as an unconditional delete)."""
        if queue.queue_type == "quorum":
            flag = "if-unused" if method.if_unused else "if-empty"
            raise AMQPConnectionError(NOT_IMPLEMENTED, f"cannot delete queue '{queue.name}' in vhost "
                                      f"'{self.vhost.name}'. queue.delete operations with {flag} flag set are "
                                      "not supported by quorum queues", 50, 40)
        self.await_reply()

        def judged(ready: int, consumers: int) -> None:
            def delete(_: Any) -> None:
                self.vhost.check_delete_conditions(queue.name, method.if_unused, method.if_empty, consumers, ready)
                if self.vhost.queues.get(queue.name) is not queue:   # deleted meanwhile: as a missing queue
                    return None if method.nowait else spec.Queue.DeleteOk(0)
                replicate()
                return None
            self._on_replicated(None, delete, None)
        queue.stat(judged)

    def _delete_at_home(self, method: spec.Queue.Delete, queue: Queue) -> None:
        """Another shard's queue: its home shard checks and deletes it (broker/node/shard_queues.py)."""
        self.await_reply()

        def deleted(count: Any) -> Any:
            if isinstance(count, ChannelError):
                raise count
            return None if method.nowait else spec.Queue.DeleteOk(count)
        queue.delete_at_home(method.if_unused, method.if_empty, partial(self._on_replicated, None, deleted))

    def _queue_name(self, name: str, class_id: int, method_id: int) -> str:
        if name:
            return name
        if self.last_queue_name is None:
            raise ChannelError(NOT_FOUND, "no previously declared queue", class_id, method_id)
        return self.last_queue_name

    def _queue_for(self, name: str, class_id: int, method_id: int) -> Queue:
        return self.vhost.queue(self._queue_name(name, class_id, method_id), self.connection.id, class_id, method_id)
