"""A WAL batch that finds the disk full waits for space instead of failing.

A write that fails for lack of space (ENOSPC, EDQUOT) is cut off the file again
and wrote nothing: the batch is written again once there is room, in its place
(the batches appended meanwhile wait behind it), and its callbacks run then,
with ok=True. A shutdown gives up on it, and so does a wait past
`no_space_give_up_seconds` (the node restarts). An fdatasync that fails stays a
failed batch: after it, the page cache's copy cannot be trusted (see
test_storage_wal's SyncFailsStore)."""
from __future__ import annotations

import asyncio
import errno
from pathlib import Path

import pytest

from tests.unit.faultyfiles import FaultyFiles
from warren.storage import group_commit, records
from warren.storage.group_commit import GroupCommitter
from warren.storage.reserve import SpaceReserve
from warren.storage.wal import LogStore, NoSpace


class DiskFullStore(LogStore):
    """The real write_batch, with the WAL file's write running out of space half
    way through the batch while `full` is set."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.full = False
        self.attempts = 0
        self.attempted_while_full = asyncio.Event()

    def write_batch(self, data: bytes):
        self.attempts += 1
        if not self.full:
            return super().write_batch(data)
        handle = self._wal
        real_write = handle.write_pieces

        def write_half_then_fail(pieces) -> None:
            chunk = b"".join(pieces)
            real_write([chunk[: len(chunk) // 2]])
            raise OSError(errno.ENOSPC, "No space left on device")

        handle.write_pieces = write_half_then_fail
        try:
            super().write_batch(data)
        finally:
            del handle.write_pieces
            self.loop.call_soon_threadsafe(self.attempted_while_full.set)


async def until_waiting_for_space(committer: GroupCommitter, reported=lambda: False) -> None:
    """Until the committer knows its batch waits for room (or `reported` says it gave an answer)."""
    while not (committer.waiting_for_space or reported()):
        await asyncio.sleep(0.001)


def disk_full_store(tmp_path) -> DiskFullStore:
    store = DiskFullStore(tmp_path / "log", 1 << 20, 8)
    store.recover()
    store.loop = asyncio.get_running_loop()
    return store


def no_rollover() -> tuple[dict[int, int], bytes]:
    raise AssertionError("no rollover expected")


def indexes_in_file_order(tmp_path) -> list[int]:
    wal_dir = tmp_path / "log" / "wal"
    found = []
    for path in sorted(wal_dir.iterdir()):
        found += [record.index for record in records.scan(path.read_bytes()).records]
    return found


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(group_commit, "NO_SPACE_RETRY_FIRST_SECONDS", 0.001)
    monkeypatch.setattr(group_commit, "NO_SPACE_RETRY_MAX_SECONDS", 0.004)


async def test_a_batch_that_finds_the_disk_full_is_written_once_there_is_room(tmp_path):
    store = disk_full_store(tmp_path)
    committer = GroupCommitter(store, no_rollover)
    outcomes: dict[int, list[bool]] = {}
    third_reported = asyncio.Event()

    def report(index: int, ok: bool) -> None:
        outcomes.setdefault(index, []).append(ok)
        if index == 3:
            third_reported.set()

    def append(index: int) -> None:
        batch = committer.append(records.encode(1, 0, index, b"m%d" % index))
        committer.when_durable(batch, lambda ok: report(index, ok))

    append(1)
    await committer.drain()
    store.full = True
    append(2)
    committer.flush()
    for _ in range(3):   # it tries again, and again, and nothing is reported meanwhile
        store.attempted_while_full.clear()
        await asyncio.wait_for(store.attempted_while_full.wait(), 5)
    append(3)            # appended while batch 2 waits: written after it
    assert outcomes == {1: [True]}, "a batch that found the disk full was reported before it was written"
    assert committer.waiting_for_space
    store.full = False   # the next try (not a shutdown's drain) writes it, then the one behind it
    await asyncio.wait_for(third_reported.wait(), 5)
    assert outcomes == {1: [True], 2: [True], 3: [True]}
    assert committer.failed_batches == 0
    assert not committer.waiting_for_space
    await committer.drain()
    store.close()
    assert indexes_in_file_order(tmp_path) == [1, 2, 3]


async def test_shutdown_gives_up_on_a_batch_waiting_for_space(tmp_path):
    store = disk_full_store(tmp_path)
    committer = GroupCommitter(store, no_rollover)
    outcomes = []
    store.full = True
    committer.when_durable(committer.append(records.encode(1, 0, 1, b"m")), outcomes.append)
    committer.flush()
    await asyncio.wait_for(store.attempted_while_full.wait(), 5)
    committer.when_durable(committer.append(records.encode(1, 0, 2, b"n")), outcomes.append)
    await asyncio.wait_for(committer.drain(), 5)
    assert outcomes == [False, False]
    assert committer.failed_batches == 2
    store.close()
    assert indexes_in_file_order(tmp_path) == []


def test_no_space_is_told_apart_from_other_write_failures(tmp_path):
    store = LogStore(tmp_path / "log", 1 << 20, 8)
    store.recover()
    handle = store._wal
    for code, expected in ((errno.ENOSPC, NoSpace), (errno.EDQUOT, NoSpace), (errno.EIO, OSError)):
        def failing_write(pieces, code: int = code) -> None:
            raise OSError(code, "injected")

        handle = store._wal
        handle.write_pieces = failing_write
        with pytest.raises(OSError) as caught:
            store.write_batch(records.encode(1, 0, 1, b"x"))
        assert type(caught.value) is expected, (code, caught.value)
        assert caught.value.errno == code
    store.close()


def test_a_rollover_that_finds_the_disk_full_leaves_batches_going_into_the_current_file():
    """A new WAL file whose header cannot be written (the disk is full) is removed again and
    the current file stays the one appended to: a batch that waited for space and is written
    after the failed switch must not land in a file without a header, which recovery refuses
    (as "not a Warren WAL file"), nor into the closed old file."""
    fake = FaultyFiles(5, mkdir_durable=True)
    fake.makedirs_durable(Path("/data"))
    store = LogStore(Path("/data/log"), 1 << 20, 8, files=fake)
    store.recover()
    store.write_batch(records.encode(1, 0, 1, b"first"))
    fake.enospc_after_bytes = fake.bytes_written_total
    with pytest.raises(OSError):
        store.switch_wal()
    with pytest.raises(NoSpace):
        store.write_batch(records.encode(1, 0, 2, b"second"))
    fake.enospc_after_bytes = None
    store.write_batch(records.encode(1, 0, 2, b"second"))
    store.close()
    recovered = LogStore(Path("/data/log"), 1 << 20, 8, files=fake).recover()
    assert sorted(recovered.logs[1]) == [1, 2]
    assert recovered.torn == []


def release_ends_the_fullness(store: LogStore, end) -> None:
    """The store's reserve, given up, is the room the full disk lacked (`end` makes room)."""
    release = store.reserve.release

    def release_and_make_room(writer: str) -> int:
        released = release(writer)
        if released:
            end()
        return released
    store.reserve.release = release_and_make_room


