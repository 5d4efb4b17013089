"""The warren-perf subprocesses that load the cluster during a chaos run."""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from warren.verification.perf.stats import finish_summary, merge_summaries

EXIT_GRACE_SECONDS = 40.0   # after --time: the perf's own stop grace plus its connections' close


class PerfLoad:
    def __init__(self, run_dir: Path, urls: list[str], history: Path, run_id: str, args):
        self.run_dir, self.urls, self.history, self.run_id, self.args = run_dir, urls, history, run_id, args
        self.processes: list[asyncio.subprocess.Process] = []
        self.summaries: list[Path] = []

    async def start(self) -> None:
        a = self.args
        for index in range(a.perf_processes):
            summary = self.run_dir / f"perf-{index}.json"
            argv = [sys.executable, "-m", "warren.verification.perf.cli", *[x for u in self.urls for x in ("--url", u)],
                    "--time", str(a.duration), "--rate", str(a.rate), "--producers", str(a.producers),
                    "--consumers", str(a.consumers), "--queues", str(a.queues), "--queue", a.queue,
                    "--queue-type", "quorum", "--size", str(a.size), "--history", str(self.history),
                    "--run-id", self.run_id, "--process-index", str(index), "--json", str(summary)]
            log = open(self.run_dir / f"perf-{index}.log", "wb")
            self.processes.append(await asyncio.create_subprocess_exec(*argv, stdout=log, stderr=log,
                                                                       start_new_session=True))
            log.close()
            self.summaries.append(summary)

    async def wait(self) -> None:
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in self.processes)), EXIT_GRACE_SECONDS)
        except TimeoutError:
            await self.stop()

    async def stop(self) -> None:
        """SIGTERM (warren-perf then closes its history), SIGKILL if that does not do."""
        for process in self.processes:
            if process.returncode is None:
                process.terminate()
        for process in self.processes:
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()

    def summary(self) -> dict | None:
        raws = [json.loads(p.read_text())["raw"] for p in self.summaries if p.exists()]
        return finish_summary(merge_summaries(raws)) if raws else None
