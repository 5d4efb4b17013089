"""When a replicated queue may cut its log: the snapshot policy of
broker/queues/queue_replica.py, pure (the replica offers its machine, this says
which snapshot to compact to).

A snapshot costs O(messages held) (a few tens of bytes each), so a replica
offers one only after at least twice as many entries as messages held, or
many times its size in log bytes (`due`): the log in memory and on disk stays
within a constant of the state, once the release cursor can move (the
oldest message kept holds the log after it). A queue that drained while a
candidate waits is offered at once (it is cheap then).
"""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from warren.broker.queues.quorum_machine import QuorumMachine
    from warren.broker.queues.snapshot_codec import CapturedSnapshot

# Entries, or bytes of entries, between snapshots at least (more when the queue
# holds many messages).
SNAPSHOT_ENTRIES_MIN = 4096
SNAPSHOT_BYTES_MIN = 512 * 1024
SNAPSHOT_BYTES_PER_MESSAGE = 64


def due(entries: int, size: int, held: int, held_bytes: int, waiting: bool) -> bool:
    """Offer a snapshot after `entries` entries of `size` bytes with `held` messages
    of `held_bytes` body bytes kept, `waiting`: a candidate waits for the release cursor?

    The bodies held count in the byte threshold: the log holds them whatever the
    snapshot (messages are references into it), so log bytes alone would snapshot a
    queue of 1 KiB messages 16 times as often as one of 16 B messages, at the same
    O(messages held) cost each; with them, a queue that only grows is snapshotted
    each time it doubles."""
    return (entries >= max(SNAPSHOT_ENTRIES_MIN, 2 * held)
            or size >= max(SNAPSHOT_BYTES_MIN, SNAPSHOT_BYTES_PER_MESSAGE * held + held_bytes)
            or (waiting and not held))


class ReleaseCursor:
    """Which snapshot the log may be truncated to (rabbit_fifo's release
    cursor). Messages are references into the log, so a snapshot at index X
    can only replace the log up to X once no message kept refers to an entry
    at or below X. The shell offers the machine every so often; each offer
    takes the state then as a candidate and promotes the newest candidate
    whose index is below every reference still kept. Between a candidate's
    capture and its promotion every message it holds was settled by a
    committed entry after it, so a replica that restores it and re-applies
    the log meets no reference it cannot read except those of messages
    settled further on (whose deliveries the consumers saw already).
    At most `keep` candidates: the oldest (the next to promote) and the
    newest. A message that is never consumed keeps the whole log after it,
    as in RabbitMQ. A candidate is captured (`QuorumMachine.capture`) and
    packed into bytes only when promoted: a queue that drains empty drops its
    candidates unpacked (rabbit_fifo's release cursor holds its state as an
    immutable term, and ra writes it only when it is promoted)."""

    def __init__(self, keep: int = 2) -> None:
        assert keep >= 2
        self.keep = keep
        self.candidates: deque[tuple[int, CapturedSnapshot]] = deque()

    def offer(self, index: int, machine: "QuorumMachine") -> tuple[int, bytes] | None:
        """`machine` has applied through `index`: the (index, snapshot) to
        compact to now, if any."""
        oldest = machine.oldest_ref_index()
        if oldest is None:   # nothing refers to the log: the state now is the snapshot
            self.candidates.clear()
            return index, machine.snapshot()
        promoted = None
        while self.candidates and self.candidates[0][0] < oldest:
            promoted = self.candidates.popleft()
        self.candidates.append((index, machine.capture()))
        if len(self.candidates) > self.keep:
            del self.candidates[-2]
        return None if promoted is None else (promoted[0], promoted[1].pack())

    def reset(self) -> None:
        """The machine was replaced (a snapshot installed): its candidates are void."""
        self.candidates.clear()
