"""Per-publisher order violations outside redeliveries.

A delivery d of (queue q, consumer c, publisher p, seq n) is a violation when
d is not flagged redelivered and c earlier received, from q, some delivery of
p with a seq m > n. "Earlier" is the consumer's mono_ns order (one recording
process per consumer, so one clock), ties broken by seq (so equal timestamps
never count as a violation). Each violating delivery counts once, however
many higher seqs preceded it.
"""
from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F


def order_violations_by_queue(deliveries: DataFrame) -> dict[str, int]:
    keyed = deliveries.where(F.col("publisher_id").isNotNull() & F.col("seq").isNotNull())
    earlier = (Window.partitionBy("queue", "consumer_id", "publisher_id").orderBy("mono_ns", "seq")
               .rowsBetween(Window.unboundedPreceding, -1))
    flagged = keyed.select("queue", "redelivered", "seq", F.max("seq").over(earlier).alias("highest_before"))
    violations = flagged.where(~F.col("redelivered") & (F.col("highest_before") > F.col("seq")))
    return {row["queue"]: int(row["count"]) for row in violations.groupBy("queue").count().collect()}
