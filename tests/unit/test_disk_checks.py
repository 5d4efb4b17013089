"""The disk alarm looks at free space sooner the nearer it is to the limit (as RabbitMQ's
disk monitor): a statvfs waits for the filesystem and cost the loop 0.6-1.5 ms at every
alarm check under an fsync load (broker/node/broker.py, `next_disk_check_in`)."""
from __future__ import annotations

import time
from types import SimpleNamespace

from warren.broker.node.broker import (
    DISK_CHECK_MAX_SECONDS,
    DISK_FILL_BYTES_PER_SECOND,
    Broker,
    next_disk_check_in,
)

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

    def free_bytes(self, path) -> int:
        self.looks += 1
        return self.free


def broker_with(free: int, limit: int) -> SimpleNamespace:
    told: list[list[str]] = []   # what the cluster shell was told of this node's alarms
    released: list[None] = []    # the storage asked to give back what its logs let go
    runtime = SimpleNamespace(stopped=False, persistence=SimpleNamespace(release_space=lambda: released.append(None)))
    return SimpleNamespace(
        queued_message_bytes=0, node_log=CountingLog(free), told=told, released=released,
        cluster=SimpleNamespace(set_local_alarms=told.append, runtime=runtime),
        settings=SimpleNamespace(memory_high_watermark_bytes=10**9, disk_free_limit_bytes=limit, data_dir=".",
                                 alarm_check_interval_seconds=0.5, node_name="n1"),
        memory_alarm=False, disk_alarm=False, next_disk_check=0.0)


def test_far_from_the_limit_free_space_is_not_looked_at_every_check():
    broker = broker_with(free=100 * 1000 * MB, limit=50 * MB)
    for _ in range(20):
        Broker.check_alarms(broker)
    assert broker.node_log.looks == 1
    assert broker.next_disk_check >= time.monotonic() + DISK_CHECK_MAX_SECONDS - 1


def test_near_the_limit_the_alarm_is_raised_and_cleared_at_the_next_check_due():
    broker = broker_with(free=60 * MB, limit=50 * MB)
    Broker.check_alarms(broker)
    assert not broker.disk_alarm
    broker.node_log.free = 40 * MB
    broker.next_disk_check = 0.0           # the check is due (0.5 s later)
    assert not broker.released
    Broker.check_alarms(broker)
    assert broker.disk_alarm and broker.told == [["disk"]]
    assert len(broker.released) == 1, "a check that finds the disk short asks the storage to give space back"
    Broker.check_alarms(broker)            # not due yet: the alarm stands, nothing looked at
    assert broker.disk_alarm and broker.node_log.looks == 2 and broker.told == [["disk"]]
    broker.node_log.free = 80 * MB
    broker.next_disk_check = 0.0
    Broker.check_alarms(broker)
    assert not broker.disk_alarm and broker.told == [["disk"], []]


def test_a_failing_statvfs_counts_as_no_space():
    broker = broker_with(free=0, limit=50 * MB)
    broker.node_log.free_bytes = lambda path: (_ for _ in ()).throw(OSError("EIO"))
    Broker.check_alarms(broker)
    assert broker.disk_alarm
