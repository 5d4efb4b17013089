"""LogStore (WAL + segments) over a fake disk that loses power, and GroupCommitter.

The durability contract under test: every batch whose ``write_batch()``
returned before a crash is recovered intact (unless a rollover released it:
index below its log's cursor, or its log was dropped); nothing is invented;
at most the un-synced tail is lost, and recovery cuts it and reports it in
``Recovered.torn``; afterwards appends continue cleanly.

Seeded simulations print the seed of a failing round; replay one with
``WARREN_SEED=<seed> pytest tests/unit/test_storage_wal.py -k <test>``.
"""
from __future__ import annotations

import asyncio
import copy
import errno
import os
import random
import threading
from pathlib import Path

import pytest

from tests.unit.faultyfiles import FaultyFiles, SimulatedCrash
from warren.storage import files as files_module
from warren.storage import records, wal
from warren.storage.group_commit import GroupCommitter
from warren.storage.records import CorruptLog, Record
from warren.storage.wal import LogStore

DATA_DIR = Path("/data")
ROOT = DATA_DIR / "log"
WAL_DIR = ROOT / "wal"
SEGMENTS_DIR = ROOT / "segments"
METADATA_LOG_ID = 0


def seeds(count: int) -> list[int]:
    if "WARREN_SEED" in os.environ:
        return [int(os.environ["WARREN_SEED"])]
    return list(range(count))


def for_each_seed(count: int, round_function) -> None:
    for seed in seeds(count):
        try:
            round_function(seed)
        except (AssertionError, CorruptLog, OSError, KeyError, ValueError) as error:
            raise AssertionError(f"seed {seed} failed (replay with WARREN_SEED={seed}): {error!r}") from error


# -- the model: what was written, what was acknowledged ----------------------

class Model:
    """What the program asked for and what the store promised."""

    def __init__(self) -> None:
        self.attempted: dict[tuple[int, int], Record] = {}
        self.acknowledged: set[tuple[int, int]] = set()
        self.maybe: set[tuple[int, int]] = set()  # in flight at a crash: may or may not survive
        self.in_flight: set[tuple[int, int]] = set()
        self.cursors: dict[int, int] = {METADATA_LOG_ID: 0, 1: 0, 2: 0}
        self.next_index: dict[int, int] = {METADATA_LOG_ID: 1, 1: 1, 2: 1}
        self.next_log_id = 3

    def record(self, rng: random.Random, log_id: int) -> tuple[tuple[int, int], bytes]:
        index = self.next_index[log_id]
        self.next_index[log_id] = index + 1
        size = rng.choice([0, 1, 17, 90, 300])
        payload = f"{log_id}/{index}/".encode() + rng.randbytes(size)
        record = Record(log_id, rng.randint(0, 3), index, payload)
        self.attempted[(log_id, index)] = record
        return (log_id, index), records.encode(record.log_id, record.term, record.index, record.payload)

    def batch(self, rng: random.Random, size: int | None = None) -> tuple[set[tuple[int, int]], bytes]:
        keys, parts = set(), []
        live = sorted(self.cursors)
        for _ in range(size if size is not None else rng.randint(1, 5)):
            key, encoded = self.record(rng, rng.choice(live))
            keys.add(key)
            parts.append(encoded)
        return keys, b"".join(parts)

    def required(self) -> set[tuple[int, int]]:
        return {(log_id, index) for log_id, index in self.acknowledged
                if log_id in self.cursors and index >= self.cursors[log_id]}

    def crashed(self) -> None:
        self.maybe |= self.in_flight
        self.in_flight = set()


def write(store: LogStore, model: Model, rng: random.Random, size: int | None = None) -> set[tuple[int, int]]:
    """One batch, noted as the group committer notes it (storage/wal_heads.py) but
    now and then not: a rollover then reads that file's heads back instead."""
    keys, data = model.batch(rng, size)
    model.in_flight = keys
    path, start = store.write_batch(data)
    if rng.random() < 0.9:
        store.note_written(path, start, records.heads_of_batch(data))
    model.in_flight = set()
    model.acknowledged |= keys
    return keys


def next_cursors(model: Model, rng: random.Random, drop: bool) -> dict[int, int]:
    cursors = {}
    for log_id, cursor in model.cursors.items():
        cursors[log_id] = rng.randint(cursor, model.next_index[log_id])  # release cursors only move forward
    droppable = [log_id for log_id in cursors if log_id != METADATA_LOG_ID]
    if drop and droppable:
        del cursors[rng.choice(droppable)]
    return cursors


def rollover(store: LogStore, model: Model, rng: random.Random, drop: bool = False) -> None:
    cursors = next_cursors(model, rng, drop)
    model.cursors = cursors  # the required set only shrinks, so adopt it before the call
    first_keys, first_batch = set(), b""
    if rng.random() < 0.7:
        key, first_batch = model.record(rng, METADATA_LOG_ID)  # like the metadata snapshot
        first_keys = {key}
    model.in_flight = first_keys
    store.rollover(dict(cursors), first_batch)
    model.in_flight = set()
    model.acknowledged |= first_keys


def new_fake(seed: int, mkdir_durable: bool = True) -> FaultyFiles:
    fake = FaultyFiles(seed, mkdir_durable=mkdir_durable)
    fake.makedirs_durable(DATA_DIR)  # the operator's data directory exists before the broker starts
    return fake


def open_store(fake: FaultyFiles, wal_max_size_bytes: int = 2048, segment_max_entries: int = 6):
    store = LogStore(ROOT, wal_max_size_bytes, segment_max_entries, files=fake)
    return store, store.recover()


def check_recovered(model: Model, recovered, context: str = "") -> None:
    for log_id, entries in recovered.logs.items():
        for index, record in entries.items():
            key = (log_id, index)
            assert key in model.attempted, f"{context}invented entry {key}"
            assert record == model.attempted[key], f"{context}entry {key} damaged: {record!r}"
            assert key in model.acknowledged or key in model.maybe, \
                f"{context}entry {key} from a batch that never completed"
    for log_id, index in sorted(model.required()):
        got = recovered.logs.get(log_id, {}).get(index)
        assert got is not None, f"{context}lost acknowledged entry {(log_id, index)} (cursor {model.cursors[log_id]})"
        assert got == model.attempted[(log_id, index)], f"{context}entry {(log_id, index)} damaged"


def wal_paths(fake: FaultyFiles) -> list[Path]:
    return [p for p in fake.listdir(WAL_DIR) if p.suffix == ".wal"]


