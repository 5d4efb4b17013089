"""Group commit: the asyncio shell around the WAL core.

Appends made during one event-loop turn form one batch; the batch is written
and fdatasynced on a worker thread while the loop keeps serving, and appends
made meanwhile form the next batch. Batches are numbered; whoever must wait
for durability (a publisher confirm) registers a callback for the batch its
record went into, and it runs on the loop once that batch is on disk — or
with ``ok=False`` if the write or fsync failed (EIO, a failed fdatasync), in which
case the batch's bytes are cut off the WAL again so the file stays well-formed.
A batch whose write finds the disk full (`NoSpace`: cut off again, nothing of
it written) is not failed: it is written again, in its place, until there is
room (the batches appended meanwhile wait behind it; the disk alarm has
stopped the publishers), as a slow disk would be waited for. A shutdown gives
up on it, and so does a wait longer than `no_space_give_up_seconds`: the batch
fails as a failed fdatasync's does, and the node restarts from its WAL. Room
that only the writes behind the batch would make never comes (a consumer's
settles, which let its queue's log go), and a node that writes nothing casts
no vote; restarted, it has forgotten the unwritten batch (Raft lets a node lose
what it has not acknowledged, and nothing in it was confirmed) and small writes
go again (chaos seed 4602: two nodes of three waiting with 11-17 MB batches on
disks their own logs had filled, and no queue of the cluster moved again).
The first write that finds the disk full, a batch's or a rollover's, gives up
the store's reserve (storage/reserve.py) and is tried again at once.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import structlog

from warren.storage import cpus, records
from warren.storage.wal import LogStore, NoSpace, Relocation, no_space
from warren.storage.writer_thread import WriterThread

log = structlog.get_logger("warren.storage")

DurableCallback = Callable[[bool], None]
# Upper bound of one batch; a larger backlog is written as several batches.
BATCH_MAX_BYTES = 16 * 1024 * 1024
# A batch that found the disk full is tried again after these, doubling.
NO_SPACE_RETRY_FIRST_SECONDS = 0.05
NO_SPACE_RETRY_MAX_SECONDS = 1.0
# A batch that has waited this long for room fails (see the module docstring); longer
# than a burst of another program's writes, or a disk being grown, usually takes.
NO_SPACE_GIVE_UP_SECONDS = 30.0
# A failed rollover is tried again no sooner than this, doubling with each failure in a
# row (else at every batch past the WAL's size, or at every disk check under the alarm,
# each copying what it could and taking it back); one asked for, `rollover_soon`, goes at once.
ROLLOVER_RETRY_FIRST_SECONDS = 1.0
ROLLOVER_RETRY_MAX_SECONDS = 16.0


class BatchWritten(NamedTuple):
    """A batch that is now durable: where it lies, and what it cost (a named
    tuple: one is made per batch, and a frozen dataclass's fields are set one
    `object.__setattr__` at a time)."""

    batch: int
    path: Path
    start_offset: int
    entries: int
    size: int
    seconds: float


class GroupCommitter:
    """The writer is driven by callbacks rather than a task, so that a batch
    costs as few loop hops as batching needs (issue 11, item 8): the first
    append of an idle turn schedules one `call_soon` (the rest of the turn
    joins the batch), `flush()` hands the batch over at once (the Raft
    runtime calls it at the end of its turn: everything it had to write is
    in), and the writer thread's completion comes back with one
    `call_soon_threadsafe` (not an asyncio future waking a task: two hops),
    which hands over the next batch at once if one has formed meanwhile
    (storage/writer_thread.py)."""

    def __init__(self, store: LogStore, prepare_rollover: Callable[[], tuple[dict[int, int], bytes]],
                 on_batch_written: Callable[[BatchWritten], None] | None = None,
                 on_relocated: Callable[[list[Relocation]], None] | None = None,
                 no_space_give_up_seconds: float = NO_SPACE_GIVE_UP_SECONDS):
        self.store = store
        self.no_space_give_up_seconds = no_space_give_up_seconds
        self._prepare_rollover = prepare_rollover
        self._written_listeners = [on_batch_written] if on_batch_written is not None else []
        self._relocated_listeners = [on_relocated] if on_relocated is not None else []
        self._writing_listeners: list[Callable[[], None]] = []
        # where the record of the latest append() starts inside its batch
        self.last_offset_in_batch = 0
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        # (log_id, index, length) of each pending record: the store notes where they went (storage/wal_heads.py)
        self._pending_heads: list[tuple[int, int, int]] = []
        # batches cut at BATCH_MAX_BYTES, waiting for the writer: (number, (pieces, heads, size))
        self._sealed: list[tuple[int, tuple[list[bytes], list[tuple[int, int, int]], int]]] = []
        self.open_batch = 1  # the batch new appends go into
        self._callbacks: dict[int, list[DurableCallback]] = {}
        # one thread writes: batches reach the file in order
        # looked up per batch, not bound here: the store's write is replaced in tests of a failing disk
        self._writer = WriterThread(lambda data: self.store.write_batch(data), self._on_written)
        # a rollover's steps and the shredding of what it let go (they may overlap), on threads that
        # leave the loop's CPU binding behind (storage/cpus.py)
        self._workers = ThreadPoolExecutor(2, thread_name_prefix="wal-rollover", initializer=cpus.run_anywhere)
        self._busy = False          # a batch is being written, or the WAL is being switched
        self._kick: asyncio.Handle | None = None
        self._idle_waiters: list[asyncio.Future] = []
        # the slow half of a rollover (copying into segments) runs beside new batches
        self._rollover_task: asyncio.Task | None = None
        self._rollover_wanted = False   # before the WAL is full (rollover_soon)
        self._rollover_failures = 0     # in a row (`rollover_failed`)
        self._rollover_retry_at = 0.0   # loop time a failed rollover may be tried again
        self._shredding: asyncio.Task | None = None   # freeing what rollovers let go (LogStore.shred_trash)
        self.failed_batches = 0
        # the batch with the writer: (batch, data, heads, size, started), to write again if it found no space
        self._writing: tuple[int, list[bytes], list[tuple[int, int, int]], int, float] | None = None
        self._space_retry: asyncio.TimerHandle | None = None
        self._space_waits = 0       # tries of the current batch that found the disk full
        self.waiting_for_space_since: float | None = None   # loop time of the first of them
        self._closing = 0           # drain()s under way: meanwhile a batch that finds no space fails

    def append(self, encoded_record: records.Encoded) -> int:
        """Queue one encoded record (bytes, or its pieces: written as they are, not
        joined); returns the batch number it will be written in."""
        head = records.head_of(encoded_record)
        if type(encoded_record) is bytes:
            self._pending.append(encoded_record)
        else:
            self._pending.extend(encoded_record)
        self.last_offset_in_batch = self._pending_bytes
        self._pending_bytes += head[2]
        self._pending_heads.append(head)
        if not self._busy and self._kick is None:
            # the rest of this turn joins the batch
            self._kick = asyncio.get_running_loop().call_soon(self._on_kick)
        if self._pending_bytes >= BATCH_MAX_BYTES:
            batch = self.open_batch
            self.open_batch += 1  # the writer picks up the full batch; later appends go on
            self._sealed.append((batch, self._take()))
            return batch
        return self.open_batch

    def flush(self) -> None:
        """Hand what was appended to the writer now if it is idle (else it goes
        as soon as the batch being written is durable)."""
        if not self._busy:
            self._write_next()

    def subscribe(self, on_batch_written: Callable[[BatchWritten], None] | None = None,
                  on_relocated: Callable[[list[Relocation]], None] | None = None,
                  on_writing: Callable[[], None] | None = None) -> None:
        """One more listener for written batches (called before the batch's
        `when_durable` callbacks), for rollover relocations, and for a batch handed
        to the writer thread (the loop may now have nothing to do until it is durable)."""
        if on_batch_written is not None:
            self._written_listeners.append(on_batch_written)
        if on_relocated is not None:
            self._relocated_listeners.append(on_relocated)
        if on_writing is not None:
            self._writing_listeners.append(on_writing)

    def _take(self) -> tuple[list[bytes], list[tuple[int, int, int]], int]:
        """The batch: its records' pieces, in order (the writer writes them as one
        `pwritev`; a join here copied every byte of the batch once more, and its
        large short-lived buffer made the heap's top grow and shrink), their heads
        and their size."""
        taken = self._pending, self._pending_heads, self._pending_bytes
        self._pending = []
        self._pending_bytes = 0
        self._pending_heads = []
        return taken

    def when_durable(self, batch: int, callback: DurableCallback) -> None:
        self._callbacks.setdefault(batch, []).append(callback)

    def _on_kick(self) -> None:
        self._kick = None
        if not self._busy:
            self._write_next()

    def _write_next(self) -> None:
        """Hand the next batch (a sealed one, else the open one) to the writer thread."""
        if self._sealed:
            batch, (data, heads, size) = self._sealed.pop(0)
        elif self._pending:
            batch = self.open_batch
            self.open_batch += 1
            data, heads, size = self._take()
        else:
            self._notify_idle()
            return
        self._busy = True
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        self._writing = (batch, data, heads, size, started)
        self._writer.submit(loop, batch, heads, data, size, started)
        for listener in self._writing_listeners:
            listener()

    def _on_written(self, batch: int, heads: list[tuple[int, int, int]], size: int, started: float,
                    where: tuple[Path, int] | None, error: BaseException | None) -> None:
        """On the loop: the batch is durable (`where`: its file and offset) or failed
        (`error`). Listeners, then its callbacks; then a rollover if the WAL is
        full, else the next batch."""
        ok = error is None
        if isinstance(error, NoSpace) and not self._closing and not self._waited_too_long():
            self._wait_for_space(error)
            return
        self._writing = None
        if self._space_waits:
            if ok:
                log.info("wal.space_found", batch=batch, tries=self._space_waits + 1)
            else:   # a shutdown, or waited too long
                log.error("wal.space_given_up", batch=batch, tries=self._space_waits + 1, shutdown=bool(self._closing))
            self._space_waits = 0
            self.waiting_for_space_since = None
        if not ok:
            self.failed_batches += 1
            if isinstance(error, OSError):
                log.error("wal.write_failed", batch=batch, bytes=size, error=str(error))
            else:
                log.error("wal.write_failed", batch=batch, bytes=size, error=repr(error),
                          exc_info=(type(error), error, error.__traceback__))
        try:
            if ok:
                path, start = where
                self.store.note_written(path, start, heads)   # before a rollover may move the file
            if ok and self._written_listeners:
                written = BatchWritten(batch, path, start, len(heads), size, time.perf_counter() - started)
                for listener in self._written_listeners:
                    listener(written)
            for callback in self._callbacks.pop(batch, ()):
                callback(ok)
        finally:   # a callback that raises must not stop the writer
            self._write_on(ok)

    @property
    def waiting_for_space(self) -> bool:
        """Whether a batch found the disk full and waits to be written again."""
        return self._space_waits > 0

    def _waited_too_long(self) -> bool:
        since = self.waiting_for_space_since
        return since is not None and asyncio.get_running_loop().time() - since >= self.no_space_give_up_seconds

    def _wait_for_space(self, error: NoSpace) -> None:
        """The batch being written found the disk full: try it again later, in its place."""
        if not self._space_waits:
            self.waiting_for_space_since = asyncio.get_running_loop().time()
            log.error("wal.no_space", batch=self._writing[0], bytes=self._writing[3], error=str(error),
                      detail=f"the batch is written again once there is room, or fails (the node restarts) after "
                             f"{self.no_space_give_up_seconds:g} s; nothing waiting for it is confirmed")
        delay = min(NO_SPACE_RETRY_MAX_SECONDS, NO_SPACE_RETRY_FIRST_SECONDS * 2 ** min(self._space_waits, 16))
        if self._release_reserve("a WAL batch"):
            delay = 0.0
        self._space_waits += 1
        self._space_retry = asyncio.get_running_loop().call_later(delay, self._write_again)

    def _write_again(self) -> None:
        self._space_retry = None
        batch, data, heads, size, started = self._writing
        self._writer.submit(asyncio.get_running_loop(), batch, heads, data, size, started)

    def hold_reserve(self, size: int) -> None:
        """Hold `size` bytes of the disk back for the moment it is full (storage/reserve.py),
        unless a reserve is held or a batch waits for room."""
        if not self.waiting_for_space and self.store.reserve.hold(size):
            log.info("wal.reserve_made", bytes=size)

    def _release_reserve(self, writer: str) -> bool:
        return self.store.reserve.release(writer) > 0

    def _rollover_failed(self, loop: asyncio.AbstractEventLoop, error: OSError) -> None:
        log.error("wal.rollover_failed", error=str(error), in_a_row=self._rollover_failures + 1)
        self._rollover_retry_at = loop.time() + min(ROLLOVER_RETRY_MAX_SECONDS,
                                                    ROLLOVER_RETRY_FIRST_SECONDS * 2 ** min(self._rollover_failures, 8))
        self._rollover_failures += 1
        if no_space(error) and self._release_reserve("a WAL rollover"):
            self._rollover_wanted = True   # again at once, into the space given up

    @property
    def rollover_failed(self) -> bool:
        """The last rollover failed: its cursors are not the log's yet."""
        return self._rollover_failures > 0

    @property
    def rollover_retry_due(self) -> bool:
        """The last rollover failed and may be tried again now."""
        return self.rollover_failed and not self._waiting_to_retry()

    def _waiting_to_retry(self) -> bool:
        """A failed rollover waits out its retry delay."""
        return self._rollover_failures > 0 and asyncio.get_running_loop().time() < self._rollover_retry_at

    def rollover_soon(self) -> None:
        """Roll over between the next two batches, or now if none is being written,
        though the WAL is not full: what it lets go (a deleted queue's segments) is freed
        then, not once the WAL has filled up, which on a quiet node may take long."""
        self._rollover_wanted = True
        if not self._busy:
            self._busy = True   # no batch is handed over while the WAL is switched
            self._write_on(True)

    def _write_on(self, ok: bool) -> None:
        if ok and self._rollover_task is None and (
                self._rollover_wanted or (self.store.needs_rollover() and not self._waiting_to_retry())):
            self._rollover_wanted = False
            asyncio.get_running_loop().create_task(self._switch_then_write())
            return
        self._busy = False
        self._write_next()

    async def _switch_then_write(self) -> None:
        """Between two batches: switch the WAL, then write on."""
        try:
            await self._start_rollover(asyncio.get_running_loop())
        finally:
            self._busy = False
            if self._rollover_wanted and self._rollover_task is None:
                self.rollover_soon()   # it found no room and gave up the reserve: again, into that
            else:
                self._write_next()

    def _notify_idle(self) -> None:
        if self._rollover_task is None:
            waiters, self._idle_waiters = self._idle_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def _start_rollover(self, loop: asyncio.AbstractEventLoop) -> None:
        """Switch to a new WAL file now; copy the old one into segments beside
        the batches that follow, so writers never wait for a rollover."""
        cursors, first_batch = self._prepare_rollover()
        try:
            await loop.run_in_executor(self._workers, self.store.switch_wal, first_batch)
        except OSError as error:
            self._rollover_failed(loop, error)
            return
        # the new file's size before any write: its first batch alone may pass the WAL's size
        switched_at = self.store.wal_size_bytes
        self._rollover_task = loop.create_task(self._finish_rollover(loop, cursors, switched_at))

    async def _finish_rollover(self, loop: asyncio.AbstractEventLoop, cursors: dict[int, int],
                               switched_at: int) -> None:
        finished = False
        try:
            moved = await loop.run_in_executor(self._workers, self.store.move_to_segments, cursors)
            if self._relocated_listeners:
                # readers switch before the old files go; one segment's worth per loop
                # turn, so a large move does not stall the node
                for relocation in moved:
                    for listener in self._relocated_listeners:
                        listener([relocation])
                    await asyncio.sleep(0)
            await loop.run_in_executor(self._workers, self.store.finish_rollover, cursors)
            finished = True
            self._rollover_failures = 0
        except OSError as error:
            # The old WAL files stay listed; the next rollover moves them again.
            self._rollover_failed(loop, error)
            return
        finally:
            self._rollover_task = None
            # Asked for while this one ran, or the writes meanwhile filled the new file: the next
            # rollover now, not at the next write, which on a quiet node may come much later.
            # (Not after a failure, nor when nothing was written since the switch: no loop of
            # rollovers that fail, or whose first batch alone passes the WAL's size.)
            filled = finished and self.store.wal_size_bytes > switched_at and self.store.needs_rollover()
            if (self._rollover_wanted or filled) and not self._busy:
                self.rollover_soon()
            elif not self._busy and not self._pending and not self._sealed:
                self._notify_idle()
        log.info("wal.rolled_over", segments=self.store.segment_count)
        if self._shredding is None and self.store.trash_to_shred:   # else the running one takes these too
            self._shredding = loop.create_task(self._shred(loop))

    async def _shred(self, loop: asyncio.AbstractEventLoop) -> None:
        """The files the rollovers let go, freed a step at a time beside the batches
        (an unlink of a whole one stalls the WAL's fdatasyncs: storage/files.py)."""
        try:
            while self.store.trash_to_shred:   # with what rollovers let go meanwhile
                await loop.run_in_executor(self._workers, self.store.shred_trash)
        except Exception:  # noqa: BLE001 -- what is left in the trash goes at the next start; never stop the node
            log.exception("wal.shred_failed")
        finally:
            self._shredding = None

    async def drain(self) -> None:
        """Wait until everything appended so far is on disk, a rollover under
        way is done and what rollovers let go is freed (used at shutdown). While
        it waits, a batch that finds the disk full fails (the one waiting for
        space is tried once more now): a full disk must not hold up a shutdown."""
        self._closing += 1
        try:
            if self._space_retry is not None:
                self._space_retry.cancel()
                self._write_again()
            while self._busy or self._pending or self._sealed or self._rollover_task is not None:
                if not self._busy:
                    self._write_next()
                if not (self._busy or self._pending or self._sealed or self._rollover_task is not None):
                    break
                waiter = asyncio.get_running_loop().create_future()
                self._idle_waiters.append(waiter)
                await waiter
            while self._shredding is not None:
                await asyncio.shield(self._shredding)
        finally:
            self._closing -= 1

    def close(self) -> None:
        """Stop the writer thread (after `drain`)."""
        if self._space_retry is not None:
            self._space_retry.cancel()
            self._space_retry = None
        self._writer.close()
        self._workers.shutdown(wait=False)   # after `drain`: idle; else each ends with its step
