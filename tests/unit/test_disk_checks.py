"""The disk alarm looks at free space sooner the nearer it is to the limit (as RabbitMQ's
disk monitor): a statvfs waits for the filesystem and cost the loop 0.6-1.5 ms at every
alarm check under an fsync load; and again as soon as the node wrote half the room left
above the limit (broker/node/disk_watch.py)."""
from __future__ import annotations

import time
from types import SimpleNamespace

from warren.broker.node.broker import Broker
from warren.broker.node.disk_watch import (
    DISK_CHECK_MAX_SECONDS,
    DISK_FILL_BYTES_PER_SECOND,
    RESERVE_MAX_BYTES,
    WRITTEN_BETWEEN_LOOKS_MIN_BYTES,
    DiskWatch,
    next_disk_check_in,
)
from warren.config import WAL_MAX_SIZE_BYTES_MIN
from warren.raft.system import COMMITTED_ENTRIES, SNAPSHOT, UNCOMMITTED_ENTRIES

MB = 1000 * 1000


def test_the_interval_is_the_time_to_fill_down_to_the_limit_within_bounds():
    assert next_disk_check_in(100 * 1000 * MB, 50 * MB, 0.5) == DISK_CHECK_MAX_SECONDS, "far from the limit"
    assert next_disk_check_in(51 * MB, 50 * MB, 0.5) == 0.5, "near it: every alarm check"
    free = 50 * MB + 3 * DISK_FILL_BYTES_PER_SECOND
    assert next_disk_check_in(free, 50 * MB, 0.5) == 3.0, "the disk could fill down to the limit in 3 s"
    assert next_disk_check_in(10 * MB, 50 * MB, 0.5) == 0.5, "below the limit: cleared as soon as space is back"


class CountingLog:
    def __init__(self, free: int) -> None:
        self.free, self.looks = free, 0
        self.reserves: list[int] = []   # the reserves it was asked to hold (storage/reserve.py)

    def free_bytes(self, path) -> int:
        self.looks += 1
        return self.free

    def roll_over_within(self, size: int) -> None:
        self.wal_room = size

    def hold_reserve(self, size: int) -> None:
        self.reserves.append(size)


def broker_with(free: int, limit: int) -> SimpleNamespace:
    told: list[list[str]] = []   # what the cluster shell was told of this node's alarms
    released: list[None] = []    # the storage asked to give back what its logs let go
    runtime = SimpleNamespace(stopped=False, persistence=SimpleNamespace(release_space=lambda: released.append(None)))
    return SimpleNamespace(
        queued_message_bytes=0, node_log=CountingLog(free), told=told, released=released,
        cluster=SimpleNamespace(set_local_alarms=told.append, runtime=runtime),
        settings=SimpleNamespace(memory_high_watermark_bytes=10**9, disk_free_limit_bytes=limit, data_dir=".",
                                 alarm_check_interval_seconds=0.5, node_name="n1"),
        memory_alarm=False, disk_alarm=False, disk_watch=DiskWatch(limit, 0.5))


def test_far_from_the_limit_free_space_is_not_looked_at_every_check():
    broker = broker_with(free=100 * 1000 * MB, limit=50 * MB)
    for _ in range(20):
        Broker.check_alarms(broker)
    assert broker.node_log.looks == 1
    assert broker.disk_watch.next_check >= time.monotonic() + DISK_CHECK_MAX_SECONDS - 1


def test_near_the_limit_the_alarm_is_raised_and_cleared_at_the_next_check_due():
    broker = broker_with(free=60 * MB, limit=50 * MB)
    Broker.check_alarms(broker)
    assert not broker.disk_alarm
    broker.node_log.free = 40 * MB
    broker.disk_watch.next_check = 0.0     # the check is due (0.5 s later)
    assert not broker.released
    Broker.check_alarms(broker)
    assert broker.disk_alarm and broker.told == [["disk"]]
    assert len(broker.released) == 1, "a check that finds the disk short asks the storage to give space back"
    Broker.check_alarms(broker)            # not due yet: the alarm stands, nothing looked at
    assert broker.disk_alarm and broker.node_log.looks == 2 and broker.told == [["disk"]]
    broker.node_log.free = 80 * MB
    broker.disk_watch.next_check = 0.0
    Broker.check_alarms(broker)
    assert not broker.disk_alarm and broker.told == [["disk"], []]