def segment_paths(fake: FaultyFiles) -> list[Path]:
    return [p for d in fake.listdir(SEGMENTS_DIR) for p in fake.listdir(d)]


def check_all_files_clean(fake: FaultyFiles) -> None:
    for path in [*wal_paths(fake), *segment_paths(fake)]:
        result = records.scan(fake.read_bytes(path), str(path))
        assert result.torn_reason is None, f"{path} still has a torn tail after recovery: {result.torn_reason}"


# -- basics -------------------------------------------------------------------

def test_written_batches_are_recovered():
    rng = random.Random(1)
    fake = new_fake(1)
    model = Model()
    store, recovered = open_store(fake)
    assert recovered.logs == {}
    assert recovered.torn == []
    for _ in range(10):
        write(store, model, rng)
    assert store.fsyncs == 10
    store.close()
    _, recovered = open_store(fake)
    check_recovered(model, recovered)
    assert sum(len(e) for e in recovered.logs.values()) == len(model.acknowledged)
    assert recovered.torn == []


def test_write_batch_is_durable_when_it_returns():
    fake = new_fake(2)
    model = Model()
    store, _ = open_store(fake)
    write(store, model, random.Random(2))
    syncs = fake.syncs
    for crash_seed in range(20):
        crashed = copy.deepcopy(fake)
        crashed.crash(random.Random(crash_seed))
        _, recovered = open_store(crashed)
        check_recovered(model, recovered, f"crash seed {crash_seed}: ")
    assert syncs == fake.syncs


# -- random crashes ----------------------------------------------------------

def random_step(store: LogStore, fake: FaultyFiles, model: Model, rng: random.Random) -> LogStore:
    roll = rng.random()
    if roll < 0.70:
        write(store, model, rng)
    elif roll < 0.82 or store.needs_rollover():
        rollover(store, model, rng, drop=rng.random() < 0.1)
    elif roll < 0.90:
        store.close()
        store, recovered = open_store(fake)
        check_recovered(model, recovered, "clean restart: ")
    else:
        log_id = model.next_log_id  # a new durable queue
        model.next_log_id += 1
        model.cursors[log_id] = 0
        model.next_index[log_id] = 1
    return store


def crash_round(seed: int) -> None:
    rng = random.Random(seed)
    fake = new_fake(seed)
    model = Model()
    store, _ = open_store(fake)
    fake.crash_at_op = fake.ops + rng.randint(1, 400)
    try:
        for _ in range(rng.randint(5, 120)):
            store = random_step(store, fake, model, rng)
    except SimulatedCrash:
        pass
    fake.crash_at_op = None
    fake.crash(rng)
    model.crashed()

    paths = wal_paths(fake)
    newest_torn = None
    if paths:
        before = records.scan(fake.read_bytes(paths[-1]), str(paths[-1]))
        if before.torn_reason is not None:
            newest_torn = (paths[-1], before.valid_end, before.torn_bytes)
    store, recovered = open_store(fake)
    check_recovered(model, recovered, "after crash: ")
    torn_wals = [(t.path, t.offset, t.bytes_lost) for t in recovered.torn if t.path.suffix == ".wal"]
    assert torn_wals == ([newest_torn] if newest_torn else []), f"torn tails reported {recovered.torn}"
    check_all_files_clean(fake)

    for _ in range(rng.randint(1, 25)):  # appends continue cleanly after recovery
        store = random_step(store, fake, model, rng)
    store.close()
    _, recovered = open_store(fake)
    check_recovered(model, recovered, "after continuing: ")
    assert recovered.torn == []


def test_random_crashes_keep_the_durability_contract():
    for_each_seed(250, crash_round)


# -- rollover ----------------------------------------------------------------

def test_rollover_moves_live_entries_to_segments_and_deletes_the_rest():
    rng = random.Random(5)
    fake = new_fake(5)
    model = Model()
    model.cursors = {1: 0, 2: 0, 3: 0}
    model.next_index = {1: 1, 2: 1, 3: 1}
    store, _ = open_store(fake, wal_max_size_bytes=1 << 20, segment_max_entries=4)
    for _ in range(10):
        for log_id in (1, 2, 3):
            key, encoded = model.record(rng, log_id)
            store.write_batch(encoded)
            model.acknowledged.add(key)
    first_wal = wal_paths(fake)[0]

    model.cursors = {1: 5, 2: 1}  # log 3 was deleted
    store.rollover(dict(model.cursors))
    assert first_wal not in fake.files(), "the old WAL file must be deleted"
    assert len(wal_paths(fake)) == 1
    assert sorted(p.name for p in fake.listdir(SEGMENTS_DIR)) == ["1", "2"]
    assert segment_indexes(fake, 1) == [[5, 6, 7, 8], [9, 10]]
    assert segment_indexes(fake, 2) == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]
    assert sorted(store.segments) == [1, 2]

    model.cursors = {1: 9, 2: 6}
    store.rollover(dict(model.cursors))
    assert segment_indexes(fake, 1) == [[9, 10]]  # [5..8] was wholly below 9
    assert segment_indexes(fake, 2) == [[5, 6, 7, 8], [9, 10]]  # [5..8] still holds 6..8

    model.cursors = {2: 6}  # now log 1 is deleted too
    store.rollover(dict(model.cursors))
    assert sorted(p.name for p in fake.listdir(SEGMENTS_DIR)) == ["2"]
    assert 1 not in store.segments
    store.close()
    _, recovered = open_store(fake)
    check_recovered(model, recovered)
    assert 3 not in recovered.logs or recovered.logs[3] == {}
    assert 1 not in recovered.logs or recovered.logs[1] == {}


def test_rollover_syncs_a_segment_in_pieces_so_wal_syncs_do_not_wait_behind_all_of_it(monkeypatch):
    """A rollover copies a whole WAL file's worth into segments while batches are
    fdatasynced on the same disk; each of those waits behind the segment data the
    disk holds, so the copy is synced every SEGMENT_SYNC_BYTES, not once at the end."""
    monkeypatch.setattr(wal, "SEGMENT_SYNC_BYTES", 256)
    rng = random.Random(7)
    fake = new_fake(7)
    model = Model()
    model.cursors = {1: 0}
    model.next_index = {1: 1}
    store, _ = open_store(fake, wal_max_size_bytes=1 << 20, segment_max_entries=1000)
    for _ in range(40):
        key, encoded = model.record(rng, 1)
        store.write_batch(encoded)
        model.acknowledged.add(key)
    fake.op_log.clear()
    store.rollover(dict(model.cursors))
    [segment] = fake.listdir(SEGMENTS_DIR / "1")
    ops = [op for op, path in fake.op_log if path == segment and op in ("write", "sync")]
    size = len(fake.read_bytes(segment))
    assert ops.count("sync") >= size // 256, f"{ops.count('sync')} syncs for a {size}-byte segment"
    assert ops[-1] == "sync", "the segment must end synced"
    assert segment_indexes(fake, 1) == [list(range(1, 41))]
    store.close()
    _, recovered = open_store(fake)
    check_recovered(model, recovered)