async def test_the_first_batch_that_finds_the_disk_full_gives_up_the_reserve_and_is_written_at_once(
        tmp_path, monkeypatch):
    monkeypatch.setattr(group_commit, "NO_SPACE_RETRY_FIRST_SECONDS", 60.0)   # the reserve's retry is not these
    store = disk_full_store(tmp_path)
    committer = GroupCommitter(store, no_rollover)
    committer.hold_reserve(1 << 20)
    reserve = tmp_path / "log" / "reserve"
    assert reserve.stat().st_size == 1 << 20 and store.reserve.held == 1 << 20
    committer.hold_reserve(2 << 20)
    assert reserve.stat().st_size == 1 << 20, "one reserve at a time"
    release_ends_the_fullness(store, lambda: setattr(store, "full", False))
    store.full = True
    written = asyncio.get_running_loop().create_future()
    committer.when_durable(committer.append(records.encode(1, 0, 1, b"m")), written.set_result)
    committer.flush()
    assert await asyncio.wait_for(written, 5) is True
    assert store.attempts == 2 and not reserve.exists() and store.reserve.held == 0
    assert not committer.waiting_for_space
    await committer.drain()
    store.close()
    assert indexes_in_file_order(tmp_path) == [1]


async def test_no_reserve_is_made_while_a_batch_waits_for_room(tmp_path):
    store = disk_full_store(tmp_path)
    committer = GroupCommitter(store, no_rollover)
    store.full = True
    written = asyncio.get_running_loop().create_future()
    committer.when_durable(committer.append(records.encode(1, 0, 1, b"m")), written.set_result)
    committer.flush()
    # The writer thread's failure reaches the committer on the loop after the store's event:
    # wait for the committer to know the batch waits, not only for the write to have failed.
    await asyncio.wait_for(until_waiting_for_space(committer, written.done), 5)
    assert committer.waiting_for_space, "the batch was answered instead of waiting for room"
    committer.hold_reserve(1 << 20)
    assert store.reserve.held == 0 and not (tmp_path / "log" / "reserve").exists()
    store.full = False
    assert await asyncio.wait_for(written, 5) is True
    await committer.drain()
    store.close()


