"""A transient, exclusive or auto-delete (non-durable) queue of a node over several
processes, as its home shard and the other shards see it (broker/node/shard_link.py
carries what they say to each other; docs/multi-process.md section 10).

On its home shard it is what it is on a single node, a replica without a log
(`LocalRoute`: each command applied at once, the messages in memory only), whose
owners are named by node (`node/incarnation/connection/channel`) so that the
deliveries and confirms of another shard's channels go there as the cluster's
DELIVERIES and APPLIED messages. Every other shard holds a `ProxyQueue`: the queue
shell of a replicated queue (its `QueueClient`: enqueuer sequences, resends,
per-consumer delivery sequences) whose route sends each command to the home shard.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable
from functools import partial
from typing import TYPE_CHECKING, Any

from warren.broker.queues import queue_codec
from warren.broker.queues import queue_commands as qc
from warren.broker.queues.queue import Queue
from warren.broker.queues.queue_client import now_ms
from warren.broker.queues.queue_routes import LocalRoute, ReplicatedRoute
from warren.broker.queues.quorum import QuorumQueue
from warren.protocol.errors import ChannelError

if TYPE_CHECKING:
    from warren.broker.node.broker import Broker
    from warren.broker.node.shard_link import ShardLink
    from warren.broker.routing.vhost import VirtualHost


class ForeignOwner(tuple):
    """The exclusive owner of another shard's queue: equal to no connection here."""


class HomeRoute(LocalRoute):
    def __init__(self, link: "ShardLink", queue: "Queue") -> None:
        super().__init__(queue, link.node)
        self.cluster = link.broker.cluster

    def owner_key(self, owner: Any) -> str:
        return self.cluster.owner_key(owner)

    def send_to(self, peer: str, message: list) -> None:
        self.cluster.app_send(peer, message)


class HomeQueue(Queue):
    """The queue on its home shard."""

    def __init__(self, link: "ShardLink", vhost: "VirtualHost", name: str, durable: bool,
                 exclusive_owner: Hashable | None, auto_delete: bool, arguments: dict) -> None:
        self.link = link
        self.group = link.new_group()
        super().__init__(vhost, name, durable, exclusive_owner, auto_delete, arguments,
                         route=partial(HomeRoute, link))

    def apply_remote(self, command: Any) -> Any:
        """Another shard's command: applied at once, its reply as it crosses the link."""
        if type(command) in qc.USES:
            self.touch()
        if type(command) is qc.Checkout:
            self.had_consumers = True
        reply = self.replica.wire_reply(self.replica.apply_now(command))
        self._maybe_auto_delete()
        return reply

    def _forget_consumer(self, consumer_id: Hashable) -> None:
        self.consumers.pop(consumer_id, None)
        if self.exclusive_consumer == consumer_id:
            self.exclusive_consumer = None
        self._maybe_auto_delete()

    def owner_down(self, owner: Hashable) -> None:
        """A channel here closed without cancelling (its connection dropped): its consumers
        leave the machine with its down, so the machine's count is judged after it."""
        super().owner_down(owner)
        self._maybe_auto_delete()

    def _maybe_auto_delete(self) -> None:
        """auto-delete counts the consumers of every shard: the machine's."""
        if self.auto_delete and self.had_consumers and not self.deleted and self.replica.machine.consumer_count == 0:
            self.vhost.delete_queue_now(self)

    def peer_gone(self, peer: str) -> None:
        """A shard went (its link dropped: it restarts with a new incarnation): what
        its channels held goes back, its consumers go."""
        self.replica.apply_now(qc.NodeGone(peer, now_ms()))
        self._maybe_auto_delete()

    def notify_deleted(self) -> None:
        super().notify_deleted()
        self.link.deleted_here(self)


def record_of(queue: HomeQueue) -> list:
    """What another shard needs to route to the queue and check its use."""
    owner = queue.exclusive_owner
    return [queue.vhost.name, queue.name, queue.group, queue.durable, queue.auto_delete,
            None if owner is None else list(owner) if isinstance(owner, tuple) else [owner], queue.arguments]


