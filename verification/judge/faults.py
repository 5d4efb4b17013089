"""Fault windows from the chaos schedule, and the unavailability after each.

Pairing: a fault_end closes the oldest open fault_start with the same
(node, detail), else the oldest open one; a fault never ended lasts to the
history's last event.

Unavailability of queue q after fault F (start s, end e): the longest gap
between consecutive points of {s} + {first-confirm times of q's messages in
[s, w]} + {w}, where w = min(e + grace, the start of the next fault starting
at or after e, q's last publish). Capping at the next fault attributes each
outage to one fault; capping at the last publish keeps the end of the load
from counting as an outage. No publish on
q after s: no value (None). The pseudo-queue "*" does the same over all queues.
"""
from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

ALL_QUEUES = "*"


def pair_faults(control: list[dict], end_ns: int) -> list[dict]:
    """[{id, node, detail, start_ns, end_ns, ended}] in start order, from control_events()."""
    faults: list[dict] = []
    open_faults: list[dict] = []
    for event in control:
        if event["event"] == "fault_start":
            fault = {"id": len(faults), "node": event["node"], "detail": event["detail"],
                     "start_ns": event["mono_ns"], "end_ns": end_ns, "ended": False}
            faults.append(fault)
            open_faults.append(fault)
        elif event["event"] == "fault_end" and open_faults:
            same = [f for f in open_faults if (f["node"], f["detail"]) == (event["node"], event["detail"])]
            closed = (same or open_faults)[0]
            closed.update(end_ns=event["mono_ns"], ended=True)
            open_faults.remove(closed)
    return faults


def measurement_windows(faults: list[dict], last_publish_ns: dict[str, int], grace_ns: int) -> list[tuple]:
    """(fault id, queue, window start, window end) for every queue with load after the fault started."""
    windows = []
    for fault in faults:
        next_starts = [f["start_ns"] for f in faults if f["start_ns"] >= fault["end_ns"] and f is not fault]
        cap = min([fault["end_ns"] + grace_ns, *next_starts])
        for queue, last in last_publish_ns.items():
            end = min(cap, last)
            if end > fault["start_ns"]:
                windows.append((fault["id"], queue, fault["start_ns"], end))
    return windows


def last_publishes(messages: DataFrame) -> dict[str, int]:
    rows = messages.groupBy("queue").agg(F.max("published_ns").alias("last")).collect()
    last = {r["queue"]: int(r["last"]) for r in rows if r["last"] is not None}
    if last:
        last[ALL_QUEUES] = max(last.values())
    return last


def unavailability(spark: SparkSession, messages: DataFrame, faults: list[dict],
                   grace_ns: int) -> dict[int, dict[str, int | None]]:
    """{fault id: {queue: longest gap without a confirm, ns}}; None where there was no load."""
    last = last_publishes(messages)
    result = {f["id"]: {queue: None for queue in last} for f in faults}
    windows = measurement_windows(faults, last, grace_ns)
    if not windows:
        return result
    frame = spark.createDataFrame(windows, "fault long, queue string, w_start long, w_end long")
    confirmed = messages.where(F.col("published_ns").isNotNull() & F.col("confirmed_ns").isNotNull())
    confirms = confirmed.select("queue", F.col("confirmed_ns").alias("t")).unionByName(
        confirmed.select(F.lit(ALL_QUEUES).alias("queue"), F.col("confirmed_ns").alias("t")))
    inside = (confirms.join(F.broadcast(frame), "queue")
              .where(F.col("t").between(F.col("w_start"), F.col("w_end"))).select("fault", "queue", "t"))
    bounds = frame.select("fault", "queue", F.col("w_start").alias("t")).unionByName(
        frame.select("fault", "queue", F.col("w_end").alias("t")))
    points = inside.unionByName(bounds)
    gap = F.col("t") - F.lag("t").over(Window.partitionBy("fault", "queue").orderBy("t"))
    rows = points.select("fault", "queue", gap.alias("gap")).groupBy("fault", "queue").agg(
        F.max("gap").alias("longest")).collect()
    for row in rows:
        result[row["fault"]][row["queue"]] = int(row["longest"])
    return result
