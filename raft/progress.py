"""What a leader knows about each follower's log (Raft Figure 2: nextIndex,
matchIndex), and how it paces replication to it.

Theory of operation (etcd-raft's progress states). A follower is in one of:

* PROBE: the leader does not know where the logs diverge. It sends one
  AppendEntries and waits (`paused`) for the answer or the next heartbeat
  response; a rejection moves next_index back using the follower's conflict
  hint (Raft §5.3).
* REPLICATE: the logs match up to match_index. The leader streams entries
  optimistically: next_index jumps past each message sent, without waiting,
  until the in-flight window (messages and bytes) is full.
* SNAPSHOT: next_index fell into the leader's compacted prefix; an
  InstallSnapshot (Raft §7) is on its way and the leader waits for its answer.

`recent_active` is set by any answer from the follower and cleared at each
check-quorum round (thesis §6.2).
"""
from __future__ import annotations

from collections import deque
from enum import Enum


class ProgressState(Enum):
    PROBE = "probe"
    REPLICATE = "replicate"
    SNAPSHOT = "snapshot"


class Inflights:
    """The AppendEntries sent but not yet acknowledged: (last index, bytes)."""

    def __init__(self, max_messages: int, max_bytes: int) -> None:
        assert max_messages > 0
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.sent: deque[tuple[int, int]] = deque()
        self.size_bytes = 0

    def add(self, last_index: int, size_bytes: int) -> None:
        assert not self.sent or last_index >= self.sent[-1][0], "in-flight indices go up"
        self.sent.append((last_index, size_bytes))
        self.size_bytes += size_bytes

    def free_to(self, index: int) -> None:
        while self.sent and self.sent[0][0] <= index:
            self.size_bytes -= self.sent.popleft()[1]

    def free_first(self) -> None:
        if self.sent:
            self.size_bytes -= self.sent.popleft()[1]

    def full(self) -> bool:
        return len(self.sent) >= self.max_messages or self.size_bytes >= self.max_bytes

    def reset(self) -> None:
        self.sent.clear()
        self.size_bytes = 0


class Progress:
    def __init__(self, next_index: int, max_inflight_messages: int, max_inflight_bytes: int) -> None:
        self.match_index = 0
        self.next_index = next_index
        self.state = ProgressState.PROBE
        self.paused = False
        self.pending_snapshot_index = 0
        self.recent_active = False
        # match_index at the last stall check; equal twice running = stalled
        self.match_at_last_check = -1
        self.inflights = Inflights(max_inflight_messages, max_inflight_bytes)

    def __repr__(self) -> str:
        return (f"Progress({self.state.value}, match={self.match_index}, next={self.next_index}, "
                f"paused={self.paused}, inflight={len(self.inflights.sent)})")

    def become_probe(self) -> None:
        # Raft §5.3: after a snapshot, probe from just after it.
        if self.state == ProgressState.SNAPSHOT:
            self.next_index = max(self.match_index + 1, self.pending_snapshot_index + 1)
        else:
            self.next_index = self.match_index + 1
        self.state = ProgressState.PROBE
        self.paused = False
        self.pending_snapshot_index = 0
        self.inflights.reset()

    def become_replicate(self) -> None:
        self.state = ProgressState.REPLICATE
        self.next_index = self.match_index + 1
        self.paused = False
        self.pending_snapshot_index = 0
        self.inflights.reset()

    def become_snapshot(self, snapshot_index: int) -> None:
        self.state = ProgressState.SNAPSHOT
        self.pending_snapshot_index = snapshot_index
        self.paused = False
        self.inflights.reset()

    def is_paused(self) -> bool:
        if self.state == ProgressState.PROBE:
            return self.paused
        if self.state == ProgressState.REPLICATE:
            return self.inflights.full()
        return True

    def on_sent(self, last_index: int, size_bytes: int, entry_count: int) -> None:
        """Account for an AppendEntries ending at `last_index`."""
        if self.state == ProgressState.REPLICATE:
            if entry_count:
                self.next_index = last_index + 1
                self.inflights.add(last_index, size_bytes)
        elif self.state == ProgressState.PROBE:
            self.paused = True

    def maybe_update(self, match_index: int) -> bool:
        """A success answer: returns whether match_index moved forward."""
        updated = match_index > self.match_index
        if updated:
            self.match_index = match_index
            self.paused = False
        self.next_index = max(self.next_index, match_index + 1)
        return updated

    def maybe_decrease_to(self, reject_index: int, hint_next_index: int) -> bool:
        """A rejection of the AppendEntries whose prev_log_index was
        reject_index; hint_next_index is where the conflict hint says to
        retry. Returns False if the rejection is stale."""
        if self.state == ProgressState.REPLICATE:
            if reject_index <= self.match_index:
                return False
            self.become_probe()
        elif self.state == ProgressState.PROBE:
            if reject_index != self.next_index - 1:
                return False
        else:
            return False
        self.next_index = max(min(reject_index, hint_next_index), self.match_index + 1)
        self.paused = False
        return True
