"""warren-verify HISTORY_DIR [HISTORY_DIR_B]: judge one history (or two, side by side).

Writes OUT/verdict.json and OUT/report.html (OUT: --out, else the first
history directory). Exit status: 0 clean, 1 when a history holds a
confirmed-and-lost or a phantom message, 2 on a usage error.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXIT_CLEAN, EXIT_VIOLATION, EXIT_USAGE = 0, 1, 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="warren-verify", description=__doc__.split("\n")[0])
    parser.add_argument("histories", nargs="+", metavar="HISTORY_DIR",
                        help="a history directory (a path or a URL Spark reads); two to compare")
    parser.add_argument("--out", help="directory for verdict.json and report.html")
    parser.add_argument("--master", help="Spark master URL (default: local[*], or spark-submit's)")
    parser.add_argument("--driver-memory", default="2g", help="when this process starts the JVM (default 2g)")
    parser.add_argument("--shuffle-partitions", type=int, help="spark.sql.shuffle.partitions")
    parser.add_argument("--grace", type=float, default=30.0,
                        help="seconds after a fault's end in which unavailability is measured (default 30)")
    parser.add_argument("--no-html", action="store_true", help="write only verdict.json")
    args = parser.parse_args(argv)
    if len(args.histories) > 2:
        parser.error("at most two histories")
    for history in args.histories:  # checked before a JVM starts; a URL is Spark's to check
        if "://" not in history and not Path(history).is_dir():
            parser.error(f"no history directory at {history}")
    return args


def output_directory(args: argparse.Namespace) -> Path:
    if args.out:
        return Path(args.out)
    first = args.histories[0]
    return Path(first) if "://" not in first else Path.cwd()  # a cluster URL is no local directory


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from pyspark.errors import AnalysisException  # after argparse: --help needs no Spark

    from warren.verification.judge.session import spark_session
    from warren.verification.judge.verdict import judge_history

    spark, created = spark_session(args.master, args.driver_memory, args.shuffle_partitions)
    try:
        verdicts = [judge_history(spark, path, args.grace) for path in args.histories]
    except (AnalysisException, ValueError) as error:  # no Parquet there, or no events in it
        print(f"warren-verify: {str(error).splitlines()[0]}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if created:
            spark.stop()
    out = output_directory(args)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"ok": all(v["ok"] for v in verdicts), "histories": verdicts}
    (out / "verdict.json").write_text(json.dumps(summary, indent=1, default=str))
    if not args.no_html:
        from warren.verification.judge.report import write_report

        write_report(verdicts, out / "report.html")
    for verdict in verdicts:
        print(one_line(verdict))
    print(f"verdict: {out / 'verdict.json'}" + ("" if args.no_html else f", report: {out / 'report.html'}"))
    return EXIT_CLEAN if summary["ok"] else EXIT_VIOLATION


def one_line(verdict: dict) -> str:
    t = verdict["totals"]
    status = "OK" if verdict["ok"] else "FAIL"
    return (f"{status} {verdict['history']}: {t['published']} published, {t['confirmed']} confirmed, "
            f"{t['confirmed_lost']} confirmed-and-lost, {t['phantom_messages']} phantom, "
            f"{t['duplicates_redelivered']}+{t['duplicates_unflagged']} duplicates (flagged+unflagged), "
            f"{t['order_violations']} order violations, {t['unconfirmed_delivered']} unconfirmed-but-delivered"
            + drain_note(verdict))


def drain_note(verdict: dict) -> str:
    if not verdict["drained"]:
        return " (no drain_end recorded)"
    if verdict.get("drain_timed_out"):
        return " (the final drain timed out: a queue was not emptied, or could not be consumed from)"
    return ""


if __name__ == "__main__":
    sys.exit(main())
