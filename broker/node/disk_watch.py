"""When a node looks at its disk's free space, and how large its WAL may grow there.

* Free space (a statvfs of data_dir) is looked at sooner the nearer it is to the limit,
  as RabbitMQ's disk monitor does: a statvfs waits for the filesystem, and under an fsync
  load took 0.6-1.5 ms of the loop at every alarm check (every 0.5 s), a tail at 5k msg/s.
  The interval assumes the disk fills no faster than DISK_FILL_BYTES_PER_SECOND.
* What the node writes itself is counted as well: once it has written half the room left
  above the limit (its share of it, on a node over several processes) since the last
  look, it looks again at once. A burst outruns any rate assumed: publishers let go when an
  alarm cleared sent a hundred megabytes at once, the disk went from the limit to full
  between two looks, and on a full disk nothing moved again (a consumer's gets and acks are
  log entries too, behind the publishes that found no room).
* The WAL rolls over once it holds half the free space (its share of it), if that comes
  before its configured size: a rollover copies what the WAL still holds into segments
  before the old file goes, so it needs that much room. With a WAL larger than the disk
  had left (RabbitMQ's 512 MiB on a small volume), the rollover the disk alarm asked for
  found no room for its copy, and the space of consumed messages never came back.
* The node holds a reserve of disk space back (a quarter of the limit, at most
  RESERVE_MAX_BYTES), made while there is room for it twice above the limit and given up
  when a write finds the disk full: then a consumer's gets and acks, and the rollover that
  lets the consumed messages go, still have room (storage/reserve.py). It is not counted
  as free: the alarm comes that much sooner. (Counted as free, the alarm came later than
  a rollover's copy could still be made, and a WAL as large as the disk was never let go.)
* What leaders replicate to this node is taken in only while the disk has room for it twice
  (its copy into segments at a rollover) above half the limit, a snapshot while it has room
  for it twice at all: a follower that took in its leaders' catch-up (AppendEntries batches
  of 20-30 MB) beyond its disk's room waited for good with a WAL batch that found the disk
  full, its alarm blocking the cluster's publishers to the end, though the consumed messages'
  space would come back only by applying the entries behind that batch. Refused, the entries
  are to the leader as lost on the way: it sends them again, or its snapshot once its log let
  go of them (Raft lets a follower drop what it has not acknowledged). Half the limit is
  the floor for entries the leader has committed already only (a catch-up: the group
  commits without this node); those it has not are taken in while they fit twice at all.
  Refused by two followers of three below half the limit, they never committed, nor did
  anything behind them: a consumer's gets and acks waited for good, and so did the queue's
  log, the space they would free (chaos seed 5202: in-flight publishes of 1.2 MB, refused
  with 28 MB free, 40 s with no delivery until a node gave up its WAL batch; another
  program's files, tests/integration/test_disk_low_followers.py). The alarm blocks
  publishers meanwhile, which bounds what is in flight.
"""
from __future__ import annotations

from warren.config import WAL_MAX_SIZE_BYTES_MIN
from warren.raft.system import COMMITTED_ENTRIES

DISK_FILL_BYTES_PER_SECOND = 250 * 1024 * 1024
DISK_CHECK_MAX_SECONDS = 10.0
# The node's reserve of disk space for the moment the disk is full (storage/reserve.py): a
# quarter of the limit, at most this much (a WAL batch is cut at 16 MiB), shared by its processes.
RESERVE_MAX_BYTES = 16 * 1024 * 1024
# Looked at again after at most this much written, however near the limit (a look costs up
# to a millisecond or so of the loop; a WAL batch is cut at 16 MiB, more when one record is).
WRITTEN_BETWEEN_LOOKS_MIN_BYTES = 8 * 1024 * 1024


def next_disk_check_in(free: int, limit: int, min_seconds: float) -> float:
    """Seconds until free space is looked at again: the time the disk would take to fill
    down to the limit at DISK_FILL_BYTES_PER_SECOND, between the alarm check interval and
    DISK_CHECK_MAX_SECONDS; the interval itself while below the limit (the alarm clears as
    soon as space is back)."""
    if free < limit:
        return min_seconds
    return min(DISK_CHECK_MAX_SECONDS, max(min_seconds, (free - limit) / DISK_FILL_BYTES_PER_SECOND))


class DiskWatch:
    """The schedule of a node's looks at its free space (a pure machine: the broker looks,
    and tells it what it saw and what the node wrote)."""

    def __init__(self, limit: int, min_seconds: float, processes: int = 1) -> None:
        self.limit = limit
        self.min_seconds = min_seconds
        self.processes = max(1, processes)   # the node's processes sharing the disk
        self.next_check = 0.0                # monotonic time of the next look
        # bytes the node may write after a look before it looks again (the first look may come after them)
        self.write_budget = WRITTEN_BETWEEN_LOOKS_MIN_BYTES
        self.free_at_look: int | None = None   # None until the first look: everything is taken in
        self.written_since_look = 0
        self.admitted_unwritten = 0              # replicated bytes taken in since the look, not written yet

    @property
    def reserve_bytes(self) -> int:
        """This process's reserve."""
        return min(RESERVE_MAX_BYTES, self.limit // 4) // self.processes

    def may_reserve(self, free: int) -> bool:
        """Whether the reserve may be made with `free` bytes on the disk: the alarm stays off
        with every process's reserve made twice over."""
        return self.reserve_bytes > 0 and free >= self.limit + 2 * self.reserve_bytes * self.processes

    def due(self, now: float) -> bool:
        return now >= self.next_check

    def looked(self, free: int, now: float) -> int:
        """Free space was looked at: when to look next, and after how much written;
        returns the size the WAL should roll over at, at the latest."""
        self.next_check = now + next_disk_check_in(free, self.limit, self.min_seconds)
        # what was taken in and written is in `free`; what is still to be written is counted by
        # `wrote` when it is; what never will be (a resend the log has already) is forgotten here
        self.free_at_look, self.written_since_look, self.admitted_unwritten = free, 0, 0
        self.write_budget = max(WRITTEN_BETWEEN_LOOKS_MIN_BYTES, (free - self.limit) // (2 * self.processes))
        return max(WAL_MAX_SIZE_BYTES_MIN, free // (2 * self.processes))

    def wrote(self, size: int) -> bool:
        """The node wrote `size` bytes; True once, when it should look at the disk now."""
        before, self.written_since_look = self.written_since_look, self.written_since_look + size
        self.admitted_unwritten = max(0, self.admitted_unwritten - size)
        if not before < self.write_budget <= self.written_since_look:
            return False   # within the budget, or past it with the look asked for already
        self.next_check = 0.0
        return True

    def admits_replicated(self, size: int, kind: str) -> bool:
        """Whether this process takes in `size` bytes a leader replicates to it (`kind`: a
        snapshot, committed or uncommitted entries, raft/system.py): its share of the room
        twice over, above half the limit for entries the leader committed without it."""
        if self.free_at_look is None:
            return True
        floor = self.limit // 2 if kind == COMMITTED_ENTRIES else 0
        room = (self.free_at_look - floor) // (2 * self.processes) - self.written_since_look - self.admitted_unwritten
        if size > room:
            self.next_check = 0.0   # at the next check: space may have been let go meanwhile
            return False
        self.admitted_unwritten += size
        return True
