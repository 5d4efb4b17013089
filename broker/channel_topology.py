"""A channel's methods on exchanges, queues and bindings (AMQP 0-9-1 §3.1).

Mixed into ``broker.channel.Channel``. Replies to durable topology changes go
out once the change is on disk, as RabbitMQ answers only after its metadata
store has committed; tx.commit-ok waits the same way for its messages.
"""
from __future__ import annotations

from functools import partial
from typing import Any

from pamqp import commands as spec

from broker import fifo
from broker.queue import Queue
from protocol.constants import INTERNAL_ERROR, NOT_FOUND
from protocol.errors import ChannelError


class TopologyMethods:
    def _reply_when_journaled(self, before: int, reply: Any | None) -> None:
        if reply is None:  # nowait
            return
        batch = self.broker.durability.last_meta_batch
        self._reply_when_durable(0 if batch == before else batch, reply)

    def _reply_when_durable(self, batch: int, reply: Any) -> None:
        """Send ``reply`` now (batch 0) or once WAL batch ``batch`` is on disk."""
        if not batch:
            self.send(reply)
            return
        self.broker.durability.committer.when_durable(batch, partial(self._send_durable_reply, reply))

    def _send_durable_reply(self, reply: Any, ok: bool) -> None:
        if self.closed:
            return
        if not ok:
            self.connection.close(INTERNAL_ERROR, "INTERNAL_ERROR - could not write the change to disk")
            return
        self.send(reply)

    def on_exchange_declare(self, method: spec.Exchange.Declare) -> None:
        before = self.broker.durability.last_meta_batch
        self.vhost.declare_exchange(method)
        self._reply_when_journaled(before, None if method.nowait else spec.Exchange.DeclareOk())

    def on_exchange_delete(self, method: spec.Exchange.Delete) -> None:
        before = self.broker.durability.last_meta_batch
        self.vhost.delete_exchange(method.exchange, method.if_unused)
        self._reply_when_journaled(before, None if method.nowait else spec.Exchange.DeleteOk())

    def on_exchange_bind(self, method: spec.Exchange.Bind) -> None:
        before = self.broker.durability.last_meta_batch
        self.vhost.bind(method.source, ("exchange", method.destination), method.routing_key,
                        method.arguments, self.connection.id, 40, 30)
        self._reply_when_journaled(before, None if method.nowait else spec.Exchange.BindOk())

    def on_exchange_unbind(self, method: spec.Exchange.Unbind) -> None:
        before = self.broker.durability.last_meta_batch
        self.vhost.unbind(method.source, ("exchange", method.destination), method.routing_key,
                          method.arguments, self.connection.id, 40, 40)
        self._reply_when_journaled(before, None if method.nowait else spec.Exchange.UnbindOk())

    def on_queue_declare(self, method: spec.Queue.Declare) -> None:
        before = self.broker.durability.last_meta_batch
        queue = self.vhost.declare_queue(method, self.connection.id)
        self.last_queue_name = queue.name
        self._reply_when_journaled(before, None if method.nowait else spec.Queue.DeclareOk(
            queue.name, queue.message_count, queue.consumer_count))

    def on_queue_bind(self, method: spec.Queue.Bind) -> None:
        name = self._queue_name(method.queue, 50, 20)
        before = self.broker.durability.last_meta_batch
        self.vhost.bind(method.exchange, ("queue", name), method.routing_key or "", method.arguments,
                        self.connection.id, 50, 20)
        self._reply_when_journaled(before, None if method.nowait else spec.Queue.BindOk())

    def on_queue_unbind(self, method: spec.Queue.Unbind) -> None:
        name = self._queue_name(method.queue, 50, 50)
        before = self.broker.durability.last_meta_batch
        self.vhost.unbind(method.exchange, ("queue", name), method.routing_key or "", method.arguments,
                          self.connection.id, 50, 50)
        self._reply_when_journaled(before, spec.Queue.UnbindOk())

    def on_queue_purge(self, method: spec.Queue.Purge) -> None:
        queue = self._queue_for(method.queue, 50, 30)
        count = queue.apply(fifo.Purge())
        if not method.nowait:
            self.send(spec.Queue.PurgeOk(count))

    def on_queue_delete(self, method: spec.Queue.Delete) -> None:
        name = self._queue_name(method.queue, 50, 40)
        before = self.broker.durability.last_meta_batch
        count = self.vhost.delete_queue(name, self.connection.id, method.if_unused, method.if_empty)
        self._reply_when_journaled(before, None if method.nowait else spec.Queue.DeleteOk(count))

    def _queue_name(self, name: str, class_id: int, method_id: int) -> str:
        if name:
            return name
        if self.last_queue_name is None:
            raise ChannelError(NOT_FOUND, "no previously declared queue", class_id, method_id)
        return self.last_queue_name

    def _queue_for(self, name: str, class_id: int, method_id: int) -> Queue:
        return self.vhost.queue(self._queue_name(name, class_id, method_id), self.connection.id, class_id, method_id)
