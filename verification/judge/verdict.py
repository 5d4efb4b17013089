"""A history judged: one JSON-able dict (the schema is in docs/verification.md)."""
from __future__ import annotations

from pyspark.sql import SparkSession

from warren.verification.judge import faults as fault_metrics
from warren.verification.judge.events import control_events, read_history, split_events
from warren.verification.judge.latency import exact_percentiles, latency_frame, latency_histogram, latency_over_time
from warren.verification.judge.messages import COUNT_COLUMNS, counts_by_queue, lost_examples, message_table
from warren.verification.judge.ordering import order_violations_by_queue
from warren.verification.judge.throughput import throughput_series

FAILING_COUNTS = ("confirmed_lost", "phantom_messages")  # what makes warren-verify exit non-zero


def judge_history(spark: SparkSession, path: str, grace_s: float = 30.0) -> dict:
    events = split_events(read_history(spark, path))
    messages = message_table(events)
    try:
        queues = _queue_reports(spark, events, messages)
        control = control_events(events.all)
        faults = fault_metrics.pair_faults(control, events.end_ns)
        gaps = fault_metrics.unavailability(spark, messages, faults, int(grace_s * 1e9))
        latencies = latency_frame(messages)
        verdict = {
            "history": path,
            "t0_mono_ns": events.t0_ns,
            "duration_s": (events.end_ns - events.t0_ns) / 1e9,
            "drained": any(e["event"] == "drain_end" for e in control),
            "drain_timed_out": any(e["event"] == "drain_end" and "timed_out=True" in (e["detail"] or "")
                                   for e in control),
            "queues": queues,
            "totals": {name: sum(q[name] for q in queues.values()) for name in (*COUNT_COLUMNS, "order_violations")},
            "lost_examples": lost_examples(messages),
            "faults": [_fault_report(f, gaps[f["id"]], events.t0_ns) for f in faults],
            "grace_s": grace_s,
            "series": {"throughput": throughput_series(messages, events.deliveries, events.t0_ns),
                       "latency": latency_over_time(latencies, events.t0_ns),
                       "latency_histogram": latency_histogram(latencies)},
        }
    finally:
        messages.unpersist()
    verdict["ok"] = not any(verdict["totals"][name] for name in FAILING_COUNTS)
    return verdict


def _queue_reports(spark: SparkSession, events, messages) -> dict[str, dict]:
    counts = counts_by_queue(messages)
    violations = order_violations_by_queue(events.deliveries)
    percentiles = exact_percentiles(spark, latency_frame(messages))
    reports = {}
    for queue in sorted(set(counts) | set(violations), key=lambda q: (q is None, q or "")):
        report = dict(counts.get(queue, dict.fromkeys(COUNT_COLUMNS, 0)))
        report["order_violations"] = violations.get(queue, 0)
        report["latency_ns"] = percentiles.get(queue, {})
        reports[queue] = report
    return reports


def _fault_report(fault: dict, gaps: dict, t0_ns: int) -> dict:
    return {"id": fault["id"], "node": fault["node"], "detail": fault["detail"], "ended": fault["ended"],
            "start_s": (fault["start_ns"] - t0_ns) / 1e9, "end_s": (fault["end_ns"] - t0_ns) / 1e9,
            "unavailability_s": {queue: None if gap is None else gap / 1e9 for queue, gap in gaps.items()}}
