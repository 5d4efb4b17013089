"""When this node must catch up with the metadata group before it serves its clients.

Theory of operation. A metadata change is answered once every *running* node
applied it (metadata_answers.py); a node the others counted down (silent for
about 0.75 s: paused, cut off, its loop stalled) is not waited for. Its clients
may still reach it, and once they do it would route by what it knew before: a
queue declared meanwhile unknown (a publish unroutable, so confirmed and
dropped), a queue deleted and declared again routed to the deleted one. So
the node raises this fence when it may have been counted down (a link to a
peer went down; or its own loop did not run for `GAP_SECONDS`, less than the
others take to count it down, which a node learns only when it runs again),
or when its replica of the metadata group no longer knows a leader (one may
lead where it cannot hear, while every link it has stays up: Cluster.on_role_change),
holds its clients' publishes while the fence is up, and lowers it once a barrier
through the metadata group (a no-op entry; a majority must commit it) started
after the fence went up has been applied here. Cut off from a majority, the
barrier waits, and so do the clients: nothing they publish is confirmed then,
and nothing is routed past a name declared elsewhere. Pure: the time and the
barrier's completion are handed in; the cluster shell submits the barrier on its
next tick while it has AMQP connections, or when a client's publish meets the
fence (so a node without connections, as the seeded simulation's, whose clients
call the queues directly, only counts).
"""
from __future__ import annotations

from warren.raft.transport import PEER_SILENT_HEARTBEATS_MAX

# The loop stalled this long and the others may be about to count this node down
# (3 silent transport heartbeats of 0.25 s: raft/transport.py); at most one heartbeat,
# for a cluster that sets them shorter (Cluster).
GAP_SECONDS = 0.3


def fenced_by_seconds(heartbeat_seconds: float) -> float:
    """How long after this node counted a peer down that peer's fence is surely up, so an
    answer given without it is safe (NodeCore.answer_peers). Cut off silently, the peer
    heard nothing from this node after this node counted it down (the link is closed then;
    before, the cut drops the rest); it counts this node down by the tick after
    `PEER_SILENT_HEARTBEATS_MAX` silent heartbeats (4 at most), or, if its loop stalled
    longer than a heartbeat meanwhile, raises its fence by the gap; one more for the way."""
    return (PEER_SILENT_HEARTBEATS_MAX + 3) * heartbeat_seconds


class MetadataFence:
    def __init__(self, gap_seconds: float = GAP_SECONDS) -> None:
        self.gap_seconds = gap_seconds
        self.raised = 0        # how often the fence went up: a barrier lowers it only if none came since it started
        self.lowered = 0       # `raised` as of the barrier that lowered it last
        self.barrier: int | None = None   # `raised` as of the barrier in flight
        self.last_seen: float | None = None

    @property
    def up(self) -> bool:
        return self.lowered < self.raised

    def raise_fence(self) -> None:
        self.raised += 1

    def saw_time(self, now: float) -> None:
        """The loop runs (a tick, a client's read): a gap since it last did raises the fence."""
        if self.last_seen is not None and now - self.last_seen > self.gap_seconds:
            self.raised += 1
        self.last_seen = now

    def barrier_to_start(self) -> bool:
        """True if a barrier should be submitted now (the fence is up and none is in flight);
        the caller then calls `barrier_applied` once it is applied here."""
        if not self.up or self.barrier is not None:
            return False
        self.barrier = self.raised
        return True

    def barrier_applied(self) -> bool:
        """The barrier in flight was applied here; True if that lowered the fence (else it went
        up again meanwhile and `barrier_to_start` asks for another)."""
        started_at, self.barrier = self.barrier, None
        if started_at is None:
            return False
        self.lowered = max(self.lowered, started_at)
        return not self.up
