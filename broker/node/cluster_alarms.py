"""Resource alarms are cluster-wide, as RabbitMQ's are: while any running node is low on
memory or disk, publishers are blocked on every node.

Theory of operation. Each node measures its own resources (Broker.check_alarms) and
tells its running peers whenever the set of its alarms changes, and again every
housekeeping pass while any is on (NodeCore: [ALARMS, [resource, ...]]). A node blocks
its publishing connections while an alarm is on anywhere it can hear of. Without
this, a node low on disk kept taking the entries of queues led elsewhere, whose
publishers nothing held back, until a WAL write failed with ENOSPC and the node
stopped (a node that cannot write must not go on), and with a full disk it could not
start again. (Replication itself is not held back, as RabbitMQ's is not: a follower
catching up on a backlog can still fill its disk.) A peer's alarm stops counting when
the peer goes down (RabbitMQ clears a down node's alarms too) or when it has not been
said again for PEER_ALARM_STALE_SECONDS: a lost "cleared" must not block a cluster for
good. Pure: the time is handed in.
"""
from __future__ import annotations

from collections.abc import Iterable

RESOURCES = ("memory", "disk")
# An alarmed node says so every housekeeping pass (0.5 s): missing six in a row, it is stale.
PEER_ALARM_STALE_SECONDS = 3.0


class ClusterAlarms:
    def __init__(self) -> None:
        self.local: frozenset[str] = frozenset()
        self.peers: dict[str, tuple[frozenset[str], float]] = {}   # peer -> (its alarms, when heard)
        self.resources: frozenset[str] = frozenset()   # in alarm on this node or a peer it hears from
        self.changed = False   # `resources` changed since `take_resources`: publishers are re-blocked

    def set_local(self, resources: Iterable[str]) -> bool:
        """This node's own alarms; True if they changed (the peers must hear)."""
        resources = frozenset(resources)
        if resources == self.local:
            return False
        self.local = resources
        self._recount()
        return True

    def on_peer(self, peer: str, resources: list, now: float) -> None:
        if not isinstance(resources, list) or not all(r in RESOURCES for r in resources):
            raise ValueError(f"ALARMS: resources must be a list of {RESOURCES}")
        if resources:
            self.peers[peer] = (frozenset(resources), now)
        else:
            self.peers.pop(peer, None)
        self._recount()

    def peer_down(self, peer: str) -> None:
        if self.peers.pop(peer, None) is not None:
            self._recount()

    def expire(self, now: float) -> None:
        stale = [peer for peer, (_, heard) in self.peers.items() if now - heard > PEER_ALARM_STALE_SECONDS]
        for peer in stale:
            del self.peers[peer]
        if stale:
            self._recount()

    def take_resources(self) -> frozenset[str]:
        """The resources in alarm, now that the caller acts on their change."""
        self.changed = False
        return self.resources

    def nodes_in_alarm(self) -> dict[str, list[str]]:
        """Which peers are in alarm, and for what (for the log)."""
        return {peer: sorted(resources) for peer, (resources, _) in sorted(self.peers.items())}

    def _recount(self) -> None:
        resources = self.local.union(*(on for on, _ in self.peers.values()))
        if resources != self.resources:
            self.resources, self.changed = resources, True
