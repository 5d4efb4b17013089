"""What the node's WAL batches cost, for the metrics endpoint (broker/admin/metrics.py)."""
from __future__ import annotations

from typing import Any

from prometheus_client import Histogram


class WalStats:
    def __init__(self) -> None:
        self.entries_per_fsync = Histogram(
            "warren_wal_entries_per_fsync", "WAL records made durable by one fdatasync",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096), registry=None)
        self.fsync_seconds = Histogram(
            "warren_wal_fsync_seconds", "Time to write and fdatasync one WAL batch",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0), registry=None)

    def on_batch_written(self, written: Any) -> None:
        """A `storage.group_commit.BatchWritten`: one batch is durable."""
        self.entries_per_fsync.observe(written.entries)
        self.fsync_seconds.observe(written.seconds)

    def collect(self) -> list:
        return [*self.entries_per_fsync.collect(), *self.fsync_seconds.collect()]
