"""What the shards of one node, or the nodes of a cluster, tell each other beside the
cluster's own messages (docs/multi-process.md section 10): the objects that live on one
shard (node) but that a connection on any uses. Nothing here goes through a Raft group
or the WAL. Below, "shard" stands for either.

* direct reply-to: a channel's reply address names its shard
  (`amq.rabbitmq.reply-to.<random>_<shard>`); a reply published on another shard
  is forwarded there (REPLY) and handed to the channel as if published there;
* transient exchanges and the bindings the metadata group does not hold (one
  end transient) are made on every shard: EXCHANGE, EXCHANGE_DELETE and BIND,
  answered ACK (the declare-ok or bind-ok waits for every running shard's); each
  has a home, the shard that made it (a binding's: its transient destination's
  home, else its source's), which tells it again to a shard whose link comes up;
* transient, exclusive and auto-delete (non-durable) queues, "a replica without a
  log" on their home shard (broker/node/shard_queues.py): the home announces them
  to every shard (DECLARE, answered ACK; the declare-ok waits for every running
  shard's), and again to a shard whose link comes up; the others route to a proxy
  whose commands come here (CMD, answered DONE); the home's deliveries and
  confirms go back as the cluster's DELIVERIES and APPLIED messages; a deletion is
  announced (DELETE) or asked of the home (DELETE_ASK, answered DONE); a
  delete-ok waits for every running shard's ACK of a SYNC sent after it.

Messages go in the node's one frame per peer per turn, under "s" beside the
Raft items and the node core's messages (raft/frames.py).
"""
from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from warren.broker.node import metadata_commands as mc
from warren.broker.node import shard_queues
from warren.broker.queues import queue_codec
from warren.broker.queues.queue_factory import split_shard
from warren.broker.routing.exchanges import Binding, Exchange
from warren.protocol.errors import ChannelError

if TYPE_CHECKING:
    from warren.broker.node.broker import Broker
    from warren.broker.routing.vhost import VirtualHost

log = structlog.get_logger("warren.shards")

FRAME_KEY = "s"
REPLY = 0        # [REPLY, routing_key, properties, body]
DECLARE = 1      # [DECLARE, record, token]: record as shard_queues.record_of; token 0: no ACK wanted
ACK = 2          # [ACK, token]
DELETE = 3       # [DELETE, vhost, name, group]
CMD = 4          # [CMD, group, data, token]: a queue command for the home; token 0: no DONE wanted
DONE = 5         # [DONE, token, reply]
RESEND = 6       # [RESEND, group, owner, tag, after_seq]
DELETE_ASK = 7   # [DELETE_ASK, group, if_unused, if_empty, token]: answered DONE count or [code, text]
EXCHANGE = 8     # [EXCHANGE, vhost, name, type, auto_delete, internal, arguments, token]: a transient exchange
EXCHANGE_DELETE = 9   # [EXCHANGE_DELETE, vhost, name, token]
BIND = 10        # [BIND, vhost, source, kind, destination, routing_key, arguments, bound, token]
COUNTS = 11      # [COUNTS, group, token]: answered DONE [message_count, consumer_count]
SYNC = 12        # [SYNC, token]: answered ACK once all sent before it was handled
TOKEN_SEPARATOR = "_"


