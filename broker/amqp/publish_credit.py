"""When a channel stops reading its socket for the queues it publishes to.

RabbitMQ holds a publisher back in two stages. A channel with more than
`quorum_commands_soft_limit` (32) commands unapplied in a quorum queue
blocks its credit flow (rabbit_fifo_client's "slow"): it stops granting its
reader credit, and the reader goes on reading and handing it messages until
the credit it had runs out (`credit_flow_default_credit`: 400, bumped after
every 200 the channel took). So a publisher is stopped only once about 432
of its publishes are in flight; RabbitMQ reads again once fewer than 32 are.

Warren has no reader process between the socket and the channel, so one
count does both stages: a channel pauses its socket past `soft_limit +
initial_credit` enqueues in flight, and reads again once `more_credit_after`
of those are done, while the queue still has a window of work (waiting for
the soft limit would leave it idle for a commit before the next read). The
memory held is bounded as RabbitMQ's: the count, plus one socket read.
Pausing at the soft limit itself, as before, made a publisher's window
that spans two socket reads wait a whole commit for its second read: the
one-node backlog case's confirm p99 came from those.
"""
from __future__ import annotations


class PublishCredit:
    __slots__ = ("in_flight", "paused", "_pause_above", "_resume_at")

    def __init__(self, soft_limit: int, initial_credit: int, more_credit_after: int) -> None:
        self.in_flight = 0
        self.paused = False
        self._pause_above = soft_limit + initial_credit
        self._resume_at = max(0, self._pause_above - more_credit_after)

    def took(self) -> bool:
        """One more enqueue in flight; True when the socket must pause now."""
        self.in_flight += 1
        if self.in_flight > self._pause_above and not self.paused:
            self.paused = True
            return True
        return False

    def done(self) -> bool:
        """One enqueue answered; True when the socket may be read again now."""
        self.in_flight -= 1
        if self.paused and self.in_flight <= self._resume_at:
            self.paused = False
            return True
        return False

    def release(self) -> bool:
        """The channel closes: True if it held its socket paused."""
        was_paused, self.paused = self.paused, False
        return was_paused
