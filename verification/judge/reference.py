"""A tiny pure-Python judge (pyarrow to read, plain dicts after): the same
counts, percentiles and unavailability as the Spark job, written the obvious
way, for small histories. The tests' oracle; not for large histories.

    python -m verification.judge.reference HISTORY_DIR
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq

from warren.verification.judge.faults import ALL_QUEUES, measurement_windows, pair_faults
from warren.verification.judge.latency import PERCENTILES_PER_MILLE, nearest_rank
from warren.verification.judge.messages import COUNT_COLUMNS


def read_events(path: str | Path) -> list[dict]:
    rows: list[dict] = []
    for file in sorted(Path(path).rglob("*.parquet")):
        rows.extend(pq.read_table(file).to_pylist())
    return rows


def first_times(events: list[dict], kind: str) -> dict[str, int]:
    first: dict[str, int] = {}
    for e in events:
        if e["event"] == kind:
            first[e["message_id"]] = min(first.get(e["message_id"], e["mono_ns"]), e["mono_ns"])
    return first


def message_records(events: list[dict]) -> dict[tuple, dict]:
    """(queue, message_id) -> published/confirmed/nacked/returned (first times) and deliveries."""
    confirmed, nacked, returned = (first_times(events, kind) for kind in ("confirm", "nack", "return"))
    records: dict[tuple, dict] = defaultdict(lambda: {"published": None, "deliveries": []})
    for e in events:
        key = (e["queue"], e["message_id"])
        if e["event"] == "publish":
            current = records[key]["published"]
            records[key]["published"] = e["mono_ns"] if current is None else min(current, e["mono_ns"])
        elif e["event"] == "deliver":
            records[key]["deliveries"].append((e["mono_ns"], bool(e["redelivered"])))
    for (_, mid), record in records.items():
        if record["published"] is not None:
            record.update(confirmed=confirmed.get(mid), nacked=nacked.get(mid), returned=returned.get(mid))
    return records


def count_messages(records: dict[tuple, dict]) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(COUNT_COLUMNS, 0))
    for (queue, _), r in records.items():
        c, deliveries = counts[queue], sorted(r["deliveries"])
        if deliveries:
            extra_flagged = sum(flag for _, flag in deliveries[1:])
            c["duplicates_redelivered"] += extra_flagged
            c["duplicates_unflagged"] += len(deliveries) - 1 - extra_flagged
        if r["published"] is None:
            c["phantom_messages"] += bool(deliveries)
            c["phantom_deliveries"] += len(deliveries)
            continue
        c["published"] += 1
        c["confirmed"] += r["confirmed"] is not None
        c["nacked"] += r["nacked"] is not None
        c["returned"] += r["returned"] is not None
        c["delivered_messages"] += bool(deliveries)
        c["deliveries"] += len(deliveries)
        c["confirmed_lost"] += r["confirmed"] is not None and r["returned"] is None and not deliveries
        c["unconfirmed_delivered"] += r["confirmed"] is None and bool(deliveries)
    return counts


def order_violations(events: list[dict]) -> dict[str, int]:
    streams: dict[tuple, list] = defaultdict(list)
    for e in events:
        if e["event"] == "deliver" and e["publisher_id"] is not None and e["seq"] is not None:
            streams[(e["queue"], e["consumer_id"], e["publisher_id"])].append(
                (e["mono_ns"], e["seq"], bool(e["redelivered"])))
    violations: dict[str, int] = defaultdict(int)
    for (queue, _, _), stream in streams.items():
        highest = None
        for _, seq, redelivered in sorted(stream):
            if not redelivered and highest is not None and highest > seq:
                violations[queue] += 1
            highest = seq if highest is None else max(highest, seq)
    return violations


def percentiles(records: dict[tuple, dict]) -> dict[str, dict[str, dict]]:
    values: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for (queue, _), r in records.items():
        if r["published"] is None:
            continue
        if r["confirmed"] is not None:
            values[queue]["publish_to_confirm"].append(r["confirmed"] - r["published"])
        if r["deliveries"]:
            values[queue]["publish_to_deliver"].append(min(r["deliveries"])[0] - r["published"])
    result: dict[str, dict[str, dict]] = {}
    for queue, metrics in values.items():
        for metric, latencies in metrics.items():
            latencies.sort()
            summary = {"count": len(latencies)}
            for name, per_mille in {**PERCENTILES_PER_MILLE, "max": 1000}.items():
                summary[name] = latencies[nearest_rank(len(latencies), per_mille) - 1]
            result.setdefault(queue, {})[metric] = summary
    return result


def unavailability(events: list[dict], records: dict[tuple, dict], grace_ns: int) -> dict[int, dict]:
    control = sorted((e for e in events if e["event"] in ("fault_start", "fault_end")), key=lambda e: e["mono_ns"])
    faults = pair_faults(control, max(e["mono_ns"] for e in events))
    confirms: dict[str, list[int]] = defaultdict(list)
    last: dict[str, int] = {}
    for (queue, _), r in records.items():
        if r["published"] is not None:
            last[queue] = max(last.get(queue, r["published"]), r["published"])
            if r["confirmed"] is not None:
                confirms[queue].append(r["confirmed"])
                confirms[ALL_QUEUES].append(r["confirmed"])
    if last:
        last[ALL_QUEUES] = max(last.values())
    result = {f["id"]: dict.fromkeys(last) for f in faults}
    for fault, queue, start, end in measurement_windows(faults, last, grace_ns):
        points = sorted([start, end] + [t for t in confirms[queue] if start <= t <= end])
        result[fault][queue] = max(b - a for a, b in zip(points, points[1:]))
    return result


def judge(path: str | Path, grace_s: float = 30.0) -> dict:
    events = read_events(path)
    records = message_records(events)
    counts, violations = count_messages(records), order_violations(events)
    latency = percentiles(records)
    queues = {}
    for queue in set(counts) | set(violations):
        queues[queue] = {**dict(counts.get(queue, dict.fromkeys(COUNT_COLUMNS, 0))),
                         "order_violations": violations.get(queue, 0), "latency_ns": latency.get(queue, {})}
    return {"queues": queues, "unavailability_ns": unavailability(events, records, int(grace_s * 1e9))}


if __name__ == "__main__":
    print(json.dumps(judge(sys.argv[1]), indent=1, sort_keys=True, default=str))
