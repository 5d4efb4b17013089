"""A node process's event loop thread bound to a CPU of its own while it runs flat out
(the setting `loop_cpu_binding`), as RabbitMQ binds its Erlang schedulers to cores.

On this 2-CPU machine a one-process node's loop thread, left to the kernel, ran 0.8-0.9
of a core through a backlog's drain and was preempted about a thousand times a second;
bound to one CPU, the drains' median rose from 158k to 167k msg/s (11 pairs; a slow run
still comes now and then). But a loop that sleeps and wakes thousands of times a second
(5,000 messages a second: 0.2 ms of CPU between sleeps) must then be woken on its own CPU,
across CPUs, every time: its confirms' median rose from 0.73 to 0.99 ms (docs/performance.md,
session 56). So by default a loop is bound only while it is saturated: most of each window
running, in bursts of at least half a millisecond between sleeps (`LoopPlacement`), and
freed once it is not. The process's other threads run on any CPU (storage/cpus.py).
"""
from __future__ import annotations

import asyncio
import os
import resource
from collections.abc import Iterable

import structlog

log = structlog.get_logger("warren.server")

WINDOW_SECONDS = 0.2
BUSY_MIN = 0.5                 # a saturated window: the loop ran at least this much of it...
BURST_MIN_SECONDS = 0.0005     # ...and as much CPU at least between two sleeps, on average
FREE_AFTER_WINDOWS = 2         # a bound loop is freed after this many windows in a row that are not


def binding(setting: str | None, cluster_nodes: int) -> str:
    """The node's binding: as set, else "busy", but "never" on a node of a cluster (a
    cluster's nodes may share a machine, and each would bind its first loop to one CPU)."""
    if setting is not None:
        return setting
    return "busy" if cluster_nodes <= 1 else "never"


def loop_cpu(process_index: int, cpus: Iterable[int]) -> int | None:
    """The CPU for the loop of a node's process `process_index` (0 for a node of one
    process): the processes take the CPUs in turn. None with a single CPU: nothing to
    choose, and a loop bound to it could not be told apart from one left free."""
    ordered = sorted(cpus)
    if len(ordered) < 2:
        return None
    return ordered[process_index % len(ordered)]


class LoopPlacement:
    """Whether the loop should be bound, decided window by window."""

    def __init__(self) -> None:
        self.bound = False
        self._unsaturated = 0   # windows in a row, while bound

    def on_window(self, wall_seconds: float, cpu_seconds: float, sleeps: int) -> bool | None:
        """A window's length, the loop thread's CPU time in it and its sleeps (voluntary
        context switches): True to bind it now, False to free it now, None to leave it."""
        saturated = (wall_seconds > 0 and cpu_seconds >= BUSY_MIN * wall_seconds
                     and cpu_seconds >= BURST_MIN_SECONDS * max(sleeps, 1))
        if saturated:
            self._unsaturated = 0
            if self.bound:
                return None
            self.bound = True
            return True
        if not self.bound:
            return None
        self._unsaturated += 1
        if self._unsaturated < FREE_AFTER_WINDOWS:
            return None
        self.bound, self._unsaturated = False, 0
        return False


class LoopBinder:
    """Binds and frees the loop's thread: always, or as `LoopPlacement` says from the
    thread's own CPU time and sleeps (`getrusage` of the calling thread, in a callback on
    the loop) every WINDOW_SECONDS."""

    def __init__(self, loop: asyncio.AbstractEventLoop, cpu: int, any_cpu: set[int], always: bool) -> None:
        self.cpu = cpu
        self._loop = loop
        self._any_cpu = any_cpu   # the CPUs the loop's thread may use when it is free
        self._placement = None if always else LoopPlacement()
        self._last = (0.0, 0.0, 0)
        self._window: asyncio.TimerHandle | None = None

    def start(self) -> None:
        if self._placement is None:
            self._bind(True)
            return
        self._last = self._sample()
        self._window = self._loop.call_later(WINDOW_SECONDS, self._on_window)

    def stop(self) -> None:
        if self._window is not None:
            self._window.cancel()
            self._window = None

    def _sample(self) -> tuple[float, float, int]:
        usage = resource.getrusage(resource.RUSAGE_THREAD)
        return self._loop.time(), usage.ru_utime + usage.ru_stime, usage.ru_nvcsw

    def _on_window(self) -> None:
        assert self._placement is not None
        now = self._sample()
        change = self._placement.on_window(*(b - a for a, b in zip(self._last, now)))
        self._last = now
        if change is not None:
            self._bind(change)
        self._window = self._loop.call_later(WINDOW_SECONDS, self._on_window)

    def _bind(self, bound: bool) -> None:
        try:
            os.sched_setaffinity(0, {self.cpu} if bound else self._any_cpu)
        except OSError as error:   # refused (a cpuset changed meanwhile): the kernel places the loop
            log.warning("server.loop_binding_failed", cpu=self.cpu, error=str(error))


def start_binder(loop: asyncio.AbstractEventLoop, process_index: int, always: bool) -> LoopBinder | None:
    """From the loop's thread: its binder, started; None on a machine of one CPU (or not Linux)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    any_cpu = os.sched_getaffinity(0)   # the loop's thread is not bound yet
    cpu = loop_cpu(process_index, any_cpu)
    if cpu is None:
        return None
    binder = LoopBinder(loop, cpu, any_cpu, always)
    binder.start()
    return binder