async def test_a_rollover_that_finds_the_disk_full_gives_up_the_reserve_and_goes_again_at_once():
    """The rollover is what lets consumed messages go; with no room for its new WAL file
    the space never came back (the disk alarm asks for it, and a failed one is asked for
    again, not taken for done)."""
    fake = FaultyFiles(5, mkdir_durable=True, capacity_bytes=4 << 20)
    fake.makedirs_durable(Path("/data"))
    store = LogStore(Path("/data/log"), 1 << 20, 8, files=fake)
    store.recover()
    committer = GroupCommitter(store, lambda: ({1: 1}, b""))
    committer.hold_reserve(1 << 20)
    assert fake.files()[Path("/data/log/reserve")] == bytes(1 << 20)
    committer.append(records.encode(1, 0, 1, b"first"))
    await committer.drain()
    fake.enospc_after_bytes = fake.bytes_written_total
    release_ends_the_fullness(store, lambda: setattr(fake, "enospc_after_bytes", None))
    committer.rollover_soon()
    await asyncio.wait_for(committer.drain(), 5)
    assert store.rollovers == 1 and not committer.rollover_failed
    assert Path("/data/log/reserve") not in fake.files()
    store.close()


def test_a_reserve_is_made_only_where_the_disk_has_room_and_is_kept_over_a_restart():
    fake = FaultyFiles(5, mkdir_durable=True, capacity_bytes=3 << 20)
    fake.makedirs_durable(Path("/data/log"))
    reserve = SpaceReserve(fake, Path("/data/log"))
    assert not reserve.hold(4 << 20) and Path("/data/log/reserve") not in fake.files(), "no room: no file"
    assert reserve.hold(2 << 20) and reserve.held == 2 << 20
    assert SpaceReserve(fake, Path("/data/log")).held == 2 << 20, "the next run finds it held"
    assert reserve.release("a test") == 2 << 20 and reserve.release("a test") == 0
    assert Path("/data/log/reserve") not in fake.files()


