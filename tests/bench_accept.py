"""Where new connections land when several uvloop processes share one listening port.

    .venv/bin/python -m tests.bench_accept [--processes 2] [--connections 400] [--busy 0.5]

Two ways of sharing (docs/multi-process.md, "Connections"):

* `shared`: the parent binds one socket and every process accepts on it
  (`create_server(sock=...)`): whichever loop wakes first takes the connection;
* `reuseport`: every process binds its own socket to the same port with
  SO_REUSEPORT: the kernel hashes each connection onto one of them.

Each is run with every process idle, and with process 0 busy for `--busy`
of its time (its loop blocked in 10 ms slices, as a loaded shard's is). The
client opens the connections one after another and each process answers a
new connection with its index. Printed: connections per process, and each
process's CPU µs per connection offered (all of them wake for every
connection on a shared socket).
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import time

import uvloop

BUSY_SLICE_SECONDS = 0.01


class Answer(asyncio.Protocol):
    def __init__(self, index: int) -> None:
        self.index = index

    def connection_made(self, transport) -> None:
        transport.write(bytes([self.index]))


async def _serve(index: int, sock: socket.socket | None, port: int, busy: float, ready, stop, cpu_out) -> None:
    loop = asyncio.get_running_loop()
    if sock is None:
        server = await loop.create_server(lambda: Answer(index), "127.0.0.1", port, reuse_port=True, backlog=1024)
    else:
        server = await loop.create_server(lambda: Answer(index), sock=sock, backlog=1024)
    ready.release()
    cpu_start = time.process_time()
    while not stop.is_set():
        if busy > 0:
            until = time.perf_counter() + BUSY_SLICE_SECONDS * busy
            while time.perf_counter() < until:
                pass  # the loop is blocked: a loaded shard's turn
        await asyncio.sleep(BUSY_SLICE_SECONDS * (1 - busy) if busy > 0 else 0.05)
    cpu_out.put((index, time.process_time() - cpu_start))
    server.close()


def _child(index: int, sock, port: int, busy: float, ready, stop, cpu_out) -> None:
    uvloop.run(_serve(index, sock, port, busy, ready, stop, cpu_out))


def run(mode: str, processes: int, connections: int, busy: float) -> tuple[list[int], list[float]]:
    context = multiprocessing.get_context("fork")
    ready, stop, cpu_out = context.Semaphore(0), context.Event(), context.Queue()
    if mode == "shared":
        listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
    else:  # bound, not listening: it holds the port, and the forked children inherit nothing that accepts
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    shared = listener if mode == "shared" else None
    children = [context.Process(target=_child, args=(n, shared, port, busy if n == 0 else 0.0, ready, stop, cpu_out))
                for n in range(processes)]
    for child in children:
        child.start()
    for _ in children:
        ready.acquire()
    counts = [0] * processes
    clients = []
    for _ in range(connections):
        client = socket.create_connection(("127.0.0.1", port))
        counts[client.recv(1)[0]] += 1
        clients.append(client)
    stop.set()
    cpu = [0.0] * processes
    for _ in children:
        index, seconds = cpu_out.get(timeout=30)
        cpu[index] = seconds
    for child in children:
        child.join(30)
    for client in clients:
        client.close()
    listener.close()
    return counts, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--connections", type=int, default=400)
    parser.add_argument("--busy", type=float, default=0.5, help="share of process 0's time its loop is blocked")
    args = parser.parse_args()
    for mode in ("shared", "reuseport"):
        for busy in (0.0, args.busy):
            counts, cpu = run(mode, args.processes, args.connections, busy)
            per_connection = [round(seconds / args.connections * 1e6, 1) for seconds in cpu]
            print(f"{mode:9} process 0 busy {busy:.0%}: connections per process {counts}; "
                  f"CPU µs per connection offered, per process {per_connection}", flush=True)


if __name__ == "__main__":
    main()
