"""How many cores the node may use: the default of `node_processes`.

`os.cpu_count()` counts the host's CPUs. A node in a container limited to 2 CPUs
of a 64-core host (`docker run --cpus 2`, a Kubernetes CPU limit) would start 64
processes, and its data directory keeps that count for good (shards.py). So the
count is the CPUs the process may run on (its affinity: `taskset`, `--cpuset-cpus`),
capped by the tightest CPU quota of its cgroup and the cgroups above it, in whole
cores (at least one): as the Erlang VM, since OTP 23, counts RabbitMQ's schedulers.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

PROC_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def usable_cores(proc_cgroup: Path = PROC_CGROUP, cgroup_root: Path = CGROUP_ROOT) -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):   # not Linux
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota(proc_cgroup, cgroup_root)
    if quota is not None:
        cores = min(cores, math.floor(quota))
    return max(1, cores)


def cgroup_cpu_quota(proc_cgroup: Path, cgroup_root: Path) -> float | None:
    """The tightest CPU quota, in cores, on this process's cgroup and its ancestors
    (cgroup v2's `cpu.max`, v1's `cpu.cfs_quota_us` / `cpu.cfs_period_us`), or None."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    quotas: list[float] = []
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:   # not a cgroup line: no quota known from it
            continue
        hierarchy, controllers, path = fields
        if hierarchy == "0" and not controllers:
            quotas += (q for d in _up_from(cgroup_root, path) if (q := _v2_quota(d)) is not None)
        elif "cpu" in controllers.split(","):
            mount = cgroup_root / controllers
            if not mount.is_dir():
                mount = cgroup_root / "cpu"
            quotas += (q for d in _up_from(mount, path) if (q := _v1_quota(d)) is not None)
    return min(quotas, default=None)


def _up_from(mount: Path, path: str) -> list[Path]:
    """The cgroup's directory and its ancestors' under `mount`. In a container without
    a cgroup namespace the path names the host's hierarchy, which the container's
    mount does not hold: its root is then the container's own cgroup, and is read."""
    parts = [part for part in path.split("/") if part]
    return [mount.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def _v2_quota(directory: Path) -> float | None:
    try:
        quota, period = (directory / "cpu.max").read_text().split()
        if quota == "max":
            return None
        cores, every = int(quota), int(period)
    except (OSError, ValueError):
        return None
    return None if cores <= 0 or every <= 0 else cores / every


def _v1_quota(directory: Path) -> float | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota <= 0 or period <= 0 else quota / period
