"""Encoders and decoders for AMQP 0-9-1 frames.

The hot methods (basic.publish in, basic.deliver / ack / nack out) are packed
by hand with ``struct`` and keep message properties as the raw bytes of the
content header (flags + property list), so a message is never turned into
objects on its way through the broker. Everything else goes through pamqp.
"""
from __future__ import annotations

import struct

from pamqp import base as pamqp_base
from pamqp import commands as spec
from pamqp import decode as pamqp_decode

from warren.protocol.constants import (
    CLASS_BASIC,
    FRAME_BODY,
    FRAME_END,
    FRAME_END_BYTE,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_OVERHEAD_BYTES,
    PRECONDITION_FAILED,
    PROP_DELIVERY_MODE,
    PROP_HEADERS,
)
from warren.protocol.errors import ChannelError

_frame_header = struct.Struct(">BHI")
_method_head = struct.Struct(">BHII")   # frame header + method id
_content_header = struct.Struct(">BHIHHQ")
_ack = struct.Struct(">BHIIQB")
_deliver_head = struct.Struct(">BHIIB")
_u64_bit = struct.Struct(">QB")
_body_head = struct.Struct(">BBHI")   # the content header's frame end, then the body frame's header

HEARTBEAT_FRAME = _frame_header.pack(FRAME_HEARTBEAT, 0, 0) + FRAME_END_BYTE
BASIC_DELIVER_ID = (60 << 16) | 60
BASIC_GET_OK_ID = (60 << 16) | 71
BASIC_RETURN_ID = (60 << 16) | 50
BASIC_ACK_ID = (60 << 16) | 80
BASIC_NACK_ID = (60 << 16) | 120

# Properties of a message published with no properties at all.
EMPTY_PROPERTIES = b"\x00\x00"


# Encoded shortstrs of recent names: every delivery encodes its exchange and routing
# key, which are mostly the same few names. Bounded: unique names (reply queues) do not
# make it grow for ever.
_shortstrs: dict[str, bytes] = {}
SHORTSTR_CACHE_MAX = 4096


def shortstr(value: str | bytes) -> bytes:
    if type(value) is str:
        encoded = _shortstrs.get(value)
        if encoded is None:
            encoded = _shortstr(value.encode())
            if len(_shortstrs) >= SHORTSTR_CACHE_MAX:
                _shortstrs.clear()
            _shortstrs[value] = encoded
        return encoded
    return _shortstr(value.encode() if isinstance(value, str) else value)


def _shortstr(raw: bytes) -> bytes:
    if len(raw) > 255:
        raise ValueError("shortstr longer than 255 bytes")
    return bytes((len(raw),)) + raw


def encode_method(channel: int, method: pamqp_base.Frame) -> bytes:
    payload = struct.pack(">I", method.index) + method.marshal()
    return _frame_header.pack(FRAME_METHOD, channel, len(payload)) + payload + FRAME_END_BYTE


def encode_content(channel: int, properties: bytes, body: bytes, frame_max: int) -> bytes:
    """Content header frame plus body frames, split to fit frame_max."""
    body_size = len(body)
    parts: list[bytes | memoryview] = [   # memoryview slices of a large body: no copy before the join
        _content_header.pack(FRAME_HEADER, channel, 12 + len(properties), CLASS_BASIC, 0, body_size),
        properties,
        FRAME_END_BYTE,
    ]
    chunk_max = frame_max - FRAME_OVERHEAD_BYTES
    if body_size <= chunk_max:
        if body_size:
            parts += (_frame_header.pack(FRAME_BODY, channel, body_size), body, FRAME_END_BYTE)
        return b"".join(parts)
    view = memoryview(body)
    for start in range(0, body_size, chunk_max):
        chunk = view[start:start + chunk_max]
        parts += (_frame_header.pack(FRAME_BODY, channel, len(chunk)), chunk, FRAME_END_BYTE)
    return b"".join(parts)


