"""A replicated queue (a quorum queue, or a durable classic queue on a Raft
group of one) as one node sees it: the queue shell of broker/queues/queue.py over a
`ReplicatedRoute`, with a replica on members only, and what its node tells
it about leadership and peers.

Every node has one in its vhost for every replicated queue, member or not, so
any node routes to it and any channel can consume from it. Every command goes
to the group's leader (`Cluster.submit`); every replica applies the
committed ones (`apply_entry`), only the leader performs the effects.

Sessions of lost nodes: the leader proposes NodeDown when a node's link drops
(its consumers keep their messages but get no more), NodeUp with the node's
incarnation when it is back (consumers of an earlier incarnation, i.e. of
channels that died with a restart, are removed and their messages returned),
NodeGone when it stayed away `cluster_node_gone_seconds`; only locally and in
its own term (`_state_own_view`). A new leader sends every checked-out message
again, a leader sends a peer's consumers theirs again when the peer's link
comes up, and a consumers' node asks a new leader as soon as it learns of it.
"""
from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, Hashable

from warren.broker.queues import queue_codec
from warren.broker.queues import queue_commands as qc
from warren.broker.queues.queue import Queue
from warren.broker.queues.queue_client import LocalConsumer, now_ms
from warren.broker.queues.queue_routes import ReplicatedRoute

if TYPE_CHECKING:
    from warren.broker.node.cluster import Cluster
    from warren.broker.routing.vhost import VirtualHost
    from warren.raft.messages import Entry, Snapshot

__all__ = ["LocalConsumer", "QuorumQueue"]


