"""Publisher confirms for one channel (RabbitMQ's extension to AMQP 0-9-1).

Publishes are numbered from 1. A publish is settled (ack or nack) when every
queue it reached has taken it; settlements may come out of order once queues
confirm asynchronously. ``take_replies`` turns what was settled since the
last call into as few basic.ack/nack frames as the rules allow: one
``multiple=true`` ack covers a run only when nothing at or below it is still
outstanding. A ``PendingPublish`` counts the queues a publish (or a
transaction's commit) still waits for when it reached more than one.
"""
from __future__ import annotations

from collections.abc import Callable


class ConfirmTracker:
    __slots__ = ("last_seq", "lowest_outstanding", "_settled", "_reported_early")

    def __init__(self) -> None:
        self.last_seq = 0
        # every seq below this one has been settled and reported
        self.lowest_outstanding = 1
        self._settled: dict[int, bool] = {}
        # settled past a gap and already reported on their own
        self._reported_early: set[int] = set()

    def next_publish(self) -> int:
        self.last_seq += 1
        return self.last_seq

    def settle(self, seq: int, ok: bool) -> None:
        assert seq <= self.last_seq, "settled a publish that was never made"
        self._settled[seq] = ok

    def take_replies(self) -> list[tuple[int, bool, bool]]:
        """(delivery_tag, multiple, ok) for everything settled so far."""
        settled = self._settled
        if not settled:
            return []
        replies: list[tuple[int, bool, bool]] = []
        # Contiguous prefix: acks coalesce into one ack per run, with multiple set only when
        # it covers more than one publish (as RabbitMQ's channel sends them).
        seq = self.lowest_outstanding
        run_end = run_length = 0
        early = self._reported_early
        while seq in settled or seq in early:
            if seq in early:
                early.discard(seq)  # already answered; re-covering it with a multiple ack is harmless
            elif settled.pop(seq):
                run_end = seq
                run_length += 1
            else:
                if run_end:
                    replies.append((run_end, run_length > 1, True))
                    run_end = run_length = 0
                replies.append((seq, False, False))
            seq += 1
        if run_end:
            replies.append((run_end, run_length > 1, True))
        self.lowest_outstanding = seq
        # Settled beyond a gap: reported one by one, never with multiple.
        for late in sorted(settled):
            replies.append((late, False, settled[late]))
            early.add(late)
        settled.clear()
        return replies


class PendingPublish:
    """A confirmed publish waiting for its quorum queues (and WAL batch); or, with
    ``on_done``, a tx.commit waiting for all its publishes, settles and WAL batch."""

    __slots__ = ("seq", "remaining", "ok", "on_done", "finished")

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.remaining = 0
        self.ok = True
        self.on_done: Callable[[bool], None] | None = None
        self.finished = False
