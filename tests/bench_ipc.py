"""What moving batches of plain records between two local processes costs, per message.

    .venv/bin/python -m tests.bench_ipc [--repeat 3] [--messages 100000] [--json out.json]

The records are what a front-end worker would hand the Raft/WAL process for a
publish: [exchange, routing_key, properties, body], a batch of N of them
msgpack-encoded as [enqueuer, first_seq, records] behind a 4-byte length.
Both ends run uvloop. For each transport (a Unix stream socketpair; a pair of
pipes), batch size N (1, 16, 256) and body (16 B, 1 KiB):

* one-way: the sender encodes and writes batches as fast as the transport's
  flow control allows, the receiver reads and decodes every batch;
* round-trip: the sender writes one batch and waits for the receiver's reply,
  [first_seq, last_seq] (what a confirm run would be), before the next.

Reported per message: the CPU time (user + system, `time.process_time`) of
the sender and of the receiver, their sum, and for round trips the wall time
of one batch's round trip. `codec` is the floor any transport pays: the same
encode and decode in one process, no I/O (a shared-memory ring could at best
remove the difference between a transport's total and this floor).
Medians over the repetitions. CPU, not wall throughput: the machine is shared.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import struct
import time

import msgpack
import uvloop

HEADER = struct.Struct(">I")
PROPERTIES = b"\x90\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"  # a persistent message's
BATCH_SIZES = (1, 16, 256)
BODY_SIZES = (16, 1024)
TRANSPORTS = ("unix", "pipe")
MODES = ("one-way", "round-trip")
END = b"end"


def make_records(count: int, body_size: int) -> list[list]:
    body = os.urandom(body_size)
    return [["", "perf-0", PROPERTIES, body] for _ in range(count)]


def frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


class Framed(asyncio.Protocol):
    """Length-prefixed frames in, `on_frame(view, reply_transport)` per frame; the write side's flow control."""

    def __init__(self, on_frame) -> None:
        self.on_frame = on_frame
        self.buffer = bytearray()
        self.transports: list[asyncio.BaseTransport] = []
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport) -> None:
        self.transports.append(transport)

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        start, end = 0, len(buffer)
        while end - start >= 4:
            (size,) = HEADER.unpack_from(buffer, start)
            if end - start - 4 < size:
                break
            self.on_frame(memoryview(buffer)[start + 4:start + 4 + size], self.transports[0])
            start += 4 + size
        del buffer[:start]

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()

    def connection_lost(self, exc) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


async def open_framed(kind: str, fds: tuple[int, ...], on_frame) -> tuple[Framed, asyncio.WriteTransport]:
    """The protocol reading frames and the transport to write with, over a
    socketpair end (one fd) or a read pipe and a write pipe (two fds)."""
    loop = asyncio.get_running_loop()
    protocol = Framed(on_frame)
    if kind == "unix":
        sock = socket.socket(fileno=fds[0])
        transport, _ = await loop.create_unix_connection(lambda: protocol, sock=sock)
        return protocol, transport
    # the write pipe first: transports[0] is what a reply is written to, even for the first frame
    transport, _ = await loop.connect_write_pipe(lambda: protocol, os.fdopen(fds[1], "wb", buffering=0))
    await loop.connect_read_pipe(lambda: protocol, os.fdopen(fds[0], "rb", buffering=0))
    return protocol, transport


# -- the receiving process --------------------------------------------------------------------------

def receiver_main(kind: str, fds: tuple[int, ...], mode: str) -> None:
    uvloop.run(_receive(kind, fds, mode))


async def _receive(kind: str, fds: tuple[int, ...], mode: str) -> None:
    done = asyncio.get_running_loop().create_future()
    counts = {"batches": 0, "records": 0, "cpu_start": None}
    reply = mode == "round-trip"

    def on_frame(view: memoryview, transport: asyncio.WriteTransport) -> None:
        if counts["cpu_start"] is None:
            counts["cpu_start"] = time.process_time()
        if view == END:
            cpu = time.process_time() - counts["cpu_start"]
            transport.write(frame(msgpack.packb([cpu, counts["batches"], counts["records"]])))
            done.set_result(None)
            return
        enqueuer, first_seq, records = msgpack.unpackb(view)
        counts["batches"] += 1
        counts["records"] += len(records)
        if reply:
            transport.write(frame(msgpack.packb([enqueuer, first_seq, first_seq + len(records) - 1])))

    protocol, transport = await open_framed(kind, fds, on_frame)
    await done
    await asyncio.sleep(0)  # let the final write go out before closing
    transport.close()
    for other in protocol.transports:
        other.close()


# -- the sending process (this one) -----------------------------------------------------------------

