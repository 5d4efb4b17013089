"""The WAL file allocated ahead of its writes, on the real disk (storage/files.py):
what is written reads back, what was allocated and never written is cut at a
clean close and read as the end of the file after a crash."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from warren.storage import files, records
from warren.storage.files import PREALLOCATE_STEP_BYTES, AppendHandle, RealFiles
from warren.storage.wal import Location, LogStore

ALLOCATE_UP_TO = 64 * 1024 * 1024


def encoded(index: int, size: int = 100) -> bytes:
    return records.encode(1, 1, index, bytes([index % 251]) * size)


def test_a_preallocated_file_is_allocated_ahead_and_cut_to_what_was_written_at_close(tmp_path: Path):
    path = tmp_path / "00000001.wal"
    handle = AppendHandle(path, preallocate_bytes=ALLOCATE_UP_TO)
    handle.write(records.FILE_HEADER)
    assert path.stat().st_size == len(records.FILE_HEADER), "the header is written before anything is allocated"
    handle.write(encoded(1))
    written = len(records.FILE_HEADER) + len(encoded(1))
    assert handle.size == written
    assert path.stat().st_size >= written + PREALLOCATE_STEP_BYTES, "space beyond the write is allocated"
    handle.close()
    assert path.stat().st_size == written


def test_a_file_grows_by_another_step_when_a_write_passes_what_was_allocated(tmp_path: Path):
    path = tmp_path / "00000001.wal"
    handle = AppendHandle(path, preallocate_bytes=ALLOCATE_UP_TO)
    handle.write(records.FILE_HEADER)
    handle.write(encoded(1))
    first = handle.allocated
    handle.write(b"\x01" * (first - handle.size + 1))
    assert handle.allocated > first and path.stat().st_size == handle.allocated
    handle.close()
    assert path.stat().st_size == first + 1


def test_nothing_is_allocated_past_the_size_given(tmp_path: Path):
    """The WAL allocates up to its rollover size: past it, a file that must take one
    more batch grows by that batch only."""
    path = tmp_path / "00000001.wal"
    handle = AppendHandle(path, preallocate_bytes=1000)
    handle.write(records.FILE_HEADER)
    handle.write(encoded(1))
    assert path.stat().st_size == 1000
    handle.write(bytes(2000))
    assert path.stat().st_size == handle.size == len(records.FILE_HEADER) + len(encoded(1)) + 2000
    handle.close()


def test_records_written_into_allocated_space_read_back_through_the_block_cache(tmp_path: Path):
    """A cached block of the file being written must not serve the zeros that lay
    where later records now are."""
    real = RealFiles()
    path = tmp_path / "00000001.wal"
    handle = real.open_append(path, preallocate_bytes=ALLOCATE_UP_TO)
    handle.write(records.FILE_HEADER)
    offset = handle.size
    for index in range(1, 40):
        record = encoded(index)
        handle.write(record)
        handle.sync()
        assert real.read_at(path, offset, len(record)) == record, f"record {index} read back wrong"
        offset += len(record)
    handle.close()


def test_a_crash_leaves_zeros_after_the_last_batch_and_recovery_reads_them_as_the_end(tmp_path: Path):
    store = LogStore(tmp_path / "log", 64 * 1024 * 1024, 1000)
    assert store.recover().logs == {}
    batches = [b"".join(encoded(index) for index in range(first, first + 3)) for first in (1, 4, 7)]
    for batch in batches:
        path, _ = store.write_batch(batch)
    assert path.stat().st_size > store.wal_size_bytes, "the WAL file is allocated ahead of its writes"
    on_disk = path.read_bytes()
    assert records.zeros_from(on_disk, store.wal_size_bytes)
    # a crash: the process is gone without a close, its zeros stay
    os.close(store._wal._fd)   # noqa: SLF001 -- the descriptor dropped without a close, as by kill -9

    recovered_store = LogStore(tmp_path / "log", 64 * 1024 * 1024, 1000)
    recovered = recovered_store.recover()
    assert recovered.torn == [], "zeros allocated ahead are not a torn tail"
    assert sorted(recovered.logs[1]) == list(range(1, 10))
    assert path.stat().st_size == len(records.FILE_HEADER) + sum(map(len, batches)), "the zeros are cut"
    recovered_store.close()


def test_a_payload_read_back_from_the_wal_being_written_is_the_one_written(tmp_path: Path):
    store = LogStore(tmp_path / "log", 64 * 1024 * 1024, 1000)
    store.recover()
    for index in range(1, 30):
        record = encoded(index, size=300)
        path, start = store.write_batch(record)
        assert store.read_payload(Location(path, start, len(record))) == bytes([index % 251]) * 300
    store.close()


def test_without_room_to_allocate_ahead_writes_go_on_as_plain_appends(tmp_path: Path, monkeypatch):
    def no_room(fd, offset, length):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(files.os, "posix_fallocate", no_room)
    path = tmp_path / "00000001.wal"
    handle = AppendHandle(path, preallocate_bytes=ALLOCATE_UP_TO)
    handle.write(records.FILE_HEADER)
    handle.write(encoded(1))
    handle.write(encoded(2))
    assert path.stat().st_size == handle.size == len(records.FILE_HEADER) + 2 * len(encoded(1))
    handle.close()


def test_a_close_that_cannot_cut_the_allocated_zeros_still_closes(tmp_path: Path, monkeypatch):
    path = tmp_path / "00000001.wal"
    handle = AppendHandle(path, preallocate_bytes=ALLOCATE_UP_TO)
    handle.write(records.FILE_HEADER)
    handle.write(encoded(1))

    def failing_cut(fd, size):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(files.os, "ftruncate", failing_cut)
    handle.close()
    assert handle.closed
    data = path.read_bytes()
    assert records.scan_heads(data, str(path))[1] == len(records.FILE_HEADER) + len(encoded(1)), \
        "the zeros left read as the end of the file"


def test_only_open_files_allocated_ahead_are_listed_for_reads(tmp_path: Path):
    """The list of files being written is bounded: a closed WAL file goes when the
    next opens, and segments (not allocated ahead) are never listed."""
    real = RealFiles()
    for number in range(1, 20):
        wal_file = real.open_append(tmp_path / f"{number:08d}.wal", preallocate_bytes=ALLOCATE_UP_TO)
        real.open_append(tmp_path / f"{number}.seg").close()
        if number < 19:
            wal_file.close()
    assert list(real._appending) == [tmp_path / "00000019.wal"]   # noqa: SLF001
    wal_file.close()


def test_a_mapped_file_reads_as_its_bytes_and_an_empty_one_as_empty(tmp_path: Path):
    full, empty = tmp_path / "full", tmp_path / "empty"
    full.write_bytes(records.FILE_HEADER + encoded(1) + encoded(2))
    empty.write_bytes(b"")
    with RealFiles().mapped(full) as data:
        assert (len(data), data[:], records.scan(data).records[1].payload) == (
            full.stat().st_size, full.read_bytes(), bytes([2]) * 100)
    with RealFiles().mapped(empty) as data:
        assert len(data) == 0 and records.scan(data).records == []


def test_an_error_while_a_view_of_a_mapped_file_is_held_goes_up_as_it_is(tmp_path: Path):
    path = tmp_path / "wal"
    path.write_bytes(records.FILE_HEADER + encoded(1))
    try:
        with RealFiles().mapped(path) as data:
            view = memoryview(data)[8:]   # kept alive by the traceback: the mapping cannot be closed at once
            raise LookupError(len(view))
    except LookupError as error:
        assert error.args == (len(encoded(1)),)


def test_a_rollover_and_a_recovery_map_the_wal_instead_of_reading_it_whole(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(RealFiles, "read_bytes", lambda *_: pytest.fail("a whole file read into memory"))
    store = LogStore(tmp_path, 1 << 20, 8)
    store.recover()
    for index in range(1, 41):
        data = encoded(index)
        path, start = store.write_batch(data)
        if index % 3:   # the others written past the notes: those files' heads are read back, mapped too
            store.note_written(path, start, records.heads_of_batch(data))
        if index % 15 == 0:
            store.rollover({1: index - 5})
    store.close()
    again = LogStore(tmp_path, 1 << 20, 8)
    recovered = again.recover()
    again.close()
    assert set(range(26, 41)) <= set(recovered.logs[1])   # and whole segments below the last cursor
    assert all(record.payload == bytes([index % 251]) * 100 for index, record in recovered.logs[1].items())


@pytest.mark.parametrize("short_writes", [False, True])
def test_pieces_are_written_as_their_concatenation_past_iov_max_and_after_short_writes(
        tmp_path: Path, monkeypatch, short_writes: bool):
    """A WAL batch goes to the disk as its records' pieces (`write_pieces`, one pwritev
    per IOV_MAX of them): the file holds exactly their concatenation, also when the
    kernel writes less than asked (it may, for a regular file, on a signal)."""
    pieces = [bytes([i % 251]) * (1 + i % 7) for i in range(files.IOV_MAX * 2 + 5)]
    pieces[3] = b""
    real_pwritev = os.pwritev
    calls = []

    def pwritev(fd, buffers, offset):
        calls.append(len(buffers))
        if short_writes and len(calls) % 2:   # every other call writes a few bytes less than asked
            wanted = sum(map(len, buffers))
            first = bytes(b"".join(bytes(b) for b in buffers)[: max(1, wanted - 5)])
            return real_pwritev(fd, [first], offset)
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(files.os, "pwritev", pwritev)
    path = tmp_path / "00000001.wal"
    handle = AppendHandle(path, preallocate_bytes=ALLOCATE_UP_TO)
    handle.write(records.FILE_HEADER)
    handle.write_pieces(pieces)
    expected = records.FILE_HEADER + b"".join(pieces)
    assert handle.size == len(expected)
    assert max(calls) <= files.IOV_MAX
    handle.close()
    assert path.read_bytes() == expected

