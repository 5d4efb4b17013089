"""broker/node/loop_cpu.py: which CPU a node process's loop is bound to, and when;
storage/cpus.py: threads the bound loop starts leave its binding behind."""
from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from warren.broker.node import loop_cpu
from warren.broker.node.loop_cpu import BURST_MIN_SECONDS, FREE_AFTER_WINDOWS, LoopPlacement
from warren.storage import cpus

TWO_CPUS = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(cpus.PROCESS_CPUS) < 2,
                              reason="needs Linux and two CPUs this process may use (a machine condition)")

# windows of 0.2 s as measured on this machine (loop thread CPU seconds, sleeps)
DRAIN = (0.2, 0.17, 140)        # a backlog's drain: 0.86 of a core, 1.2 ms between sleeps
FIVE_THOUSAND = (0.2, 0.11, 520)   # 5,000 msg/s: 0.56 of a core, 0.2 ms between sleeps
IDLE = (0.2, 0.001, 3)


def test_the_binding_is_busy_for_a_single_node_never_for_a_cluster_node_unless_set():
    assert [loop_cpu.binding(None, nodes) for nodes in (0, 1, 3)] == ["busy", "busy", "never"]
    assert [loop_cpu.binding(setting, 3) for setting in ("busy", "always")] == ["busy", "always"]
    assert loop_cpu.binding("never", 1) == "never"


def test_a_node_of_one_process_binds_its_loop_to_the_first_cpu_it_may_use():
    assert loop_cpu.loop_cpu(0, {3, 1, 2}) == 1


def test_a_nodes_processes_take_the_cpus_in_turn():
    assert [loop_cpu.loop_cpu(k, {4, 6}) for k in range(5)] == [4, 6, 4, 6, 4]


def test_with_one_cpu_nothing_is_bound():
    assert loop_cpu.loop_cpu(0, {0}) is None
    assert loop_cpu.loop_cpu(1, set()) is None


def test_a_saturated_loop_is_bound_at_once_and_freed_only_after_windows_that_are_not():
    placement = LoopPlacement()
    assert placement.on_window(*DRAIN) is True
    assert placement.on_window(*DRAIN) is None
    decisions = [placement.on_window(*IDLE) for _ in range(FREE_AFTER_WINDOWS)]
    assert decisions == [None] * (FREE_AFTER_WINDOWS - 1) + [False] and not placement.bound
    assert placement.on_window(*IDLE) is None


def test_one_saturated_window_keeps_a_bound_loop_bound():
    placement = LoopPlacement()
    placement.on_window(*DRAIN)
    for _ in range(3):
        assert [placement.on_window(*IDLE) for _ in range(FREE_AFTER_WINDOWS - 1)] == [None] * (FREE_AFTER_WINDOWS - 1)
        assert placement.on_window(*DRAIN) is None
    assert placement.bound


def test_a_loop_that_wakes_thousands_of_times_a_second_or_idles_is_never_bound():
    placement = LoopPlacement()
    assert [placement.on_window(*window) for window in (FIVE_THOUSAND, IDLE) * 5] == [None] * 10


def test_a_window_of_short_bursts_however_busy_is_not_saturated():
    placement = LoopPlacement()
    sleeps = int(0.19 / BURST_MIN_SECONDS) + 1
    assert placement.on_window(0.2, 0.19, sleeps) is None
    assert placement.on_window(0.2, 0.19, sleeps - 2) is True


def in_a_thread(target) -> None:
    """Run `target` on a thread of its own: binding the test's thread would outlive the test."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as failure:  # noqa: BLE001 -- re-raised on the test's thread
            failures.append(failure)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failures:
        raise failures[0]


@TWO_CPUS
def test_the_binder_binds_a_loop_that_runs_flat_out_and_frees_it_when_it_idles():
    cpu = loop_cpu.loop_cpu(1, cpus.PROCESS_CPUS)
    seen: list[set[int]] = []

    async def load() -> None:
        binder = loop_cpu.start_binder(asyncio.get_running_loop(), 1, always=False)
        assert binder is not None and binder.cpu == cpu
        seen.append(os.sched_getaffinity(0))
        deadline = time.monotonic() + 10
        while os.sched_getaffinity(0) != {cpu}:   # flat out, in bursts between yields
            assert time.monotonic() < deadline, "a loop running flat out for 10 s was not bound"
            spin_until = time.thread_time() + 0.005
            while time.thread_time() < spin_until:
                pass
            await asyncio.sleep(0)
        seen.append(os.sched_getaffinity(0))
        while os.sched_getaffinity(0) == {cpu}:   # idle
            assert time.monotonic() < deadline + 10, "an idle loop was not freed in 10 s"
            await asyncio.sleep(0.05)
        seen.append(os.sched_getaffinity(0))
        binder.stop()

    in_a_thread(lambda: asyncio.run(load()))
    assert seen == [set(cpus.PROCESS_CPUS), {cpu}, set(cpus.PROCESS_CPUS)]


@TWO_CPUS
def test_threads_and_workers_started_by_the_bound_loop_run_on_every_cpu_of_the_process():
    seen: dict[str, set[int]] = {}

    async def bound_loop() -> None:
        binder = loop_cpu.start_binder(asyncio.get_running_loop(), 1, always=True)
        seen["loop"] = os.sched_getaffinity(0)
        freed = threading.Thread(target=lambda: (cpus.run_anywhere(), seen.update(freed=os.sched_getaffinity(0))))
        inherited = threading.Thread(target=lambda: seen.update(inherited=os.sched_getaffinity(0)))
        for thread in (freed, inherited):
            thread.start()
            thread.join()
        with ThreadPoolExecutor(1, initializer=cpus.run_anywhere) as workers:
            seen["worker"] = workers.submit(os.sched_getaffinity, 0).result()
        assert binder is not None
        binder.stop()

    in_a_thread(lambda: asyncio.run(bound_loop()))
    assert seen["loop"] == {sorted(cpus.PROCESS_CPUS)[1]}
    assert seen["inherited"] == seen["loop"], "Linux no longer gives a thread its creator's binding"
    assert seen["freed"] == seen["worker"] == set(cpus.PROCESS_CPUS)
