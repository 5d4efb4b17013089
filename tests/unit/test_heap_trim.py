"""When a quiet node gives its heap's free memory back (broker/node/heap_trim.py)."""
from __future__ import annotations

import os
import time

from hypothesis import given
from hypothesis import strategies as st

from warren.broker.node.broker import Broker
from warren.broker.node.heap_trim import QuietTrim, malloc_trim
from warren.config.settings import Settings


def test_trims_once_the_work_has_stood_still_for_the_quiet_time() -> None:
    trim = QuietTrim(1.0)
    assert not trim.due(0.0, 10)
    assert not trim.due(0.5, 10)
    assert trim.due(1.0, 10)


def test_trims_once_a_quiet_spell_however_long_it_lasts() -> None:
    trim = QuietTrim(1.0)
    trim.due(0.0, 10)
    assert trim.due(1.5, 10)
    assert [trim.due(t, 10) for t in (2.0, 5.0, 100.0)] == [False, False, False]


def test_work_restarts_the_spell_and_rearms_the_trim() -> None:
    trim = QuietTrim(1.0)
    trim.due(0.0, 10)
    assert trim.due(1.0, 10)
    assert not trim.due(1.5, 11)     # work again
    assert not trim.due(2.0, 11)
    assert trim.due(2.5, 11)


def test_a_busy_node_is_never_trimmed() -> None:
    trim = QuietTrim(1.0)
    assert not any(trim.due(t / 2, t) for t in range(1000))


@given(st.lists(st.tuples(st.floats(0, 5), st.booleans()), max_size=60))
def test_a_trim_comes_only_after_the_quiet_time_and_at_most_once_a_spell(steps: list[tuple[float, bool]]) -> None:
    trim = QuietTrim(1.0)
    now, work, moved_at = 0.0, 0, 0.0
    trimmed_this_spell = False
    trim.due(now, work)
    for gap, worked in steps:
        now += gap
        if worked:
            work += 1
            moved_at, trimmed_this_spell = now, False
        if trim.due(now, work):
            assert not worked and now - moved_at >= 1.0
            assert not trimmed_this_spell
            trimmed_this_spell = True


def test_glibc_trim_is_found_and_runs_on_linux() -> None:
    trim = malloc_trim()
    assert trim is not None, "glibc's malloc_trim was not found on this Linux machine"
    assert trim() in (0, 1)


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_glibc_trim_gives_back_memory_freed_under_live_objects() -> None:
    """What the node relies on: glibc keeps pages freed below a live chunk, and the
    trim returns them (bodies over 512 B are malloc's, not Python's own allocator's)."""
    trim = malloc_trim()
    assert trim is not None
    trim()
    bodies = [bytes([i & 255]) * 2000 for i in range(32_000)]   # 64 MB, every page written
    kept = bodies[::32]
    del bodies
    held = _resident_bytes()
    trim()
    given_back = held - _resident_bytes()
    assert given_back > 40_000_000, f"the trim gave back {given_back:,} bytes of about 62 MB freed"
    assert len(kept) == 1000


def _quiet_broker(tmp_path, quiet_seconds: float) -> tuple[Broker, list[float]]:
    broker = Broker(Settings(data_dir=tmp_path, heap_trim_quiet_seconds=quiet_seconds))
    trimmed: list[float] = []
    broker.trim_heap = lambda: trimmed.append(time.monotonic())
    return broker, trimmed


def test_the_node_trims_after_its_counters_and_wal_stand_still(tmp_path, monkeypatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    broker, trimmed = _quiet_broker(tmp_path, 1.0)
    for step, work in enumerate(("published", "delivered", "acknowledged", "wal")):
        if work == "wal":
            broker.node_log.store.bytes_written += 100
        else:
            setattr(broker.counters, work, getattr(broker.counters, work) + 1)
        broker.trim_heap_when_quiet()
        clock[0] += 0.5
        broker.trim_heap_when_quiet()
        assert len(trimmed) == step, f"trimmed while busy ({work} moved half a second ago)"
        clock[0] += 0.5
        broker.trim_heap_when_quiet()
        assert len(trimmed) == step + 1, f"no trim a second after {work} stood still"
    assert broker.counters.heap_trims == 4


def test_no_trim_when_the_setting_is_zero(tmp_path, monkeypatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    broker, trimmed = _quiet_broker(tmp_path, 0)
    for _ in range(10):
        broker.trim_heap_when_quiet()
        clock[0] += 10
    assert trimmed == [] and broker.counters.heap_trims == 0