def test_a_start_on_a_disk_full_to_its_last_byte_opens_its_wal_in_the_reserve_an_earlier_run_left():
    fake = FaultyFiles(5, mkdir_durable=True, capacity_bytes=3 << 20)
    store = LogStore(Path("/data/log"), 1 << 20, 8, files=fake)
    store.recover()
    store.write_batch(records.encode(1, 0, 1, b"kept"))
    assert store.reserve.hold(1 << 20)
    store.close()
    assert fake.allocate(Path("/data/filler"), fake.free_bytes(Path("/data"))), "another program's file"

    restarted = LogStore(Path("/data/log"), 1 << 20, 8, files=fake)
    assert sorted(restarted.recover().logs[1]) == [1]
    assert restarted.reserve.held == 0 and Path("/data/log/reserve") not in fake.files()
    restarted.write_batch(records.encode(1, 0, 2, b"an ack's room"))
    restarted.close()
    assert fake.allocate(Path("/data/filler2"), fake.free_bytes(Path("/data")))

    without_reserve = LogStore(Path("/data/log"), 1 << 20, 8, files=fake)
    with pytest.raises(OSError) as full:
        without_reserve.recover()
    assert full.value.errno == errno.ENOSPC


async def test_a_rollover_that_keeps_finding_no_room_is_tried_again_less_and_less_often(monkeypatch):
    """Each try copies what fits and takes it back: tried at every disk check under the alarm
    (every 50 ms in a test), it copied tens of megabytes twenty times a second for nothing."""
    monkeypatch.setattr(group_commit, "ROLLOVER_RETRY_FIRST_SECONDS", 0.05)
    fake = FaultyFiles(5, mkdir_durable=True)
    fake.makedirs_durable(Path("/data"))
    store = LogStore(Path("/data/log"), 1 << 20, 8, files=fake)
    store.recover()
    committer = GroupCommitter(store, lambda: ({1: 1}, b""))
    committer.append(records.encode(1, 0, 1, b"first"))
    await committer.drain()
    fake.enospc_after_bytes = fake.bytes_written_total
    loop = asyncio.get_running_loop()
    waits = []
    for _ in range(3):
        tried_at = loop.time()   # before the failure that sets the retry's deadline, never after it
        committer.rollover_soon()
        await asyncio.wait_for(committer.drain(), 5)
        assert committer.rollover_failed and not committer.rollover_retry_due
        while not committer.rollover_retry_due:
            await asyncio.sleep(0.01)
        waits.append(loop.time() - tried_at)
    assert waits[0] >= 0.05 and waits[1] >= 0.1 and waits[2] >= 0.2, waits
    fake.enospc_after_bytes = None
    committer.rollover_soon()
    await asyncio.wait_for(committer.drain(), 5)
    assert store.rollovers == 1 and not committer.rollover_failed and not committer.rollover_retry_due
    store.close()



async def test_a_batch_that_waits_too_long_for_room_fails_and_the_next_is_written(tmp_path):
    """Room that only the writes behind a waiting batch would make never comes
    (chaos seed 4602): after `no_space_give_up_seconds` the batch fails as a failed
    fdatasync's does (the node restarts from its WAL), cut off, nothing of it written."""
    store = disk_full_store(tmp_path)
    committer = GroupCommitter(store, no_rollover, no_space_give_up_seconds=0.05)
    outcomes: dict[int, list[bool]] = {}
    second_reported = asyncio.Event()

    def report(index: int, ok: bool) -> None:
        outcomes.setdefault(index, []).append(ok)
        if index == 1:
            store.full = False   # room again before the batch behind it goes to the writer
        else:
            second_reported.set()

    def append(index: int) -> None:
        batch = committer.append(records.encode(1, 0, index, b"m%d" % index))
        committer.when_durable(batch, lambda ok: report(index, ok))

    store.full = True
    append(1)
    committer.flush()
    await asyncio.wait_for(until_waiting_for_space(committer, lambda: outcomes), 5)
    assert outcomes == {} and committer.waiting_for_space, "a batch failed at its first try for want of room"
    append(2)   # waits behind it
    await asyncio.wait_for(second_reported.wait(), 5)
    assert outcomes == {1: [False], 2: [True]}, outcomes
    assert store.attempts > 2, "batch 1 gave up before trying again"
    assert committer.failed_batches == 1 and not committer.waiting_for_space
    await committer.drain()
    store.close()
    assert indexes_in_file_order(tmp_path) == [2]
