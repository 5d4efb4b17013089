"""Reading a history directory into the DataFrames the metrics start from.

Every frame keeps only the columns its metrics need (Parquet reads just
those). Row order never matters: every metric orders by mono_ns itself.
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from warren.verification.history import SCHEMA

_SPARK_TYPES = {pa.string(): T.StringType(), pa.int64(): T.LongType(), pa.bool_(): T.BooleanType()}


def spark_schema() -> T.StructType:
    """history.SCHEMA as a Spark schema: the files are read with it, never inferred."""
    return T.StructType([T.StructField(f.name, _SPARK_TYPES[f.type], f.nullable) for f in SCHEMA])


def read_history(spark: SparkSession, path: str) -> DataFrame:
    """Every `*.parquet` under path (recursively; a recorder's `.parquet.tmp` is not one)."""
    return (spark.read.schema(spark_schema())
            .option("recursiveFileLookup", "true").option("pathGlobFilter", "*.parquet")
            .parquet(path))


@dataclass
class Events:
    all: DataFrame
    deliveries: DataFrame  # queue, message_id, publisher_id, seq, consumer_id, redelivered, mono_ns
    t0_ns: int             # the history's first mono_ns: time 0 of every series
    end_ns: int


def split_events(history: DataFrame) -> Events:
    bounds = history.agg(F.min("mono_ns"), F.max("mono_ns")).first()
    if bounds[0] is None:
        raise ValueError("the history holds no events")
    deliveries = history.where(F.col("event") == "deliver").select(
        "queue", "message_id", "publisher_id", "seq", "consumer_id",
        F.coalesce("redelivered", F.lit(False)).alias("redelivered"), "mono_ns")
    return Events(all=history,
                  deliveries=deliveries, t0_ns=bounds[0], end_ns=bounds[1])


def control_events(history: DataFrame) -> list[dict]:
    """fault_start/fault_end/drain_start/drain_end rows: a handful per run, safe to collect."""
    kinds = ["fault_start", "fault_end", "drain_start", "drain_end"]
    rows = (history.where(F.col("event").isin(kinds))
            .select("event", "node", "detail", "mono_ns").orderBy("mono_ns").collect())
    return [row.asDict() for row in rows]
