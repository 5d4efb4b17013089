"""A node process's event loop thread bound to a CPU of its own (the setting
`bind_loop_to_cpu`), as RabbitMQ binds its Erlang schedulers to cores by default.

The loop is the process's one busy thread. Left to the kernel, on this 2-CPU machine it
moved between the CPUs over a thousand times a second whenever a client's process woke
on its CPU, and a backlog's drain ran in a slow mode in some runs; bound, it did not
(docs/performance.md, session 56). The process's other threads run on any CPU
(storage/cpus.py: the loop starts them, and Linux would give them its binding).
"""
from __future__ import annotations

import os
from collections.abc import Iterable


def binds(setting: bool | None, cluster_nodes: int) -> bool:
    """Whether the node's loops are bound: as set, else unless the node is one of a cluster
    (a cluster's nodes may share a machine, and each would take the same first CPU)."""
    return setting if setting is not None else cluster_nodes <= 1


def loop_cpu(process_index: int, cpus: Iterable[int]) -> int | None:
    """The CPU for the loop of a node's process `process_index` (0 for a node of one
    process): the processes take the CPUs in turn. None with a single CPU: nothing to
    choose, and a loop bound to it could not be told apart from one left free."""
    ordered = sorted(cpus)
    if len(ordered) < 2:
        return None
    return ordered[process_index % len(ordered)]


def bind_loop_thread(process_index: int) -> int | None:
    """Bind the calling thread (the loop's) to its CPU among those it may use now; the
    CPU, or None if not bound. Raises OSError if the kernel refuses."""
    cpu = loop_cpu(process_index, os.sched_getaffinity(0)) if hasattr(os, "sched_setaffinity") else None
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    return cpu