def test_a_failing_statvfs_counts_as_no_space():
    broker = broker_with(free=0, limit=50 * MB)
    broker.node_log.free_bytes = lambda path: (_ for _ in ()).throw(OSError("EIO"))
    Broker.check_alarms(broker)
    assert broker.disk_alarm


def test_what_the_node_writes_brings_the_next_look_forward():
    """Half the room above the limit written since the last look: look now, once, however
    far off the next look by time is (a burst outruns the fill rate the interval assumes)."""
    watch = DiskWatch(limit=50 * MB, min_seconds=0.5)
    assert watch.wrote(WRITTEN_BETWEEN_LOOKS_MIN_BYTES), "before any look: after the first megabytes written"
    watch.looked(free=250 * MB, now=100.0)
    assert not watch.due(100.1)
    assert not watch.wrote(99 * MB), "under half of the 200 MB above the limit"
    assert watch.wrote(1 * MB) and watch.due(100.1), "half of it: look now"
    assert not watch.wrote(50 * MB), "one look asked for until it is done"
    watch.looked(free=150 * MB, now=100.2)
    assert not watch.wrote(49 * MB) and watch.wrote(1 * MB), "half of the 100 MB left: the looks come closer"
    watch.looked(free=51 * MB, now=100.3)
    assert not watch.wrote(WRITTEN_BETWEEN_LOOKS_MIN_BYTES - 1), "not closer than a batch or so"
    assert watch.wrote(1)


def test_a_node_over_several_processes_counts_its_share_of_the_room():
    watch = DiskWatch(limit=50 * MB, min_seconds=0.5, processes=4)
    watch.looked(free=450 * MB, now=0.0)
    assert not watch.wrote(49 * MB) and watch.wrote(1 * MB), "a quarter of half the 400 MB above the limit"


def test_the_wal_rolls_over_while_its_rollover_has_room():
    """A rollover copies what the WAL still holds: the WAL rolls over at half the free space
    (its share of it), or its configured size if that comes first, or the least WAL size."""
    assert DiskWatch(limit=50 * MB, min_seconds=0.5).looked(free=300 * MB, now=0.0) == 150 * MB
    assert DiskWatch(limit=50 * MB, min_seconds=0.5, processes=2).looked(free=300 * MB, now=0.0) == 75 * MB
    assert DiskWatch(limit=50 * MB, min_seconds=0.5).looked(free=0, now=0.0) == WAL_MAX_SIZE_BYTES_MIN


def test_replicated_bytes_are_taken_in_while_the_disk_has_room_for_them_twice():
    watch = DiskWatch(limit=40 * MB, min_seconds=0.5)
    assert watch.admits_replicated(10**12, kind=COMMITTED_ENTRIES), "before the first look: everything"
    watch.looked(100 * MB, now=1.0)
    room = (100 * MB - 20 * MB) // 2               # twice over (a rollover's copy), above half the limit
    assert watch.admits_replicated(room - 1 * MB, kind=COMMITTED_ENTRIES)
    assert not watch.admits_replicated(2 * MB, kind=COMMITTED_ENTRIES), "taken in but not written yet counts"
    assert watch.due(1.0), "a refusal looks again at the next check: space may have been let go"
    watch.wrote(room - 1 * MB)                     # those bytes written: counted once, not twice
    assert watch.admits_replicated(1 * MB - 1, kind=COMMITTED_ENTRIES)
    watch.looked(22 * MB, now=2.0)                 # below the limit, 2 MB above its half
    assert not watch.admits_replicated(1 * MB + 1, kind=COMMITTED_ENTRIES)
    assert watch.admits_replicated(5 * MB, kind=SNAPSHOT), "a snapshot (what lets the log go) while it fits twice"
    assert not watch.admits_replicated(7 * MB, kind=SNAPSHOT)