def test_what_a_rollover_lets_go_waits_in_the_trash_and_a_restart_empties_it(tmp_path):
    """The old WAL file and the segments below their cursor are renamed into the trash
    (durably, before any is cut), shredded later; a stop before that leaves them there,
    and the next start removes them without reading them, even cut short."""
    store = LogStore(tmp_path / "log", 4096, 4)
    store.recover()
    for index in range(1, 30):
        store.write_batch(records.encode(1, 0, index, b"x" * 200))
    old_wal = store.wal_path
    store.start_rollover({1: 1})
    store.finish_rollover({1: 1})
    store.switch_wal()
    store.move_to_segments({1: 26})
    store.finish_rollover({1: 26})     # segments wholly below 26 let go too
    trash = sorted(p.name for p in (tmp_path / "log" / wal.TRASH_DIR).iterdir())
    assert f"00000001.{old_wal.name}" in trash and any(name.endswith(".seg") for name in trash), trash
    assert not old_wal.exists()
    victim = next((tmp_path / "log" / wal.TRASH_DIR).iterdir())
    os.truncate(victim, 7)   # a shred cut short by a crash: not a torn log
    store.close()
    again = LogStore(tmp_path / "log", 4096, 4)
    recovered = again.recover()
    kept = sorted(recovered.logs[1])   # whole segments of 4 below 26 went
    assert kept[-4:] == [26, 27, 28, 29] and kept[0] > 22, kept
    assert list((tmp_path / "log" / wal.TRASH_DIR).iterdir()) == []
    again.close()


def test_a_rollover_that_fails_half_way_through_letting_go_is_finished_by_the_next(tmp_path):
    store = LogStore(tmp_path / "log", 2048, 4)
    store.recover()
    rename, calls = store.files.rename, []

    def failing_second(source, target):
        calls.append(source)
        if len(calls) == 2:
            raise OSError(errno.EIO, "injected rename failure")
        rename(source, target)
    store.files.rename = failing_second
    index = 0
    for _ in range(2):   # two old WAL files for one rollover to let go
        for _ in range(12):
            index += 1
            store.write_batch(records.encode(1, 0, index, b"y" * 200))
        store.switch_wal()
    store.move_to_segments({1: 1})
    with pytest.raises(OSError, match="injected"):
        store.finish_rollover({1: 1})
    store.rollover({1: 1})   # the next one lets go of what is left, and of its own old file
    assert len(list(store.wal_dir.iterdir())) == 1 and list(store.trash_dir.iterdir()) == []
    store.close()
    again = LogStore(tmp_path / "log", 2048, 4)
    assert sorted(again.recover().logs[1]) == list(range(1, index + 1))
    again.close()


def test_shredding_frees_a_file_in_steps_then_removes_it(tmp_path, monkeypatch):
    monkeypatch.setattr(files_module, "SHRED_STEP_BYTES", 1000)
    monkeypatch.setattr(files_module, "SHRED_PAUSE_SECONDS", 0)
    cuts: list[int] = []
    ftruncate = os.ftruncate
    monkeypatch.setattr(os, "ftruncate", lambda fd, size: (cuts.append(size), ftruncate(fd, size))[1])
    path = tmp_path / "big"
    path.write_bytes(b"z" * 3500)
    files_module.RealFiles().shred(path)
    assert cuts == [2500, 1500, 500] and not path.exists()
    files_module.RealFiles().shred(path)   # gone already: nothing to do


async def test_the_committer_shreds_what_its_rollovers_let_go_off_the_loop(tmp_path):
    store = real_store(tmp_path, wal_max_size_bytes=600)
    shredded_on: list[str] = []
    shred = store.files.shred
    store.files.shred = lambda path: (shredded_on.append(threading.current_thread().name), shred(path))[1]
    cursor = {"at": 1}

    def prepare_rollover() -> tuple[dict[int, int], bytes]:
        return {METADATA_LOG_ID: 1, 1: cursor["at"]}, records.encode(METADATA_LOG_ID, 0, 1, b"snapshot")

    committer = GroupCommitter(store, prepare_rollover)
    for index in range(1, 41):
        committer.append(records.encode(1, 0, index, b"p" * 50))
        cursor["at"] = index
        await committer.drain()
    assert store.rollovers >= 3
    assert shredded_on and threading.main_thread().name not in shredded_on, shredded_on
    assert list(store.trash_dir.iterdir()) == [] and not store.trash_to_shred
    committer.close()
    store.close()


async def test_a_rollover_asked_for_runs_though_the_wal_is_not_full(tmp_path):
    """`rollover_soon` on an idle committer: the WAL is switched now, and a log missing
    from the cursors (a removed group's) loses its segments then."""
    store = real_store(tmp_path, wal_max_size_bytes=4096)
    live = {"logs": {1: 1, 2: 1}}
    committer = GroupCommitter(store, lambda: (dict(live["logs"]), b""))
    for index in range(1, 41):
        for log_id in (1, 2):
            committer.append(records.encode(log_id, 0, index, b"e" * 100))
        await committer.drain()
    assert store.rollovers >= 2 and store.log_segment_bytes(2) > 0
    rollovers = store.rollovers
    assert not store.needs_rollover()
    del live["logs"][2]
    committer.rollover_soon()
    await committer.drain()
    assert store.rollovers == rollovers + 1
    assert store.log_segment_bytes(2) == 0 and not (store.segments_dir / "2").exists()
    assert store.log_segment_bytes(1) > 0 and list(store.trash_dir.iterdir()) == []
    committer.close()
    store.close()


def segment_indexes(fake: FaultyFiles, log_id: int) -> list[list[int]]:
    out = []
    for path in fake.listdir(SEGMENTS_DIR / str(log_id)):
        result = records.scan(fake.read_bytes(path), str(path))
        assert result.torn_reason is None
        assert all(r.log_id == log_id for r in result.records)
        out.append([r.index for r in result.records])
    return out