class QuorumQueue(Queue):
    replicated = True

    def __init__(self, vhost: "VirtualHost", name: str, arguments: dict, cluster: "Cluster",
                 group: str, members: list[str], auto_delete: bool):
        self.cluster = cluster
        self.group = group
        self.members = list(members)
        self.leader_hint: str | None = members[0] if members else None
        self.gone_handled: set[str] = set()
        self.transient_dropped = False   # DropTransientBefore proposed in this incarnation
        super().__init__(vhost, name, True, None, auto_delete, arguments, route=partial(ReplicatedRoute, cluster))

    # -- the replica ----------------------------------------------------------------------
    def apply_entry(self, entry: "Entry", leading: bool) -> Any:
        if self.replica is None:
            return None
        consumed = self.auto_delete and leading and self.replica.machine.consumer_count > 0
        command, reply = self.replica.apply_entry(entry.index, entry.data, leading,
                                                  self.route.proposed.take(entry.data))
        if type(command) in qc.USES:
            self.last_used_ms = now_ms()   # x-expires counts from the last use
        if consumed and self.replica.machine.consumer_count == 0 and not self.expiring:
            self.route.expire()   # auto-delete: its last consumer went; deleted through the metadata group
        return reply

    def _forget_consumer(self, consumer_id: Hashable) -> None:
        """Not the base's local auto-delete: the leader deletes through the metadata group (`apply_entry`)."""
        self.consumers.pop(consumer_id, None)
        if self.exclusive_consumer == consumer_id:
            self.exclusive_consumer = None

    def install_snapshot(self, snapshot: "Snapshot") -> None:
        self._make_replica(True)
        self.replica.install_snapshot(snapshot.data)

    def resend_deliveries(self, owner: str, tag: str, after_seq: int) -> None:
        if self.replica is not None:
            self.replica.resend_deliveries(owner, tag, after_seq)

    def on_leader_change(self, leader_id: str | None, leading: bool) -> None:
        if not leading:
            self.route.proposed.clear()   # what it proposed as leader and did not apply yet may never come
        if leader_id is not None and leader_id != self.leader_hint:
            self.leader_hint = leader_id
            if not leading:
                self.client.ask_for_checked_out(leader_id)
        if not leading or self.replica is None:
            return
        # What the old leader delivered may not have arrived: send it all again.
        self.replica.resend_checked_out()
        # This node is up as its current incarnation: what its channels of an earlier
        # one (before a kill -9) held goes back; no other node says so for a group it
        # is alone in.
        cluster = self.cluster
        self._state_own_view(qc.NodeUp(cluster.node, cluster.incarnation, now_ms()))
        if self.queue_type == "classic" and not self.transient_dropped:
            self.transient_dropped = True
            self._drop_earlier_transients()
        for peer in list(cluster.down_since):
            self._state_own_view(qc.NodeDown(peer, now_ms()))
        for peer, incarnation in cluster.peer_incarnations.items():
            if peer not in cluster.down_since:
                self._state_own_view(qc.NodeUp(peer, incarnation, now_ms()))

    def _drop_earlier_transients(self) -> None:
        """A durable classic queue loses its transient messages when its node restarts
        (RabbitMQ). It is a group of one, led by its node only, so its first leadership in
        this incarnation starts at a term no earlier incarnation had, and its first entry
        of that term (the no-op, Raft §8) splits the log: every entry below it was written
        before the restart, every entry of this incarnation (only a leader appends) is at
        or above it. The command names that index rather than "now", so it drops exactly
        the earlier incarnations' messages however it interleaves with the first publishes,
        and a resent copy changes nothing. A new group's first term starts at index 1."""
        log_ = self.cluster.runtime.system.groups[self.group].raft.log
        term_start = log_.first_index_of_term(log_.last_index())
        if term_start > 1:
            self.client.route.submit(qc.DropTransientBefore(term_start, now_ms()), None)

    # -- nodes -----------------------------------------------------------------------
    def _state_own_view(self, command: Any) -> None:
        """NodeDown, NodeUp and NodeGone state this node's view of its peers, which
        counts only while it leads: proposed here in its own term, never submitted
        (so never forwarded to another leader, nor resent after a leader change). A
        leader deposed without knowing it yet (paused, partitioned) proposes from a
        stale view; Raft commits an entry of its term only if it still has a majority
        in that term, so a stale one stays in its own log (and on followers still in
        its term) until the real leader's log replaces it. Should a later leader's log
        hold it and commit it, that leader's own view follows it: stated on its
        election (on_leader_change), at later indexes."""
        if self.route.leading():
            self.cluster.runtime.propose(self.group, queue_codec.encode(command))

    def on_node_down(self, peer: str) -> None:
        self._state_own_view(qc.NodeDown(peer, now_ms()))

    def on_node_up(self, peer: str, incarnation: str) -> None:
        self.gone_handled.discard(peer)
        self._state_own_view(qc.NodeUp(peer, incarnation, now_ms()))

    def on_node_gone(self, peer: str) -> None:
        if peer not in self.gone_handled and self.route.leading():
            self.gone_handled.add(peer)
            self._state_own_view(qc.NodeGone(peer, now_ms(), keep_consumers=True))

    def on_link_up(self, peer: str) -> None:
        """Deliveries between this node and `peer` may have been lost while the link
        was down: as leader, send the peer's consumers everything checked out to them
        again; as a consumers' node whose leader is `peer`, ask for it."""
        if self.route.leading():
            self.replica.resend_checked_out(peer)
        elif self.leader_hint == peer:
            self.client.ask_for_checked_out(peer)

    # -- this node's sessions, as broker/node/cluster.py calls them ---------------------------------
    def on_applied(self, enqueuer: str, first_seq: int, last_seq: int, refused: list[int]) -> None:
        self.client.on_applied(enqueuer, first_seq, last_seq, refused)

    def on_remote_deliveries(self, owner: str, tag: str, deliveries: list) -> None:
        self.client.on_deliveries(owner, tag, deliveries)

    def on_resent(self, owner: str, tag: str, horizon: int, checked_out: list[int]) -> None:
        self.client.on_resent(owner, tag, horizon, checked_out)

    def ask_for_gaps(self) -> None:
        self.client.ask_for_gaps()

    def resend_enqueues(self, now: float, leader_changed: bool) -> None:
        self.client.resend_enqueues(now, leader_changed)

    def forget_enqueuer(self, owner: Hashable) -> None:
        self.client.forget_enqueuer(owner)
