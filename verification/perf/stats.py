"""Counters and latency histograms, mergeable across processes (for the summary)."""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

_GROWTH = math.log(1.05)  # 5 % wide buckets: percentiles within 5 %, constant memory


class LatencyHistogram:
    def __init__(self, buckets: dict[int, int] | None = None):
        self.buckets: Counter = Counter(buckets or {})
        self.count = sum(self.buckets.values())

    def add_ns(self, latency_ns: int) -> None:
        micros = max(latency_ns // 1000, 1)
        self.buckets[int(math.log(micros) / _GROWTH)] += 1
        self.count += 1

    def merge(self, other: "LatencyHistogram") -> None:
        self.buckets.update(other.buckets)
        self.count += other.count

    def percentile_ms(self, fraction: float) -> float | None:
        if not self.count:
            return None
        rank, seen = fraction * self.count, 0
        for bucket in sorted(self.buckets):
            seen += self.buckets[bucket]
            if seen >= rank:
                return math.exp((bucket + 1) * _GROWTH) / 1000.0
        return None

    def summary(self) -> dict:
        return {f"p{int(f * 1000) / 10:g}": self.percentile_ms(f) for f in (0.5, 0.75, 0.95, 0.99, 0.999)} | {
            "max": self.percentile_ms(1.0)}


@dataclass
class PerfStats:
    """Everything one process counted; `interval` histograms are reset every progress line."""
    published: int = 0
    confirmed: int = 0
    nacked: int = 0
    returned: int = 0
    delivered: int = 0
    redelivered: int = 0
    acked: int = 0
    reconnects: int = 0
    connection_losses: int = 0
    outstanding_confirms: int = 0
    confirm_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    deliver_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    interval_confirm_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    interval_deliver_latency: LatencyHistogram = field(default_factory=LatencyHistogram)

    COUNTS = ("published", "confirmed", "nacked", "returned", "delivered", "redelivered", "acked", "reconnects",
              "connection_losses", "outstanding_confirms")

    def confirm_took(self, latency_ns: int) -> None:
        self.confirm_latency.add_ns(latency_ns)
        self.interval_confirm_latency.add_ns(latency_ns)

    def delivery_took(self, latency_ns: int) -> None:
        self.deliver_latency.add_ns(latency_ns)
        self.interval_deliver_latency.add_ns(latency_ns)

    def counts(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.COUNTS}

    def to_json(self, elapsed_seconds: float) -> dict:
        return {"elapsed_seconds": elapsed_seconds, **self.counts(),
                "confirm_latency_buckets": dict(self.confirm_latency.buckets),
                "deliver_latency_buckets": dict(self.deliver_latency.buckets)}


def merge_summaries(summaries: list[dict]) -> dict:
    """One summary of several processes' to_json() results."""
    total: dict = {name: sum(s[name] for s in summaries) for name in PerfStats.COUNTS}
    total["elapsed_seconds"] = max((s["elapsed_seconds"] for s in summaries), default=0.0)
    for kind in ("confirm", "deliver"):
        merged = LatencyHistogram()
        for s in summaries:
            merged.merge(LatencyHistogram({int(k): v for k, v in s[f"{kind}_latency_buckets"].items()}))
        total[f"{kind}_latency_buckets"] = dict(merged.buckets)
    return total


def finish_summary(total: dict) -> dict:
    """Rates and percentiles for display and --json."""
    elapsed = total["elapsed_seconds"] or 1e-9
    out = {k: v for k, v in total.items() if not k.endswith("_buckets")}
    out["publish_rate"] = total["published"] / elapsed
    out["confirm_rate"] = total["confirmed"] / elapsed
    out["deliver_rate"] = total["delivered"] / elapsed
    for kind in ("confirm", "deliver"):
        hist = LatencyHistogram({int(k): v for k, v in total[f"{kind}_latency_buckets"].items()})
        out[f"{kind}_latency_ms"] = hist.summary()
    return out
