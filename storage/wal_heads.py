"""Where each log's records lie in a WAL file written in this run, noted as its
batches are written, so that a rollover picks the records it moves into segments
from here instead of reading every record's head back.

Why: reading the heads back is a Python loop over the whole old file (about
2 µs a record: 120 ms for a 64 MiB file of 1 KiB messages, nearly a second for
one of 16 B messages) on a worker thread that holds the GIL meanwhile, so the
event loop stalled for tens of milliseconds at a time during every rollover.
Noting a record as its batch is written costs a fraction of that, on the loop,
spread evenly; picking is a binary search per log, and the records kept spelled
out a run at a time.

The notes are used only when they cover the file byte for byte
(`WalHeads.complete`): a batch written past them (a test writing the store
directly, a note that failed) leaves the rollover to read the heads back as
before, so a missing note can cost time but never a record.
"""
from __future__ import annotations

from array import array
from bisect import bisect_right
from itertools import compress
from pathlib import Path
from typing import NamedTuple

from warren.storage import records


class Picked(NamedTuple):
    """Records a rollover moves, in file order, as parallel arrays (made on the rollover's
    thread, only for the records it keeps)."""

    indexes: array
    offsets: array
    lengths: array


class LogHeads:
    """One log's entry records in one WAL file, in file order: each record's offset and
    length, and its index as runs of consecutive indexes (a log's entries follow each
    other: one run a file, unless a follower's tail was written again in it).

    Why so: a WAL file may be as large as RabbitMQ's (512 MiB), millions of small
    records; an index, an offset and a length of 8 bytes each were 24 bytes of the heap
    per record, now 12. Control records (index 0) are not noted: no cursor is below 1,
    so a rollover never moves them (every new WAL file starts with them again)."""

    __slots__ = ("_next_index", "increasing", "lengths", "offsets", "run_indexes", "run_starts")

    def __init__(self) -> None:
        self.offsets = array("q")
        self.lengths = array("I")   # a record's payload is at most 1 GiB (records.RECORD_PAYLOAD_MAX_BYTES)
        self.run_indexes = array("q")   # the first index of each run...
        self.run_starts = array("q")    # ...and the position of its first record
        self._next_index = -1
        self.increasing = True   # indexes strictly increase (no rewrite of the log's tail in this file)

    def add(self, index: int, offset: int, length: int) -> None:
        if index != self._next_index:
            if self.run_starts and index < self._next_index:
                self.increasing = False
            self.run_indexes.append(index)
            self.run_starts.append(len(self.lengths))
        self.offsets.append(offset)
        self.lengths.append(length)
        self._next_index = index + 1

    def __len__(self) -> int:
        return len(self.lengths)

    def from_index(self, cursor: int) -> Picked:
        """The records at or above `cursor`, in file order (what a rollover keeps)."""
        if self.increasing:
            return self._records_from(self._position_of(cursor))
        every = self._records_from(0)   # rare: a follower's tail rewritten in this file; every later write replaces it
        kept = [index >= cursor for index in every.indexes]
        return Picked(*(array(column.typecode, compress(column, kept)) for column in every))

    def _position_of(self, cursor: int) -> int:
        """Where the first record at or above `cursor` is (indexes increase)."""
        run = bisect_right(self.run_indexes, cursor) - 1
        if run < 0:
            return 0
        return min(self.run_starts[run] + cursor - self.run_indexes[run], self._run_stop(run))

    def _run_stop(self, run: int) -> int:
        return self.run_starts[run + 1] if run + 1 < len(self.run_starts) else len(self.lengths)

    def _records_from(self, position: int) -> Picked:
        """Records from `position` on, their indexes spelled out a run at a time."""
        indexes = array("q")
        for run in range(max(bisect_right(self.run_starts, position) - 1, 0), len(self.run_starts)):
            start, stop = max(self.run_starts[run], position), self._run_stop(run)
            first = self.run_indexes[run] + start - self.run_starts[run]
            indexes.extend(range(first, first + max(stop - start, 0)))
        return Picked(indexes, self.offsets[position:], self.lengths[position:])


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
        offset = start
        for log_id, index, length in heads:
            self.note_record(log_id, index, offset, length)
            offset += length
        self.covered = offset

    def note_record(self, log_id: int, index: int, offset: int, length: int) -> None:
        """One record, written or read back by a recovery (`covered` is the caller's).
        A control record (index 0) is not noted (LogHeads)."""
        if not index:
            return
        log_heads = self.logs.get(log_id)
        if log_heads is None:
            log_heads = self.logs[log_id] = LogHeads()
        log_heads.add(index, offset, length)

    def forget(self, log_id: int) -> None:
        """A removed log: a rollover moves none of its records (`pick`), so its notes go now,
        not at the rollover (a 512 MiB WAL outlives thousands of deleted queues)."""
        self.logs.pop(log_id, None)

    def complete(self, file_size: int) -> bool:
        """The notes account for every byte of a file of `file_size` bytes."""
        return self.covered == file_size

    def pick(self, cursors: dict[int, int]) -> dict[int, Picked]:
        """Per live log (one in `cursors`), its records at or above its cursor."""
        picked = {}
        for log_id, log_heads in self.logs.items():
            cursor = cursors.get(log_id)
            if cursor is None:
                continue
            kept = log_heads.from_index(cursor)
            if kept.lengths:
                picked[log_id] = kept
        return picked


def pick_by_scan(data: bytes, path: Path, cursors: dict[int, int]) -> dict[int, Picked]:
    """Per live log, its records at or above its cursor, read from the file's heads
    (which lie back to back from the file header: noted as the writer notes them)."""
    heads, _ = records.scan_heads(data, str(path))
    read_back = WalHeads()
    read_back.note_batch(records.FILE_HEADER_SIZE, [(log_id, index, length) for log_id, index, _, length in heads])
    return read_back.pick(cursors)
