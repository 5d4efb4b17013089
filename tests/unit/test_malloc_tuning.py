"""When warren-server executes itself again with its malloc tunables
(broker/node/malloc_tuning.py), and what the tunables do to a process."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from warren.broker.node.malloc_tuning import TUNABLES, environment_with_tunables

OURS = ":".join(f"{name}={value}" for name, value in TUNABLES)


def test_linux_without_the_tunables_gets_them_and_keeps_the_rest_of_the_environment():
    env = environment_with_tunables({"PATH": "/bin", "WARREN_AMQP_PORT": "5672"}, "linux")
    assert env == {"PATH": "/bin", "WARREN_AMQP_PORT": "5672", "GLIBC_TUNABLES": OURS}
    assert OURS == ("glibc.malloc.hugetlb=1:glibc.malloc.trim_threshold=33554432:"
                    "glibc.malloc.mmap_threshold=33554432")


def test_other_tunables_are_kept_beside_them():
    env = environment_with_tunables({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "linux")
    assert env is not None and env["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{OURS}"


@pytest.mark.parametrize("tunables", ["glibc.malloc.hugetlb=1", "glibc.malloc.hugetlb=0",
                                      "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=0",
                                      "glibc.malloc.trim_threshold=131072", OURS])
def test_a_tunable_of_ours_already_set_leaves_them_alone_so_the_server_executes_itself_once(tunables):
    assert environment_with_tunables({"GLIBC_TUNABLES": tunables}, "linux") is None, (
        f"with GLIBC_TUNABLES={tunables} the server must not execute itself again (a loop, or the user's choice)")


def test_not_on_linux_nothing_is_done():
    assert environment_with_tunables({}, "darwin") is None


CHURN = """
import resource
def churn(rounds):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        held = [bytes(1024) for _ in range(4000)]   # 4 MB of bodies on the heap, then freed
        del held
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
churn(1)
print(churn(40))
"""


def page_faults_of_churn(tunables: str) -> int:
    env = {**os.environ, "GLIBC_TUNABLES": tunables}
    result = subprocess.run([sys.executable, "-c", CHURN], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
                    reason="glibc's tunables: Linux with glibc only")
def test_with_the_tunables_a_heap_that_grows_and_shrinks_by_megabytes_is_not_faulted_in_again_each_time():
    """A publish's bodies (1 KiB each, on glibc's heap) are freed once written: with glibc's
    own thresholds the heap's top is given back and faulted in again each batch (with
    huge pages a 2 MB page zeroed each time: ~5 % of a backlog's publish, docs/performance.md)."""
    assert page_faults_of_churn("glibc.malloc.hugetlb=1") >= 40, "glibc's defaults churn (the check can fail)"
    assert page_faults_of_churn("glibc.malloc.hugetlb=0") >= 40 * 256, "4 KiB pages: a fault per page"
    faults = page_faults_of_churn(OURS)
    assert faults < 10, f"the heap's top was given back and faulted in again: {faults} minor faults in 40 rounds"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the tunables are set on Linux only")
def test_the_launcher_executes_the_process_again_with_every_tunable():
    """What a process started by broker/node/launch.py runs with (its own environment:
    /proc/<pid>/environ may show glibc's cut of the original)."""
    script = ("from warren.broker.node import launch; launch._execute_again_with_malloc_tunables(); "
              "import os; print(os.environ['GLIBC_TUNABLES'])")
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == OURS
