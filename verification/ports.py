"""Listener ports for the servers a harness starts (warren-chaos, the test suite).

Below the kernel's ephemeral range (32768-60999 on Linux): a port bind(0) gives is
one the kernel may also give a client's outgoing connection (a pika client, a cluster
link) or a node's shard its cluster link (a node of several processes binds those
itself, from bind(0)) before the server handed it binds it (warren-chaos seed 49 of 5
nodes: a node could never start).
"""
from __future__ import annotations

import os
import random
import socket

LISTEN_PORTS = range(20000, 32768)
_ports = random.Random(os.getpid())
_handed_out: set[int] = set()


def listen_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at `host` now, not handed out before in this process."""
    for _ in range(1000):
        port = _ports.choice(LISTEN_PORTS)
        if port in _handed_out or not _bindable(host, port):
            continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port in {LISTEN_PORTS}")


def listen_port_block(count: int, host: str = "127.0.0.1") -> int:
    """The first of `count` consecutive ports as `listen_port` gives them (nodes on adjacent
    cluster ports, RabbitMQ's local layout)."""
    for _ in range(1000):
        base = _ports.choice(range(LISTEN_PORTS.start, LISTEN_PORTS.stop - count + 1))
        block = range(base, base + count)
        if _handed_out.intersection(block) or not all(_bindable(host, port) for port in block):
            continue
        _handed_out.update(block)
        return base
    raise RuntimeError(f"no {count} consecutive free ports in {LISTEN_PORTS}")


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
