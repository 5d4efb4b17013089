"""Write history events (verification/history.py) as Parquet files, incrementally.

Events are appended to per-column lists (cheap: the hot path is one append per
column); a batch is handed to a writer thread every `batch_events` events or
`batch_seconds`, which writes `<writer>-<part>.parquet.tmp` and renames it, so
a `kill -9` leaves only complete files behind (the judge reads `*.parquet`)
and loses at most the batch in memory and the one being written.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from warren.verification.history import EVENTS, SCHEMA

COLUMNS = SCHEMA.names
_STOP = object()


class HistoryRecorder:
    def __init__(self, directory: str | Path, writer: str, run_id: str | None,
                 batch_events: int = 20_000, batch_seconds: float = 1.0):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.writer, self.run_id = writer, run_id
        self.batch_events, self.batch_seconds = batch_events, batch_seconds
        self.events_written = 0
        self._part = 0
        self._columns = self._empty_columns()
        self._batch_started = time.monotonic()
        self._batches: queue.Queue = queue.Queue(maxsize=8)
        self._thread = threading.Thread(target=self._write_batches, name=f"history-{writer}", daemon=True)
        self._thread.start()

    @staticmethod
    def _empty_columns() -> dict[str, list]:
        return {name: [] for name in COLUMNS}

    def record(self, event: str, *, queue: str | None = None, message_id: str | None = None,
               publisher_id: str | None = None, seq: int | None = None, consumer_id: str | None = None,
               node: str | None = None, redelivered: bool | None = None, detail: str | None = None) -> None:
        assert event in EVENTS, event
        c = self._columns
        c["run_id"].append(self.run_id)
        c["writer"].append(self.writer)
        c["event"].append(event)
        c["queue"].append(queue)
        c["message_id"].append(message_id)
        c["publisher_id"].append(publisher_id)
        c["seq"].append(seq)
        c["consumer_id"].append(consumer_id)
        c["node"].append(node)
        c["redelivered"].append(redelivered)
        c["mono_ns"].append(time.monotonic_ns())
        c["wall_ns"].append(time.time_ns())
        c["detail"].append(detail)
        if len(c["event"]) >= self.batch_events:
            self.flush()

    def flush_if_due(self) -> None:
        """Called by a ~1 s timer, so a quiet recorder still closes its files."""
        if self._columns["event"] and time.monotonic() - self._batch_started >= self.batch_seconds:
            self.flush()

    def flush(self) -> None:
        columns, self._columns = self._columns, self._empty_columns()
        self._batch_started = time.monotonic()
        if columns["event"]:
            self._batches.put(columns)  # blocks only when the writer thread is 8 batches behind

    def close(self) -> None:
        self.flush()
        self._batches.put(_STOP)
        self._thread.join()

    def _write_batches(self) -> None:
        while (columns := self._batches.get()) is not _STOP:
            self._write(columns)

    def _write(self, columns: dict[str, list]) -> None:
        table = pa.Table.from_pydict(columns, schema=SCHEMA)
        final = self.directory / f"{self.writer}-{self._part:06d}.parquet"
        temporary = final.with_suffix(".parquet.tmp")
        pq.write_table(table, temporary)
        os.replace(temporary, final)
        self._part += 1
        self.events_written += table.num_rows