async def _send(kind: str, fds: tuple[int, ...], mode: str, batch: int, body_size: int, messages: int) -> dict:
    loop = asyncio.get_running_loop()
    replies: asyncio.Queue = asyncio.Queue()
    protocol, transport = await open_framed(kind, fds, lambda view, _: replies.put_nowait(bytes(view)))
    records = make_records(batch, body_size)
    batches = max(1, messages // batch)
    wall_start, cpu_start = time.perf_counter(), time.process_time()
    seq = 1
    for _ in range(batches):
        transport.write(frame(msgpack.packb(["perf-p0", seq, records])))
        seq += batch
        if mode == "round-trip":
            msgpack.unpackb(await replies.get())
        elif not protocol.can_write.is_set():
            await protocol.can_write.wait()
    cpu = time.process_time() - cpu_start
    transport.write(frame(END))
    receiver_cpu, received_batches, received = msgpack.unpackb(await replies.get())
    wall = time.perf_counter() - wall_start
    assert received_batches == batches and received == batches * batch, (received_batches, received)
    transport.close()
    for other in protocol.transports:
        other.close()
    await asyncio.sleep(0)
    del loop
    total = batches * batch
    return {"sender_us": cpu / total * 1e6, "receiver_us": receiver_cpu / total * 1e6,
            "wall_us_per_batch": wall / batches * 1e6}


def measure(kind: str, mode: str, batch: int, body_size: int, messages: int) -> dict:
    """One run: a receiving child process, this process sending."""
    context = multiprocessing.get_context("fork")
    if kind == "unix":
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        child_fds, our_fds = (theirs.detach(),), (ours.detach(),)
    else:
        to_child_r, to_child_w = os.pipe()
        to_us_r, to_us_w = os.pipe()
        child_fds, our_fds = (to_child_r, to_us_w), (to_us_r, to_child_w)
    child = context.Process(target=receiver_main, args=(kind, child_fds, mode))
    child.start()
    for fd in child_fds:
        os.close(fd)
    try:
        return uvloop.run(_send(kind, our_fds, mode, batch, body_size, messages))
    finally:
        child.join(30)


def measure_codec(batch: int, body_size: int, messages: int) -> dict:
    """Encode and decode the same batches in one process: the floor of every transport."""
    records = make_records(batch, body_size)
    batches = max(1, messages // batch)
    start = time.process_time()
    for seq in range(batches):
        data = frame(msgpack.packb(["perf-p0", seq, records]))
        msgpack.unpackb(memoryview(data)[4:])
    cpu = time.process_time() - start
    total = batches * batch
    return {"sender_us": cpu / total * 1e6, "receiver_us": 0.0, "wall_us_per_batch": 0.0}


def run_all(repeat: int, messages: int) -> list[dict]:
    rows = []
    cases = [("codec", "-")] + [(kind, mode) for kind in TRANSPORTS for mode in MODES]
    for kind, mode in cases:
        for batch in BATCH_SIZES:
            for body_size in BODY_SIZES:
                # round trips of single messages are slow in wall time: fewer of them
                count = messages // 5 if (mode == "round-trip" and batch == 1) else messages
                runs = [measure_codec(batch, body_size, count) if kind == "codec"
                        else measure(kind, mode, batch, body_size, count) for _ in range(repeat)]
                row = {"transport": kind, "mode": mode, "batch": batch, "body": body_size, "messages": count}
                for key in ("sender_us", "receiver_us", "wall_us_per_batch"):
                    row[key] = round(statistics.median(r[key] for r in runs), 3)
                row["total_us"] = round(statistics.median(r["sender_us"] + r["receiver_us"] for r in runs), 3)
                row["spread_total_us"] = [round(r["sender_us"] + r["receiver_us"], 3) for r in runs]
                rows.append(row)
                print(_line(row), flush=True)
    return rows


def _line(row: dict) -> str:
    rt = f"{row['wall_us_per_batch']:9.1f}" if row["mode"] == "round-trip" else " " * 9
    return (f"{row['transport']:6} {row['mode']:10} N={row['batch']:<4} body={row['body']:<5} "
            f"sender {row['sender_us']:7.3f}  receiver {row['receiver_us']:7.3f}  total {row['total_us']:7.3f} "
            f"µs/msg  rt-wall/batch {rt} µs  runs {row['spread_total_us']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--messages", type=int, default=100_000, help="messages per run (round trips of N=1: a fifth)")
    parser.add_argument("--json", dest="json_path", help="also write the rows as JSON to this file")
    args = parser.parse_args()
    print(f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.2f} repeat={args.repeat} messages={args.messages}")
    rows = run_all(args.repeat, args.messages)
    if args.json_path:
        with open(args.json_path, "w") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