def test_segment_bytes_counts_through_the_file_layer():
    """BUG (storage/wal.py, LogStore.segment_bytes): it calls ``segment.path.stat()``
    instead of going through ``self.files``, so with any substitute file layer
    (and the warren_segment_bytes gauge in tests) it reports 0."""
    rng = random.Random(6)
    fake = new_fake(6)
    model = Model()
    store, _ = open_store(fake, wal_max_size_bytes=1 << 20, segment_max_entries=4)
    for _ in range(5):
        write(store, model, rng)
    store.rollover({0: 0, 1: 0, 2: 0})
    on_disk = sum(len(fake.read_bytes(p)) for p in segment_paths(fake))
    assert on_disk > 0
    assert store.segment_bytes == on_disk


def build_rollover_scenario():
    rng = random.Random(11)
    fake = new_fake(11)
    model = Model()
    store, _ = open_store(fake, wal_max_size_bytes=1 << 20, segment_max_entries=4)
    for _ in range(8):
        write(store, model, rng)
    rollover(store, model, rng)
    model.cursors[3] = 0  # a third queue appears
    model.next_index[3] = 1
    for _ in range(10):
        write(store, model, rng)
    store.close()
    store, _ = open_store(fake, wal_max_size_bytes=1 << 20, segment_max_entries=4)  # two WAL files now
    for _ in range(6):
        write(store, model, rng)
    return fake, store, model, rng


def test_crash_at_each_file_operation_of_a_rollover_loses_nothing_durable():
    base = build_rollover_scenario()
    probe_fake, probe_store, probe_model, probe_rng = copy.deepcopy(base)
    ops_before = probe_fake.ops
    rollover(probe_store, probe_model, probe_rng, drop=True)
    operations = probe_fake.op_log[ops_before:]
    assert len(operations) >= 8, operations
    assert any(op == "remove" for op, _ in operations)

    for step, (operation, path) in enumerate(operations, start=1):
        for outcome in range(4):
            context = f"crash before op {step} ({operation} {path}), outcome {outcome}: "
            try:
                crash_during_rollover_round(base, step, outcome, context)
            except (AssertionError, CorruptLog, OSError) as error:
                raise AssertionError(f"{context}{error!r}") from error


def crash_during_rollover_round(base, step: int, outcome: int, context: str) -> None:
    fake, store, model, rng = copy.deepcopy(base)
    fake.crash_at_op = fake.ops + step
    with pytest.raises(SimulatedCrash):
        rollover(store, model, rng, drop=True)
    fake.crash(random.Random(1000 * step + outcome))
    model.crashed()
    store, recovered = open_store(fake, wal_max_size_bytes=1 << 20, segment_max_entries=4)
    check_recovered(model, recovered, context)
    check_all_files_clean(fake)
    for _ in range(3):  # the interrupted rollover is redone by the next one
        write(store, model, rng)
    rollover(store, model, rng)
    write(store, model, rng)
    store.close()
    _, recovered = open_store(fake, wal_max_size_bytes=1 << 20, segment_max_entries=4)
    check_recovered(model, recovered, context + "after the next rollover: ")


def test_disk_use_stays_bounded_while_a_queue_is_published_to_and_consumed_from():
    rng = random.Random(8)
    fake = new_fake(8)
    store, _ = open_store(fake, wal_max_size_bytes=4096, segment_max_entries=16)
    payload_bytes, backlog = 100, 40
    record_bytes = len(records.encode(1, 0, 1, b"x" * payload_bytes))
    bound = 4096 + 3 * record_bytes + (backlog + 2 * 16) * record_bytes + 16 * records.FILE_HEADER_SIZE
    index, cursor, rollovers, peak = 1, 1, 0, 0
    while rollovers < 60:
        batch = b"".join(records.encode(1, 0, index + k, rng.randbytes(payload_bytes)) for k in range(3))
        store.write_batch(batch)
        index += 3
        cursor = max(cursor, index - backlog)  # consumers keep up, a backlog of ~40 messages
        if store.needs_rollover():
            store.rollover({1: cursor})
            rollovers += 1
        peak = max(peak, fake.total_bytes())
        assert fake.total_bytes() <= bound, f"{fake.total_bytes()} bytes on disk after {rollovers} rollovers"
    assert len(fake.files()) <= 8, sorted(fake.files())
    store.close()
    _, recovered = open_store(fake, wal_max_size_bytes=4096, segment_max_entries=16)
    assert set(range(cursor, index)) <= set(recovered.logs[1])


# -- disk faults ---------------------------------------------------------------

@pytest.mark.parametrize("fault", ["enospc", "eio"])
def test_failed_write_batch_raises_and_is_cut_off(fault):
    rng = random.Random(9)
    fake = new_fake(9)
    model = Model()
    store, _ = open_store(fake)
    write(store, model, rng)
    write(store, model, rng)
    failed, data = model.batch(rng, 4)
    if fault == "enospc":
        fake.enospc_after_bytes = fake.bytes_written_total + len(data) // 2
    else:
        fake.eio_on_sync = True
    with pytest.raises(OSError) as caught:
        store.write_batch(data)
    assert caught.value.errno == (errno.ENOSPC if fault == "enospc" else errno.EIO)
    fake.enospc_after_bytes = None
    fake.eio_on_sync = False
    assert records.scan(fake.read_bytes(wal_paths(fake)[-1])).torn_reason is None, "failed batch left in the WAL"
    write(store, model, rng)
    store.close()
    _, recovered = open_store(fake)
    check_recovered(model, recovered)  # has the batches before and after
    assert not any(recovered.logs.get(log_id, {}).get(index) for log_id, index in failed)
    assert recovered.torn == []


@pytest.mark.parametrize("fault", ["enospc", "eio"])
def test_failed_write_batch_then_crash_keeps_acknowledged_batches(fault):
    def one_round(seed: int) -> None:
        rng = random.Random(seed)
        fake = new_fake(seed)
        model = Model()
        store, _ = open_store(fake)
        write(store, model, rng)
        failed, data = model.batch(rng, 4)
        if fault == "enospc":
            fake.enospc_after_bytes = fake.bytes_written_total + rng.randint(0, len(data) - 1)
        else:
            fake.eio_on_sync = True
        with pytest.raises(OSError):
            store.write_batch(data)
        fake.enospc_after_bytes = None
        fake.eio_on_sync = False
        model.maybe |= failed  # the disk may hold some of it after a crash: ambiguous, like a lost ack
        if rng.random() < 0.5:
            write(store, model, rng)
        fake.crash(rng)
        _, recovered = open_store(fake)
        check_recovered(model, recovered)
    for_each_seed(40, one_round)


