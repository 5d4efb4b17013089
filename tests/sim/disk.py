"""A node's storage in the simulation: the real WAL (`storage.wal.LogStore`)
over the fault-injecting file layer (tests/unit/faultyfiles.py), written by a
group committer whose writer thread is the world's step.

Theory of operation. `SimCommitter` keeps `storage.group_commit.GroupCommitter`'s
contract as the Raft runtime uses it (`append` returns the batch a record
goes into, `flush` hands the open batch to the writer, `when_durable`,
`subscribe`, `last_offset_in_batch`), but its writer is not a thread: the
world calls `write_some(rng)` each step, which writes the batches handed over
(each one `LogStore.write_batch`: write + fdatasync) now or later, so a
batch is durable at a random later time. A crash loses what was handed over
but not written, and whatever the file layer had not synced; a disk error
(`FaultyFiles.eio_on_sync`) fails the batch, and the runtime then fails the
node as it would in production (the world restarts it, as a supervisor). A
full disk (`FaultyFiles.enospc_after_bytes`: `LogStore.write_batch` raises
`NoSpace`) fails nothing: the batch waits at the head to be written again, as
`GroupCommitter` does, until the world frees the space.
"""
from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from warren.storage import records
from warren.storage.group_commit import BatchWritten
from warren.storage.wal import LogStore, NoSpace

WAL_MAX_BYTES = 1 << 40   # no rollover in the simulation


class SimCommitter:
    def __init__(self, store: LogStore, loop) -> None:
        self.store = store
        self.loop = loop
        self.last_offset_in_batch = 0
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self.open_batch = 1
        self._kicked = False
        self.handed: list[tuple[int, bytes, int]] = []   # (batch, data, records) for the writer
        self._callbacks: dict[int, list[Callable[[bool], None]]] = {}
        self._written_listeners: list = []
        self._relocated_listeners: list = []
        self._writing_listeners: list = []
        self.failed_batches = 0
        self.no_space_tries = 0   # writes that found the disk full (the batch waited)
        self.waiting_for_space_since: float | None = None   # as GroupCommitter's: the runtime's leaders step down

    def append(self, encoded_record: records.Encoded) -> int:
        encoded_record = records.joined(encoded_record)
        self._pending.append(encoded_record)
        self.last_offset_in_batch = self._pending_bytes
        self._pending_bytes += len(encoded_record)
        if not self._kicked:
            self._kicked = True   # the rest of this loop turn joins the batch
            self.loop.call_soon(self.flush)
        return self.open_batch

    def flush(self) -> None:
        self._kicked = False
        if not self._pending:
            return
        batch = self.open_batch
        self.open_batch += 1
        self.handed.append((batch, b"".join(self._pending), len(self._pending)))
        self._pending.clear()
        self._pending_bytes = 0
        for listener in self._writing_listeners:
            listener()

    def subscribe(self, on_batch_written=None, on_relocated=None, on_writing=None) -> None:
        if on_batch_written is not None:
            self._written_listeners.append(on_batch_written)
        if on_relocated is not None:
            self._relocated_listeners.append(on_relocated)
        if on_writing is not None:
            self._writing_listeners.append(on_writing)

    def when_durable(self, batch: int, callback: Callable[[bool], None]) -> None:
        self._callbacks.setdefault(batch, []).append(callback)

    def rollover_soon(self) -> None:
        """No rollover in the simulation (WAL_MAX_BYTES)."""

    def write_some(self, rng: random.Random, rate: float) -> None:
        """The writer: the oldest handed batches become durable (or fail), each with chance `rate`."""
        while self.handed and rng.random() < rate:
            batch, data, count = self.handed.pop(0)
            try:
                path, start = self.store.write_batch(data)
                self.store.note_written(path, start, records.heads_of_batch(data))   # as GroupCommitter
            except NoSpace:
                self.handed.insert(0, (batch, data, count))   # written again, in its place, when there is room
                self.no_space_tries += 1
                if self.waiting_for_space_since is None:
                    self.waiting_for_space_since = self.loop.time()
                return
            except OSError:
                self.waiting_for_space_since = None
                self.failed_batches += 1
                for callback in self._callbacks.pop(batch, ()):
                    callback(False)
                continue
            self.waiting_for_space_since = None
            written = BatchWritten(batch, Path(path), start, count, len(data), 0.0)
            for listener in self._written_listeners:
                listener(written)
            for callback in self._callbacks.pop(batch, ()):
                callback(True)
