"""The node-wide write-ahead log and the per-log segment files (synchronous core).

Theory of operation (after rabbitmq/ra's LOG.md). Every log on the node — each
durable queue's, and the metadata log (id 0) — appends to ONE WAL file; the
asyncio shell (``group_commit``) hands this core one batch per turn and it
writes it with one fdatasync. When the WAL file passes ``wal_max_size_bytes``
it is rolled over: a new WAL file is started, and each log's entries from the
old file that are still needed (index >= that log's release cursor) move to
the log's segment files (``segment_max_entries`` per file); then the old WAL
file is deleted. Segment files wholly below a log's cursor are deleted too, so
a queue that is published to and consumed from keeps its disk use bounded.

Recovery reads the segments and then the WAL files in order; a torn tail of
the newest WAL file is cut off (and reported), damage anywhere else raises
``CorruptLog`` naming the file and offset.
"""
from __future__ import annotations

import contextlib
import errno
from array import array
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, compress
from operator import add, ne
from pathlib import Path
from typing import NamedTuple

import structlog

from warren.storage import records
from warren.storage.files import RealFiles
from warren.storage.reserve import SpaceReserve
from warren.storage.wal_heads import Picked, WalHeads, pick_by_scan

log = structlog.get_logger("warren.storage")

WAL_DIR = "wal"
SEGMENTS_DIR = "segments"
# Files a rollover let go wait here to be shredded (their space freed a step at a time,
# storage/files.py): a name no recovery reads, so a file cut short there is never data.
TRASH_DIR = "trash"
# A write that fails with one of these wrote nothing once it is cut off again: the batch
# may be written again when there is room (`NoSpace`).
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# A rollover's copy into segments is synced in pieces of this size (`_write_segment`).
SEGMENT_SYNC_BYTES = 4 * 1024 * 1024
# A segment file ends at this size as well as at segment_max_entries (ra's
# segment_max_size_bytes): it is let go only once every entry in it is below its log's
# cursor, and 4096 entries of large bodies made files of a gigabyte or more.
SEGMENT_MAX_BYTES = 64 * 1000 * 1000


class NoSpace(OSError):
    """A batch's write found the disk full (ENOSPC, EDQUOT) and was cut off the WAL
    again: nothing of it is on disk, so it may be written again once there is room.
    A failed fdatasync is never this: after one, what the page cache holds cannot
    be trusted to reach the disk, so that batch is lost for good."""


def no_space(error: OSError) -> bool:
    """Whether `error` is a full disk's (ENOSPC, EDQUOT): a write it failed may be tried again."""
    return error.errno in NO_SPACE_ERRNOS


@dataclass(slots=True)
class SegmentFile:
    path: Path
    first_index: int
    last_index: int
    entries: int
    size: int = 0   # bytes, the header included


@dataclass(slots=True)
class TornTail:
    path: Path
    offset: int
    bytes_lost: int
    reason: str


class Location(NamedTuple):
    """Where one record lies on disk, so its payload can be read back later.
    (A named tuple: one is kept per stored message, and made per recovered record.)"""

    path: Path
    offset: int
    length: int


@dataclass(slots=True)
class Relocation:
    """Entries of one log copied by a rollover into one segment file, as parallel
    arrays (a rollover may move millions of entries: no object per entry)."""

    log_id: int
    path: Path
    indexes: array
    offsets: array
    lengths: array

    def locations(self):
        """(index, Location) of each entry."""
        path = self.path
        for index, offset, length in zip(self.indexes, self.offsets, self.lengths):
            yield index, Location(path, offset, length)


def _record_runs(data: memoryview, offsets: array, lengths: array, start: int, stop: int) -> list[memoryview]:
    """The records ``start..stop`` of ``data`` as slices, one per run of records
    that lie back to back in the WAL file (most of a log's): nothing is copied.
    The runs' breaks are found by C iterators, not a Python loop per record."""
    ends = map(add, offsets[start:stop - 1], lengths[start:stop - 1])
    breaks = compress(range(start + 1, stop), map(ne, ends, offsets[start + 1:stop]))
    pieces = []
    run_start = start
    for run_break in breaks:
        pieces.append(data[offsets[run_start]:offsets[run_break - 1] + lengths[run_break - 1]])
        run_start = run_break
    pieces.append(data[offsets[run_start]:offsets[stop - 1] + lengths[stop - 1]])
    return pieces


