"""CPU of idle quorum queues: declare N quorum queues on a running cluster, let
them settle, then measure the broker processes' CPU over a window.

    .venv/bin/python tests/bench_idle_queues.py --url amqp://guest:guest@127.0.0.1:5672/ \
        --pids 101,102,103 [--queues 1000] [--settle 10] [--seconds 30] [--label warren]

Prints one JSON line: queues, seconds measured, CPU seconds used by all the
given pids together, and that as a share of one core. Deletes the queues after.
Run it against Warren (deploy/local-cluster.sh) and against RabbitMQ
(../shared/bench/rabbitmq-up.sh cluster) in the same session for a ratio.
"""
from __future__ import annotations

import argparse
import json
import time

import pika

from warren.verification.perf.broker_cpu import cpu_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--pids", required=True, help="comma-separated broker pids")
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--settle", type=float, default=10.0, help="seconds to wait after declaring")
    parser.add_argument("--seconds", type=float, default=30.0, help="measurement window")
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    pids = [int(p) for p in args.pids.split(",") if p]
    names = [f"idle-{i}" for i in range(args.queues)]
    connection = pika.BlockingConnection(pika.URLParameters(args.url))
    channel = connection.channel()
    started = time.monotonic()
    for name in names:
        channel.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    declared = time.monotonic() - started
    connection.close()
    time.sleep(args.settle)   # a benchmark's settle time, not a synchronisation
    before, t0 = cpu_seconds(pids), time.monotonic()
    time.sleep(args.seconds)
    used, elapsed = cpu_seconds(pids) - before, time.monotonic() - t0
    connection = pika.BlockingConnection(pika.URLParameters(args.url))
    channel = connection.channel()
    for name in names:
        channel.queue_delete(name)
    connection.close()
    print(json.dumps({"label": args.label, "queues": args.queues, "declare_seconds": round(declared, 2),
                      "seconds": round(elapsed, 2), "cpu_seconds": round(used, 3),
                      "cores": round(used / elapsed, 4)}))


if __name__ == "__main__":
    main()
