"""A rollover picks the records it moves from the heads noted as batches were
written (storage/wal_heads.py), never by reading a whole file's heads back when
the notes cover it, and exactly what reading them back would pick."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warren.storage import records, wal_heads
from warren.storage.wal import LogStore

LOGS = (0, 1, 2)


def batches_of(rng: random.Random, count: int) -> list[bytes]:
    """Records of three logs, now and then a log's tail written again from an
    earlier index (a follower whose uncommitted tail a new leader replaced) or
    a control record (index 0)."""
    next_index = dict.fromkeys(LOGS, 1)
    batches = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 6)):
            log_id = rng.choice(LOGS)
            roll = rng.random()
            if roll < 0.1:
                parts.append(records.encode(log_id, 1, 0, b"control"))
                continue
            if roll < 0.2 and next_index[log_id] > 3:
                next_index[log_id] -= rng.randint(1, 3)
            index = next_index[log_id]
            next_index[log_id] = index + 1
            parts.append(records.encode(log_id, 1, index, rng.randbytes(rng.choice([0, 5, 60]))))
        batches.append(b"".join(parts))
    return batches


def as_lists(picked: dict) -> dict:
    return {log_id: (list(h.indexes), list(h.offsets), list(h.lengths)) for log_id, h in picked.items() if len(h)}


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32), batches=st.integers(1, 40), cursors=st.lists(st.integers(1, 60), min_size=3,
                                                                                  max_size=3), drop=st.booleans())
def test_the_noted_heads_pick_what_reading_the_file_back_picks(tmp_path_factory, seed, batches, cursors, drop):
    store = LogStore(tmp_path_factory.mktemp("wal"), 1 << 30, 16)
    store.recover()
    for data in batches_of(random.Random(seed), batches):
        path, start = store.write_batch(data)
        store.note_written(path, start, records.heads_of_batch(data))
    path = store.wal_path
    store.close()   # as a rollover reads it: closed, cut to what was written (not allocated ahead)
    data = path.read_bytes()
    noted = store._heads[path]
    assert noted.complete(len(data))
    live = dict(zip(LOGS, cursors))
    if drop:
        del live[1]
    picked = as_lists(noted.pick(live))
    assert picked == as_lists(wal_heads.pick_by_scan(data, path, live))
    # the model: each live log's records at or above its cursor (a release cursor: 1 at least), in file order
    every, _ = records.scan_heads(data)
    model: dict[int, tuple[list, list, list]] = {}
    for log_id, index, offset, length in every:
        if log_id in live and index >= live[log_id]:
            for column, value in zip(model.setdefault(log_id, ([], [], [])), (index, offset, length)):
                column.append(value)
    assert picked == model


def test_a_logs_entries_among_control_records_and_other_logs_are_one_run_of_twelve_bytes_a_record(tmp_path):
    """As the runtime writes them: each batch a log's entries, other logs' records, and
    the log's hard state (a control record, index 0) after them."""
    store = LogStore(tmp_path, 1 << 30, 16)
    store.recover()
    for index in range(1, 1001):
        data = b"".join((records.encode(5, 1, index, b"m" * (index % 7)), records.encode(6, 1, index, b"other"),
                         records.encode(5, 1, 0, b"hard state")))
        path, start = store.write_batch(data)
        store.note_written(path, start, records.heads_of_batch(data))
    log_heads = store._heads[store.wal_path].logs[5]
    assert (len(log_heads), len(log_heads.run_starts), log_heads.increasing) == (1000, 1, True)
    assert log_heads.offsets.itemsize + log_heads.lengths.itemsize == 12
    picked = log_heads.from_index(990)
    assert list(picked.indexes) == list(range(990, 1001))
    store.close()


def test_a_recovered_wal_file_is_noted_as_read_and_its_rollover_reads_no_heads_back(tmp_path, monkeypatch):
    store, written = filled_store(tmp_path, noted_every=2)   # whatever the first run noted: a restart reads anew
    store.close()
    again = LogStore(tmp_path, 1 << 30, 8)
    again.recover()
    monkeypatch.setattr(records, "scan_heads", lambda *_: pytest.fail("the heads were read back"))
    again.rollover({1: 11})
    again.close()
    assert recovered_payloads(tmp_path) == {key: value for key, value in written.items() if key[1] >= 11}


def test_heads_of_a_batch_are_those_read_back():
    data = b"".join(batches_of(random.Random(7), 20))
    scanned, _ = records.scan_heads(records.FILE_HEADER + data)
    assert records.heads_of_batch(data) == [(log_id, index, length) for log_id, index, _, length in scanned]


def filled_store(directory: Path, noted_every: int = 1) -> tuple[LogStore, dict[tuple[int, int], bytes]]:
    store = LogStore(directory, 1 << 30, 8)
    store.recover()
    written = {}
    for index in range(1, 41):
        payload = f"entry {index}".encode()
        record = records.encode(1, 1, index, payload)
        written[(1, index)] = payload
        path, start = store.write_batch(record)
        if index % noted_every:
            continue
        store.note_written(path, start, [records.head_of(record)])
    return store, written


def recovered_payloads(directory: Path) -> dict[tuple[int, int], bytes]:
    store = LogStore(directory, 1 << 30, 8)
    recovered = store.recover()
    store.close()
    return {(log_id, index): record.payload for log_id, entries in recovered.logs.items()
            for index, record in entries.items()}


def test_a_rollover_of_a_noted_file_never_reads_its_heads_back(tmp_path, monkeypatch):
    store, written = filled_store(tmp_path)
    monkeypatch.setattr(records, "scan_heads", lambda *_: pytest.fail("the heads were read back"))
    store.rollover({1: 11})
    store.close()
    assert recovered_payloads(tmp_path) == {key: value for key, value in written.items() if key[1] >= 11}


def test_a_file_written_past_its_notes_has_its_heads_read_back(tmp_path, monkeypatch):
    store, written = filled_store(tmp_path, noted_every=2)   # every other batch not noted
    read_back = []
    scan_heads = records.scan_heads
    monkeypatch.setattr(records, "scan_heads", lambda *args: read_back.append(args[1]) or scan_heads(*args))
    store.rollover({1: 11})
    store.close()
    assert len(read_back) == 1
    assert recovered_payloads(tmp_path) == {key: value for key, value in written.items() if key[1] >= 11}


def test_a_note_that_fails_leaves_the_file_to_be_read_back(tmp_path):
    store, written = filled_store(tmp_path)
    store.note_written(store.wal_path, store.wal_size_bytes, [(1, "not an index", 10)])   # cannot be taken
    assert not store._heads[store.wal_path].complete(store.wal_size_bytes)
    store.rollover({1: 11})
    store.close()
    assert recovered_payloads(tmp_path) == {key: value for key, value in written.items() if key[1] >= 11}
