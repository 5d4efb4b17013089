"""Client-side frame builders and event normalisers for the sans-I/O parser tests.

Frames are built with pamqp (an independent encoder), so the parser is checked
against someone else's idea of the wire format, not against its own.
"""
from __future__ import annotations

import struct

from pamqp import base as pamqp_base
from pamqp import body as pamqp_body
from pamqp import commands as spec
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp import heartbeat as pamqp_heartbeat

from warren.protocol.connection import (
    EV_ACK,
    EV_CHANNEL_ERROR,
    EV_HEARTBEAT,
    EV_METHOD,
    EV_NACK,
    EV_PUBLISH,
    EV_REJECT,
    ServerConnection,
)
from warren.protocol.constants import FRAME_END, PROTOCOL_HEADER
from warren.protocol.errors import ChannelError

FRAME_MAX = 4096
CHANNEL_MAX = 16
MAX_MESSAGE_SIZE = 1 << 20


def method(channel: int, value) -> bytes:
    return pamqp_frame.marshal(value, channel)


def raw_frame(frame_type: int, channel: int, payload: bytes, end: int = FRAME_END) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes((end,))


def heartbeat() -> bytes:
    return pamqp_frame.marshal(pamqp_heartbeat.Heartbeat(), 0)


def content_header(channel: int, body_size: int, properties: spec.Basic.Properties | None = None) -> bytes:
    props = properties if properties is not None else spec.Basic.Properties()
    return pamqp_frame.marshal(pamqp_header.ContentHeader(0, body_size, props), channel)


def content_body(channel: int, data: bytes) -> bytes:
    return pamqp_frame.marshal(pamqp_body.ContentBody(data), channel)


def body_frames(channel: int, data: bytes, chunk: int) -> bytes:
    return b"".join(content_body(channel, data[i:i + chunk]) for i in range(0, len(data), chunk))


def publish(channel: int, data: bytes, exchange: str = "ex", routing_key: str = "rk",
            properties: spec.Basic.Properties | None = None, chunk: int = FRAME_MAX - 8,
            mandatory: bool = False, immediate: bool = False) -> bytes:
    return (method(channel, spec.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                               mandatory=mandatory, immediate=immediate))
            + content_header(channel, len(data), properties)
            + body_frames(channel, data, chunk))


def start_ok() -> bytes:
    return method(0, spec.Connection.StartOk(
        client_properties={"product": "test"}, mechanism="PLAIN", response="\0guest\0guest"))


def tune_ok(frame_max: int = FRAME_MAX, channel_max: int = CHANNEL_MAX) -> bytes:
    return method(0, spec.Connection.TuneOk(channel_max=channel_max, frame_max=frame_max, heartbeat=0))


def connection_open() -> bytes:
    return method(0, spec.Connection.Open(virtual_host="/"))


def channel_open(channel: int) -> bytes:
    return method(channel, spec.Channel.Open())


HANDSHAKE = PROTOCOL_HEADER + start_ok() + tune_ok() + connection_open()


def new_connection(frame_max: int = FRAME_MAX, channel_max: int = CHANNEL_MAX,
                   max_message_size: int = MAX_MESSAGE_SIZE) -> ServerConnection:
    return ServerConnection(frame_max, channel_max, max_message_size)


def opened_connection(*channels: int, frame_max: int = FRAME_MAX,
                      max_message_size: int = MAX_MESSAGE_SIZE) -> ServerConnection:
    """A connection past the handshake, with the given channels open."""
    conn = new_connection(frame_max=frame_max, max_message_size=max_message_size)
    events = conn.receive_data(HANDSHAKE + b"".join(channel_open(c) for c in channels))
    assert len(events) == 3 + len(channels), f"handshake gave unexpected events: {describe(events)}"
    return conn


def normalise(event: tuple) -> tuple:
    """An event as plain comparable values (pamqp methods become (name, attributes))."""
    kind = event[0]
    if kind == EV_METHOD:
        m = event[2]
        return ("method", event[1], m.name, tuple((k, _plain(v)) for k, v in m))
    if kind == EV_PUBLISH:
        return ("publish", event[1], event[2], event[3], event[4], event[5], bytes(event[6]), bytes(event[7]))
    if kind == EV_ACK:
        return ("ack", event[1], event[2], event[3])
    if kind == EV_NACK:
        return ("nack", event[1], event[2], event[3], event[4])
    if kind == EV_REJECT:
        return ("reject", event[1], event[2], event[3])
    if kind == EV_HEARTBEAT:
        return ("heartbeat", event[1])
    if kind == EV_CHANNEL_ERROR:
        error = event[2]
        return ("channel-error", event[1], error.reply_code, error.class_id, error.method_id)
    raise AssertionError(f"unknown event kind {kind!r} in {event!r}")


def _plain(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _plain(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_plain(v) for v in value)
    return value


def describe(events: list) -> list:
    """Short readable form for assertion messages."""
    out = []
    for event in events:
        n = normalise(event)
        if n[0] == "method":
            out.append(("method", n[1], n[2]))
        elif n[0] == "publish":
            out.append(n[:6] + (f"{len(n[7])} body bytes",))
        else:
            out.append(n)
    return out


EVENT_ARITY = {EV_METHOD: 3, EV_PUBLISH: 8, EV_ACK: 4, EV_NACK: 5, EV_REJECT: 4,
               EV_HEARTBEAT: 2, EV_CHANNEL_ERROR: 3}


def check_well_formed(event) -> None:
    """Assert one event tuple has the documented shape and types."""
    assert isinstance(event, tuple), f"event is not a tuple: {event!r}"
    assert event and event[0] in EVENT_ARITY, f"unknown event kind: {event!r}"
    kind = event[0]
    assert len(event) == EVENT_ARITY[kind], f"event {event!r} has {len(event)} fields, expected {EVENT_ARITY[kind]}"
    channel = event[1]
    assert isinstance(channel, int) and 0 <= channel <= 0xFFFF, f"bad channel number in {event!r}"
    if kind == EV_METHOD:
        assert isinstance(event[2], pamqp_base.Frame), f"method event without a pamqp method: {event!r}"
    elif kind == EV_PUBLISH:
        assert channel > 0, f"publish on channel 0: {event!r}"
        assert isinstance(event[2], str) and isinstance(event[3], str), f"exchange/routing key not str: {event!r}"
        assert isinstance(event[4], bool) and isinstance(event[5], bool), f"flags not bool: {event!r}"
        assert isinstance(event[6], (bytes, bytearray, memoryview)), f"properties not bytes: {event!r}"
        assert isinstance(event[7], (bytes, bytearray, memoryview)), f"body not bytes: {event!r}"
    elif kind in (EV_ACK, EV_NACK, EV_REJECT):
        assert channel > 0, f"ack/nack/reject on channel 0: {event!r}"
        assert isinstance(event[2], int) and 0 <= event[2] < 2 ** 64, f"bad delivery tag: {event!r}"
        assert all(isinstance(flag, bool) for flag in event[3:]), f"flags not bool: {event!r}"
    elif kind == EV_HEARTBEAT:
        assert channel == 0, f"heartbeat event not on channel 0: {event!r}"
    elif kind == EV_CHANNEL_ERROR:
        assert isinstance(event[2], ChannelError), f"channel error event without a ChannelError: {event!r}"
