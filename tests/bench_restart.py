#!/usr/bin/env python3
"""Restart benchmark: how long does Warren take to come back with a big backlog?

Not a pytest test (the name does not start with ``test_``); run it directly:

    .venv/bin/python tests/bench_restart.py [--messages 1000000] [--queues 10] [--signal kill|term]

1. start ``python -m warren.broker`` (this interpreter, one process) on free ports with a fresh data dir;
2. publish --messages persistent 16-byte messages, spread evenly over --queues durable
   queues, with publisher confirms (one raw pamqp connection per queue, pipelined);
3. stop the server with SIGKILL (default) or SIGTERM;
4. restart it on the same data dir and time, from process start, (a) until the AMQP port
   accepts and (b) until a passive queue.declare reports the full message_count on every
   queue; then read the server's VmRSS and the data dir size.
Prints one JSON line.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pamqp import body as pbody
from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp import header as pheader


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vm_rss_bytes(pid: int) -> int:
    line = next(row for row in Path(f"/proc/{pid}/status").read_text().splitlines() if row.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def start_server(data_dir: Path, port: int, log) -> subprocess.Popen:
    env = dict(os.environ, WARREN_AMQP_HOST="127.0.0.1", WARREN_AMQP_PORT=str(port),
               WARREN_METRICS_PORT="0", WARREN_DATA_DIR=str(data_dir), WARREN_LOG_LEVEL="warning",
               WARREN_NODE_PROCESSES="1")
    # cwd = the data dir's parent, so the broker package comes from PYTHONPATH / the venv
    return subprocess.Popen([sys.executable, "-m", "warren.broker"], env=env, cwd=data_dir.parent,
                            stdout=log, stderr=subprocess.STDOUT)


class Conn:
    """A minimal AMQP 0-9-1 connection with one channel (number 1), frames via pamqp."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.r, self.w = reader, writer

    @classmethod
    async def open(cls, port: int) -> "Conn":
        c = cls(*await asyncio.open_connection("127.0.0.1", port))
        c.w.write(b"AMQP\x00\x00\x09\x01")
        await c.expect(spec.Connection.Start)
        c.send(0, spec.Connection.StartOk(mechanism="PLAIN", response="\0guest\0guest", locale="en_US"))
        tune = await c.expect(spec.Connection.Tune)
        c.send(0, spec.Connection.TuneOk(channel_max=tune.channel_max, frame_max=min(tune.frame_max, 131072),
                                         heartbeat=0))
        c.send(0, spec.Connection.Open(virtual_host="/"))
        await c.expect(spec.Connection.OpenOk)
        c.send(1, spec.Channel.Open())
        await c.expect(spec.Channel.OpenOk)
        return c

    def send(self, channel: int, value) -> None:
        self.w.write(pframe.marshal(value, channel))

    async def read(self):
        head = await self.r.readexactly(7)
        _, _, size = struct.unpack(">BHI", head)
        return pframe.unmarshal(head + await self.r.readexactly(size + 1))[2]

    async def expect(self, kind):
        value = await self.read()
        if not isinstance(value, kind):
            raise RuntimeError(f"expected {kind.__name__}, got {value!r}")
        return value

    async def close(self) -> None:
        self.w.close()  # no connection.close handshake: the broker copes with a dropped socket


async def publish_queue(port: int, queue: str, count: int, inflight: int) -> int:
    """Declare ``queue`` and publish ``count`` confirmed messages to it; returns the nack count."""
    c = await Conn.open(port)
    c.send(1, spec.Queue.Declare(queue=queue, durable=True))
    await c.expect(spec.Queue.DeclareOk)
    c.send(1, spec.Confirm.Select())
    await c.expect(spec.Confirm.SelectOk)
    # one message = method + header + body frame, marshalled once and written `count` times
    msg = (pframe.marshal(spec.Basic.Publish(exchange="", routing_key=queue), 1)
           + pframe.marshal(pheader.ContentHeader(0, 16, spec.Basic.Properties(delivery_mode=2)), 1)
           + pframe.marshal(pbody.ContentBody(b"0123456789abcdef"), 1))
    state = {"confirmed": 0, "nacked": 0}
    progress = asyncio.Event()

    async def read_confirms() -> None:   # broker acks/nacks, `multiple` collapses ranges
        try:
            while state["confirmed"] < count:
                value = await c.read()
                if isinstance(value, (spec.Basic.Ack, spec.Basic.Nack)):
                    upto = value.delivery_tag if value.multiple else state["confirmed"] + 1
                    if isinstance(value, spec.Basic.Nack):
                        state["nacked"] += upto - state["confirmed"]
                    state["confirmed"] = max(state["confirmed"], upto)
                    progress.set()
                elif isinstance(value, (spec.Channel.Close, spec.Connection.Close)):
                    raise RuntimeError(f"{queue}: broker closed: {value!r}")
        finally:
            progress.set()   # wake the publisher on the end or on an error

    reader = asyncio.create_task(read_confirms())
    sent = 0
    while sent < count:
        room = min(inflight - (sent - state["confirmed"]), count - sent)
        if room < min(256, count - sent):   # wait for confirms before the next burst
            progress.clear()
            await progress.wait()
            if reader.done():
                reader.result()   # re-raises a broker close or a dropped connection
            continue
        c.w.write(msg * room)
        sent += room
        await c.w.drain()
    await reader
    await c.close()
    return state["nacked"]


