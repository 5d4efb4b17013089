"""--processes N: N child warren-perf processes; their progress lines merged into one display."""
from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from warren.verification.perf.options import PerfOptions, to_argv
from warren.verification.perf.stats import LatencyHistogram, merge_summaries

CHILD_EXIT_GRACE_SECONDS = 30.0


async def run_children(options: PerfOptions, reporter) -> dict:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="warren-perf-") as scratch:
        summaries = [Path(scratch) / f"{n}.json" for n in range(options.processes)]
        children = [await asyncio.create_subprocess_exec(
            sys.executable, "-m", "warren.verification.perf.cli",
            *to_argv(options, process_index=n, json_path=str(summaries[n]), quiet=False, progress_jsonl=True),
            stdout=asyncio.subprocess.PIPE) for n in range(options.processes)]
        latest: list[dict | None] = [None] * len(children)
        readers = [asyncio.ensure_future(_read_progress(child, n, latest)) for n, child in enumerate(children)]
        try:
            await _show_until_done(readers, latest, started, options.interval_seconds, reporter)
        finally:
            for child in children:
                if child.returncode is None:
                    child.terminate()  # a signal to us: the children stop and write their summaries
            await asyncio.wait_for(asyncio.gather(*(c.wait() for c in children)), CHILD_EXIT_GRACE_SECONDS)
        return merge_summaries([json.loads(p.read_text())["raw"] for p in summaries if p.exists()])


async def _read_progress(child, index: int, latest: list) -> None:
    async for line in child.stdout:
        try:
            latest[index] = json.loads(line)
        except ValueError:
            sys.stderr.write(line.decode(errors="replace"))
    await child.wait()


async def _show_until_done(readers, latest, started, interval, reporter) -> None:
    while True:
        done, _ = await asyncio.wait(readers, timeout=interval)
        lines = [line for line in latest if line]
        if lines:
            counts = {k: sum(line["counts"][k] for line in lines) for k in lines[0]["counts"]}
            confirm, deliver = LatencyHistogram(), LatencyHistogram()
            for line in lines:
                confirm.merge(LatencyHistogram({int(k): v for k, v in line["confirm"].items()}))
                deliver.merge(LatencyHistogram({int(k): v for k, v in line["deliver"].items()}))
            reporter.update(time.monotonic() - started, counts, confirm, deliver)
        if len(done) == len(readers):
            return
