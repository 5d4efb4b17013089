"""A minimal raw-socket AMQP 0-9-1 client for tests that must misbehave.

Frames are encoded and decoded with pamqp; every read has a deadline and
fails with a message that says what was awaited.
"""
from __future__ import annotations

import asyncio
import struct

from pamqp import commands as spec
from pamqp import frame as pamqp_frame
from pamqp import heartbeat as pamqp_heartbeat
from pamqp.header import ProtocolHeader

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_END = 0xCE
FRAME_HEADER_SIZE = 7
DEFAULT_TIMEOUT_SECONDS = 5.0


class Closed(Exception):
    """The server closed the socket."""


class RawClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, port: int, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> "RawClient":
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def send_frame(self, channel: int, value) -> None:
        await self.send(pamqp_frame.marshal(value, channel))

    async def read_exactly(self, count: int, timeout: float, what: str) -> bytes:
        try:
            return await asyncio.wait_for(self.reader.readexactly(count), timeout)
        except asyncio.IncompleteReadError as error:
            raise Closed(f"socket closed while waiting for {what} (got {error.partial!r})") from None
        except (ConnectionResetError, BrokenPipeError) as error:
            raise Closed(f"connection reset while waiting for {what}: {error}") from None
        except TimeoutError:
            raise AssertionError(f"no {what} within {timeout}s") from None

    async def read_frame(self, timeout: float = DEFAULT_TIMEOUT_SECONDS, what: str = "a frame"):
        """(channel, pamqp frame) of the next frame; a protocol header comes back as (0, ProtocolHeader)."""
        head = await self.read_exactly(FRAME_HEADER_SIZE, timeout, what)
        if head.startswith(b"AMQP"):
            rest = await self.read_exactly(1, timeout, what)
            _, channel, value = pamqp_frame.unmarshal(head + rest)
            return channel, value
        _, _, size = struct.unpack(">BHI", head)
        payload = await self.read_exactly(size + 1, timeout, what)
        assert payload[-1] == FRAME_END, f"frame from the server does not end in 0xCE: {head + payload!r}"
        _, channel, value = pamqp_frame.unmarshal(head + payload)
        return channel, value

    async def expect(self, kind: type, timeout: float = DEFAULT_TIMEOUT_SECONDS, skip_heartbeats: bool = True):
        while True:
            channel, value = await self.read_frame(timeout, kind.__name__)
            if skip_heartbeats and isinstance(value, pamqp_heartbeat.Heartbeat):
                continue
            assert isinstance(value, kind), f"expected {kind.__name__}, server sent {value!r} on channel {channel}"
            return value

    async def handshake(self, user: str = "guest", password: str = "guest", heartbeat: int = 0,
                        vhost: str = "/") -> spec.Connection.Tune:
        """Header, start/start-ok, tune/tune-ok, open/open-ok. Returns the server's Tune."""
        await self.send(PROTOCOL_HEADER)
        await self.expect(spec.Connection.Start)
        await self.send_frame(0, spec.Connection.StartOk(
            client_properties={"product": "warren-tests-raw"}, mechanism="PLAIN",
            response=f"\0{user}\0{password}", locale="en_US"))
        tune = await self.expect(spec.Connection.Tune)
        await self.send_frame(0, spec.Connection.TuneOk(
            channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=heartbeat))
        await self.send_frame(0, spec.Connection.Open(virtual_host=vhost))
        await self.expect(spec.Connection.OpenOk)
        return tune

    async def wait_for_eof(self, timeout: float) -> bytes:
        """Everything the server still sends until it closes the socket; fails if it does not in time."""
        received = bytearray()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(
                    f"server did not close the socket within {timeout}s (received {bytes(received)!r})")
            try:
                chunk = await asyncio.wait_for(self.reader.read(65536), remaining)
            except TimeoutError:
                continue
            except (ConnectionResetError, BrokenPipeError):
                return bytes(received)
            if not chunk:
                return bytes(received)
            received += chunk

    async def close(self) -> None:
        self.writer.close()
        try:
            await asyncio.wait_for(self.writer.wait_closed(), 2)
        except (TimeoutError, ConnectionError, OSError):
            pass


def parse_frames(data: bytes) -> list:
    """Whole frames (channel, value) in ``data``; a trailing partial frame is an error."""
    frames = []
    while data:
        if data.startswith(b"AMQP"):
            consumed, channel, value = pamqp_frame.unmarshal(data[:8])
        else:
            assert len(data) >= FRAME_HEADER_SIZE, f"partial frame header from the server: {data!r}"
            size = struct.unpack(">I", data[3:7])[0]
            assert len(data) >= FRAME_HEADER_SIZE + size + 1, f"partial frame from the server: {data[:64]!r}"
            consumed, channel, value = pamqp_frame.unmarshal(data[:FRAME_HEADER_SIZE + size + 1])
        frames.append((channel, value))
        data = data[consumed:]
    return frames


__all__ = ["Closed", "PROTOCOL_HEADER", "ProtocolHeader", "RawClient", "parse_frames"]
