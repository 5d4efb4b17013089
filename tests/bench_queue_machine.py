#!/usr/bin/env python3
"""The queue machine's per-message cost: µs per message through
`QuorumMachine.apply` for an EnqueueBatch, its Delivery to a consumer, and
the Settle of that delivery (as a replica with a log applies them).

Not a pytest test (the name does not start with ``test_``); run it directly:

    .venv/bin/python tests/bench_queue_machine.py [--messages 30000] [--repeats 15]

Prints the best of --repeats runs per batch size (1 message per EnqueueBatch,
and 50): the machine alone, no Raft, no codec.
"""
from __future__ import annotations

import argparse
import time

from warren.broker.queues import queue_commands as qc
from warren.broker.queues.quorum_machine import QuorumMachine

OWNER = "n1/i1/ch"
PERSISTENT = b"\x10\x00\x02"   # properties with delivery_mode 2


def microseconds_per_message(messages: int, batch: int) -> float:
    machine = QuorumMachine()
    machine.apply(qc.Checkout(OWNER, "t", 0, 1000), 1)
    index, seq = 2, 1
    started = time.perf_counter()
    for _ in range(messages // batch):
        batch_messages = [["", "q", PERSISTENT, b"body", None, 0] for _ in range(batch)]
        _, effects = machine.apply(qc.EnqueueBatch(OWNER, seq, index, batch_messages), index)
        deliveries = [[e.msg_id, e.seq] for e in effects if type(e) is qc.Delivery]
        assert len(deliveries) == batch, effects
        machine.apply(qc.Settle(OWNER, "t", index + 1, deliveries), index + 1)
        seq, index = seq + batch, index + 2
    return (time.perf_counter() - started) / messages * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=30_000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    for batch in (1, 50):
        best = min(microseconds_per_message(args.messages, batch) for _ in range(args.repeats))
        print(f"batch {batch:3}: {best:.2f} us/message (enqueue, delivery, settle)")


if __name__ == "__main__":
    main()
