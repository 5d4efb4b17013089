"""A seeded synthetic history (verification/history.py) with known anomalies.

    python -m verification.judge.synthetic --events 1000000 --out DIR [--seed 1]

Publishers publish to their queue (publisher p -> queue p % queues) at a
steady rate; every clean message is publish, confirm, deliver (to one of its
queue's consumers), ack: 4 events. Delivery times are strictly increasing
per publisher, so a clean history has no order violation. Injected, at
counts written to DIR/injected.json (per queue, as the verdict names them):

* confirmed_lost: confirmed, never delivered;
* unconfirmed_delivered: delivered, no confirm;
* duplicates_redelivered / duplicates_unflagged: a second delivery, flagged
  redelivered (later, any consumer) or not (1 ns after the first, same
  consumer, so it is not also an order violation);
* phantom_messages: a delivery of a message nobody published;
* order_violations: seq i and i+1 to the same consumer with their delivery
  times swapped (exactly one violation each);
* nacked and returned (returned messages are confirmed, never delivered, and
  not lost), late confirms (2 to 5 s) and faults: while a fault lasts,
  messages are confirmed and delivered only after it ends.

Pure Python (random, pyarrow): about 10^5 events/s, a few hundred MB.
"""
from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from warren.verification.history import SCHEMA, message_id

ANOMALIES = ("confirmed_lost", "unconfirmed_delivered", "duplicates_redelivered", "duplicates_unflagged",
             "order_violations", "nacked", "returned", "late_confirm")
START_NS = 1_000_000_000_000
MS = 1_000_000


