"""Throughput over time: confirms/s (a message's first confirm) and deliveries/s
(every delivery, duplicates included), per queue, per one-second bucket of
mono_ns counted from the history's first event."""
from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def _second(column: str, t0_ns: int):
    return F.floor((F.col(column) - F.lit(t0_ns)) / F.lit(1_000_000_000)).cast("long").alias("second")


def throughput_series(messages: DataFrame, deliveries: DataFrame, t0_ns: int) -> list[dict]:
    confirms = (messages.where(F.col("published_ns").isNotNull() & F.col("confirmed_ns").isNotNull())
                .groupBy("queue", _second("confirmed_ns", t0_ns)).agg(F.count(F.lit(1)).alias("confirms")))
    delivered = (deliveries.groupBy("queue", _second("mono_ns", t0_ns))
                 .agg(F.count(F.lit(1)).alias("deliveries")))
    joined = confirms.join(delivered, ["queue", "second"], "full").orderBy("queue", "second")
    return [{"queue": r["queue"], "second": r["second"], "confirms": int(r["confirms"] or 0),
             "deliveries": int(r["deliveries"] or 0)} for r in joined.collect()]
