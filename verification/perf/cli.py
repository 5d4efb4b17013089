"""warren-perf: drive any AMQP 0-9-1 broker (Warren, RabbitMQ) with publishers and
consumers, print rates and latencies, optionally record a history (see docs/verification-tools.md)."""
from __future__ import annotations

import json
import sys

import uvloop

from warren.verification.perf.display import ProgressDisplay, print_summary
from warren.verification.perf.multiprocess import run_children
from warren.verification.perf.options import parse
from warren.verification.perf.runner import ProcessRun, RateReporter
from warren.verification.perf.stats import finish_summary


async def _run(options) -> dict:
    display = ProgressDisplay(quiet=options.quiet or options.progress_jsonl)
    reporter = RateReporter(display)
    try:
        if options.processes > 1:
            return await run_children(options, reporter)
        run = ProcessRun(options)
        run.reporter = reporter
        return await run.run()
    finally:
        display.stop()


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    raw = uvloop.run(_run(options))
    summary = finish_summary(raw)
    if options.json_path:
        with open(options.json_path, "w") as out:
            json.dump({**summary, "raw": raw}, out, indent=1)
    if not options.progress_jsonl:
        print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