def test_entries_the_leader_has_not_committed_are_taken_in_below_half_the_limit_while_they_fit_twice():
    """Its vote may be what commits them (and a consumer's gets and acks behind them): refused
    by two followers of three, nothing commits. A catch-up the group committed without the
    node still keeps half the limit."""
    watch = DiskWatch(limit=40 * MB, min_seconds=0.5)
    watch.looked(4 * MB, now=1.0)                  # below half the limit (another program's files)
    assert not watch.admits_replicated(64 * 1024, kind=COMMITTED_ENTRIES)
    assert not watch.admits_replicated(2 * MB + 1, kind=UNCOMMITTED_ENTRIES)
    assert watch.admits_replicated(1 * MB, kind=UNCOMMITTED_ENTRIES)
    assert watch.admits_replicated(1 * MB, kind=UNCOMMITTED_ENTRIES)
    assert not watch.admits_replicated(1, kind=UNCOMMITTED_ENTRIES), "half the room taken in: until the next look"


def test_a_process_of_several_takes_in_its_share():
    watch = DiskWatch(limit=40 * MB, min_seconds=0.5, processes=2)
    watch.looked(100 * MB, now=1.0)
    assert not watch.admits_replicated((100 * MB - 20 * MB) // 2 // 2 + 1, kind=COMMITTED_ENTRIES)
    assert watch.admits_replicated((100 * MB - 20 * MB) // 2 // 2, kind=COMMITTED_ENTRIES)


def test_the_reserve_is_a_quarter_of_the_limit_at_most_16_mib_shared_by_the_processes():
    assert DiskWatch(limit=50 * MB, min_seconds=0.5).reserve_bytes == 12_500_000
    assert DiskWatch(limit=50 * MB, min_seconds=0.5, processes=2).reserve_bytes == 6_250_000
    assert DiskWatch(limit=1000 * MB, min_seconds=0.5).reserve_bytes == RESERVE_MAX_BYTES
    assert DiskWatch(limit=0, min_seconds=0.5).reserve_bytes == 0, "no limit, no reserve: a full disk waits"


def test_the_reserve_is_held_while_the_disk_has_room_for_it_twice_above_the_limit():
    broker = broker_with(free=74 * MB, limit=50 * MB)
    Broker.check_alarms(broker)
    assert broker.node_log.reserves == [], "with it made the alarm would be near: not made"
    broker.node_log.free = 75 * MB
    broker.disk_watch.next_check = 0.0
    Broker.check_alarms(broker)
    assert broker.node_log.reserves == [12_500_000] and not broker.disk_alarm
    watch = DiskWatch(limit=50 * MB, min_seconds=0.5, processes=2)
    assert not watch.may_reserve(74 * MB) and watch.may_reserve(75 * MB), "every process's reserve, twice"


def test_what_was_taken_in_but_never_written_is_forgotten_at_the_next_look():
    """An AppendEntries taken in may never be written: a resend whose entries the log has
    already, one from a stale term, one whose previous entry does not match. Counted until
    written, those bytes added up (connections reset by a chaos run's flaky fault resend a
    lot), and a node refused everything its leaders sent for the rest of the run, with
    146 MB free (chaos seed 4603). A look sees what was written; what is still to be written
    is counted as it is written (`wrote`)."""
    watch = DiskWatch(limit=40 * MB, min_seconds=0.5)
    watch.looked(100 * MB, now=1.0)
    room = (100 * MB - 20 * MB) // 2
    assert watch.admits_replicated(room, kind=COMMITTED_ENTRIES)
    assert not watch.admits_replicated(1 * MB, kind=COMMITTED_ENTRIES), "nothing of it written: no room"
    watch.looked(100 * MB, now=1.5)                # the disk as it was: none of it was written
    assert watch.admits_replicated(room, kind=COMMITTED_ENTRIES)
