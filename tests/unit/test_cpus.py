"""broker/node/loop_cpu.py: which CPU a node process's loop is bound to; storage/cpus.py:
threads the bound loop starts leave its binding behind."""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from warren.broker.node import loop_cpu
from warren.storage import cpus


def test_bound_as_set_else_unless_one_of_a_cluster():
    assert [loop_cpu.binds(None, nodes) for nodes in (0, 1, 3)] == [True, True, False]
    assert [loop_cpu.binds(setting, 3) for setting in (True, False)] == [True, False]
    assert loop_cpu.binds(False, 1) is False


def test_a_node_of_one_process_binds_its_loop_to_the_first_cpu_it_may_use():
    assert loop_cpu.loop_cpu(0, {3, 1, 2}) == 1


def test_a_nodes_processes_take_the_cpus_in_turn():
    assert [loop_cpu.loop_cpu(k, {4, 6}) for k in range(5)] == [4, 6, 4, 6, 4]


def test_with_one_cpu_nothing_is_bound():
    assert loop_cpu.loop_cpu(0, {0}) is None
    assert loop_cpu.loop_cpu(1, set()) is None


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(cpus.PROCESS_CPUS) < 2,
                    reason="needs Linux and two CPUs this process may use (a machine condition)")
def test_threads_and_workers_started_by_the_bound_loop_run_on_every_cpu_of_the_process():
    seen: dict[str, set[int]] = {}

    def bound_loop() -> None:   # a thread of its own: binding the test's thread would outlive the test
        seen["loop"] = {loop_cpu.bind_loop_thread(1)}
        freed = threading.Thread(target=lambda: (cpus.run_anywhere(), seen.update(freed=os.sched_getaffinity(0))))
        inherited = threading.Thread(target=lambda: seen.update(inherited=os.sched_getaffinity(0)))
        for thread in (freed, inherited):
            thread.start()
            thread.join()
        with ThreadPoolExecutor(1, initializer=cpus.run_anywhere) as workers:
            seen["worker"] = workers.submit(os.sched_getaffinity, 0).result()

    thread = threading.Thread(target=bound_loop)
    thread.start()
    thread.join()
    assert seen["loop"] == {sorted(cpus.PROCESS_CPUS)[1]}
    assert seen["inherited"] == seen["loop"], "Linux no longer gives a thread its creator's binding"
    assert seen["freed"] == seen["worker"] == set(cpus.PROCESS_CPUS)
