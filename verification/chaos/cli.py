"""warren-chaos: start a local Warren cluster, load it with warren-perf (recording a
history), inject seeded faults, heal, drain every queue on every node, clean up."""
from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time

from warren.verification.chaos.run import ChaosRun
from warren.verification.chaos.schedule import KINDS


def _kinds(text: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = set(kinds) - set(KINDS)
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    return kinds


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="warren-chaos", description=__doc__)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load; faults fit inside")
    p.add_argument("--faults", type=_kinds, default=["kill", "pause", "partition"],
                   help=f"comma-separated, of: {', '.join(KINDS)} (partition: any shape)")
    p.add_argument("--nodes", type=int, choices=(3, 5), default=3)
    p.add_argument("--node-processes", type=int, default=1,
                   help="WARREN_NODE_PROCESSES of every node: its shards, sharing its one cluster port")
    p.add_argument("--run-dir", default=f"./chaos-run-{time.strftime('%Y%m%d-%H%M%S')}")
    p.add_argument("--run-id")
    p.add_argument("--heartbeat", type=float, default=0.25, help="WARREN_CLUSTER_HEARTBEAT_SECONDS")
    p.add_argument("--node-gone-seconds", type=float, default=5.0)
    p.add_argument("--wal-max-bytes", type=int, default=0,
                   help="WARREN_WAL_MAX_SIZE_BYTES of every node (0: the default); small makes rollovers frequent")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds of load before the first fault")
    p.add_argument("--fault-min", type=float, default=3.0)
    p.add_argument("--fault-max", type=float, default=8.0)
    p.add_argument("--gap-min", type=float, default=2.0)
    p.add_argument("--gap-max", type=float, default=5.0)
    p.add_argument("--max-faults", type=int, default=20)
    p.add_argument("--perf-processes", type=int, default=2)
    p.add_argument("--producers", type=int, default=1, help="per perf process")
    p.add_argument("--consumers", type=int, default=1, help="per perf process")
    p.add_argument("--rate", type=float, default=100.0, help="messages/s per producer")
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--queues", type=int, default=1)
    p.add_argument("--queue", default="chaos")
    p.add_argument("--drain-idle", type=float, default=3.0, help="a queue is drained after this long quiet and empty")
    p.add_argument("--drain-max", type=float, default=None,
                   help="seconds the final drain may take (default: 90, or --duration if longer: a queue "
                        "without a consumer holds the whole load's messages)")
    p.add_argument("--json", dest="json_path", help="write the run's report here")
    return p


async def _main(args) -> dict:
    run = ChaosRun(args)
    task = asyncio.ensure_future(run.run())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)  # cancellation runs the run's cleanup
    return await task


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.drain_max is None:
        args.drain_max = max(90.0, args.duration)
    if args.queues > args.perf_processes * args.producers:
        # a queue without a publisher is never declared: the final drain would wait for it until --drain-max
        parser.error(f"--queues {args.queues} needs a publisher each: --perf-processes x --producers is "
                     f"{args.perf_processes * args.producers}")
    try:
        report = asyncio.run(_main(args))
    except asyncio.CancelledError:
        print("warren-chaos: interrupted; everything it started is stopped", file=sys.stderr)
        return 130
    text = json.dumps(report, indent=1)
    print(text)
    if args.json_path:
        with open(args.json_path, "w") as out:
            out.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
