"""One row per (queue, message_id): what was published, confirmed, delivered.

A message is identified by its message_id (`<publisher_id>:<seq>`, unique in
a run). Confirms and nacks are matched on message_id alone (a confirm's
queue is the publish's), and so are returns (basic.return: unroutable, so
its confirm promises nothing and it is not lost); deliveries on (queue, message_id), so a delivery
from a queue the message was never published to is a phantom of that queue.
"""
from __future__ import annotations

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from warren.verification.judge.events import Events

COUNT_COLUMNS = ("published", "confirmed", "nacked", "returned", "delivered_messages", "deliveries",
                 "confirmed_lost", "unconfirmed_delivered", "phantom_messages", "phantom_deliveries",
                 "duplicates_redelivered", "duplicates_unflagged")


def message_table(events: Events) -> DataFrame:
    """Columns: queue, message_id, published_ns, deliveries, flagged (deliveries with redelivered
    set), first_delivered_ns, first_flagged, confirmed_ns, nacked_ns, returned_ns.

    Two shuffles, both on message_id: publishes and deliveries are repartitioned by message_id and
    aggregated per (queue, message_id) in place, confirms/nacks/returns aggregated per message_id,
    so the join between them needs no third exchange."""
    partitions = int(events.all.sparkSession.conf.get("spark.sql.shuffle.partitions"))
    event, t = F.col("event"), F.col("mono_ns")
    is_delivery = event == "deliver"
    handled = (events.all.where(event.isin("publish", "deliver"))
               .select("queue", "message_id", "event", "mono_ns",
                       F.coalesce("redelivered", F.lit(False)).alias("redelivered"))
               .repartition(partitions, "message_id")
               .groupBy("queue", "message_id").agg(
                   F.min(F.when(event == "publish", t)).alias("published_ns"),
                   F.count(F.when(is_delivery, 1)).alias("deliveries"),
                   F.sum(F.when(is_delivery, F.col("redelivered").cast("long"))).alias("flagged"),
                   # The first delivery is the earliest; on a tie the unflagged one (false < true).
                   F.min(F.when(is_delivery, F.struct("mono_ns", "redelivered"))).alias("first")))
    answered = (events.all.where(event.isin("confirm", "nack", "return")).groupBy("message_id").agg(
        *[F.min(F.when(event == kind, t)).alias(f"{name}_ns")
          for kind, name in (("confirm", "confirmed"), ("nack", "nacked"), ("return", "returned"))]))
    table = (handled.join(answered, "message_id", "left")
             .select("queue", "message_id", "published_ns", "deliveries", "flagged",
                     F.col("first.mono_ns").alias("first_delivered_ns"),
                     F.col("first.redelivered").alias("first_flagged"),
                     "confirmed_ns", "nacked_ns", "returned_ns"))
    return table.persist(StorageLevel.MEMORY_AND_DISK)


def counts_by_queue(messages: DataFrame) -> dict[str, dict[str, int]]:
    """The COUNT_COLUMNS per queue, from one aggregation of the message table."""
    published = F.col("published_ns").isNotNull()
    confirmed = published & F.col("confirmed_ns").isNotNull()
    returned = published & F.col("returned_ns").isNotNull()
    delivered = F.col("deliveries") > 0
    extra_flagged = F.col("flagged") - F.col("first_flagged").cast("long")  # flagged deliveries after the first

    def count_if(condition):
        return F.sum(F.when(condition, 1).otherwise(0))

    def sum_if(condition, value):
        return F.sum(F.when(condition, value).otherwise(0))

    rows = messages.groupBy("queue").agg(
        count_if(published).alias("published"),
        count_if(confirmed).alias("confirmed"),
        count_if(published & F.col("nacked_ns").isNotNull()).alias("nacked"),
        count_if(returned).alias("returned"),
        count_if(published & delivered).alias("delivered_messages"),
        sum_if(published & delivered, F.col("deliveries")).alias("deliveries"),  # phantoms apart
        count_if(confirmed & ~returned & ~delivered).alias("confirmed_lost"),
        count_if(published & F.col("confirmed_ns").isNull() & delivered).alias("unconfirmed_delivered"),
        count_if(~published & delivered).alias("phantom_messages"),
        sum_if(~published & delivered, F.col("deliveries")).alias("phantom_deliveries"),
        sum_if(delivered, extra_flagged).alias("duplicates_redelivered"),
        sum_if(delivered, F.col("deliveries") - 1 - extra_flagged).alias("duplicates_unflagged"),
    ).collect()
    return {row["queue"]: {name: int(row[name]) for name in COUNT_COLUMNS} for row in rows}


def lost_examples(messages: DataFrame, limit: int = 20) -> dict[str, list[str]]:
    """A few confirmed-and-lost message ids per queue, for the report (bounded collect)."""
    lost = messages.where(F.col("published_ns").isNotNull() & F.col("confirmed_ns").isNotNull()
                          & F.col("returned_ns").isNull() & (F.col("deliveries") == 0))
    rows = lost.select("queue", "message_id").orderBy("queue", "message_id").limit(limit).collect()
    examples: dict[str, list[str]] = {}
    for row in rows:
        examples.setdefault(row["queue"], []).append(row["message_id"])
    return examples
