"""A tiny raw AMQP 0-9-1 client over a blocking socket, for what pika cannot send.

Used by the test_pika_*.py files. Frames are built and parsed with pamqp; the
socket is read with deadlines so every wait is bounded. ``frames`` records
(frame_type, channel, size_bytes, raw_bytes) of every frame received, for
tests about framing.
"""
from __future__ import annotations

import socket
import struct
import time

from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader
from pamqp.heartbeat import Heartbeat

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_HEADER_SIZE = 7
FRAME_END_SIZE = 1
READ_CHUNK_BYTES = 65536
WAIT_SECONDS = 5.0
DEFAULT_FRAME_MAX = 131072


class RawClient:
    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = WAIT_SECONDS):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buffer = b""
        self.frames: list[tuple[int, int, int, bytes]] = []
        self.frame_max = 0
        self.server_properties: dict = {}

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "RawClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- frames -----------------------------------------------------------
    def send(self, channel: int, *values) -> None:
        self.sock.sendall(self.marshal(channel, *values))

    def publish(self, channel: int, method: commands.Basic.Publish, body: bytes,
                properties: commands.Basic.Properties | None = None, frame_max: int | None = None) -> bytes:
        """Send publish + header + body frames; returns the raw header frame sent."""
        header, frames = self.publish_frames(channel, method, body, properties, frame_max)
        self.sock.sendall(frames)
        return header

    def publish_frames(self, channel: int, method: commands.Basic.Publish, body: bytes,
                       properties: commands.Basic.Properties | None = None,
                       frame_max: int | None = None) -> tuple[bytes, bytes]:
        """(header frame, all frames) of one publish, to send with others in one write."""
        header = pamqp_frame.marshal(ContentHeader(0, len(body), properties or commands.Basic.Properties()), channel)
        chunk = (frame_max or self.frame_max or DEFAULT_FRAME_MAX) - FRAME_HEADER_SIZE - FRAME_END_SIZE
        bodies = [pamqp_frame.marshal(ContentBody(body[i:i + chunk]), channel) for i in range(0, len(body), chunk)]
        return header, pamqp_frame.marshal(method, channel) + header + b"".join(bodies)

    def marshal(self, channel: int, *values) -> bytes:
        return b"".join(pamqp_frame.marshal(value, channel) for value in values)

    def read_frame(self, timeout: float = WAIT_SECONDS):
        """(channel, pamqp value) of the next frame, or None if none came within ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buffer) >= FRAME_HEADER_SIZE:
                frame_type, channel, size = struct.unpack(">BHI", self.buffer[:FRAME_HEADER_SIZE])
                total = FRAME_HEADER_SIZE + size + FRAME_END_SIZE
                if len(self.buffer) >= total:
                    raw, self.buffer = self.buffer[:total], self.buffer[total:]
                    self.frames.append((frame_type, channel, total, raw))
                    _, channel, value = pamqp_frame.unmarshal(raw)
                    return channel, value
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(READ_CHUNK_BYTES)
            except TimeoutError:
                return None
            if not data:
                raise ConnectionError("the server closed the socket")
            self.buffer += data

    def expect(self, kind: type, timeout: float = WAIT_SECONDS, skip_heartbeats: bool = True):
        deadline = time.monotonic() + timeout
        while True:
            got = self.read_frame(max(0.0, deadline - time.monotonic()))
            if got is None:
                raise AssertionError(f"no {kind.__name__} frame within {timeout}s")
            _, value = got
            if skip_heartbeats and isinstance(value, Heartbeat):
                continue
            assert isinstance(value, kind), f"expected {kind.__name__}, got {value!r}"
            return value

    # -- handshake (AMQP 0-9-1 §2.2.4) ------------------------------------
    def handshake(self, user: str = "guest", password: str = "guest", vhost: str = "/",
                  heartbeat: int = 0, frame_max: int | None = None, channel_max: int | None = None,
                  expect_open_ok: bool = True) -> commands.Connection.Tune:
        """PLAIN login; tune values default to the server's proposal."""
        self.sock.sendall(PROTOCOL_HEADER)
        self.server_properties = self.expect(commands.Connection.Start).server_properties
        self.send(0, commands.Connection.StartOk(
            client_properties={"product": "warren-raw-test",
                               "capabilities": {"consumer_cancel_notify": True, "basic.nack": True,
                                                "publisher_confirms": True}},
            mechanism="PLAIN", response=f"\0{user}\0{password}", locale="en_US"))
        tune = self.expect(commands.Connection.Tune)
        self.frame_max = tune.frame_max if frame_max is None else frame_max
        self.send(0, commands.Connection.TuneOk(
            channel_max=tune.channel_max if channel_max is None else channel_max,
            frame_max=self.frame_max,
            heartbeat=heartbeat))
        self.send(0, commands.Connection.Open(virtual_host=vhost))
        if expect_open_ok:
            self.expect(commands.Connection.OpenOk)
        return tune

    def open_channel(self, channel: int = 1) -> None:
        self.send(channel, commands.Channel.Open())
        self.expect(commands.Channel.OpenOk)

    def consume_new_queue(self, queue: str, channel: int = 1, **declare) -> None:
        """Log in, open `channel`, declare `queue` (with `declare`'s flags) and consume from it."""
        self.handshake()
        self.open_channel(channel)
        self.send(channel, commands.Queue.Declare(queue=queue, **declare))
        self.expect(commands.Queue.DeclareOk)
        self.send(channel, commands.Basic.Consume(queue=queue))
        self.expect(commands.Basic.ConsumeOk)

    def close_connection(self) -> None:
        self.send(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        self.expect(commands.Connection.CloseOk)
