"""The cores a node may use, the default of node_processes (broker/node/usable_cores.py):
its CPU affinity, capped by its cgroups' CPU quota; read from fake cgroup trees."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from warren.broker.node.usable_cores import cgroup_cpu_quota, usable_cores


def tree(tmp_path: Path, proc_cgroup: str, files: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    root.mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(proc_cgroup)
    return proc, root


def test_cgroup_v2_the_tightest_quota_of_the_cgroup_and_its_ancestors(tmp_path):
    proc, root = tree(tmp_path, "0::/kubepods/pod1/app\n", {
        "cpu.max": "max 100000\n",
        "kubepods/pod1/cpu.max": "250000 100000\n",
        "kubepods/pod1/app/cpu.max": "max 100000\n",
    })
    assert cgroup_cpu_quota(proc, root) == 2.5
    assert usable_cores(proc, root) == min(2, len(os.sched_getaffinity(0)))   # whole cores, as Erlang's


def test_cgroup_v2_in_a_container_its_own_cgroup_is_the_root(tmp_path):
    proc, root = tree(tmp_path, "0::/\n", {"cpu.max": "100000 100000\n"})
    assert cgroup_cpu_quota(proc, root) == 1.0
    assert usable_cores(proc, root) == 1


def test_a_path_of_the_hosts_hierarchy_falls_back_to_the_mounts_root(tmp_path):
    proc, root = tree(tmp_path, "0::/system.slice/docker-abc.scope\n", {"cpu.max": "50000 100000\n"})
    assert cgroup_cpu_quota(proc, root) == 0.5
    assert usable_cores(proc, root) == 1   # half a core still runs one process


def test_cgroup_v1_quota(tmp_path):
    proc, root = tree(tmp_path, "4:memory:/x\n3:cpu,cpuacct:/docker/abc\n", {
        "cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
        "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "150000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
    })
    assert cgroup_cpu_quota(proc, root) == 1.5


def test_no_quota_anywhere(tmp_path):
    proc, root = tree(tmp_path, "0::/user.slice\n1:cpu:/\n", {
        "cpu.max": "max 100000\n", "cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"})
    assert cgroup_cpu_quota(proc, root) is None
    assert usable_cores(proc, root) == len(os.sched_getaffinity(0))
    assert cgroup_cpu_quota(tmp_path / "missing", root) is None
    odd, _ = tree(tmp_path / "odd", "garbage\n0::/\n", {})
    assert cgroup_cpu_quota(odd, root) is None
    for text in ("abc 100000\n", "100000 0\n"):   # unreadable cpu.max files name no quota
        proc, bad = tree(tmp_path / text.split()[1], "0::/\n", {"cpu.max": text})
        assert cgroup_cpu_quota(proc, bad) is None, text


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to tell one from all")
def test_a_process_bound_to_one_cpu_counts_one():
    code = "from warren.broker.node.usable_cores import usable_cores; print(usable_cores())"
    cpu = min(os.sched_getaffinity(0))
    bound = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    assert bound.stdout.strip() == "1"
