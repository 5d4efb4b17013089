"""A blocking raw-socket AMQP 0-9-1 client for tests that need exact frames.

(Reconstructed: the original of this file was overwritten by accident; the
API follows its callers in test_pika_*.py.) Frames are encoded and decoded
with pamqp. ``frames`` records every frame read as
``(channel, value, size, raw)`` where ``size`` is the whole frame's length in
bytes (header, payload and frame-end, the unit frame_max limits) and ``raw``
its bytes.
"""
from __future__ import annotations

import socket
import struct
import time

from pamqp import body as pamqp_body
from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp import heartbeat as pamqp_heartbeat

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_HEADER_SIZE = 7
FRAME_END = 0xCE
DEFAULT_TIMEOUT_SECONDS = 5.0


class RawClient:
    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = DEFAULT_TIMEOUT_SECONDS):
        self.timeout = timeout
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buffer = b""
        self.frames: list[tuple] = []
        self.frame_max = 131072

    def __enter__(self) -> "RawClient":
        return self

    def __exit__(self, *exc_info) -> None:
        self.sock.close()

    # -- output -----------------------------------------------------------
    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, channel: int, value) -> None:
        self.send_raw(pamqp_frame.marshal(value, channel))

    def publish(self, channel: int, method: commands.Basic.Publish, body: bytes,
                properties: commands.Basic.Properties | None = None) -> bytes:
        """basic.publish + content header + body frames; returns the content header frame's bytes."""
        header = pamqp_frame.marshal(
            pamqp_header.ContentHeader(0, len(body), properties or commands.Basic.Properties()), channel)
        chunk_bytes = self.frame_max - FRAME_HEADER_SIZE - 1
        bodies = [pamqp_frame.marshal(pamqp_body.ContentBody(body[i:i + chunk_bytes]), channel)
                  for i in range(0, len(body), chunk_bytes)]
        self.send_raw(pamqp_frame.marshal(method, channel) + header + b"".join(bodies))
        return header

    # -- input ------------------------------------------------------------
    def _fill(self, count: int, deadline: float) -> bool:
        while len(self.buffer) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                return False
            if not chunk:
                raise ConnectionError(f"server closed the socket (buffered {self.buffer!r})")
            self.buffer += chunk
        return True

    def read_frame(self, timeout: float | None = None):
        """The next frame as (channel, value, size, raw), or None if none arrives in ``timeout``."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        if not self._fill(FRAME_HEADER_SIZE, deadline):
            return None
        if self.buffer.startswith(b"AMQP"):
            if not self._fill(8, deadline):
                return None
            size = 8
        else:
            size = FRAME_HEADER_SIZE + struct.unpack(">I", self.buffer[3:7])[0] + 1
            if not self._fill(size, deadline):
                return None
        raw, self.buffer = self.buffer[:size], self.buffer[size:]
        _, channel, value = pamqp_frame.unmarshal(raw)
        entry = (channel, value, size, raw)
        self.frames.append(entry)
        return entry

    def expect(self, kind: type, timeout: float | None = None):
        """The next non-heartbeat frame, which must be a ``kind``; its value."""
        wait = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        while True:
            got = self.read_frame(max(0.0, deadline - time.monotonic()))
            assert got is not None, f"no {kind.__name__} within {wait}s"
            if isinstance(got[1], pamqp_heartbeat.Heartbeat) and kind is not pamqp_heartbeat.Heartbeat:
                continue
            assert isinstance(got[1], kind), f"expected {kind.__name__}, got {got[1]!r} on channel {got[0]}"
            return got[1]

    # -- conversations ----------------------------------------------------
    def handshake(self, user: str = "guest", password: str = "guest", vhost: str = "/", heartbeat: int = 0,
                  frame_max: int | None = None, channel_max: int | None = None,
                  expect_open_ok: bool = True) -> commands.Connection.Tune:
        """Protocol header through connection.open(-ok); returns the server's connection.tune."""
        self.send_raw(PROTOCOL_HEADER)
        self.expect(commands.Connection.Start)
        self.send(0, commands.Connection.StartOk(
            client_properties={"product": "warren-tests-raw", "capabilities": {"consumer_cancel_notify": True}},
            mechanism="PLAIN", response=f"\0{user}\0{password}", locale="en_US"))
        tune = self.expect(commands.Connection.Tune)
        self.frame_max = tune.frame_max if frame_max is None else frame_max
        self.send(0, commands.Connection.TuneOk(
            channel_max=tune.channel_max if channel_max is None else channel_max,
            frame_max=self.frame_max, heartbeat=heartbeat))
        self.send(0, commands.Connection.Open(virtual_host=vhost))
        if expect_open_ok:
            self.expect(commands.Connection.OpenOk)
        return tune

    def open_channel(self, channel: int) -> None:
        self.send(channel, commands.Channel.Open())
        self.expect(commands.Channel.OpenOk)

    def close_connection(self) -> None:
        self.send(0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
        self.expect(commands.Connection.CloseOk)