def test_eio_on_sync_then_clean_restart_then_crash_still_recovers():
    """After a failed fsync the batch is cut with ftruncate, which is not made
    durable; part of the batch may already be on disk (partial writeback). A
    clean restart makes that file a non-newest WAL file; a crash then lets the
    un-truncated tail come back, and recovery refuses to start.

    BUG (storage/wal.py, LogStore.write_batch): the cut-off of a failed batch is
    not durable (AppendHandle.truncate has no fsync), so a non-newest WAL file
    can end in a torn tail, which recover() reports as CorruptLog.
    """
    def one_round(seed: int) -> None:
        rng = random.Random(seed)
        fake = new_fake(seed)
        model = Model()
        store, _ = open_store(fake)
        write(store, model, rng)
        failed, data = model.batch(rng, 4)
        fake.eio_on_sync = True
        with pytest.raises(OSError):
            store.write_batch(data)
        fake.eio_on_sync = False
        model.maybe |= failed
        store.close()
        store, _ = open_store(fake)  # clean restart: a new WAL file is started
        write(store, model, rng)
        fake.crash(rng)
        _, recovered = open_store(fake)
        check_recovered(model, recovered)
    for_each_seed(40, one_round)


def test_enospc_during_rollover_leaves_recoverable_segments():
    """ENOSPC while rollover writes a segment: rollover raises; once space is
    back, later appends and rollovers must leave files that recover.

    BUG (storage/wal.py, LogStore._append_segment): the SegmentFile is added to
    ``self.segments`` (entries=0) before its write, and a failed write is
    neither cut off nor forgotten. The next rollover appends behind the partial
    bytes (and, for a new file, without the file header), so recovery meets a
    bad record followed by good ones: CorruptLog, and the broker cannot start.
    """
    def one_round(seed: int) -> None:
        rng = random.Random(seed)
        fake = new_fake(seed)
        model = Model()
        store, _ = open_store(fake, wal_max_size_bytes=1 << 20, segment_max_entries=4)
        for _ in range(6):
            write(store, model, rng)
        written_before = fake.bytes_written_total
        probe_fake, probe_store = copy.deepcopy((fake, store))
        probe_store.rollover(dict(model.cursors))
        rollover_bytes = probe_fake.bytes_written_total - written_before
        header_bytes = records.FILE_HEADER_SIZE
        fake.enospc_after_bytes = written_before + rng.randint(header_bytes + 1, rollover_bytes - 1)
        with pytest.raises(OSError):
            store.rollover(dict(model.cursors))
        fake.enospc_after_bytes = None
        for _ in range(4):
            write(store, model, rng)
        store.rollover(dict(model.cursors))
        write(store, model, rng)
        store.close()
        _, recovered = open_store(fake, wal_max_size_bytes=1 << 20, segment_max_entries=4)
        check_recovered(model, recovered)
    for_each_seed(20, one_round)


# -- bit rot -------------------------------------------------------------------

def two_wal_files(seed: int):
    """An older WAL file (left by a clean restart) and a newest one, both with records."""
    rng = random.Random(seed)
    fake = new_fake(seed)
    model = Model()
    store, _ = open_store(fake, wal_max_size_bytes=1 << 20)
    for _ in range(4):
        write(store, model, rng, size=1)
    store.close()
    store, _ = open_store(fake, wal_max_size_bytes=1 << 20)
    for _ in range(4):
        write(store, model, rng, size=1)
    store.close()
    paths = wal_paths(fake)
    assert len(paths) == 2
    return fake, model, paths


def record_starts(data: bytes) -> list[int]:
    offsets, offset = [], records.FILE_HEADER_SIZE
    for record in records.scan(data).records:
        offsets.append(offset)
        offset += len(records.encode(record.log_id, record.term, record.index, record.payload))
    return offsets


@pytest.mark.parametrize("which", ["older", "newest"])
def test_bit_flip_in_the_middle_of_a_wal_file_is_corruption(which):
    fake, _, paths = two_wal_files(12)
    path = paths[0] if which == "older" else paths[1]
    starts = record_starts(fake.read_bytes(path))
    fake.flip_bit(path, starts[1] + 20, 3)  # the second of four records
    with pytest.raises(CorruptLog) as caught:
        open_store(fake)
    assert caught.value.path == str(path)
    assert caught.value.offset == starts[1]


def test_bit_flip_in_the_last_record_of_an_older_wal_file_is_corruption():
    fake, _, paths = two_wal_files(13)
    starts = record_starts(fake.read_bytes(paths[0]))
    fake.flip_bit(paths[0], starts[-1] + 14, 0)
    with pytest.raises(CorruptLog) as caught:
        open_store(fake)
    assert caught.value.path == str(paths[0])
    assert caught.value.offset == starts[-1]


def test_bit_flip_in_the_last_record_of_the_newest_wal_file_is_a_torn_tail():
    fake, model, paths = two_wal_files(14)
    data = fake.read_bytes(paths[1])
    starts = record_starts(data)
    fake.flip_bit(paths[1], starts[-1] + 40, 5)
    _, recovered = open_store(fake)
    torn = [(t.path, t.offset, t.bytes_lost) for t in recovered.torn]
    assert torn == [(paths[1], starts[-1], len(data) - starts[-1])]
    assert len(fake.read_bytes(paths[1])) == starts[-1]
    kept_in_newest = records.scan(data[:starts[-1]]).records
    assert len(kept_in_newest) == 3
    assert sum(len(e) for e in recovered.logs.values()) == len(model.acknowledged) - 1


def segment_scenario(seed: int):
    rng = random.Random(seed)
    fake = new_fake(seed)
    model = Model()
    store, _ = open_store(fake, wal_max_size_bytes=1 << 20, segment_max_entries=8)
    model.cursors = {1: 0}
    for _ in range(6):
        write(store, model, rng, size=1)
    store.rollover(dict(model.cursors))  # all six move to one segment file; the WAL file is deleted
    store.close()
    [path] = segment_paths(fake)
    return fake, model, path


