"""Where each log's records lie in a WAL file written in this run, noted as its
batches are written, so that a rollover picks the records it moves into segments
from here instead of reading every record's head back.

Why: reading the heads back is a Python loop over the whole old file (about
2 µs a record: 120 ms for a 64 MiB file of 1 KiB messages, nearly a second for
one of 16 B messages) on a worker thread that holds the GIL meanwhile, so the
event loop stalled for tens of milliseconds at a time during every rollover.
Noting a record as its batch is written costs a fraction of that, on the loop,
spread evenly; picking is a binary search and a slice per log.

The notes are used only when they cover the file byte for byte
(`WalHeads.complete`): a batch written past them (a test writing the store
directly, a note that failed) leaves the rollover to read the heads back as
before, so a missing note can cost time but never a record.
"""
from __future__ import annotations

from array import array
from bisect import bisect_left

from warren.storage import records


class LogHeads:
    """One log's records in one WAL file, in file order: index, offset, length."""

    __slots__ = ("increasing", "indexes", "lengths", "offsets")

    def __init__(self, indexes: array | None = None, offsets: array | None = None,
                 lengths: array | None = None) -> None:
        self.indexes = indexes if indexes is not None else array("q")
        self.offsets = offsets if offsets is not None else array("q")
        self.lengths = lengths if lengths is not None else array("q")
        self.increasing = True   # indexes strictly increase (no rewrite of the log's tail in this file)

    def add(self, index: int, offset: int, length: int) -> None:
        indexes = self.indexes
        if indexes and index <= indexes[-1]:
            self.increasing = False
        indexes.append(index)
        self.offsets.append(offset)
        self.lengths.append(length)

    def __len__(self) -> int:
        return len(self.indexes)

    def from_index(self, cursor: int) -> LogHeads:
        """The records at or above `cursor`, in file order (what a rollover keeps)."""
        if self.increasing:
            start = bisect_left(self.indexes, cursor)
            return LogHeads(self.indexes[start:], self.offsets[start:], self.lengths[start:])
        kept = LogHeads()   # rare: a follower's tail rewritten in this file; every later write replaces it
        for index, offset, length in zip(self.indexes, self.offsets, self.lengths):
            if index >= cursor:
                kept.add(index, offset, length)
        return kept


class WalHeads:
    """The records of one WAL file, per log, as its batches were written."""

    __slots__ = ("covered", "logs")

    def __init__(self) -> None:
        self.logs: dict[int, LogHeads] = {}
        self.covered = records.FILE_HEADER_SIZE   # bytes from the file's start that the notes account for

    def note_batch(self, start: int, heads: list[tuple[int, int, int]]) -> None:
        """A batch of records, (log_id, index, length) each, written at `start`."""
        if start != self.covered:
            self.covered = -1   # a gap: these notes cannot stand for the file any more
            return
        logs = self.logs
        offset = start
        for log_id, index, length in heads:
            log_heads = logs.get(log_id)
            if log_heads is None:
                log_heads = logs[log_id] = LogHeads()
            log_heads.add(index, offset, length)
            offset += length
        self.covered = offset

    def complete(self, file_size: int) -> bool:
        """The notes account for every byte of a file of `file_size` bytes."""
        return self.covered == file_size

    def pick(self, cursors: dict[int, int]) -> dict[int, LogHeads]:
        """Per live log (one in `cursors`), its records at or above its cursor."""
        picked = {}
        for log_id, log_heads in self.logs.items():
            cursor = cursors.get(log_id)
            if cursor is None:
                continue
            kept = log_heads.from_index(cursor)
            if kept:
                picked[log_id] = kept
        return picked
