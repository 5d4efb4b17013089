"""warren-chaos's link proxy over real loopback sockets: a slowed link keeps every byte in
order and holds it back, a blackholed one drops, a reset closes the link's connections."""
from __future__ import annotations

import asyncio
import random

import pytest

from warren.verification.chaos.proxy import LinkProxy

BYTES = 2_000_000   # more than the proxy's chunk, so a stream crosses it in many pieces
TIMEOUT_SECONDS = 20.0


class Echo:
    """The acceptor's side: echoes every byte back."""

    async def start(self) -> int:
        self.server = await asyncio.start_server(self.echo, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def echo(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        writer.close()

    async def close(self) -> None:
        self.server.close()
        await self.server.wait_closed()


@pytest.fixture
async def link():
    echo = Echo()
    proxy = await LinkProxy("a", "b", await echo.start()).start()
    yield proxy
    await proxy.close()
    await echo.close()


async def round_trip(proxy: LinkProxy, payload: bytes) -> tuple[bytes, float]:
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    started = loop.time()

    async def send() -> None:
        for offset in range(0, len(payload), 10_000):
            writer.write(payload[offset:offset + 10_000])
            await writer.drain()

    sending = asyncio.ensure_future(send())
    echoed = await asyncio.wait_for(reader.readexactly(len(payload)), TIMEOUT_SECONDS)
    await sending
    writer.close()
    return echoed, loop.time() - started


async def test_a_slow_link_delivers_every_byte_in_order_and_late(link):
    payload = random.Random(1).randbytes(BYTES)
    echoed, _ = await round_trip(link, payload)
    assert echoed == payload
    link.slow(0.2, 0.2, random.Random(2))
    echoed, seconds = await round_trip(link, payload)
    assert echoed == payload, "a slowed link reordered or changed bytes"
    assert seconds >= 0.4, f"held back 0.2 s each way, yet the round trip took {seconds:.3f} s"
    link.heal()
    echoed, _ = await round_trip(link, payload)
    assert echoed == payload


async def test_a_reset_closes_the_links_connections_and_a_new_one_works(link):
    reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
    writer.write(b"ping")
    assert await asyncio.wait_for(reader.readexactly(4), TIMEOUT_SECONDS) == b"ping"
    assert link.reset() == 1
    assert await asyncio.wait_for(reader.read(), TIMEOUT_SECONDS) == b"", "the reset connection stayed open"
    writer.close()
    echoed, _ = await round_trip(link, b"after the reset")
    assert echoed == b"after the reset"


async def test_a_blackholed_direction_drops_bytes(link):
    reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
    link.block("forward")
    writer.write(b"lost")
    await writer.drain()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(reader.read(1), 0.3)   # bounded: nothing may come back
    link.heal()   # the stream lost bytes: healing closes it
    assert await asyncio.wait_for(reader.read(), TIMEOUT_SECONDS) == b""
    writer.close()
