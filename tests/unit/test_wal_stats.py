"""The WAL's histograms (broker/admin/wal_stats.py) expose what prometheus_client's would."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.registry import Collector

from warren.broker.admin.wal_stats import LoopHistogram

BUCKETS = (0.0005, 0.001, 0.002, 0.005, 1.0)
VALUES = [0.0001, 0.0005, 0.0007, 0.001, 0.0031, 0.005, 0.9, 1.0, 2.5, 0.0005]


class Only(Collector):
    def __init__(self, histogram: LoopHistogram) -> None:
        self.histogram = histogram

    def collect(self):
        return self.histogram.collect()


def exposition(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


def test_buckets_count_and_sum_are_those_of_a_prometheus_client_histogram():
    reference_registry, loop_registry = CollectorRegistry(), CollectorRegistry()
    reference = Histogram("warren_test_seconds", "A test histogram", buckets=BUCKETS, registry=reference_registry)
    ours = LoopHistogram("warren_test_seconds", "A test histogram", BUCKETS)
    loop_registry.register(Only(ours))
    for value in VALUES:
        reference.observe(value)
        ours.observe(value)
    assert exposition(loop_registry) == exposition(reference_registry)