@dataclass
class Shape:
    events: int
    seed: int = 1
    publishers: int = 8
    queues: int = 4
    consumers_per_queue: int = 2
    rate_per_s: int = 20_000
    anomalies_each: int | None = None  # default: grows with the history, at least 2

    @property
    def messages_per_publisher(self) -> int:
        return max(20, self.events // 4 // self.publishers)

    @property
    def per_kind(self) -> int:
        if self.anomalies_each is not None:
            return self.anomalies_each
        return max(2, self.messages_per_publisher * self.publishers // 20_000)


class PartWriter:
    """Column lists of one writer, flushed to `<writer>-<part>.parquet` every `rows` events."""

    def __init__(self, out: Path, writer: str, rows: int = 200_000):
        self.out, self.writer, self.rows, self.part = out, writer, rows, 0
        self.columns: dict[str, list] = {name: [] for name in SCHEMA.names}

    def add(self, event: str, t: int, queue=None, publisher=None, seq=None, consumer=None,
            redelivered=None, node=None, detail=None) -> None:
        c = self.columns
        for name, value in (("run_id", "synthetic"), ("writer", self.writer), ("event", event), ("queue", queue),
                            ("message_id", None if publisher is None else message_id(publisher, seq)),
                            ("publisher_id", publisher), ("seq", seq), ("consumer_id", consumer), ("node", node),
                            ("redelivered", redelivered), ("mono_ns", t), ("wall_ns", t + 1_700_000_000 * 10**9),
                            ("detail", detail)):
            c[name].append(value)
        if len(c["event"]) >= self.rows:
            self.flush()

    def flush(self) -> None:
        if self.columns["event"]:
            table = pa.Table.from_pydict(self.columns, schema=SCHEMA)
            pq.write_table(table, self.out / f"{self.writer}-{self.part:06d}.parquet")
            self.part += 1
            self.columns = {name: [] for name in SCHEMA.names}


@dataclass
class Plan:
    """Which (publisher, seq) get which anomaly; reorders take seq and seq + 1."""
    by_message: dict[tuple[int, int], str] = field(default_factory=dict)
    faults: list[tuple[int, int]] = field(default_factory=list)  # (start_ns, end_ns)


def plan_anomalies(shape: Shape, rng: random.Random) -> Plan:
    plan, taken = Plan(), set()
    n = shape.messages_per_publisher
    for kind in ANOMALIES:
        placed = 0
        while placed < shape.per_kind:
            p, i = rng.randrange(shape.publishers), rng.randrange(1, n - 3)
            span = [(p, j) for j in range(i - 1, i + 3)]  # a neighbour on each side stays clean
            if any(key in taken for key in span):
                continue
            taken.update(span)
            plan.by_message[(p, i)] = kind
            if kind == "order_violations":
                plan.by_message[(p, i + 1)] = "reorder_second"
            placed += 1
    duration = n * shape.publishers * 1_000_000_000 // shape.rate_per_s
    for at, length in ((0.3, 0.04), (0.7, 0.08)):  # fractions of the run's duration
        start = START_NS + int(duration * at)
        plan.faults.append((start, start + int(duration * length)))
    return plan


class Generator:
    def __init__(self, shape: Shape, out: Path):
        self.shape, self.out = shape, out
        self.rng = random.Random(shape.seed)
        self.plan = plan_anomalies(shape, self.rng)
        self.interval = shape.publishers * 1_000_000_000 // shape.rate_per_s
        self.consumers = {q: [PartWriter(out, f"perf-2000-c{q}x{j}") for j in range(shape.consumers_per_queue)]
                          for q in range(shape.queues)}
        self.injected = {f"q{q}": dict.fromkeys((*ANOMALIES, "phantom_messages"), 0) for q in range(shape.queues)}
        self.last_ns = START_NS

    def run(self) -> dict:
        for p in range(self.shape.publishers):
            self.publisher(p)
        self.phantoms()
        self.control()
        for writers in self.consumers.values():
            for writer in writers:
                writer.flush()
        return self.injected

    def latency(self, median_ms: float) -> int:
        return int(self.rng.lognormvariate(0, 0.5) * median_ms * MS)

    def after_faults(self, t: int) -> int:
        """A message published while a fault lasts is handled only once it ended."""
        for start, end in self.plan.faults:
            if start <= t < end:
                return end
        return t

    def deliver(self, queue: int, consumer: int, p: int, seq: int, t: int, redelivered: bool = False) -> None:
        writer = self.consumers[queue][consumer]
        common = dict(queue=f"q{queue}", publisher=f"pub{p}", seq=seq, consumer=f"c{queue}x{consumer}")
        writer.add("deliver", t, redelivered=redelivered, **common)
        writer.add("ack", t + 50_000, **common)
        self.last_ns = max(self.last_ns, t + 50_000)

    def publisher(self, p: int) -> None:
        shape, rng = self.shape, self.rng
        queue, writer = p % shape.queues, PartWriter(self.out, f"perf-1000-p{p}")
        common = dict(queue=f"q{queue}", publisher=f"pub{p}")
        previous_delivery, held = 0, None  # held: the first of a reordered pair, delivered after the second
        for seq in range(shape.messages_per_publisher):
            kind = self.plan.by_message.get((p, seq))
            published = START_NS + seq * self.interval + rng.randrange(self.interval // 2) + p
            handled = self.after_faults(published)
            confirmed = handled + self.latency(2)
            delivered = previous_delivery = max(handled + self.latency(3), previous_delivery + 1000)
            consumer = held[1] if kind == "reorder_second" else rng.randrange(shape.consumers_per_queue)
            writer.add("publish", published, seq=seq, **common)
            self.outcome(writer, kind, p, seq, published, confirmed, common)
            if kind in ANOMALIES:
                self.injected[f"q{queue}"][kind] += 1
            if kind == "order_violations":
                held = (delivered, consumer)
            elif kind == "reorder_second":
                self.deliver(queue, consumer, p, seq, held[0])
                self.deliver(queue, consumer, p, seq - 1, delivered)
            elif kind not in ("confirmed_lost", "nacked", "returned"):
                self.deliver(queue, consumer, p, seq, delivered)
            if kind == "duplicates_unflagged":
                self.deliver(queue, consumer, p, seq, delivered + 1)
            elif kind == "duplicates_redelivered":
                later = delivered + rng.randrange(100 * MS, 1000 * MS)
                self.deliver(queue, rng.randrange(shape.consumers_per_queue), p, seq, later, redelivered=True)
        writer.flush()

    def outcome(self, writer: PartWriter, kind, p, seq, published, confirmed, common) -> None:
        """What the publisher hears back about one message."""
        if kind == "nacked":
            writer.add("nack", confirmed, seq=seq, **common)
            return
        if kind == "returned":
            writer.add("return", confirmed - 1, seq=seq, detail="312 NO_ROUTE", **common)
        if kind == "late_confirm":
            confirmed = published + self.rng.randrange(2000 * MS, 5000 * MS)
        if kind != "unconfirmed_delivered":
            writer.add("confirm", confirmed, seq=seq, **common)
        self.last_ns = max(self.last_ns, confirmed)

    def phantoms(self) -> None:
        end = START_NS + self.shape.messages_per_publisher * self.interval
        for j in range(self.shape.per_kind):
            queue = self.rng.randrange(self.shape.queues)
            consumer = self.rng.randrange(self.shape.consumers_per_queue)
            self.deliver(queue, consumer, 10_000 + j, 0, self.rng.randrange(START_NS, end))
            self.injected[f"q{queue}"]["phantom_messages"] += 1

    def control(self) -> None:
        chaos = PartWriter(self.out, "chaos")
        for n, (start, end) in enumerate(self.plan.faults):
            node, detail = f"warren-{n % 3 + 1}", "kill -9" if n % 2 else "partition 1s"
            chaos.add("fault_start", start, node=node, detail=detail)
            chaos.add("fault_end", end, node=node, detail=detail)
        last_publish = START_NS + self.shape.messages_per_publisher * self.interval
        chaos.add("drain_start", last_publish + 100 * MS)
        chaos.add("drain_end", max(self.last_ns, last_publish) + 200 * MS)
        chaos.flush()


def generate(events: int, out: str | Path, seed: int = 1, **shape) -> dict:
    """Write the history into out (created); return (and write out/injected.json) the injected counts."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    injected = Generator(Shape(events=events, seed=seed, **shape), out).run()
    (out / "injected.json").write_text(json.dumps(injected, indent=1, sort_keys=True))
    return injected


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m verification.judge.synthetic", description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, required=True, help="about this many events (4 per clean message)")
    parser.add_argument("--out", required=True, help="history directory to write")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    print(json.dumps(generate(args.events, args.out, args.seed), sort_keys=True))


if __name__ == "__main__":
    main()
