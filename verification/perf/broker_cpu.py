"""--broker-pid: the CPU the brokers spent during the run, and per message.

CPU seconds are utime + stime (and those of reaped children) from
/proc/<pid>/stat, read before and after the run; a multi-process broker
passes every process's pid. Per message: the CPU over the messages confirmed
(and over those delivered), so a run of publishers and consumers reports what
one message costs the broker end to end.
"""
from __future__ import annotations

import os

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    """The CPU seconds `pids` used so far, summed."""
    ticks = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        ticks += sum(int(f) for f in fields[11:15])   # utime stime cutime cstime
    return ticks / CLOCK_TICKS


def broker_cpu_summary(cpu: float, raw: dict) -> dict:
    """The broker's CPU over the run, as seconds, cores used, and µs per message."""
    elapsed = raw["elapsed_seconds"] or 1e-9
    return {"broker_cpu_seconds": cpu, "broker_cores": cpu / elapsed,
            "broker_cpu_us_per_confirmed": cpu / raw["confirmed"] * 1e6 if raw["confirmed"] else None,
            "broker_cpu_us_per_delivered": cpu / raw["delivered"] * 1e6 if raw["delivered"] else None}
