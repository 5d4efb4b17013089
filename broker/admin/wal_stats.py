"""What the node's WAL batches cost, for the metrics endpoint (broker/admin/metrics.py).

Observed on the event loop once per WAL batch, so the histograms are plain
counts found with a bisect: prometheus_client's `Histogram.observe` takes a
lock for the sum and one for the bucket, about 1 % of the loop at 5k msg/s
(a batch every ~1 ms). The metrics endpoint reads a copy of the counts.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from typing import Any

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString


class LoopHistogram:
    """A Prometheus histogram written by one thread (the loop) without locks."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = tuple(float(bound) for bound in buckets)
        self.counts = [0] * (len(self.bounds) + 1)   # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1   # the first bucket whose `le` holds value
        self.sum += value

    def collect(self) -> list[HistogramMetricFamily]:
        counts, total = list(self.counts), self.sum
        cumulative, buckets = 0, []
        for bound, count in zip((*self.bounds, math.inf), counts):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))
        family = HistogramMetricFamily(self.name, self.documentation)
        family.add_metric([], buckets, sum_value=total)
        return [family]


class WalStats:
    def __init__(self) -> None:
        self.entries_per_fsync = LoopHistogram(
            "warren_wal_entries_per_fsync", "WAL records made durable by one fdatasync",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096))
        self.fsync_seconds = LoopHistogram(
            "warren_wal_fsync_seconds", "Time to write and fdatasync one WAL batch",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0))

    def on_batch_written(self, written: Any) -> None:
        """A `storage.group_commit.BatchWritten`: one batch is durable."""
        self.entries_per_fsync.observe(written.entries)
        self.fsync_seconds.observe(written.seconds)

    def collect(self) -> list:
        return [*self.entries_per_fsync.collect(), *self.fsync_seconds.collect()]
