"""Network partitions between real nodes on 127.0.0.1, without root.

Every pair of nodes talks over one TCP connection, dialed by the node whose
name sorts first (raft/transport.py). Here each pair gets a small TCP proxy
in the test process, and the dialer's config names the proxy as its peer's
address (a node only uses its peers' host and port to dial them, and the
handshake checks names, not addresses; so per-node configs may differ in peer
ports). A cut blackholes the bytes going one way (or both) through the
pair's proxy: nothing is closed, as when packets are lost, so the nodes
notice by their heartbeats. Connections made during a cut are held and
blackholed the same way. A delay holds the bytes going one way for a while
before they go on, in order. `heal()` lets bytes through again, without delay, and closes the
connections that lost bytes (their streams have holes), so the nodes dial
afresh at once. A node's close going a cut way is lost with the bytes, as
a RST is on a real partition: the far node notices by its own heartbeats,
maybe later than the near one did.

    network = Network(real_ports)     # {"a": its cluster port, ...}
    network.cut("a", "b")            # both ways; one_way=True: only a -> b
    network.isolate("a")             # a from everyone
    network.delay("a", "b", 0.2)     # what a sends b arrives 0.2 s later
    network.heal()
    network.close()

The proxies run on an asyncio loop in a daemon thread; the methods are safe
to call from any other thread and return once the change is in force.
"""
from __future__ import annotations

import asyncio
import itertools
import threading

from tests.serverproc import free_port

CHUNK_BYTES = 65536
CALL_SECONDS = 5.0


class _Connection:
    """One proxied TCP connection between `dialer` and `acceptor`."""

    def __init__(self, dialer: str, acceptor: str) -> None:
        self.ends = (dialer, acceptor)
        self.writers: list[asyncio.StreamWriter] = []
        self.lost_bytes = False   # something was blackholed: the stream has a hole

    def close(self) -> None:
        for writer in self.writers:
            writer.transport.abort()


class PairProxy:
    """The proxy of one node pair: listens on `port`, forwards to the acceptor's real port."""

    def __init__(self, network: "Network", dialer: str, acceptor: str, target_port: int) -> None:
        self.network, self.dialer, self.acceptor, self.target_port = network, dialer, acceptor, target_port
        self.port = free_port()
        self.connections: set[_Connection] = set()
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def _accept(self, from_dialer: asyncio.StreamReader, to_dialer: asyncio.StreamWriter) -> None:
        connection = _Connection(self.dialer, self.acceptor)
        try:
            from_acceptor, to_acceptor = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            to_dialer.transport.abort()   # the node is down: refused, as without a proxy
            return
        connection.writers = [to_dialer, to_acceptor]
        self.connections.add(connection)
        try:
            await asyncio.gather(self._pump(connection, from_dialer, to_acceptor, self.dialer, self.acceptor),
                                 self._pump(connection, from_acceptor, to_dialer, self.acceptor, self.dialer))
        finally:
            self.connections.discard(connection)
            connection.close()

    async def _pump(self, connection: _Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    source: str, destination: str) -> None:
        loop = asyncio.get_running_loop()
        last_due = 0.0
        try:
            while data := await reader.read(CHUNK_BYTES):
                if (source, destination) in self.network.blocked:
                    connection.lost_bytes = True
                    continue
                delay = self.network.delays.get((source, destination), 0.0)
                if delay or last_due >= loop.time():   # held, or behind bytes still held (after a heal)
                    # strictly later than the chunk before: timers due at the same time run in no set order
                    last_due = max(last_due + 1e-6, loop.time() + delay)
                    loop.call_at(last_due, writer.write, data)
                    continue
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if (source, destination) in self.network.blocked:
                # the close is lost with the bytes: only the source's end goes; heal() closes the rest
                connection.lost_bytes = True
                connection.writers[0 if source == self.dialer else 1].transport.abort()
            else:
                connection.close()

    async def heal(self) -> None:
        for connection in [c for c in self.connections if c.lost_bytes]:
            connection.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
        for connection in list(self.connections):
            connection.close()


class Network:
    """A proxy per pair of `real_ports`' nodes (name -> the node's own cluster port)."""

    def __init__(self, real_ports: dict[str, int]) -> None:
        self.real_ports = dict(real_ports)
        self.blocked: set[tuple[str, str]] = set()   # (source, destination): bytes dropped that way
        self.delays: dict[tuple[str, str], float] = {}   # (source, destination): seconds bytes are held that way
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="partition-proxies")
        self.thread.start()
        self.proxies = {(a, b): PairProxy(self, a, b, real_ports[b])
                        for a, b in itertools.combinations(sorted(real_ports), 2)}
        for proxy in self.proxies.values():
            self._call(proxy.start())

    def _call(self, coroutine) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(CALL_SECONDS)

    def peer_port(self, node: str, peer: str) -> int:
        """The port `node` should dial `peer` at (its real one when `node` does not dial it)."""
        proxy = self.proxies.get((node, peer))
        return proxy.port if proxy is not None else self.real_ports[peer]

    def cut(self, a: str, b: str, one_way: bool = False) -> None:
        """Drop what `a` sends `b` (and what `b` sends `a`, unless `one_way`)."""
        async def change() -> None:
            self.blocked.add((a, b))
            if not one_way:
                self.blocked.add((b, a))
        self._call(change())

    def delay(self, source: str, destination: str, seconds: float) -> None:
        """Hold what `source` sends `destination` for `seconds` before it goes on."""
        async def change() -> None:
            self.delays[(source, destination)] = seconds
        self._call(change())

    def isolate(self, node: str) -> None:
        for other in self.real_ports:
            if other != node:
                self.cut(node, other)

    def heal(self) -> None:
        async def change() -> None:
            self.blocked.clear()
            self.delays.clear()
            for proxy in self.proxies.values():
                await proxy.heal()
        self._call(change())

    def close(self) -> None:
        async def stop() -> None:
            for proxy in self.proxies.values():
                await proxy.stop()
        self._call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(CALL_SECONDS)
