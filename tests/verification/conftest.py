"""One local[2] SparkSession for every judge test (a JVM start costs seconds)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    from warren.verification.judge.session import spark_session

    session, created = spark_session("local[2]", driver_memory="1g", shuffle_partitions=4)
    session.conf.set("spark.sql.adaptive.coalescePartitions.enabled", "true")
    yield session
    if created:
        session.stop()
