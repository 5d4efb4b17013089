"""Reading a recorded history in tests: a tiny pure-Python look, not a judge."""
from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from warren.verification.history import SCHEMA


def read_events(directory: Path) -> list[dict]:
    """Every row of every *.parquet file, each file checked against the schema."""
    rows = []
    for path in sorted(directory.glob("*.parquet")):
        table = pq.read_table(path)
        assert table.schema.equals(SCHEMA), f"{path.name}: {table.schema}"
        rows += table.to_pylist()
    return rows


def ids(rows: list[dict], event: str) -> set[str]:
    return {r["message_id"] for r in rows if r["event"] == event}


def assert_consistent(rows: list[dict]) -> None:
    published = ids(rows, "publish")
    assert ids(rows, "confirm") <= published
    assert ids(rows, "deliver") <= published
    assert ids(rows, "ack") <= ids(rows, "deliver")
    for row in rows:
        if row["event"] == "publish":
            assert row["message_id"] == f"{row['publisher_id']}:{row['seq']}"