class ShardRoute(ReplicatedRoute):
    """A proxy's commands go to the home shard over the shard link."""

    def __init__(self, link: "ShardLink", home: str, queue: "Queue") -> None:
        self.link = link
        self.home = home
        super().__init__(link.broker.cluster, queue)

    def replica_wanted(self) -> bool:
        return False

    def leading(self) -> bool:
        return False

    def expire(self) -> None:
        pass   # the home decides

    def send(self, command: Any) -> str | None:
        self.link.command(self.home, self.group, queue_codec.encode(command), None)
        return self.home

    def submit(self, command: Any, on_done: Callable[[Any], None] | None) -> None:
        self.link.command(self.home, self.group, queue_codec.encode(command), on_done)

    def submit_down(self, down: Any) -> None:
        self.submit(down, None)

    def leader(self) -> str | None:
        return self.home

    def ask_resend(self, owner: str, tag: str, after_seq: int) -> None:
        self.link.ask_resend(self.home, self.group, owner, tag, after_seq)


class ProxyQueue(QuorumQueue):
    """Another shard's queue: routed to, consumed from, declared passively and deleted here."""

    replicated = False
    forwarded = True

    def __init__(self, link: "ShardLink", home: str, vhost: "VirtualHost", name: str, group: str, durable: bool,
                 auto_delete: bool, exclusive_owner: Hashable | None, arguments: dict) -> None:
        self.cluster = link.broker.cluster
        self.group = group
        self.members = [home]
        self.home = home
        self.leader_hint = home
        self.gone_handled: set[str] = set()
        self.transient_dropped = True
        self.link = link
        Queue.__init__(self, vhost, name, durable, exclusive_owner, auto_delete, arguments,
                       route=partial(ShardRoute, link, home))

    def _forget_consumer(self, consumer_id: Hashable) -> None:
        self.consumers.pop(consumer_id, None)
        if self.exclusive_consumer == consumer_id:
            self.exclusive_consumer = None

    def on_leader_change(self, leader_id: str | None, leading: bool) -> None:
        pass

    def counts_at_home(self, on_done: Callable[[int, int], None]) -> None:
        """`on_done(messages, consumers)` as the home counts them (0, 0 if it has gone)."""
        self.link.counts_at_home(self.home, self.group, lambda counts: on_done(*(counts or (0, 0))))

    def delete_at_home(self, if_unused: bool, if_empty: bool, on_done: Callable[[Any], None]) -> None:
        """queue.delete from this shard: the home checks and deletes; `on_done(count)`,
        or a ChannelError for its refusal."""
        def answered(reply: Any) -> None:
            if isinstance(reply, list):
                on_done(ChannelError(reply[0], reply[1], 50, 40))
            else:
                on_done(reply or 0)
        self.link.delete_at_home(self.home, self.group, if_unused, if_empty, answered)


def proxy_of(broker: "Broker", link: "ShardLink", home: str, record: list) -> ProxyQueue | None:
    vhost_name, name, group, durable, auto_delete, owner, arguments = record
    vhost = broker.vhosts.get(vhost_name)
    if vhost is None:
        return None
    existing = vhost.queues.get(name)
    if existing is not None:
        if not existing.forwarded:
            return None   # a queue of this shard's own by that name (declared at the same time): it stays
        link.proxies.pop(existing.group, None)
        vhost.delete_queue_now(existing)
    proxy = ProxyQueue(link, home, vhost, name, group, durable, auto_delete,
                       None if owner is None else ForeignOwner((home, *owner)), arguments)
    vhost.add_queue(proxy)
    return proxy


def local_queue_factory(link: "ShardLink") -> Callable[..., Queue]:
    """What a vhost of a shard makes for a queue without a log: one the other shards see."""
    def make(vhost: "VirtualHost", name: str, arguments: dict, *, durable: bool, exclusive_owner: Hashable | None,
             auto_delete: bool) -> Queue:
        return HomeQueue(link, vhost, name, durable, exclusive_owner, auto_delete, arguments)
    return make
