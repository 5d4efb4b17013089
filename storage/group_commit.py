"""Group commit: the asyncio shell around the WAL core.

Appends made during one event-loop turn form one batch; the batch is written
and fdatasynced on a worker thread while the loop keeps serving, and appends
made meanwhile form the next batch. Batches are numbered; whoever must wait
for durability (a publisher confirm) registers a callback for the batch its
record went into, and it runs on the loop once that batch is on disk — or
with ``ok=False`` if the write or fsync failed (ENOSPC, EIO), in which case the
batch's bytes are cut off the WAL again so the file stays well-formed.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from storage.wal import LogStore, Relocation

log = structlog.get_logger("warren.storage")

DurableCallback = Callable[[bool], None]
# Upper bound of one batch; a larger backlog is written as several batches.
BATCH_MAX_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class BatchWritten:
    """A batch that is now durable: where it lies, and what it cost."""

    batch: int
    path: Path
    start_offset: int
    entries: int
    size: int
    seconds: float


class GroupCommitter:
    def __init__(self, store: LogStore, prepare_rollover: Callable[[], tuple[dict[int, int], bytes]],
                 on_batch_written: Callable[[BatchWritten], None] | None = None,
                 on_relocated: Callable[[list[Relocation]], None] | None = None):
        self.store = store
        self._prepare_rollover = prepare_rollover
        self._written_listeners = [on_batch_written] if on_batch_written is not None else []
        self._relocated_listeners = [on_relocated] if on_relocated is not None else []
        # where the record of the latest append() starts inside its batch
        self.last_offset_in_batch = 0
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._pending_entries = 0
        # batches cut at BATCH_MAX_BYTES, waiting for the writer: (number, (bytes, entries))
        self._sealed: list[tuple[int, tuple[bytes, int]]] = []
        self.open_batch = 1  # the batch new appends go into
        self._callbacks: dict[int, list[DurableCallback]] = {}
        self._task: asyncio.Task | None = None
        # the slow half of a rollover (copying into segments) runs beside new batches
        self._rollover_task: asyncio.Task | None = None
        self.failed_batches = 0

    def append(self, encoded_record: bytes) -> int:
        """Queue one encoded record; returns the batch number it will be written in."""
        self._pending.append(encoded_record)
        self.last_offset_in_batch = self._pending_bytes
        self._pending_bytes += len(encoded_record)
        self._pending_entries += 1
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        if self._pending_bytes >= BATCH_MAX_BYTES:
            batch = self.open_batch
            self.open_batch += 1  # the writer picks up the full batch; later appends go on
            self._sealed.append((batch, self._take()))
            return batch
        return self.open_batch

    def subscribe(self, on_batch_written: Callable[[BatchWritten], None] | None = None,
                  on_relocated: Callable[[list[Relocation]], None] | None = None) -> None:
        """One more listener for written batches (called before the batch's
        `when_durable` callbacks) and for rollover relocations."""
        if on_batch_written is not None:
            self._written_listeners.append(on_batch_written)
        if on_relocated is not None:
            self._relocated_listeners.append(on_relocated)

    def _take(self) -> tuple[bytes, int]:
        data = b"".join(self._pending)
        entries = self._pending_entries
        self._pending.clear()
        self._pending_bytes = 0
        self._pending_entries = 0
        return data, entries

    def when_durable(self, batch: int, callback: DurableCallback) -> None:
        self._callbacks.setdefault(batch, []).append(callback)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await asyncio.sleep(0)  # let the rest of this turn append to the batch
            while self._sealed or self._pending:
                if self._sealed:
                    batch, (data, entries) = self._sealed.pop(0)
                else:
                    batch = self.open_batch
                    self.open_batch += 1
                    data, entries = self._take()
                started = time.perf_counter()
                ok = True
                try:
                    path, start = await loop.run_in_executor(None, self.store.write_batch, data)
                except OSError as error:
                    ok = False
                    self.failed_batches += 1
                    log.error("wal.write_failed", batch=batch, bytes=len(data), error=str(error))
                if ok and self._written_listeners:
                    written = BatchWritten(batch, path, start, entries, len(data), time.perf_counter() - started)
                    for listener in self._written_listeners:
                        listener(written)
                for callback in self._callbacks.pop(batch, ()):
                    callback(ok)
                if ok and self._rollover_task is None and self.store.needs_rollover():
                    await self._start_rollover(loop)
        finally:
            self._task = None
            if self._pending or self._sealed:
                self._task = loop.create_task(self._run())

    async def _start_rollover(self, loop: asyncio.AbstractEventLoop) -> None:
        """Switch to a new WAL file now; copy the old one into segments beside
        the batches that follow, so writers never wait for a rollover."""
        cursors, first_batch = self._prepare_rollover()
        try:
            await loop.run_in_executor(None, self.store.switch_wal, first_batch)
        except OSError as error:
            log.error("wal.rollover_failed", error=str(error))
            return
        self._rollover_task = loop.create_task(self._finish_rollover(loop, cursors))

    async def _finish_rollover(self, loop: asyncio.AbstractEventLoop, cursors: dict[int, int]) -> None:
        try:
            moved = await loop.run_in_executor(None, self.store.move_to_segments, cursors)
            if self._relocated_listeners:
                # readers switch before the old files go; one segment's worth per loop
                # turn, so a large move does not stall the node
                for relocation in moved:
                    for listener in self._relocated_listeners:
                        listener([relocation])
                    await asyncio.sleep(0)
            await loop.run_in_executor(None, self.store.finish_rollover, cursors)
        except OSError as error:
            # The old WAL files stay listed; the next rollover moves them again.
            log.error("wal.rollover_failed", error=str(error))
            return
        finally:
            self._rollover_task = None
        log.info("wal.rolled_over", segments=self.store.segment_count)

    async def drain(self) -> None:
        """Wait until everything appended so far is on disk (used at shutdown)."""
        while self._task is not None or self._rollover_task is not None:
            await asyncio.shield(self._task or self._rollover_task)
