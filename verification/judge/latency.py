"""Latencies: publish-to-confirm (first confirm minus first publish) and
publish-to-deliver (first delivery minus first publish), in ns, per queue.

Percentiles are exact, by nearest rank: with the n latencies of a queue
sorted ascending, pXX is the value at rank ceil(XX/100 * n) (1-based), max
the value at rank n. Ranks come from row_number over the sorted values (an
external sort, so a queue's values need not fit in memory), never from
approx_percentile.
"""
from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

PERCENTILES_PER_MILLE = {"p50": 500, "p99": 990, "p99.9": 999}
HISTOGRAM_BINS_PER_DECADE = 10
METRICS = ("publish_to_confirm", "publish_to_deliver")


def latency_frame(messages: DataFrame) -> DataFrame:
    """queue, metric, published_ns, latency_ns: one row per message and metric it has."""
    base = messages.where(F.col("published_ns").isNotNull())
    confirm = base.where(F.col("confirmed_ns").isNotNull()).select(
        "queue", F.lit("publish_to_confirm").alias("metric"), "published_ns",
        (F.col("confirmed_ns") - F.col("published_ns")).alias("latency_ns"))
    deliver = base.where(F.col("first_delivered_ns").isNotNull()).select(
        "queue", F.lit("publish_to_deliver").alias("metric"), "published_ns",
        (F.col("first_delivered_ns") - F.col("published_ns")).alias("latency_ns"))
    return confirm.unionByName(deliver)


def nearest_rank(count: int, per_mille: int) -> int:
    return max(1, -(-per_mille * count // 1000))  # integer ceil: no float rounding at 99.9%


def exact_percentiles(spark: SparkSession, latencies: DataFrame) -> dict[str, dict[str, dict]]:
    """{queue: {metric: {count, p50, p99, p99.9, max}}} (ns)."""
    counts = latencies.groupBy("queue", "metric").count().collect()
    wanted = [(row["queue"], row["metric"], name, nearest_rank(row["count"], pm))
              for row in counts for name, pm in {**PERCENTILES_PER_MILLE, "max": 1000}.items()]
    result: dict[str, dict[str, dict]] = {}
    for row in counts:
        result.setdefault(row["queue"], {})[row["metric"]] = {"count": int(row["count"])}
    if not wanted:
        return result
    targets = spark.createDataFrame(wanted, "queue string, metric string, name string, rank long")
    ranked = latencies.withColumn(
        "rank", F.row_number().over(Window.partitionBy("queue", "metric").orderBy("latency_ns")))
    for row in ranked.join(F.broadcast(targets), ["queue", "metric", "rank"]).collect():
        result[row["queue"]][row["metric"]][row["name"]] = int(row["latency_ns"])
    return result


def latency_over_time(latencies: DataFrame, t0_ns: int) -> list[dict]:
    """Per second of publish time and metric, over all queues: exact p50, p99 (interpolated,
    Spark's `percentile`, which is exact per group; a second's values fit in memory) and max."""
    second = F.floor((F.col("published_ns") - F.lit(t0_ns)) / F.lit(1_000_000_000)).cast("long")
    rows = (latencies.groupBy(second.alias("second"), "metric")
            .agg(F.percentile("latency_ns", F.array(F.lit(0.5), F.lit(0.99))).alias("p"),
                 F.max("latency_ns").alias("max"))
            .orderBy("metric", "second").collect())
    return [{"second": r["second"], "metric": r["metric"], "p50_ns": float(r["p"][0]),
             "p99_ns": float(r["p"][1]), "max_ns": int(r["max"])} for r in rows]


def latency_histogram(latencies: DataFrame) -> list[dict]:
    """Counts per metric in log-spaced bins: bin b holds [10^(b/10), 10^((b+1)/10)) ns;
    latencies under 1 ns (clock ties, a confirm recorded first) fall in bin 0."""
    value = F.greatest(F.col("latency_ns"), F.lit(1)).cast("double")
    bin_ = F.floor(F.log10(value) * HISTOGRAM_BINS_PER_DECADE).cast("long")
    rows = latencies.groupBy("metric", bin_.alias("bin")).count().orderBy("metric", "bin").collect()
    return [{"metric": r["metric"], "bin": r["bin"], "count": int(r["count"])} for r in rows]
