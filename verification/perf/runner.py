"""One warren-perf process: its publishers, consumers, progress and history."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time

from warren.verification.perf.consumer import Consumer
from warren.verification.perf.display import ProgressDisplay, progress_fields
from warren.verification.perf.link import Link
from warren.verification.perf.options import PerfOptions
from warren.verification.perf.publisher import Publisher
from warren.verification.perf.stats import LatencyHistogram, PerfStats
from warren.verification.recorder import HistoryRecorder

STOP_GRACE_SECONDS = 5.0       # a stopping publisher's last confirms
DRAIN_MAX_SECONDS = 120.0      # bound on --consumer-drain however busy the queue stays
FLUSH_TICK_SECONDS = 0.25


class ProcessRun:
    def __init__(self, options: PerfOptions):
        self.options = options
        self.writer = f"perf-{os.getpid()}-{options.process_index}"
        self.stats = PerfStats()
        self.recorder = HistoryRecorder(options.history, self.writer, options.run_id) if options.history else None
        self.stop_requested = asyncio.Event()
        self.publishers, self.consumers = self._make_clients()
        self.started = time.monotonic()
        self.reporter: RateReporter | None = None  # set by the CLI unless progress goes to a parent

    def _make_clients(self) -> tuple[list[Publisher], list[Consumer]]:
        o = self.options
        first = o.process_index * (o.producers + o.consumers)  # spread processes' clients over the URLs too
        queues = [f"{o.queue_prefix}-{n}" if o.queues > 1 else o.queue_prefix for n in range(o.queues)]
        # the processes' clients are numbered on from each other's, so that N processes of one publisher
        # each cover N queues (not N publishers on the first queue)
        first_consumer, first_producer = o.process_index * o.consumers, o.process_index * o.producers
        consumers = [Consumer(f"{self.writer}-c{n}", queues[(first_consumer + n) % o.queues],
                              Link(o.urls, first + n, f"{self.writer}-c{n}", self.stats, self.recorder),
                              o, self.stats, self.recorder) for n in range(o.consumers)]
        publishers = [Publisher(f"{self.writer}-p{n}", queues[(first_producer + n) % o.queues],
                                Link(o.urls, first + o.consumers + n, f"{self.writer}-p{n}", self.stats,
                                     self.recorder, is_publisher=True),
                                o, self.stats, self.recorder) for n in range(o.producers)]
        return publishers, consumers

    async def run(self) -> dict:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop_requested.set)
        consumer_tasks = [asyncio.ensure_future(c.run()) for c in self.consumers]
        publisher_tasks = [asyncio.ensure_future(p.run()) for p in self.publishers]
        ticker = asyncio.ensure_future(self._tick())
        try:
            await self._until_publishing_ends(publisher_tasks)
            await self._drain_consumers()
        finally:
            for task in [*consumer_tasks, *publisher_tasks, ticker]:
                task.cancel()
            await asyncio.gather(*consumer_tasks, *publisher_tasks, ticker, return_exceptions=True)
            await asyncio.gather(*(c.link.close() for c in self.consumers), return_exceptions=True)
            self._emit_progress()
            if self.recorder is not None:
                self.recorder.close()
        return self.stats.to_json(time.monotonic() - self.started)

    async def _until_publishing_ends(self, publisher_tasks: list[asyncio.Task]) -> None:
        """Until every publisher reached its count, the --time deadline, or a signal."""
        waits = [asyncio.ensure_future(self.stop_requested.wait())]
        if publisher_tasks:
            waits.append(asyncio.ensure_future(asyncio.wait(publisher_tasks)))
        await asyncio.wait(waits, timeout=self.options.time_seconds or None, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()
        for publisher in self.publishers:
            publisher.stopping = True
        if publisher_tasks:
            await asyncio.wait(publisher_tasks, timeout=STOP_GRACE_SECONDS)

    async def _drain_consumers(self) -> None:
        idle_wanted = self.options.consumer_drain_seconds
        if idle_wanted <= 0 or not self.consumers:
            return
        deadline = time.monotonic() + DRAIN_MAX_SECONDS
        while time.monotonic() < deadline and not self.stop_requested.is_set():
            idle = time.monotonic() - max(c.last_delivery for c in self.consumers)
            if idle >= idle_wanted:
                return
            await asyncio.sleep(min(idle_wanted - idle, 0.1))  # polling the consumers' idleness, with a bound

    async def _tick(self) -> None:
        next_progress = time.monotonic() + self.options.interval_seconds
        while True:
            await asyncio.sleep(FLUSH_TICK_SECONDS)
            if self.recorder is not None:
                self.recorder.flush_if_due()
            await self._ack_paused_consumers()
            if time.monotonic() >= next_progress:
                next_progress += self.options.interval_seconds
                self._emit_progress()

    async def _ack_paused_consumers(self) -> None:
        """With --multi-ack-every, a consumer whose deliveries paused acks what it holds:
        otherwise the last deliveries of a run stay unacked."""
        quiet_since = time.monotonic() - FLUSH_TICK_SECONDS
        for consumer in self.consumers:
            if consumer.unacked and consumer.last_delivery <= quiet_since:
                await consumer.ack_unacked()

    def _emit_progress(self) -> None:
        """A JSON line for a parent process, or a line / table for a person."""
        counts = self.stats.counts()
        confirm, deliver = self.stats.interval_confirm_latency, self.stats.interval_deliver_latency
        self.stats.interval_confirm_latency = LatencyHistogram()
        self.stats.interval_deliver_latency = LatencyHistogram()
        if self.options.progress_jsonl:
            line = {"counts": counts, "confirm": dict(confirm.buckets), "deliver": dict(deliver.buckets)}
            sys.stdout.write(json.dumps(line) + "\n")
            sys.stdout.flush()
        elif self.reporter is not None:
            self.reporter.update(time.monotonic() - self.started, counts, confirm, deliver)


class RateReporter:
    """Turns cumulative counts into per-second rates for a ProgressDisplay."""

    def __init__(self, display: ProgressDisplay):
        self.display = display
        self.last_counts: dict[str, int] | None = None
        self.last_time = 0.0

    def update(self, elapsed: float, counts: dict[str, int], confirm: LatencyHistogram,
               deliver: LatencyHistogram) -> None:
        previous = self.last_counts or {k: 0 for k in counts}
        span = max(elapsed - self.last_time, 1e-9)
        rates = {k: (counts[k] - previous[k]) / span for k in ("published", "confirmed", "delivered")}
        self.last_counts, self.last_time = dict(counts), elapsed
        self.display.show(progress_fields(elapsed, rates, counts, confirm, deliver))