def test_bit_flip_in_the_middle_of_a_segment_is_corruption():
    fake, _, path = segment_scenario(15)
    starts = record_starts(fake.read_bytes(path))
    fake.flip_bit(path, starts[2] + 30, 1)
    with pytest.raises(CorruptLog) as caught:
        open_store(fake)
    assert caught.value.path == str(path)
    assert caught.value.offset == starts[2]


def test_bit_flip_in_the_last_record_of_a_segment_whose_wal_is_gone_is_corruption():
    """wal.py's docstring: only the newest WAL file's torn tail is cut; damage
    anywhere else raises CorruptLog.

    BUG (storage/wal.py, LogStore._recover_segment): any torn tail of a segment
    is cut and merely reported, on the reasoning that "the WAL still has the
    entries". When the WAL file the segment came from is already deleted, it
    does not: an acknowledged entry is silently dropped at startup.
    """
    fake, model, path = segment_scenario(16)
    starts = record_starts(fake.read_bytes(path))
    fake.flip_bit(path, starts[-1] + 30, 1)
    with pytest.raises(CorruptLog):
        _, recovered = open_store(fake)
        check_recovered(model, recovered)


# -- directories must be synced too (strict POSIX model) ----------------------

def test_first_start_directories_survive_a_crash():
    """BUG (storage/wal.py, LogStore.recover): ``makedirs`` creates log/, wal/ and
    segments/ but their entries in the parent directories are never fsynced, so
    after a power loss the whole wal/ directory (with fsynced batches in it) may
    be gone. Fix: after makedirs, sync_directory() each newly created
    directory's parent (self.directory.parent, self.directory)."""
    def one_round(seed: int) -> None:
        rng = random.Random(seed)
        fake = new_fake(seed, mkdir_durable=False)
        model = Model()
        store, _ = open_store(fake)
        write(store, model, rng)
        fake.crash(rng)
        _, recovered = open_store(fake)
        check_recovered(model, recovered)
    for_each_seed(20, one_round)


def test_new_segment_directory_survives_a_crash_after_rollover():
    """BUG (storage/wal.py, LogStore._append_segment): the first segment of a
    log creates segments/<log_id>/ and syncs that directory, but not
    segments/ itself. The rollover then deletes the WAL file and syncs wal/, so
    a power loss can leave neither the WAL file nor the segment directory.
    Fix: after ``makedirs(log_dir)`` of a new directory, sync_directory(self.segments_dir)."""
    def one_round(seed: int) -> None:
        rng = random.Random(seed)
        fake = new_fake(seed, mkdir_durable=False)
        fake.makedirs_durable(WAL_DIR)  # isolate this from the first-start bug above
        fake.makedirs_durable(SEGMENTS_DIR)
        model = Model()
        store, _ = open_store(fake)
        for _ in range(4):
            write(store, model, rng)
        store.rollover(dict(model.cursors))
        fake.crash(rng)
        _, recovered = open_store(fake)
        check_recovered(model, recovered)
    for_each_seed(20, one_round)


# -- GroupCommitter over a real LogStore ----------------------------------------

def real_store(tmp_path: Path, wal_max_size_bytes: int = 1 << 20, store_class=LogStore) -> LogStore:
    store = store_class(tmp_path / "log", wal_max_size_bytes, 8)
    store.recover()
    return store


def no_rollover() -> tuple[dict[int, int], bytes]:
    raise AssertionError("no rollover expected")


def recovered_indexes(tmp_path: Path, log_id: int = 1) -> list[int]:
    store = LogStore(tmp_path / "log", 1 << 20, 8)
    recovered = store.recover()
    store.close()
    return sorted(recovered.logs.get(log_id, {}))


async def test_appends_in_one_turn_are_one_batch_and_one_fsync(tmp_path):
    store = real_store(tmp_path)
    committer = GroupCommitter(store, no_rollover)
    outcomes = []
    batches = [committer.append(records.encode(1, 0, i, b"m%d" % i)) for i in range(1, 21)]
    assert set(batches) == {1}
    committer.when_durable(1, outcomes.append)
    await committer.drain()
    assert outcomes == [True]
    assert store.fsyncs == 1
    store.close()
    assert recovered_indexes(tmp_path) == list(range(1, 21))


class BlockingStore(LogStore):
    """write_batch waits for the test's go-ahead, so the test can append meanwhile."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.started = threading.Event()
        self.go = threading.Event()

    def write_batch(self, data: bytes):
        self.started.set()
        assert self.go.wait(10), "test never released the write"
        return super().write_batch(data)


async def test_appends_during_a_write_go_into_the_next_batch_and_callbacks_run_in_order(tmp_path):
    store = real_store(tmp_path, store_class=BlockingStore)
    committer = GroupCommitter(store, no_rollover)
    order: list[tuple[int, bool]] = []
    first = committer.append(records.encode(1, 0, 1, b"a"))
    committer.when_durable(first, lambda ok: order.append((first, ok)))
    assert await asyncio.to_thread(store.started.wait, 10)
    second = [committer.append(records.encode(1, 0, i, b"b")) for i in (2, 3, 4)]
    assert set(second) == {first + 1}
    for tag in ("x", "y"):
        committer.when_durable(second[0], lambda ok, tag=tag: order.append((second[0], ok)))
    store.go.set()
    await committer.drain()
    assert order == [(first, True), (first + 1, True), (first + 1, True)]
    assert store.fsyncs == 2
    store.close()
    assert recovered_indexes(tmp_path) == [1, 2, 3, 4]


class SyncFailsStore(LogStore):
    """The real write_batch, with the WAL file's fdatasync failing on chosen calls."""

    fail_calls: set[int] = set()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = 0

    def write_batch(self, data: bytes):
        self.calls += 1
        if self.calls not in self.fail_calls:
            return super().write_batch(data)
        handle = self._wal

        def failing_sync() -> None:
            raise OSError(errno.EIO, "injected fdatasync failure")

        handle.sync = failing_sync
        try:
            super().write_batch(data)
        finally:
            del handle.sync


async def test_failed_batch_gets_ok_false_and_later_batches_succeed(tmp_path):
    SyncFailsStore.fail_calls = {2}
    store = real_store(tmp_path, store_class=SyncFailsStore)
    committer = GroupCommitter(store, no_rollover)
    outcomes: dict[int, list[bool]] = {}
    for index in (1, 2, 3):
        batch = committer.append(records.encode(1, 0, index, b"m"))
        committer.when_durable(batch, lambda ok, index=index: outcomes.setdefault(index, []).append(ok))
        await committer.drain()
    assert outcomes == {1: [True], 2: [False], 3: [True]}
    assert committer.failed_batches == 1
    assert store.fsyncs == 2
    store.close()
    assert recovered_indexes(tmp_path) == [1, 3]


