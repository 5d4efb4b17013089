#!/usr/bin/env python3
"""Topology benchmark: the cost of many exclusive queues bound to one exchange.

Not a pytest test (the name does not start with ``test_``); run it directly:

    .venv/bin/python tests/bench_topology.py [--queues 20000]

In one process, without sockets: the node's own metadata machine
(broker/node/local_topology.py) over a routing read model, as a channel and a
closing connection drive them. Declares --queues exclusive queues, each of its
own connection, binds each to one fanout exchange (the shape of Celery's
pidbox replies or an RPC client per process), then closes every connection.
Prints one JSON line: microseconds per declare-and-bind and per close. A
close that scans every queue or binding makes the second grow with --queues.
"""
from __future__ import annotations

import argparse
import json
import time

from warren.broker.node import metadata_commands as mc
from warren.broker.node.local_topology import LocalTopology
from warren.broker.node.metadata_state import initial_state
from warren.broker.routing.vhost import VirtualHost

VHOST = "/"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=20_000)
    count = parser.parse_args().queues
    shared = initial_state([VHOST])
    vhosts = {VHOST: VirtualHost(VHOST)}
    own = LocalTopology(vhosts, lambda: shared, lambda command: None)
    vhosts[VHOST].drop_own_queue = lambda name: own.apply(mc.DeleteQueue(VHOST, name))
    own.apply(mc.DeclareExchange(VHOST, "replies", "fanout", False, False, {}, durable=False))
    started = time.perf_counter()
    for i in range(count):
        own.apply(mc.DeclareQueue(VHOST, f"q{i}", {}, (), "node", False, durable=False, exclusive_owner=i))
        own.apply(mc.Bind(VHOST, "replies", "queue", f"q{i}", "", {}, 50, 20))
    declared = time.perf_counter()
    for i in range(count):
        vhosts[VHOST].delete_exclusive_queues(i)
    closed = time.perf_counter()
    assert not vhosts[VHOST].queues and not own.own[VHOST].bindings
    print(json.dumps({"queues": count,
                      "declare_and_bind_us": round((declared - started) / count * 1e6, 1),
                      "close_us": round((closed - declared) / count * 1e6, 1)}))


if __name__ == "__main__":
    main()