# Called for every record recovered, segments first, then WAL files, in file order.
RecordVisitor = Callable[[records.Record, Location], None]


@dataclass(slots=True)
class Recovered:
    # filled only when recover() is called without a visitor
    logs: dict[int, dict[int, records.Record]] = field(default_factory=dict)
    torn: list[TornTail] = field(default_factory=list)


class LogStore:
    def __init__(self, directory: Path, wal_max_size_bytes: int, segment_max_entries: int,
                 files: RealFiles | None = None):
        self.directory = directory
        self.wal_dir = directory / WAL_DIR
        self.segments_dir = directory / SEGMENTS_DIR
        self.trash_dir = directory / TRASH_DIR
        self._trash_number = 0
        self._discarded: list[Path] = []    # moved to the trash by the rollover under way
        self._shreddable: list[Path] = []   # in the trash durably: may be cut (shred_trash, another thread)
        self.wal_max_size_bytes = wal_max_size_bytes
        # the room a rollover has on the disk, when it is less (set by the node's looks at its
        # free space, broker/node/disk_watch.py): a rollover copies what the WAL still holds
        self.wal_room_bytes = wal_max_size_bytes
        self.segment_max_entries = segment_max_entries
        self.files = files or RealFiles()
        self.reserve = SpaceReserve(self.files, directory)   # given up when the disk is full
        self.segments: dict[int, list[SegmentFile]] = {}
        self._wal_number = 0
        self._wal = None
        self._old_wals: list[Path] = []
        # bytes of the WAL files an earlier run left (recover): they count toward the next rollover, else a
        # node restarted before its WAL filled keeps every file its runs left; none once a rollover starts
        self._inherited_wal_bytes = 0
        # per WAL file written in this run or read by its recovery: where each log's records lie
        # (storage/wal_heads.py)
        self._heads: dict[Path, WalHeads] = {}
        # set when a failed batch could not be cut off: no more appends are accepted
        self._broken: OSError | None = None
        # read by the metrics endpoint on the loop while a rollover runs on a thread
        self.segment_count = 0
        self.segment_bytes = 0
        # counters for metrics
        self.fsyncs = 0
        self.bytes_written = 0
        self.rollovers = 0

    # -- recovery ---------------------------------------------------------
    def recover(self, visit: RecordVisitor | None = None) -> Recovered:
        """Read everything back and open a fresh WAL file for appends.

        With ``visit``, each record is handed over with its location instead of
        being kept, so a large backlog is not held in memory at once.
        """
        recovered = Recovered()
        if visit is None:
            def visit(record: records.Record, location: Location) -> None:
                recovered.logs.setdefault(record.log_id, {})[record.index] = record
        for directory in (self.directory, self.wal_dir, self.segments_dir, self.trash_dir):
            self.files.makedirs(directory)
            self.files.sync_directory(directory.parent)
        for path in self.files.listdir(self.trash_dir):   # let go before a crash or a stop
            self.files.remove(path)
        wal_paths = [p for p in self.files.listdir(self.wal_dir) if p.suffix == ".wal"]
        # A rollover opens the new WAL file before it moves entries to segments and
        # deletes the old one: with two or more WAL files a crash hit a rollover.
        rollover_interrupted = len(wal_paths) >= 2
        for log_dir in self.files.listdir(self.segments_dir):
            log_id = int(log_dir.name)
            for path in self.files.listdir(log_dir):
                self._recover_segment(log_id, path, recovered, rollover_interrupted, visit)
        for position, path in enumerate(wal_paths):
            # noted as read, so that the first rollover does not read the file's heads back (storage/wal_heads.py)
            heads = WalHeads()
            with self.files.mapped(path) as data:   # cut (below) only once unmapped
                result = records.scan(data, str(path), zero_tail_ok=True, visit=_FileVisitor(path, visit, heads))
            if result.zero_tail:   # allocated ahead and not written before a crash (storage/files.py)
                self.files.truncate(path, result.valid_end)
            if result.torn_reason is not None:
                if position != len(wal_paths) - 1:
                    raise records.CorruptLog(str(path), result.valid_end,
                                             result.torn_reason + " (not the newest WAL file)")
                recovered.torn.append(TornTail(path, result.valid_end, result.torn_bytes, result.torn_reason))
                self.files.truncate(path, result.valid_end)
            heads.covered = result.valid_end   # the file is cut to this above
            self._heads[path] = heads
            self._wal_number = max(self._wal_number, int(path.stem))
            self._inherited_wal_bytes += result.valid_end
        self._old_wals = wal_paths
        self._open_first_wal()
        self._count_segments()
        return recovered

    def _open_first_wal(self) -> None:
        """The start's new WAL file; on a disk full to its last byte, in the reserve an earlier
        run left (storage/reserve.py): else the node could not start until something else
        freed a page, nor its consumers' acks let its queues' space go."""
        try:
            self._open_new_wal()
        except OSError as error:
            if not no_space(error) or not self.reserve.release("the start's new WAL file"):
                raise
            self._open_new_wal()

    def _recover_segment(self, log_id: int, path: Path, recovered: Recovered, rollover_interrupted: bool,
                         visit: RecordVisitor) -> None:
        visitor = _FileVisitor(path, visit)
        with self.files.mapped(path) as data:   # cut (below) only once unmapped
            result = records.scan(data, str(path), visit=visitor)
        if result.torn_reason is not None:
            # Segments are fsynced before the WAL file they came from is deleted, so a
            # torn segment is only acceptable after a crash during that move, when the
            # WAL file still holds the entries; otherwise it is lost data.
            if not rollover_interrupted:
                raise records.CorruptLog(str(path), result.valid_end, result.torn_reason + " (segment)")
            recovered.torn.append(TornTail(path, result.valid_end, result.torn_bytes, result.torn_reason))
            self.files.truncate(path, result.valid_end)
        if visitor.count:
            self.segments.setdefault(log_id, []).append(SegmentFile(
                path, visitor.first_index, visitor.last_index, visitor.count, result.valid_end))
        else:
            self.files.remove(path)

    def _open_new_wal(self) -> None:
        """Start the next WAL file. It becomes the one appended to only once its header
        is durable: if that fails (the disk is full) the file is removed again and the
        error raised, and batches go on into the current file, never into a file
        without a header, which no recovery would read."""
        path = self.wal_dir / f"{self._wal_number + 1:08d}.wal"
        wal = self.files.open_append(path, preallocate_bytes=self.wal_max_size_bytes)
        try:
            wal.write(records.FILE_HEADER)
            wal.sync()
            self.files.sync_directory(self.wal_dir)
        except OSError:
            wal.close()
            with contextlib.suppress(OSError):
                self.files.remove(path)
                self.files.sync_directory(self.wal_dir)
            raise
        self._wal_number += 1
        self._wal = wal
        self._heads[path] = WalHeads()

    # -- appends ----------------------------------------------------------
    def write_batch(self, data: bytes | Sequence[bytes]) -> tuple[Path, int]:
        """Append one batch of encoded records (bytes, or the pieces they are made
        of, in order) and make it durable (one fdatasync). Returns the WAL file and
        the offset the batch starts at."""
        pieces = (data,) if isinstance(data, bytes) else data
        if self._broken is not None:
            raise OSError(f"WAL unusable since an earlier failure: {self._broken}")
        size_before = self._wal.size
        try:
            self._wal.write_pieces(pieces)
        except OSError as error:
            # A batch that found no space is written again at this offset, the same bytes: readers
            # on the loop keep their cache (forgetting it here, on the writer thread, would race them).
            full = no_space(error)
            if self._cut_off(size_before, keep_cache=full) and full:
                raise NoSpace(error.errno, f"no space for a WAL batch: {error.strerror}") from error
            raise
        try:
            self._wal.sync()
        except OSError:
            self._cut_off(size_before)
            raise
        self.fsyncs += 1
        self.bytes_written += self._wal.size - size_before
        return self._wal.path, size_before

    def _cut_off(self, size_before: int, keep_cache: bool = False) -> bool:
        """Cut a failed batch off, durably, so later batches follow a well-formed
        file; whether that worked (if not, the WAL is unusable from now on)."""
        path = self._wal.path
        try:
            self._wal.close()
            self.files.truncate(path, size_before, keep_cache=keep_cache)
            self._wal = self.files.open_append(path, preallocate_bytes=self.wal_max_size_bytes)
        except OSError as cut_error:
            self._broken = cut_error
            return False
        return True

    def note_written(self, path: Path, start: int, heads: list[tuple[int, int, int]]) -> None:
        """The batch `write_batch` wrote at `start` of `path` held records (log_id,
        index, length) `heads`, in order: a rollover picks from these notes
        instead of reading the file's heads back (storage/wal_heads.py)."""
        noted = self._heads.get(path)
        if noted is None:
            return
        try:
            noted.note_batch(start, heads)
        except Exception:   # noqa: BLE001 -- a bad note must not keep the batch's confirms back
            noted.covered = -1   # so its rollover reads the file's heads back instead
            log.exception("wal.heads_note_failed", path=str(path))

    def forget_log_notes(self, log_id: int) -> None:
        """A removed log's records, once its REMOVED record is written: no rollover moves them.
        Only the current file's notes: a rollover's thread may be picking from an old file's
        (they all go when it finishes)."""
        noted = self._heads.get(self.wal_path)
        if noted is not None:
            noted.forget(log_id)

    def read_payload(self, location: Location) -> bytes | memoryview:
        """The payload of the record at ``location`` (checked against its checksums; a
        view of what `read_at` read)."""
        data = self.files.read_at(location.path, location.offset, location.length)
        record, _, problem = records.decode_at(data, 0)
        if record is None:  # a cached block may predate a cut-off batch: read the disk itself
            data = self.files.read_at(location.path, location.offset, location.length, cached=False)
            record, _, problem = records.decode_at(data, 0)
        if record is None:
            raise records.CorruptLog(str(location.path), location.offset, problem)
        return record.payload

    @property
    def wal_path(self) -> Path | None:
        """The WAL file new batches go into."""
        return self._wal.path if self._wal is not None else None

    @property
    def wal_size_bytes(self) -> int:
        return self._wal.size if self._wal is not None else 0

    def needs_rollover(self) -> bool:
        return self.wal_size_bytes + self._inherited_wal_bytes >= min(self.wal_max_size_bytes, self.wal_room_bytes)

    # -- rollover ---------------------------------------------------------
    def rollover(self, cursors: dict[int, int], first_batch: bytes = b"") -> list[Relocation]:
        """All steps of a rollover at once (for callers that read nothing meanwhile)."""
        moved = self.start_rollover(cursors, first_batch)
        self.finish_rollover(cursors)
        self.shred_trash()
        return moved

    def start_rollover(self, cursors: dict[int, int], first_batch: bytes = b"") -> list[Relocation]:
        self.switch_wal(first_batch)
        return self.move_to_segments(cursors)

    def switch_wal(self, first_batch: bytes = b"") -> None:
        """Close the current WAL file and start a new one beginning with ``first_batch``.
        Quick: appends go on into the new file while ``move_to_segments`` runs."""
        old = self._wal
        self._inherited_wal_bytes = 0   # a failed rollover is not retried after every batch
        self._open_new_wal()            # if it fails, the current file stays the one appended to
        self._old_wals.append(old.path)
        old.close()
        if first_batch:
            path, start = self.write_batch(first_batch)
            self.note_written(path, start, records.heads_of_batch(first_batch))

    def move_to_segments(self, cursors: dict[int, int]) -> list[Relocation]:
        """Copy what is still needed from the old WAL files into segments. Returns
        where the copied entries now lie. The old files
        stay readable until ``finish_rollover``, so readers can switch first.
        Touches only old WAL files and segments, never the current WAL file.

        ``cursors`` maps every live log to its release cursor: entries below it
        are not needed any more. A log missing from ``cursors`` was deleted.
        """
        moved: list[Relocation] = []
        before: dict[int, tuple[int, SegmentFile | None, int, int, int]] = {}   # what it appends to, as it was
        try:
            for path in list(self._old_wals):
                self._move_to_segments(path, cursors, moved, before)
        except OSError:
            # taken back: the next rollover copies the same files again, and what this one
            # copied would stay twice (on a disk short of space, each failed try took more)
            self._take_back_segments(before)
            raise
        return moved

    def _take_back_segments(self, before: dict[int, tuple[int, SegmentFile | None, int, int, int]]) -> None:
        for log_id, (count, last, entries, last_index, size) in before.items():
            files = self.segments.get(log_id, [])
            for added in files[count:]:
                self.files.remove(added.path)
            del files[count:]
            if not files:
                self.segments.pop(log_id, None)
            if last is not None:
                self.files.truncate(last.path, size)
                last.entries, last.last_index, last.size = entries, last_index, size

    def finish_rollover(self, cursors: dict[int, int]) -> None:
        """Let the old WAL files go, and the segment files wholly below their cursor:
        into the trash, which `shred_trash` empties."""
        for path in list(self._old_wals):
            self._discard(path)
            self._heads.pop(path, None)
            self._old_wals.remove(path)   # one by one: a failure half way is retried from where it stopped
        self.files.sync_directory(self.wal_dir)
        self.truncate_segments(cursors)
        self.files.sync_directory(self.trash_dir)   # before any of it is cut: see TRASH_DIR
        self._shreddable += self._discarded
        self._discarded = []
        self._count_segments()
        self.rollovers += 1

    def _discard(self, path: Path) -> None:
        self.files.forget(path)
        self._trash_number += 1
        target = self.trash_dir / f"{self._trash_number:08d}.{path.name}"
        try:
            self.files.rename(path, target)
        except FileNotFoundError:   # moved by a rollover that failed after it: retried
            return
        self._discarded.append(target)

    @property
    def trash_to_shred(self) -> bool:
        return bool(self._shreddable)

    def shred_trash(self) -> None:
        """Free what finished rollovers let go, a step at a time (blocks: a worker thread's;
        may run beside the next rollover, which adds to the list only once its renames are durable)."""
        while self._shreddable:
            self.files.shred(self._shreddable.pop(0))

    def _move_to_segments(self, wal_path: Path, cursors: dict[int, int], moved: list[Relocation],
                          before: dict[int, tuple[int, SegmentFile | None, int, int, int]]) -> None:
        # mapped, not read: the file (up to wal_max_size_bytes) is never copied into the heap
        with self.files.mapped(wal_path) as data, memoryview(data) as view:
            noted = self._heads.get(wal_path)
            if noted is not None and noted.complete(len(data)):
                by_log = noted.pick(cursors)
            else:   # a file recovered at start, or written past the notes: its heads are read back
                by_log = pick_by_scan(data, wal_path, cursors)
            for log_id, picked in by_log.items():
                if log_id not in before:
                    files = self.segments.get(log_id, [])
                    last = files[-1] if files else None
                    before[log_id] = (len(files), last, last.entries if last else 0, last.last_index if last else 0,
                                      last.size if last else 0)
                self._append_segment(log_id, view, picked, moved, cursors[log_id])

    def _append_segment(self, log_id: int, data: memoryview, picked: Picked, moved: list[Relocation],
                        cursor: int) -> None:
        """Copy the picked records (in index order) from ``data`` to the log's segments,
        their bytes unchanged (segments use the WAL's record format). A segment wholly
        below the log's `cursor` is not appended to: it goes at the end of this rollover,
        and one live entry at its end kept the whole file (a drained queue's 37 MB).

        A segment is recorded in ``self.segments`` only once its bytes are synced;
        a failed write is cut off again (or the new file removed) before the error
        goes up, so the next rollover appends to a well-formed file.
        """
        log_dir = self.segments_dir / str(log_id)
        if log_id not in self.segments:
            self.files.makedirs(log_dir)
            self.files.sync_directory(self.segments_dir)
        files = self.segments.setdefault(log_id, [])
        indexes, offsets, lengths = picked.indexes, picked.offsets, picked.lengths
        start = 0
        while start < len(indexes):
            current = files[-1] if files else None
            new_file = (current is None or current.entries >= self.segment_max_entries
                        or current.size + lengths[start] > SEGMENT_MAX_BYTES or current.last_index < cursor)
            if new_file:
                number = int(current.path.stem) + 1 if current is not None else 1
                current = SegmentFile(log_dir / f"{number:08d}.seg", indexes[start], indexes[start], 0)
            stop = min(len(indexes), start + self.segment_max_entries - current.entries)
            # as many as fit under SEGMENT_MAX_BYTES, at least one (summed and searched in C)
            room = SEGMENT_MAX_BYTES - max(current.size, len(records.FILE_HEADER))
            stop = start + max(1, bisect_right(list(accumulate(lengths[start:stop])), room))
            offset = self._write_segment(current, new_file, _record_runs(data, offsets, lengths, start, stop))
            # back to back from `offset`, summed in C (a rollover may move millions of records)
            new_offsets = array("q", accumulate(lengths[start:stop - 1], initial=offset))
            moved.append(Relocation(log_id, current.path, indexes[start:stop], new_offsets, lengths[start:stop]))
            if new_file:
                files.append(current)
            current.entries += stop - start
            current.last_index = indexes[stop - 1]
            current.size = new_offsets[-1] + lengths[stop - 1]
            start = stop
        self.files.sync_directory(log_dir)

    def _write_segment(self, segment: SegmentFile, new_file: bool, pieces: list[memoryview]) -> int:
        """Append ``pieces`` (synced); returns the offset they start at.

        Synced every SEGMENT_SYNC_BYTES, not once at the end: the WAL's batches
        are fdatasynced meanwhile on the same disk, and each of those waits
        behind whatever segment data the disk has queued (ext4 commits them in
        one journal transaction), so a whole WAL file's worth at once stalls
        the confirms of every batch written during the move (tens of ms)."""
        if new_file:
            self.files.remove(segment.path)  # a leftover of an interrupted delete is not ours
        handle = self.files.open_append(segment.path)
        size_before = handle.size
        try:
            if new_file:   # a file of just its header holds no records: recovery removes it
                handle.write(records.FILE_HEADER)
            unsynced = 0
            for piece in pieces:
                for at in range(0, len(piece), SEGMENT_SYNC_BYTES):
                    chunk = piece[at:at + SEGMENT_SYNC_BYTES]
                    if unsynced and unsynced + len(chunk) > SEGMENT_SYNC_BYTES:
                        handle.sync()
                        unsynced = 0
                    handle.write(chunk)
                    unsynced += len(chunk)
            handle.sync()
        except OSError:
            handle.close()
            if new_file:
                self.files.remove(segment.path)
            else:
                self.files.truncate(segment.path, size_before)
            raise
        handle.close()
        return size_before + (records.FILE_HEADER_SIZE if new_file else 0)

    def truncate_segments(self, cursors: dict[int, int]) -> None:
        """Let segment files wholly below their log's cursor go, and deleted logs' files."""
        for log_id in list(self.segments):
            cursor = cursors.get(log_id)
            kept = []
            for segment in self.segments[log_id]:
                if cursor is None or segment.last_index < cursor:
                    self._discard(segment.path)
                else:
                    kept.append(segment)
            if len(kept) == len(self.segments[log_id]):
                continue
            self.files.sync_directory(self.segments_dir / str(log_id))
            if kept:
                self.segments[log_id] = kept
            else:
                del self.segments[log_id]
                self.files.remove_tree(self.segments_dir / str(log_id))

    def log_segment_bytes(self, log_id: int) -> int:
        """The size of one log's segment files (read on the loop; a rollover may be appending)."""
        return sum(self.files.size(segment.path) for segment in list(self.segments.get(log_id, ())))

    def _count_segments(self) -> None:
        self.segment_count = sum(len(files) for files in self.segments.values())
        self.segment_bytes = sum(self.log_segment_bytes(log_id) for log_id in list(self.segments))

    def close(self) -> None:
        if self._wal is not None:
            self._wal.close()
            self._wal = None


class _FileVisitor:
    """Hands each record `records.scan` decodes in one file on with its location, and
    counts them (a segment's first and last index), so that none is kept meanwhile;
    with `heads`, notes the entry records as a write notes them (a WAL file)."""

    __slots__ = ("count", "first_index", "heads", "last_index", "path", "visit")
    _overhead = records.PREFIX_SIZE + records.ENTRY_HEAD_SIZE

    def __init__(self, path: Path, visit: RecordVisitor, heads: WalHeads | None = None) -> None:
        self.path = path
        self.visit = visit
        self.heads = heads
        self.count = 0
        self.first_index = self.last_index = 0

    def __call__(self, record: records.Record, offset: int) -> None:
        index = record.index
        if not self.count:
            self.first_index = index
        self.last_index = index
        self.count += 1
        location = Location(self.path, offset, self._overhead + len(record.payload))
        if self.heads is not None:
            self.heads.note_record(record.log_id, index, offset, location.length)
        self.visit(record, location)
