"""The SNAPSHOT record and compaction on a real LogStore, crash point by crash
point (raft/raft_storage.py): a torn snapshot record leaves the old log; a
durable one, before, during or after the rollover that drops the entries
below it, leaves the snapshot plus the entries after it; rollovers keep the
snapshot (its record is written again at the start of each new WAL file).
"""
from __future__ import annotations

import msgpack
import pytest

from warren.raft import packing
from warren.raft.group import PersistItem
from warren.raft.messages import Entry, EntryKind, HardState, Snapshot
from warren.raft.packing import Pieces
from warren.raft.raft_storage import (
    RAFT_LOG_ID_BASE,
    GroupStorage,
    RecoveryScan,
    entry_payload_data,
    entry_record,
    group_record,
    snapshot_record_pieces,
)
from warren.storage import records
from warren.storage.wal import LogStore

LOG_ID = RAFT_LOG_ID_BASE + 3
MEMBERS = ("a", "b", "c")


@pytest.mark.parametrize("size", [0, 1, 255, 256, 65535, 65536, 70000])
def test_the_snapshot_record_is_the_record_format_and_round_trips(size):
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    snapshot = Snapshot(2**35, 2**33 + 1, MEMBERS, data)
    expected = records.encode(LOG_ID, snapshot.term, 0, msgpack.packb(
        [18, snapshot.index, snapshot.term, list(MEMBERS), data], use_bin_type=True))
    head, body = snapshot_record_pieces(LOG_ID, snapshot)
    assert body is data, "the data is not copied before the pieces are joined"
    assert head + body == expected
    scan = RecoveryScan()
    for record in records.scan(records.FILE_HEADER + group_record(LOG_ID, "g", MEMBERS) + expected).records:
        scan.visit(record)
    (group,) = scan.groups()
    assert group.state.snapshot == snapshot and group.state.entries == []


@pytest.mark.parametrize("kind", list(EntryKind))
@pytest.mark.parametrize("size", [0, 1, 255, 256, 65535, 65536, 70000])
def test_an_entry_record_is_its_head_and_its_data_uncopied_and_the_record_format(kind, size):
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    entry_ = Entry(2**33 + 1, 2**35, kind, data)
    expected = records.encode(LOG_ID, entry_.term, entry_.index, msgpack.packb([int(kind), data], use_bin_type=True))
    head, body = entry_record(LOG_ID, entry_)
    assert body is data, "the entry's data is written as it is, not copied into the record"
    assert head + body == expected
    assert records.head_of((head, body)) == (LOG_ID, entry_.index, len(expected))
    (record,) = records.scan(records.FILE_HEADER + expected).records
    assert (record.log_id, record.term, record.index) == (LOG_ID, entry_.term, entry_.index)
    read_back = entry_payload_data(record.payload)
    assert type(read_back) is memoryview and read_back == data, "read back as a view of the record, not a copy"


def test_an_entry_whose_data_is_pieces_is_written_as_its_pieces_and_read_back_as_their_bytes(tmp_path):
    body = bytes(range(256)) * 80
    head = b"\x95\x0f\xa1o\x01\x00\x91\x96\xa0\xa1q\xc4\x00" + packing.bin_header(len(body))
    data = Pieces((head, body, b"\xc0\x00"))
    entry_ = Entry(3, 7, EntryKind.NORMAL, data)
    record = entry_record(LOG_ID, entry_)
    assert record[1:] == data.parts and record[2] is body, "the pieces follow the record's head, uncopied"
    whole = entry_record(LOG_ID, Entry(3, 7, EntryKind.NORMAL, bytes(data)))
    assert records.joined(record) == records.joined(whole), "byte for byte the record of the joined bytes"
    store = LogStore(tmp_path / "log", wal_max_size_bytes=1 << 30, segment_max_entries=16)
    store.recover(lambda record, location: None)
    path, start = store.write_batch(list(record))
    (read,) = records.scan(records.FILE_HEADER + records.joined(record)).records
    assert entry_payload_data(read.payload) == bytes(data)
    assert path.read_bytes()[start:start + records.record_size(record)] == records.joined(whole)


@pytest.mark.parametrize("payload", [[0, None], [1, "text"], [2, b"x", "more"], [200, b"y"]])
def test_an_entry_payload_in_another_form_is_read_through_msgpack(payload):
    assert entry_payload_data(msgpack.packb(payload, use_bin_type=True)) == payload[1]


def entry(index: int) -> Entry:
    return Entry(1, index, EntryKind.NORMAL, f"e{index}".encode() * 20)


def open_store(tmp_path) -> tuple[LogStore, RecoveryScan, list]:
    store = LogStore(tmp_path / "log", wal_max_size_bytes=1 << 30, segment_max_entries=16)
    scan = RecoveryScan()
    recovered = store.recover(lambda record, location: scan.visit(record, location))
    return store, scan, recovered.torn