async def wait_until_ready(server: subprocess.Popen, port: int, queues: dict[str, int],
                           deadline: float) -> tuple[float, float]:
    """Poll until the port accepts, then until every queue reports its expected message_count.
    Returns (port_accepting, all_counts_ok) as time.monotonic() values."""
    t_port = None
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"server exited with code {server.returncode}; see its log")
        try:
            c = await Conn.open(port)
        except (OSError, asyncio.IncompleteReadError, RuntimeError):
            await asyncio.sleep(0.02)
            continue
        t_port = t_port or time.monotonic()   # first successful AMQP handshake
        try:
            ok = True
            for queue, expected in queues.items():
                c.send(1, spec.Queue.Declare(queue=queue, passive=True))
                reply = await c.read()
                if not isinstance(reply, spec.Queue.DeclareOk) or reply.message_count != expected:
                    ok = False   # not recovered yet (404 closes the channel) or count short
                    break
            if ok:
                return t_port, time.monotonic()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            await c.close()
        await asyncio.sleep(0.05)
    raise TimeoutError("server not ready before the deadline")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--queues", type=int, default=10)
    ap.add_argument("--inflight", type=int, default=2000, help="unconfirmed messages per queue connection")
    ap.add_argument("--signal", choices=["kill", "term"], default="kill", help="how the first server is stopped")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds allowed for the restart")
    ap.add_argument("--keep", action="store_true", help="keep the data dir")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="warren-bench-restart-"))
    data_dir, port = work / "data", free_port()
    queues = {f"bench-restart-{i}": args.messages // args.queues + (i < args.messages % args.queues)
              for i in range(args.queues)}
    log = open(work / "server.log", "ab")
    result = {"messages": args.messages, "queues": args.queues, "signal": args.signal, "port": port}
    server = start_server(data_dir, port, log)
    try:
        await wait_until_ready(server, port, {}, time.monotonic() + 60)   # first start: just the port
        # -- phase 1: publish with confirms -----------------------------------------------------
        t0 = time.monotonic()
        nacks = await asyncio.gather(*(publish_queue(port, q, n, args.inflight) for q, n in queues.items()))
        result["publish_s"] = round(time.monotonic() - t0, 3)
        result["publish_rate"] = round(args.messages / result["publish_s"])
        result["nacked"] = sum(nacks)
        result["rss_before_stop_bytes"] = vm_rss_bytes(server.pid)
        # -- phase 2: stop the server -------------------------------------------------------------
        server.send_signal(signal.SIGKILL if args.signal == "kill" else signal.SIGTERM)
        t_stop = time.monotonic()
        server.wait(timeout=120)
        result["stop_s"] = round(time.monotonic() - t_stop, 3)
        result["data_dir_bytes"] = dir_size(data_dir)
        # -- phase 3: restart on the same data dir, time recovery ---------------------------------
        t_start = time.monotonic()
        server = start_server(data_dir, port, log)
        t_port, t_ready = await wait_until_ready(server, port, queues, t_start + args.timeout)
        result["restart_port_accepting_s"] = round(t_port - t_start, 3)
        result["restart_ready_s"] = round(t_ready - t_start, 3)
        result["rss_after_restart_bytes"] = vm_rss_bytes(server.pid)
        result["data_dir_bytes_after_restart"] = dir_size(data_dir)
    finally:
        if server.poll() is None:   # the restarted server: stop it gracefully
            server.terminate()
            server.wait(timeout=60)
        log.close()
        if args.keep:
            result["work_dir"] = str(work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
