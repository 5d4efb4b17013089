"""A TCP proxy on one cluster link, to partition nodes without touching the host's network.

Warren has one connection per pair of nodes, dialled by the node whose name
sorts first (raft/transport.py), to the host:port its WARREN_CLUSTER_NODES
lists for the peer; only the name is authenticated (raft/handshake.py). So
each dialer lists its higher-named peers at a proxy port, and every byte
between two nodes passes one LinkProxy. Each direction can be blackholed:
bytes are read and dropped (a silent network, not a reset: the nodes' failure
detector has to notice). A node's close going a blackholed way is lost too
(as its RST would be): the far side learns by its own heartbeats, maybe
later than the near side did. Dropped bytes break the framing of the stream,
so healing closes the connections that lost bytes; the dialer reconnects.

A link can also be slowed (`slow`: every chunk held back a delay with jitter,
in order, as a congested or far network: heartbeats arrive late and bunched)
or reset (`reset`: its connections closed at once, as a flaky network's
resets: the nodes see the link fail and dial again, resending what was lost).
"""
from __future__ import annotations

import asyncio
import random

CHUNK_BYTES = 65536
# Chunks read but held back by a delay, per direction of a connection: then the reader waits (TCP
# backpressure to the sending node), so a slow link holds bounded memory.
HELD_CHUNKS = 256


class LinkProxy:
    def __init__(self, dialer: str, acceptor: str, target_port: int, host: str = "127.0.0.1"):
        self.dialer, self.acceptor = dialer, acceptor
        self.host, self.target_port = host, target_port
        self.port: int | None = None
        # Blackholed directions: "forward" = dialer -> acceptor, "backward" = acceptor -> dialer.
        self.blocked: set[str] = set()
        self._server: asyncio.Server | None = None
        self._streams: set[asyncio.StreamWriter] = set()
        self._lossy: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task] = set()
        # a slow link: each chunk is held back `delay` seconds plus up to `jitter` more, in order
        self.delay = self.jitter = 0.0
        self._rng = random.Random(0)

    def __repr__(self) -> str:
        return f"LinkProxy({self.dialer}->{self.acceptor} :{self.port}, blocked={sorted(self.blocked)})"

    async def start(self, port: int = 0) -> "LinkProxy":
        self._server = await asyncio.start_server(self._accept, self.host, port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def block(self, *directions: str) -> None:
        assert set(directions) <= {"forward", "backward"}, directions
        self.blocked |= set(directions)

    def slow(self, delay: float, jitter: float, rng: random.Random) -> None:
        self.delay, self.jitter, self._rng = delay, jitter, rng

    def reset(self) -> int:
        """Close every connection through this link now; returns how many pairs."""
        writers = list(self._streams)
        for writer in writers:
            writer.close()
        return len(writers) // 2

    def heal(self) -> None:
        self.delay = self.jitter = 0.0   # what was held back still arrives, in order
        self.blocked.clear()
        for writer in list(self._lossy):
            writer.close()  # a stream that lost bytes cannot be resumed
        self._lossy.clear()

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            client_writer.close()  # the acceptor is down: as a refused connection
            return
        pair = (client_writer, server_writer)
        self._streams.update(pair)
        pumps = [asyncio.ensure_future(self._pump(client_reader, server_writer, "forward", pair)),
                 asyncio.ensure_future(self._pump(server_reader, client_writer, "backward", pair))]
        self._tasks.update(pumps)
        done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        direction = "forward" if pumps[0] in done else "backward"
        if direction in self.blocked:   # the close is lost: the other side stays open, dropping, until heal
            (client_writer if direction == "forward" else server_writer).close()
            self._lossy.update(pair)
            await asyncio.wait(pumps)
        for task in pumps:
            task.cancel()
        for writer in pair:
            writer.close()
            self._streams.discard(writer)
            self._lossy.discard(writer)
        self._tasks.difference_update(pumps)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str,
                    pair: tuple[asyncio.StreamWriter, ...]) -> None:
        loop = asyncio.get_running_loop()
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(HELD_CHUNKS)
        release = asyncio.ensure_future(self._release(held, writer))
        try:
            last_due = 0.0
            while data := await reader.read(CHUNK_BYTES):
                if direction in self.blocked:
                    self._lossy.update(pair)
                    continue
                due = loop.time() + self.delay + (self._rng.uniform(0, self.jitter) if self.jitter else 0.0)
                last_due = max(last_due, due)   # a later chunk never overtakes an earlier one
                await held.put((last_due, data))
            await held.join()   # what was read before the close still goes out
        except (ConnectionError, OSError):
            pass  # either side went away: _accept closes the pair
        finally:
            release.cancel()

    @staticmethod
    async def _release(held: asyncio.Queue, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due, data = await held.get()
            try:
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)   # the link's delay, not synchronisation
                if not writer.is_closing():   # reset or closed meanwhile: what was held back is lost
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass   # the far side went away: _accept closes the pair
            finally:
                held.task_done()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._streams):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            await self._server.wait_closed()
