"""Hand-written histories for edge cases: a few events as plain dicts."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from warren.verification.history import SCHEMA, message_id


def event(kind: str, t: int, queue: str | None = "q", publisher: str | None = "p", seq: int | None = None,
          consumer: str | None = None, redelivered: bool | None = None, **extra) -> dict:
    row = dict.fromkeys(SCHEMA.names)
    row.update(writer="test", event=kind, queue=queue, publisher_id=publisher, seq=seq, consumer_id=consumer,
               redelivered=redelivered, mono_ns=t, wall_ns=t,
               message_id=None if seq is None else message_id(publisher, seq), **extra)
    return row


def published_confirmed(seq: int, t: int) -> list[dict]:
    return [event("publish", t, seq=seq), event("confirm", t + 10, seq=seq)]


def delivered(seq: int, t: int, consumer: str = "c", redelivered: bool = False) -> list[dict]:
    return [event("deliver", t, seq=seq, consumer=consumer, redelivered=redelivered)]


def write_history(directory: Path, rows: list[dict]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), directory / "test-000000.parquet")
    return directory