async def test_rollover_runs_through_prepare_rollover_when_the_wal_is_full(tmp_path, monkeypatch):
    store = real_store(tmp_path, wal_max_size_bytes=600)
    # the committer notes every batch (storage/wal_heads.py): no rollover reads a file's heads back
    monkeypatch.setattr(records, "scan_heads", lambda *_: pytest.fail("the heads were read back"))
    calls = []
    consumed = {"cursor": 1}

    def prepare_rollover() -> tuple[dict[int, int], bytes]:
        calls.append(store.wal_size_bytes)
        snapshot_index = len(calls)
        return ({METADATA_LOG_ID: snapshot_index, 1: consumed["cursor"]},
                records.encode(METADATA_LOG_ID, 0, snapshot_index, b"snapshot"))

    committer = GroupCommitter(store, prepare_rollover)
    outcomes = []
    for index in range(1, 61):
        committer.when_durable(committer.append(records.encode(1, 0, index, b"p" * 50)), outcomes.append)
        consumed["cursor"] = max(1, index - 5)
        if index % 3 == 0:
            await committer.drain()
    await committer.drain()
    assert outcomes == [True] * 60
    assert len(calls) >= 3
    assert all(size >= 600 for size in calls)
    assert store.segment_count >= 1
    assert len(list((tmp_path / "log" / "wal").iterdir())) == 1
    store.close()
    store = LogStore(tmp_path / "log", 600, 8)
    recovered = store.recover()
    assert set(range(consumed["cursor"], 61)) <= set(recovered.logs[1])
    assert max(recovered.logs[METADATA_LOG_ID]) == len(calls)


class RolloverFailsOnceStore(LogStore):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rollover_failures = 0

    def move_to_segments(self, cursors: dict[int, int]):
        if self.rollover_failures == 0:
            self.rollover_failures += 1
            raise OSError(errno.ENOSPC, "injected: no space for segments")
        return super().move_to_segments(cursors)


async def test_failed_rollover_does_not_break_the_committer(tmp_path):
    """A rollover that fails (ENOSPC writing segments) must not take the writer
    down: later batches are still written and confirmed, and drain() (called at
    shutdown by Durability.close) completes.

    BUG (storage/group_commit.py, GroupCommitter._run): the OSError from
    ``store.rollover`` is not caught; it escapes the writer task, is not logged
    as a WAL error, and is re-raised by drain() — so shutdown fails — or is left
    as "Task exception was never retrieved". Fix: catch OSError around the
    rollover, log it, and retry at the next batch (the old WAL files are still
    in ``_old_wals``)."""
    store = real_store(tmp_path, wal_max_size_bytes=300, store_class=RolloverFailsOnceStore)
    committer = GroupCommitter(store, lambda: ({1: 1}, b""))
    outcomes = []
    for index in range(1, 31):
        committer.when_durable(committer.append(records.encode(1, 0, index, b"q" * 40)), outcomes.append)
        try:
            await committer.drain()
        except OSError as error:
            pytest.fail(f"drain() raised {error!r} after append {index}")
    assert store.rollover_failures == 1
    assert outcomes == [True] * 30
    store.close()
    assert recovered_indexes(tmp_path) == list(range(1, 31))