def recover(tmp_path):
    store, scan, torn = open_store(tmp_path)
    store.close()
    (group,) = scan.groups()
    return group, torn


def write_log(tmp_path, last: int) -> tuple[LogStore, GroupStorage]:
    """A group with entries 1..last, all committed and durable."""
    store, _, _ = open_store(tmp_path)
    storage = GroupStorage(LOG_ID, "g", MEMBERS)
    encoded = [group_record(LOG_ID, "g", MEMBERS)]
    encoded += storage.records_for(PersistItem("g", HardState(1, "a", last), None, None,
                                               tuple(entry(i) for i in range(1, last + 1))))
    store.write_batch(b"".join(map(records.joined, encoded)))
    return store, storage


def compact(store: LogStore, storage: GroupStorage, index: int, data: bytes, torn: bool = False) -> None:
    """What RaftRuntime.compact does: the record, then the cursor."""
    record = b"".join(snapshot_record_pieces(LOG_ID, Snapshot(index, 1, MEMBERS, data)))
    store.write_batch(record[:-7] if torn else record)
    storage.snapshot = Snapshot(index, 1, MEMBERS, data)


def rollover_batch(storage: GroupStorage) -> tuple[dict[int, int], bytes]:
    return {LOG_ID: storage.cursor()}, b"".join(storage.rollover_records())


def test_a_torn_snapshot_record_leaves_the_old_log(tmp_path):
    store, storage = write_log(tmp_path, 100)
    compact(store, storage, 60, b"state@60", torn=True)
    store.close()
    group, torn = recover(tmp_path)
    assert torn, "the torn record was not cut off"
    assert group.state.snapshot is None
    assert [e.index for e in group.state.entries] == list(range(1, 101))


def test_a_durable_snapshot_before_the_rollover_starts_the_log(tmp_path):
    store, storage = write_log(tmp_path, 100)
    compact(store, storage, 60, b"state@60")
    store.close()
    group, _ = recover(tmp_path)
    assert group.state.snapshot == Snapshot(60, 1, MEMBERS, b"state@60")
    assert [e.index for e in group.state.entries] == list(range(61, 101))
    assert group.state.hard_state.commit_index == 100


@pytest.mark.parametrize("crash", ["after_switch", "after_move", "none"])
def test_a_rollover_drops_the_entries_below_the_snapshot_at_every_crash_point(tmp_path, crash):
    store, storage = write_log(tmp_path, 100)
    cursors, first = rollover_batch(storage)   # a first rollover: entries 1..100 into segments
    store.rollover(cursors, first)
    assert sum(s.entries for s in store.segments[LOG_ID]) == 100
    compact(store, storage, 60, b"state@60")
    cursors, first = rollover_batch(storage)
    assert cursors == {LOG_ID: 61}
    store.switch_wal(first)
    if crash != "after_switch":
        store.move_to_segments(cursors)
        if crash != "after_move":
            store.finish_rollover(cursors)
            # segment files wholly below the cursor are gone: 1..48 in 16-entry files
            assert min(s.first_index for s in store.segments[LOG_ID]) == 49
            assert len(list((tmp_path / "log" / "wal").iterdir())) == 1
    store.close()
    group, _ = recover(tmp_path)
    assert group.state.snapshot == Snapshot(60, 1, MEMBERS, b"state@60")
    assert [e.index for e in group.state.entries] == list(range(61, 101))


def test_rollovers_carry_the_newest_snapshot_and_a_newer_one_wins(tmp_path):
    store, storage = write_log(tmp_path, 100)
    compact(store, storage, 40, b"state@40")
    for _ in range(3):
        store.rollover(*rollover_batch(storage))
    compact(store, storage, 90, b"state@90")
    store.rollover(*rollover_batch(storage))
    store.close()
    group, _ = recover(tmp_path)
    assert group.state.snapshot.data == b"state@90"
    assert [e.index for e in group.state.entries] == list(range(91, 101))


def test_the_group_record_keeps_what_hosted_the_replica_through_recovery_and_rollover():
    """`hosted_at` (the broker's metadata index that hosted the replica) comes back after a
    restart and is written again at a rollover; a GROUP record without it reads as 0."""
    older = records.encode(LOG_ID + 1, 0, 0, msgpack.packb([16, "h", list(MEMBERS)], use_bin_type=True))
    scan = RecoveryScan()
    for record in records.scan(records.FILE_HEADER + group_record(LOG_ID, "g", MEMBERS, 42) + older).records:
        scan.visit(record)
    by_id = {group.group_id: group for group in scan.groups()}
    assert (by_id["g"].storage().hosted_at, by_id["h"].storage().hosted_at) == (42, 0)
    assert by_id["g"].storage().rollover_records()[0] == group_record(LOG_ID, "g", MEMBERS, 42)
