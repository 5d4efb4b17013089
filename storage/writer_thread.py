"""The one thread that writes the WAL's batches, in order.

A `ThreadPoolExecutor` costs every batch a `Future`, a work item, a lock and
a condition on both sides of the hand-over, and its completion runs the
future's callbacks on the writer thread while it holds the GIL the event loop
needs. This thread takes `(batch, data)` from a `queue.SimpleQueue` (one C
call each way), writes, and reports with one `call_soon_threadsafe`: the
loop's side of a batch is a `put`, the thread's a `get`, the write and the
report.
"""
from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any

from warren.storage import cpus

# report(batch, heads, size, started, result, error) on the loop: result is what `write` returned, or
# error what it raised
Report = Callable[[int, Any, int, float, Any, BaseException | None], None]


class WriterThread:
    def __init__(self, write: Callable[[list[bytes]], Any], report: Report, name: str = "wal-writer") -> None:
        self._write = write
        self._report = report
        self._name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None   # started by the first batch

    def submit(self, loop: asyncio.AbstractEventLoop, batch: int, heads: Any, data: list[bytes], size: int,
               started: float) -> None:
        """`data`: the batch's pieces, written one after another; `size`: their bytes."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._jobs.put((loop, batch, heads, data, size, started))

    def _run(self) -> None:
        cpus.run_anywhere()   # started by the loop's thread, which may be bound to one CPU
        while True:
            job = self._jobs.get()
            if job is None:
                return
            loop, batch, heads, data, size, started = job
            result, error = None, None
            try:
                result = self._write(data)
            except Exception as raised:  # noqa: BLE001 -- reported on the loop: the batch failed
                error = raised
            try:
                loop.call_soon_threadsafe(self._report, batch, heads, size, started, result, error)
            except RuntimeError:   # the loop is closed: nobody is waiting for the batch any more
                pass

    def close(self) -> None:
        """Let the batches handed over be written, then stop the thread."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None