class SlowMoveStore(LogStore):
    """A store whose rollover copies into segments only once the test lets it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.move_started = threading.Event()
        self.release_move = threading.Event()

    def move_to_segments(self, cursors: dict[int, int]):
        self.move_started.set()
        assert self.release_move.wait(10), "the test never let the rollover's copy go on"
        return super().move_to_segments(cursors)


async def test_a_wal_filled_during_a_rollover_is_rolled_over_when_that_one_ends(tmp_path):
    """Writes go on while a rollover copies the old WAL file into segments. If they fill the
    new file past the WAL's size meanwhile, the next rollover follows at once, not at the next
    write, which on a quiet node may come much later: the WAL stays within its size."""
    store = real_store(tmp_path, wal_max_size_bytes=1000, store_class=SlowMoveStore)
    committer = GroupCommitter(store, lambda: ({1: 1}, b""))
    loop = asyncio.get_running_loop()

    async def write(index: int) -> None:
        durable = loop.create_future()
        committer.when_durable(committer.append(records.encode(1, 0, index, b"w" * 100)), durable.set_result)
        assert await asyncio.wait_for(durable, 5), f"record {index} was not written"

    index = 0
    while not store.move_started.is_set():   # the first WAL file fills and its rollover starts
        index += 1
        await write(index)
    while not store.needs_rollover():        # the new file fills while that rollover copies
        index += 1
        await write(index)
    store.release_move.set()
    await asyncio.wait_for(committer.drain(), 10)
    assert not store.needs_rollover(), (
        f"the WAL holds {store.wal_size_bytes} B, over its {store.wal_max_size_bytes}, after"
        f" {store.rollovers} rollover(s) and nothing is being written: no rollover until the next write")
    assert store.rollovers == 2
    committer.close()
    store.close()
    assert recovered_indexes(tmp_path) == list(range(1, index + 1))


async def test_a_first_batch_larger_than_the_wal_does_not_roll_over_again_and_again(tmp_path):
    """A rollover's new file starts with every group's newest snapshot, which may alone pass
    the WAL's size: with nothing written since, the rollover that ends is not followed by
    another (each would start the same way), and the committer goes idle."""
    store = real_store(tmp_path, wal_max_size_bytes=1000)
    committer = GroupCommitter(store, lambda: ({1: 1}, records.encode(METADATA_LOG_ID, 0, 1, b"s" * 1500)))
    for index in range(1, 12):
        committer.append(records.encode(1, 0, index, b"w" * 100))
    await asyncio.wait_for(committer.drain(), 5)
    assert store.rollovers == 1, f"{store.rollovers} rollovers for one WAL file's worth of writes"
    committer.close()
    store.close()


def test_wal_files_left_by_restarts_count_toward_the_next_rollover():
    """Every start opens a new WAL file and keeps the older ones until a rollover
    moves what they hold into segments. If only the newest file counted toward
    `wal_max_size_bytes`, a node restarted before its WAL filled would keep every
    file its runs left behind: disk and recovery time growing with each restart."""
    fake = new_fake(11)
    max_bytes = 4096
    store, _ = open_store(fake, wal_max_size_bytes=max_bytes, segment_max_entries=16)
    batch_bytes = 3 * len(records.encode(1, 0, 1, b"x" * 100))
    index, rollovers = 1, 0
    for restart in range(30):
        for _ in range(4):   # about a third of the WAL's size per run
            store.write_batch(b"".join(records.encode(1, 0, index + k, b"x" * 100) for k in range(3)))
            index += 3
            if store.needs_rollover():
                store.rollover({1: max(1, index - 40)})
                rollovers += 1
        store.close()
        store, recovered = open_store(fake, wal_max_size_bytes=max_bytes, segment_max_entries=16)
        assert set(range(max(1, index - 40), index)) <= set(recovered.logs[1])
        wal_bytes = sum(len(fake.read_bytes(path)) for path in wal_paths(fake))
        assert wal_bytes <= max_bytes + batch_bytes + 8 * records.FILE_HEADER_SIZE, (
            f"{wal_bytes} bytes of WAL in {len(wal_paths(fake))} files after {restart + 1} restarts "
            f"and {rollovers} rollovers")
    store.close()


def _segment_bytes(store: LogStore) -> dict[str, int]:
    return {str(path.relative_to(store.segments_dir)): path.stat().st_size
            for path in store.segments_dir.rglob("*.seg")}


def test_a_move_into_segments_that_finds_no_room_takes_back_what_it_copied(tmp_path):
    """A rollover's copy into segments that runs out of space half way (one log's records
    copied, the next log's not) leaves the segments as they were: the next rollover copies
    the same old WAL files again, and what the failed one had copied stayed a second time.
    On a disk short of space every failed try took more of it, until nothing was left."""
    def filled(root: Path) -> LogStore:
        store = LogStore(root, 1 << 20, 8)
        store.recover()
        for index in range(1, 21):
            store.write_batch(records.encode(1, 0, index, b"a" * 300) + records.encode(2, 0, index, b"b" * 300))
        store.switch_wal()
        return store

    reference = filled(tmp_path / "reference")
    reference.move_to_segments({1: 1, 2: 1})
    store = filled(tmp_path / "log")
    open_append = store.files.open_append

    def no_room_for_log_2(path: Path, preallocate_bytes: int = 0):
        handle = open_append(path, preallocate_bytes)
        if path.parent.name == "2":
            def write(data: bytes) -> None:
                raise OSError(errno.ENOSPC, "injected: no space left")
            handle.write = write
        return handle
    store.files.open_append = no_room_for_log_2
    with pytest.raises(OSError, match="injected"):
        store.move_to_segments({1: 1, 2: 1})
    assert _segment_bytes(store) == {}, "the copy that failed took back what it had written"
    store.files.open_append = open_append
    store.move_to_segments({1: 1, 2: 1})
    assert _segment_bytes(store) == _segment_bytes(reference), "each record in the segments once"
    store.finish_rollover({1: 1, 2: 1})
    store.close()
    again = LogStore(tmp_path / "log", 1 << 20, 8)
    logs = again.recover().logs
    assert sorted(logs[1]) == sorted(logs[2]) == list(range(1, 21))
    again.close()
    reference.close()


def test_a_segment_file_holds_at_most_segment_max_bytes_so_large_entries_are_let_go_in_pieces(tmp_path, monkeypatch):
    """A segment file is let go only once every entry in it is below the log's cursor: with
    4096 entries a file and 300 KB bodies a file held over a gigabyte, and one queue's
    consumed messages kept 112 MB of a 256 MB disk (chaos seed 4602). A file also ends at
    SEGMENT_MAX_BYTES (64 MB, as ra's segment_max_size_bytes), at least one record each."""
    monkeypatch.setattr(wal, "SEGMENT_MAX_BYTES", 10_000)
    store = LogStore(tmp_path / "log", 1 << 20, 4096)
    store.recover()
    for index in range(1, 51):
        store.write_batch(records.encode(1, 0, index, b"m" * 1000))
    store.write_batch(records.encode(2, 0, 1, b"h" * 30_000))   # one record over the cap: a file of its own
    store.rollover({1: 1, 2: 1})
    sizes = {path.name: path.stat().st_size for path in (store.segments_dir / "1").iterdir()}
    assert len(sizes) >= 5 and all(size <= 10_000 for size in sizes.values()), sizes
    assert len(list((store.segments_dir / "2").iterdir())) == 1
    store.rollover({1: 30, 2: 1})
    kept = sorted(path.name for path in (store.segments_dir / "1").iterdir())
    assert len(kept) < len(sizes), f"the files wholly below the cursor went: {sorted(sizes)} -> {kept}"
    store.close()
    again = LogStore(tmp_path / "log", 1 << 20, 4096)
    logs = again.recover().logs
    assert sorted(logs[1])[-21:] == list(range(30, 51)) and sorted(logs[2]) == [1]
    for index in range(51, 61):   # appends after a restart respect the files' sizes read back
        again.write_batch(records.encode(1, 0, index, b"m" * 1000))
    again.rollover({1: 30, 2: 1})
    assert all(path.stat().st_size <= 10_000 for path in (again.segments_dir / "1").iterdir())
    again.close()


def test_live_entries_go_into_a_new_segment_file_not_one_wholly_below_the_cursor(tmp_path):
    """A queue drained empty: its segment file holds every consumed message, and the next
    rollover copies the entries after the last snapshot. Appended to that file, they kept
    it whole (37 MB of a drained queue on a 96 MiB disk, the disk alarm never cleared);
    in a file of their own, the old one goes."""
    store = LogStore(tmp_path / "log", 1 << 20, 4096)
    store.recover()
    for index in range(1, 41):
        store.write_batch(records.encode(1, 0, index, b"m" * 1000))
    store.rollover({1: 1})
    first = sorted((store.segments_dir / "1").iterdir())
    assert len(first) == 1 and first[0].stat().st_size > 40_000
    for index in range(41, 44):   # gets and acks after the messages; a snapshot at 42
        store.write_batch(records.encode(1, 0, index, b"a"))
    store.rollover({1: 43})
    kept = sorted((store.segments_dir / "1").iterdir())
    assert first[0] not in kept and len(kept) == 1 and kept[0].stat().st_size < 1000, kept
    store.close()
    assert sorted(LogStore(tmp_path / "log", 1 << 20, 4096).recover().logs[1]) == [43]
