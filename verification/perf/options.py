"""warren-perf's command line, with PerfTest's short flags where it has them."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field


@dataclass
class PerfOptions:
    urls: list[str]
    producers: int = 1
    consumers: int = 1
    queues: int = 1
    queue_prefix: str = "perf"
    queue_type: str = "quorum"
    queue_args: dict = field(default_factory=dict)
    size: int = 12
    confirm_window: int = 100
    prefetch: int = 100
    multi_ack_every: int = 1
    rate: float = 0.0             # per producer, messages/s; 0: as fast as confirms allow
    time_seconds: float = 0.0     # 0: until the message count
    pmessages: int = 0            # per producer; 0: until the time
    consumer_drain_seconds: float = 0.0
    processes: int = 1
    process_index: int = 0
    history: str | None = None
    run_id: str | None = None
    json_path: str | None = None
    quiet: bool = False
    interval_seconds: float = 1.0
    progress_jsonl: bool = False  # a child of --processes: progress as JSON lines for the parent
    broker_pids: list[int] = field(default_factory=list)  # CPU of these processes over the run, in the summary


def _queue_arg(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"--queue-arg wants key=value, got {text!r}")
    for convert in (int, float):
        try:
            return key, convert(value)
        except ValueError:
            pass
    return key, {"true": True, "false": False}.get(value.lower(), value)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="warren-perf", description=__doc__, add_help=False)
    p.add_argument("--url", "-h", action="append", dest="urls",
                   help="broker URL (repeat: connections spread over them)")
    p.add_argument("--help", action="help")
    p.add_argument("--producers", "-x", type=int, default=1)
    p.add_argument("--consumers", "-y", type=int, default=1)
    p.add_argument("--queues", type=int, default=1, help="queues <prefix>-0..N-1; clients spread over them")
    p.add_argument("--queue", "-u", dest="queue_prefix", default="perf")
    p.add_argument("--queue-type", choices=("quorum", "classic"), default="quorum")
    p.add_argument("--queue-arg", action="append", type=_queue_arg, default=[], help="k=v, repeatable")
    p.add_argument("--size", "-s", type=int, default=12, help="message body bytes")
    p.add_argument("--confirm", "-c", dest="confirm_window", type=int, default=100,
                   help="unconfirmed publishes in flight per producer")
    p.add_argument("--qos", "-q", dest="prefetch", type=int, default=100, help="consumer prefetch")
    p.add_argument("--multi-ack-every", type=int, default=1,
                   help="consumers ack with multiple=true every N deliveries (and when deliveries pause)")
    p.add_argument("--rate", "-r", type=float, default=0.0, help="messages/s per producer (0: unlimited)")
    p.add_argument("--time", "-z", dest="time_seconds", type=float, default=0.0, help="run for seconds")
    p.add_argument("--pmessages", "-C", type=int, default=0, help="messages per producer")
    p.add_argument("--consumer-drain", dest="consumer_drain_seconds", type=float, default=0.0,
                   help="after publishing ends, consume until nothing arrives for this long")
    p.add_argument("--processes", type=int, default=1, help="run N processes, summaries merged")
    p.add_argument("--process-index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--history", help="record every event as Parquet under this directory")
    p.add_argument("--run-id")
    p.add_argument("--json", dest="json_path", help="write the summary as JSON to this file")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--interval", dest="interval_seconds", type=float, default=1.0)
    p.add_argument("--progress-jsonl", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--broker-pid", dest="broker_pids", type=int, action="append", default=[],
                   help="a broker process on this machine (repeat): its CPU over the run, and per message")
    return p


def parse(argv: list[str] | None) -> PerfOptions:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if not ns.urls:
        ns.urls = ["amqp://guest:guest@127.0.0.1:5672/%2F"]
    if ns.time_seconds <= 0 and ns.pmessages <= 0:
        parser.error("give --time or --pmessages (or both: whichever comes first)")
    if ns.queues < 1 or ns.producers < 0 or ns.consumers < 0 or ns.confirm_window < 1 or ns.multi_ack_every < 1:
        parser.error("--queues, --confirm, --multi-ack-every must be >= 1; --producers, --consumers >= 0")
    values = vars(ns)
    values["queue_args"] = dict(values.pop("queue_arg"))
    return PerfOptions(**values)


def to_argv(options: PerfOptions, **overrides) -> list[str]:
    """The command line of one child process (for --processes)."""
    o = {**vars(options), **overrides}
    argv = [a for url in o["urls"] for a in ("--url", url)]
    for name, flag in _FLAG.items():
        argv += [flag, str(o[name])]
    argv += ["--queue", o["queue_prefix"], "--queue-type", o["queue_type"]]
    argv += [a for k, v in o["queue_args"].items() for a in ("--queue-arg", f"{k}={v}")]
    for name, flag in (("history", "--history"), ("run_id", "--run-id"), ("json_path", "--json")):
        if o[name]:
            argv += [flag, o[name]]
    return argv + (["--quiet"] if o["quiet"] else []) + (["--progress-jsonl"] if o["progress_jsonl"] else [])


_FLAG = {"producers": "--producers", "consumers": "--consumers", "queues": "--queues", "size": "--size",
         "confirm_window": "--confirm", "prefetch": "--qos", "multi_ack_every": "--multi-ack-every", "rate": "--rate",
         "time_seconds": "--time",
         "pmessages": "--pmessages", "consumer_drain_seconds": "--consumer-drain", "process_index": "--process-index",
         "interval_seconds": "--interval"}
