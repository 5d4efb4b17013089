"""Progress: a live table on a terminal (rich), plain lines otherwise; and the summary."""
from __future__ import annotations

import sys

from warren.verification.perf.stats import LatencyHistogram


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def progress_fields(elapsed: float, rates: dict[str, float], counts: dict[str, int],
                    confirm: LatencyHistogram, deliver: LatencyHistogram) -> dict[str, str]:
    return {
        "time s": f"{elapsed:.0f}",
        "sent/s": f"{rates['published']:.0f}",
        "confirmed/s": f"{rates['confirmed']:.0f}",
        "received/s": f"{rates['delivered']:.0f}",
        "confirm ms p50/p95/p99": "/".join(_ms(confirm.percentile_ms(f)) for f in (0.5, 0.95, 0.99)),
        "latency ms p50/p95/p99": "/".join(_ms(deliver.percentile_ms(f)) for f in (0.5, 0.95, 0.99)),
        "outstanding": str(counts["outstanding_confirms"]),
        "nacked": str(counts["nacked"]),
        "returned": str(counts["returned"]),
        "reconnects": str(counts["reconnects"]),
    }


class ProgressDisplay:
    """`show(fields)` once per interval; a rich Live table when stdout is a terminal."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.live = None
        if not quiet and sys.stdout.isatty():
            from rich.live import Live
            self.live = Live(auto_refresh=False)
            self.live.start()

    def show(self, fields: dict[str, str]) -> None:
        if self.quiet:
            return
        if self.live is None:
            print(" ".join(f"{k}={v}" for k, v in fields.items()).replace(" ms ", "_ms_"), flush=True)
            return
        from rich.table import Table
        table = Table(title="warren-perf")
        for key in fields:
            table.add_column(key, justify="right")
        table.add_row(*fields.values())
        self.live.update(table, refresh=True)

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()


def print_summary(summary: dict) -> None:
    c, d = summary["confirm_latency_ms"], summary["deliver_latency_ms"]
    print(f"summary: {summary['elapsed_seconds']:.1f}s, published {summary['published']} "
          f"({summary['publish_rate']:.0f}/s), confirmed {summary['confirmed']} ({summary['confirm_rate']:.0f}/s), "
          f"nacked {summary['nacked']}, returned {summary['returned']}, delivered {summary['delivered']} "
          f"({summary['deliver_rate']:.0f}/s, {summary['redelivered']} redelivered), acked {summary['acked']}, "
          f"reconnects {summary['reconnects']}", flush=True)
    print("confirm latency ms: " + " ".join(f"{k}={_ms(v)}" for k, v in c.items()), flush=True)
    print("end-to-end latency ms: " + " ".join(f"{k}={_ms(v)}" for k, v in d.items()), flush=True)