def encode_deliver(
    channel: int,
    consumer_tag: bytes,
    delivery_tag: int,
    redelivered: bool,
    exchange_and_key: bytes,
    properties: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    """basic.deliver + content; consumer_tag and exchange_and_key are shortstrs."""
    head, tail = deliver_frame_parts(channel, consumer_tag, exchange_and_key)
    return encode_deliver_between(head, tail, channel, delivery_tag, redelivered, properties, body, frame_max)


def deliver_frame_parts(channel: int, consumer_tag: bytes, exchange_and_key: bytes) -> tuple[bytes, bytes]:
    """basic.deliver's method frame before and after its delivery tag and redelivered
    bit: the same for every delivery of one consumer from one exchange and routing key,
    so a channel keeps them (`encode_deliver_between`)."""
    method_size = 4 + len(consumer_tag) + 9 + len(exchange_and_key)
    return (_method_head.pack(FRAME_METHOD, channel, method_size, BASIC_DELIVER_ID) + consumer_tag,
            exchange_and_key + FRAME_END_BYTE)


def encode_deliver_between(head: bytes, tail: bytes, channel: int, delivery_tag: int, redelivered: bool,
                           properties: bytes, body: bytes, frame_max: int) -> bytes:
    """basic.deliver from its `deliver_frame_parts`, + content. The frames are one join
    when the body fits one frame: the body is copied once."""
    body_size = len(body)
    if not 0 < body_size <= frame_max - FRAME_OVERHEAD_BYTES:
        return b"".join((head, _u64_bit.pack(delivery_tag, redelivered), tail,
                         encode_content(channel, properties, body, frame_max)))
    return b"".join((head, _u64_bit.pack(delivery_tag, redelivered), tail,
                     _content_header.pack(FRAME_HEADER, channel, 12 + len(properties), CLASS_BASIC, 0, body_size),
                     properties, FRAME_END_BYTE, _frame_header.pack(FRAME_BODY, channel, body_size), body,
                     FRAME_END_BYTE))


class DeliverFrames:
    """basic.deliver + content for one consumer's deliveries from one exchange and
    routing key, added to an output list as parts (the connection joins them once,
    so a body is copied once): what comes before the properties is one struct made
    for this method frame, packed in one call per delivery."""

    __slots__ = ("channel", "head", "tail", "_pack")

    def __init__(self, channel: int, consumer_tag: bytes, exchange_and_key: bytes) -> None:
        self.channel = channel
        self.head, self.tail = deliver_frame_parts(channel, consumer_tag, exchange_and_key)
        self._pack = struct.Struct(f">{len(self.head)}sQB{len(self.tail)}sBHIHHQ").pack

    def add(self, out: list, delivery_tag: int, redelivered: bool, properties: bytes, body: bytes,
            frame_max: int) -> int:
        """Adds one delivery's frames to `out`; returns their size."""
        body_size = len(body)
        if not 0 < body_size <= frame_max - FRAME_OVERHEAD_BYTES:
            frames = encode_deliver_between(self.head, self.tail, self.channel, delivery_tag, redelivered,
                                            properties, body, frame_max)
            out.append(frames)
            return len(frames)
        start = self._pack(self.head, delivery_tag, redelivered, self.tail, FRAME_HEADER, self.channel,
                           12 + len(properties), CLASS_BASIC, 0, body_size)
        out += (start, properties, _body_head.pack(FRAME_END, FRAME_BODY, self.channel, body_size), body,
                FRAME_END_BYTE)
        return len(start) + len(properties) + 8 + body_size + 1


def encode_get_ok(
    channel: int,
    delivery_tag: int,
    redelivered: bool,
    exchange_and_key: bytes,
    message_count: int,
    properties: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    args = _u64_bit.pack(delivery_tag, redelivered) + exchange_and_key + struct.pack(">I", message_count)
    method = (_frame_header.pack(FRAME_METHOD, channel, 4 + len(args)) + struct.pack(">I", BASIC_GET_OK_ID)
              + args + FRAME_END_BYTE)
    return method + encode_content(channel, properties, body, frame_max)


def encode_return(
    channel: int, reply_code: int, reply_text: str, exchange: str, routing_key: str,
    properties: bytes, body: bytes, frame_max: int,
) -> bytes:
    args = struct.pack(">H", reply_code) + shortstr(reply_text) + shortstr(exchange) + shortstr(routing_key)
    method = (_frame_header.pack(FRAME_METHOD, channel, 4 + len(args)) + struct.pack(">I", BASIC_RETURN_ID)
              + args + FRAME_END_BYTE)
    return method + encode_content(channel, properties, body, frame_max)


def encode_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    return _ack.pack(FRAME_METHOD, channel, 13, BASIC_ACK_ID, delivery_tag, multiple) + FRAME_END_BYTE


def encode_nack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    # bits: multiple (bit 0), requeue (bit 1); a broker's nack never requeues.
    return _ack.pack(FRAME_METHOD, channel, 13, BASIC_NACK_ID, delivery_tag, multiple) + FRAME_END_BYTE


def decode_properties(properties: bytes) -> spec.Basic.Properties:
    """Full decode of a raw content header property list (the rare path)."""
    flags = 0
    offset = 0
    shift = 0
    while True:
        (partial,) = struct.unpack_from(">H", properties, offset)
        offset += 2
        flags |= (partial & 0xFFFE) << shift
        if not partial & 1:
            break
        shift += 16
    decoded = spec.Basic.Properties()
    decoded.unmarshal(flags, properties[offset:])
    return decoded


def encode_properties(properties: spec.Basic.Properties) -> bytes:
    return properties.marshal()


def property_flags(properties: bytes) -> int:
    return (properties[0] << 8) | properties[1]


def headers_of(properties: bytes) -> dict | None:
    """The headers table, or None; the full decode happens only when there is one."""
    flags = property_flags(properties)
    if not flags & PROP_HEADERS:
        return None
    return decode_properties(properties).headers


def is_persistent(properties: bytes) -> bool:
    """delivery_mode == 2, read without a full decode."""
    flags = property_flags(properties)
    if not flags & PROP_DELIVERY_MODE:
        return False
    if flags & 0xE000 == 0 and not flags & 1:
        return properties[2] == 2
    return decode_properties(properties).delivery_mode == 2


def decode_table(raw: bytes) -> dict:
    return pamqp_decode.field_table(raw)[1]


def expiration_ms(value: object) -> int:
    """The expiration property: milliseconds as a decimal string (RabbitMQ's rule)."""
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    if not text.isdigit():
        negative = text.startswith("-") and text[1:].isdigit()
        reason = f"{{value_negative,{text}}}" if negative else f"{{leftover_string,{text}}}"
        raise ChannelError(PRECONDITION_FAILED, f"invalid expiration '{text}': {reason}", 60, 40)
    return int(text)