class ShardLink:
    """Between the shards of one node (`shard`: this one's number) or, with `shard` None,
    between the nodes of a cluster, which are to each other what shards are: a node's
    transient objects are usable from every node, as RabbitMQ's are (a reply address names
    a node by its place in the sorted cluster)."""

    def __init__(self, broker: "Broker", shard: int | None) -> None:
        self.broker = broker
        self.node = broker.settings.node_name
        self.peers = [n.name for n in broker.settings.cluster_nodes if n.name != self.node]
        self.members: list[str] | None = None   # a cluster's nodes, in the order reply addresses number them
        if shard is None:
            self.members = sorted(n.name for n in broker.settings.cluster_nodes)
            shard = self.members.index(self.node)
        self.shard = shard
        self.outbox: dict[str, list] = {}
        self.tokens = itertools.count(1)
        self.waiting: dict[int, tuple[str, Callable[[Any], None]]] = {}   # token -> (asked peer, on_done)
        self.acks: dict[int, tuple[set[str], Callable[[], None]]] = {}   # token -> (peers yet to ack, then)
        self.home: dict[str, shard_queues.HomeQueue] = {}     # group -> a queue homed here
        self.proxies: dict[str, shard_queues.ProxyQueue] = {}   # group -> another shard's queue
        self.groups = itertools.count(1)
        self.exchange_homes: dict[tuple[str, str], str] = {}   # (vhost, name) -> home of a transient exchange

    # -- sending ------------------------------------------------------------------------
    def send(self, peer: str, message: list) -> None:
        """`message` goes in the turn's frame to `peer` (cut as the cluster's, raft/frames.py)."""
        self.outbox.setdefault(peer, []).append(message)
        self.broker.cluster.frame_soon()

    def take_outbox(self) -> dict[str, list]:
        """The end of the node's turn: the messages for its frames, per peer."""
        outbox, self.outbox = self.outbox, {}
        return outbox

    def running_peers(self) -> list[str]:
        return self.broker.cluster.running_peers()

    def ask(self, peer: str, message: list, on_done: Callable[[Any], None] | None) -> None:
        """`message` with a fresh token as its last field; `on_done(reply)` on its DONE."""
        token = 0
        if on_done is not None:
            token = next(self.tokens)
            self.waiting[token] = (peer, on_done)
        self.send(peer, [*message, token])

    def command(self, home: str, group: str, data: bytes, on_done: Callable[[Any], None] | None) -> None:
        self.ask(home, [CMD, group, data], on_done)

    def ask_resend(self, home: str, group: str, owner: str, tag: str, after_seq: int) -> None:
        self.send(home, [RESEND, group, owner, tag, after_seq])

    def counts_at_home(self, home: str, group: str, on_done: Callable[[Any], None]) -> None:
        self.ask(home, [COUNTS, group], on_done)

    def delete_at_home(self, home: str, group: str, if_unused: bool, if_empty: bool,
                       on_done: Callable[[Any], None]) -> None:
        self.ask(home, [DELETE_ASK, group, if_unused, if_empty], on_done)

    # -- direct reply-to ------------------------------------------------------------------
    def reply_token(self) -> str:
        return f"{secrets.token_urlsafe(18)}{TOKEN_SEPARATOR}{self.shard}"

    def reply_peer(self, token: str) -> str | None:
        """The shard a reply address is of, when not this one."""
        _, separator, shard = token.rpartition(TOKEN_SEPARATOR)
        if not separator or not shard.isdigit() or int(shard) == self.shard:
            return None
        if self.members is not None:
            peer = self.members[int(shard)] if int(shard) < len(self.members) else None
        else:
            peer = f"{split_shard(self.node)[0]}#{int(shard)}"
        return peer if peer in self.peers else None   # no such shard or node: nobody waits for it

    # -- transient queues ---------------------------------------------------------------------
    def new_group(self) -> str:
        return f"t:{self.node}:{self.broker.cluster.incarnation}:{next(self.groups)}"

    def unannounced(self, queue: Any) -> bool:
        """A queue homed here that the other shards were not told of yet."""
        return isinstance(queue, shard_queues.HomeQueue) and queue.group not in self.home

    def announce(self, queue: "shard_queues.HomeQueue", then: Callable[[], None]) -> None:
        """A new queue homed here: to every shard; `then()` once every running one has it."""
        self.home[queue.group] = queue
        self.broadcast([DECLARE, shard_queues.record_of(queue)], then)

    def broadcast(self, message: list, then: Callable[[], None]) -> None:
        """`message` (its token appended) to every running shard; `then()` once each ACKed it."""
        peers = set(self.running_peers())
        if not peers:
            then()
            return
        token = next(self.tokens)
        self.acks[token] = (peers, then)
        for peer in peers:
            self.send(peer, [*message, token])

    def synced(self, then: Callable[[], None]) -> None:
        """`then()` once every running shard handled all sent to it so far (each
        peer's messages arrive in order): a queue deleted here is gone there too."""
        self.broadcast([SYNC], then)

    # -- transient exchanges and bindings --------------------------------------------------
    def exchange_declared(self, vhost: str, exchange: Exchange, then: Callable[[], None]) -> None:
        self.exchange_homes[(vhost, exchange.name)] = self.node
        self.broadcast(_exchange_message(vhost, exchange), then)

    def exchange_deleted(self, vhost: str, name: str, then: Callable[[], None]) -> None:
        """`then()` once every running shard dropped it: a client told delete-ok finds it
        gone on every connection."""
        if self.exchange_homes.pop((vhost, name), None) is None:
            then()   # no other shard was told of it
            return
        self.broadcast([EXCHANGE_DELETE, vhost, name], then)

    def binding_changed(self, vhost: str, binding: Binding, bound: bool, then: Callable[[], None]) -> None:
        self.broadcast(_bind_message(vhost, binding, bound), then)

    def _home_of_binding(self, vhost: "VirtualHost", binding: Binding) -> str | None:
        kind, name = binding.destination
        if kind == "queue":
            queue = vhost.queues.get(name)
            if queue is not None and not queue.replicated:
                return queue.home if queue.forwarded else self.node
        else:
            home = self.exchange_homes.get((vhost.name, name))
            if home is not None:
                return home
        return self.exchange_homes.get((vhost.name, binding.source))

    def _tell_what_is_homed_here(self, peer: str) -> None:
        """A shard whose link came up (restarted, say) learns this one's transient objects."""
        vhosts = self.broker.vhosts
        for (vhost, name), home in self.exchange_homes.items():
            exchange = vhosts[vhost].exchanges.get(name) if vhost in vhosts else None
            if home == self.node and exchange is not None:
                self.send(peer, [*_exchange_message(vhost, exchange), 0])
        for queue in self.home.values():
            self.send(peer, [DECLARE, shard_queues.record_of(queue), 0])
        for vhost in vhosts.values():
            for exchange in vhost.exchanges.values():
                for binding in exchange.bindings:
                    if self._home_of_binding(vhost, binding) == self.node:
                        self.send(peer, [*_bind_message(vhost.name, binding, True), 0])

    def deleted_here(self, queue: "shard_queues.HomeQueue") -> None:
        if self.home.pop(queue.group, None) is not None:
            for peer in self.running_peers():
                self.send(peer, [DELETE, queue.vhost.name, queue.name, queue.group])

    def _drop_proxy(self, group: str) -> None:
        proxy = self.proxies.pop(group, None)
        if proxy is not None:
            self.broker.cluster.queues.pop(group, None)
            proxy.vhost.delete_queue_now(proxy)

    # -- links -----------------------------------------------------------------------------
    def peer_up(self, peer: str) -> None:
        self._tell_what_is_homed_here(peer)

    def peer_down(self, peer: str) -> None:
        """As RabbitMQ when a node goes: its transient queues go; its consumers of ours
        give back what they held."""
        for group, proxy in list(self.proxies.items()):
            if proxy.home == peer:
                self._drop_proxy(group)
        for (vhost, name), home in list(self.exchange_homes.items()):
            if home == peer:
                del self.exchange_homes[(vhost, name)]
                self._own(mc.DeleteExchange(vhost, name, False))
        for queue in list(self.home.values()):
            queue.peer_gone(peer)
        for token in list(self.acks):
            self._acked(token, peer)
        for token, (asked, on_done) in list(self.waiting.items()):
            if asked == peer:   # it will not answer: as if the queue were gone
                del self.waiting[token]
                on_done(None)

    def _acked(self, token: int, peer: str) -> None:
        waiting = self.acks.get(token)
        if waiting is None:
            return
        waiting[0].discard(peer)
        if not waiting[0]:
            del self.acks[token]
            waiting[1]()

    # -- receiving ------------------------------------------------------------------------
    def on_messages(self, peer: str, messages: list) -> None:
        for message in messages:
            try:
                self._on_message(peer, message)
            except (TypeError, ValueError, IndexError, KeyError):
                log.warning("shards.bad_message", peer=peer, kind=message[0] if message else None)

    def _on_message(self, peer: str, message: list) -> None:
        kind = message[0]
        if kind == REPLY:
            self.broker.deliver_reply(message[1], message[2], message[3])
        elif kind == DECLARE:
            self._on_declare(peer, message[1])
            self._ack(peer, message[2])
        elif kind == ACK:
            self._acked(message[1], peer)
        elif kind == DELETE:
            self._drop_proxy(message[3])
        elif kind == CMD:
            self._on_command(peer, message[1], message[2], message[3])
        elif kind == DONE:
            asked = self.waiting.pop(message[1], None)
            if asked is not None:
                asked[1](message[2])
        elif kind == RESEND:
            queue = self.home.get(message[1])
            if queue is not None:
                queue.replica.resend_deliveries(message[2], message[3], message[4])
        elif kind == DELETE_ASK:
            self._on_delete_ask(peer, *message[1:])
        elif kind == COUNTS:
            queue = self.home.get(message[1])
            self.send(peer, [DONE, message[2], None if queue is None else [queue.message_count, queue.consumer_count]])
        elif kind == EXCHANGE:
            self._on_exchange(peer, *message[1:7])
            self._ack(peer, message[7])
        elif kind == EXCHANGE_DELETE:
            self._on_exchange_delete(message[1], message[2])
            self._ack(peer, message[3])
        elif kind == SYNC:
            self._ack(peer, message[1])
        elif kind == BIND:
            self._on_bind(*message[1:8])
            self._ack(peer, message[8])

    def _ack(self, peer: str, token: int) -> None:
        if token:
            self.send(peer, [ACK, token])

    # Another shard's objects are this shard's own too: its machine applies them (broker/node/local_topology.py).
    def _own(self, command: mc.Command) -> None:
        reply = self.broker.local_topology.apply(command)
        if isinstance(reply, list):
            log.warning("shards.change_refused", command=type(command).__name__, reply=reply)

    def _on_exchange(self, peer: str, vhost_name: str, name: str, type_: str, auto_delete: bool, internal: bool,
                     arguments: dict) -> None:
        vhost = self.broker.vhosts.get(vhost_name)
        if vhost is not None and name not in vhost.exchanges:
            self.exchange_homes[(vhost_name, name)] = peer
            self._own(mc.DeclareExchange(vhost_name, name, type_, auto_delete, internal, arguments, False))

    def _on_exchange_delete(self, vhost_name: str, name: str) -> None:
        if self.exchange_homes.pop((vhost_name, name), None) is not None:
            self._own(mc.DeleteExchange(vhost_name, name, False))

    def _on_bind(self, vhost_name: str, source: str, kind: str, destination: str, routing_key: str,
                 arguments: dict, bound: bool) -> None:
        change = mc.Bind if bound else mc.Unbind
        self._own(change(vhost_name, source, kind, destination, routing_key, arguments, 0, 0))

    def _on_declare(self, peer: str, record: list) -> None:
        group = record[2]
        if group in self.proxies:
            return
        proxy = shard_queues.proxy_of(self.broker, self, peer, record)
        if proxy is None:
            return
        self.proxies[group] = proxy
        self.broker.cluster.queues[group] = proxy   # the cluster's DELIVERIES and APPLIED find it
        # the machine records it (the read model has its proxy: the effect makes nothing)
        self._own(mc.DeclareQueue(proxy.vhost.name, proxy.name, proxy.arguments, (), peer, proxy.auto_delete,
                                  proxy.durable, proxy.exclusive_owner))

    def _on_command(self, peer: str, group: str, data: bytes, token: int) -> None:
        queue = self.home.get(group)
        reply = None
        if queue is not None:
            reply = queue.apply_remote(queue_codec.decode(data))
        if token:
            self.send(peer, [DONE, token, reply])

    def _on_delete_ask(self, peer: str, group: str, if_unused: bool, if_empty: bool, token: int) -> None:
        queue = self.home.get(group)
        try:
            count = 0 if queue is None else queue.vhost.delete_queue(queue.name, None, if_unused, if_empty)
        except ChannelError as error:
            count = [error.reply_code, error.text]
        self.send(peer, [DONE, token, count])


def _exchange_message(vhost: str, exchange: Exchange) -> list:
    return [EXCHANGE, vhost, exchange.name, exchange.type, exchange.auto_delete, exchange.internal,
            exchange.arguments]


def _bind_message(vhost: str, binding: Binding, bound: bool) -> list:
    kind, destination = binding.destination
    return [BIND, vhost, binding.source, kind, destination, binding.routing_key, binding.table, bound]
