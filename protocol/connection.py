"""Sans-I/O AMQP 0-9-1 server connection: bytes in, events out.

Theory of operation. ``receive_data(bytes)`` parses as many whole frames as
the buffer holds and returns a list of events; the caller (the asyncio shell)
acts on them and writes whatever the broker answers. The machine tracks only
what the wire protocol itself defines (AMQP 0-9-1 §2.3, §4.2):

* the protocol header, then the connection handshake on channel 0, in order
  start-ok → tune-ok → open; anything else is 504/503 as RabbitMQ sends;
* per channel: closed → open → closing (after the server sent channel.close
  only close-ok and close are looked at, §4.2.6 "the peer must discard");
* content assembly: after basic.publish the channel expects exactly one
  content header and then body frames up to the announced size (505
  UNEXPECTED_FRAME otherwise);
* frame limits: a payload over frame_max (501 FRAME_ERROR; RabbitMQ lets a frame be 8 bytes
  over), max message size (406), channel_max open channels (530).

Events are tuples, first element the kind, because one is made per message:
  (EV_METHOD, channel, pamqp_method)
  (EV_PUBLISH, channel, exchange, routing_key, mandatory, immediate, properties, body)
  (EV_ACK, channel, delivery_tag, multiple)
  (EV_NACK, channel, delivery_tag, multiple, requeue)
  (EV_REJECT, channel, delivery_tag, requeue)
  (EV_HEARTBEAT, 0)
A soft error inside a channel becomes (EV_CHANNEL_ERROR, channel, ChannelError)
and a hard error raises AMQPConnectionError out of ``receive_data`` after the
events parsed before it have been returned through ``pending_events``.
"""
from __future__ import annotations

import struct

from pamqp import commands as spec

from warren.protocol.constants import (
    BASIC_ACK,
    BASIC_CONSUME,
    BASIC_NACK,
    BASIC_PUBLISH,
    BASIC_REJECT,
    CHANNEL_ERROR,
    COMMAND_INVALID,
    FRAME_BODY,
    FRAME_END,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
    FRAME_OVERHEAD_BYTES,
    NOT_ALLOWED,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    PROTOCOL_HEADER,
    SYNTAX_ERROR,
    UNEXPECTED_FRAME,
)
from warren.protocol.errors import AMQPConnectionError, ChannelError

EV_METHOD = 0
EV_PUBLISH = 1
EV_ACK = 2
EV_NACK = 3
EV_REJECT = 4
EV_HEARTBEAT = 5
EV_CHANNEL_ERROR = 6

# Connection states (channel 0), in handshake order.
AWAIT_HEADER = "header"
AWAIT_START_OK = "start_ok"
AWAIT_TUNE_OK = "tune_ok"
AWAIT_OPEN = "open"
OPEN = "opened"
CLOSING = "closing"
CLOSED = "closed"

_HANDSHAKE_EXPECTS = {
    AWAIT_START_OK: spec.Connection.StartOk,
    AWAIT_TUNE_OK: spec.Connection.TuneOk,
    AWAIT_OPEN: spec.Connection.Open,
}

_frame_header = struct.Struct(">BHI")
_method_id = struct.Struct(">I")
_content_header = struct.Struct(">HHQ")
_ack_args = struct.Struct(">QB")
_u16 = struct.Struct(">H")

_CHANNEL_OPEN = "open"
# A part of a body of several frames (or of a frame the reads cut) is referenced where it
# was read, not copied, when it is at least this long and a quarter of its read: the body
# is then copied once, when its parts are joined, and what a body's parts keep alive is at
# most four times its size.
_BODY_VIEW_MIN_BYTES = 2048
# What a connection commits itself to a queue with (ServerConnection.stop_at_commitment).
_COMMITMENTS = frozenset({BASIC_PUBLISH, BASIC_CONSUME})
_CHANNEL_CLOSING = "closing"


class _Content:
    """A basic.publish waiting for its header and body frames."""

    __slots__ = ("exchange", "routing_key", "mandatory", "immediate", "properties", "body_size", "parts", "received")

    def __init__(self, exchange: str, routing_key: str, mandatory: bool, immediate: bool):
        self.exchange = exchange
        self.routing_key = routing_key
        self.mandatory = mandatory
        self.immediate = immediate
        self.properties: bytes | None = None
        self.body_size = 0
        self.parts: list[bytes | memoryview] = []
        self.received = 0


class ServerConnection:
    def __init__(self, frame_max: int, channel_max: int, max_message_size_bytes: int):
        self.state = AWAIT_HEADER
        self.frame_max = frame_max
        self.channel_max = channel_max
        self.max_message_size_bytes = max_message_size_bytes
        self.channels: dict[int, str] = {}
        self._contents: dict[int, _Content] = {}
        self._buffer = b""
        # A body frame the last read cut, taken as it comes: (its channel, its content, the
        # bytes still to come including the frame end).
        self._cut_body: tuple[int, _Content, int] | None = None
        self.pending_events: list[tuple] = []
        # Set by the shell while it may still hand the connection to another process:
        # parsing stops before the first basic.publish or basic.consume on an open
        # channel (its frame and what follows stay unparsed, `unparsed`), and
        # `stopped_at` is (channel, method id, the method's argument bytes).
        self.stop_at_commitment = False
        self.stopped_at: tuple[int, int, bytes] | None = None

    # -- input ------------------------------------------------------------
    def receive_data(self, data: bytes) -> list[tuple]:
        """Parse whole frames; return their events. Raises AMQPConnectionError."""
        events: list[tuple] = []
        self.pending_events = events
        if self._cut_body is not None:
            start = self._continue_body(self._cut_body, data, events)
            return events if self._cut_body is not None else self._parse_rest(data, start, events)
        split = self._completing_bytes(len(data)) if self._buffer else 0
        if split:
            # The frame the last read cut, completed with just the bytes it lacks; the rest of
            # `data` is parsed where it lies. Joining all of it to the remainder copied every
            # byte of a read that ended inside a frame, as reads of large messages nearly
            # always do (a body was copied twice on its way to the disk).
            first = self._buffer + data[:split]
            pos = self._parse(first, 0, events)
            if pos < len(first):   # parsing stopped inside it (a commitment): the rest waits as it came
                self._buffer = first[pos:] + data[split:]
                return events
            pos = self._parse(data, split, events)
            self._buffer = data[pos:] if pos < len(data) else b""
            return events
        buf = self._buffer + data if self._buffer else data
        if self.state == AWAIT_HEADER:
            after = self._after_protocol_header(buf)
            if after is None:
                return events
            buf = after
        return self._parse_rest(buf, 0, events)

    def _parse_rest(self, buf: bytes, start: int, events: list) -> list[tuple]:
        """The whole frames of `buf` from `start` on; what they leave waits for the next read."""
        pos = self._parse(buf, start, events)
        self._buffer = buf[pos:] if pos < len(buf) else b""
        return events

    def _continue_body(self, cut: tuple[int, _Content, int], data: bytes, events: list) -> int:
        """The next bytes of the body frame the last read cut; where the rest of `data`
        begins (`_cut_body` stays set while the frame goes on into the next read)."""
        channel, content, rest = cut
        taken = min(len(data), rest - 1)
        if taken:
            content.parts.append(_part(data, 0, taken))
        if len(data) < rest:
            self._cut_body = (channel, content, rest - len(data))
            return 0
        self._cut_body = None
        if data[rest - 1] != FRAME_END:
            raise AMQPConnectionError(FRAME_ERROR, f"frame end marker missing (type {FRAME_BODY}, channel {channel})")
        if content.received == content.body_size and self._contents.get(channel) is content:
            self._complete(channel, content, b"".join(content.parts), events)
        return rest

    def _take_cut_body(self, channel: int, buf: bytes, start: int, frame_end: int) -> bool:
        """A body frame whose end the read has not brought yet, taken as far as it goes
        (its bytes referenced where they lie when worth it, `_part`), the rest from the next
        reads (`_continue_body`). Only one of a content arriving as it should: anything else
        waits whole and is judged by `_on_body`, so an error is the same however it was read."""
        content = self._contents.get(channel)
        size = frame_end - start
        if (content is None or content.properties is None or content.received + size > content.body_size
                or self.stop_at_commitment):
            return False
        content.received += size
        if len(buf) > start:
            content.parts.append(_part(buf, start, len(buf)))
        self._cut_body = (channel, content, frame_end + 1 - len(buf))
        return True

    def _completing_bytes(self, available: int) -> int:
        """How many bytes of the next read complete the frame the unparsed input starts
        with, if fewer than `available` (else 0: the input is joined whole, as when it
        holds frames left unparsed at a commitment, or not even a frame's header)."""
        buf = self._buffer
        if self.state == AWAIT_HEADER or self.stopped_at is not None or len(buf) < 7:
            return 0
        need = 8 + _frame_header.unpack_from(buf, 0)[2] - len(buf)
        return need if 0 < need < available else 0

    def _parse(self, buf: bytes, pos: int, events: list) -> int:
        """The whole frames of `buf` from `pos` on, as events; returns where parsing stopped."""
        end = len(buf)
        frame_max = self.frame_max
        unpack_header = _frame_header.unpack_from
        while end - pos >= 7:
            frame_type, channel, size = unpack_header(buf, pos)
            if size > frame_max:
                raise _frame_too_large(frame_type, size, frame_max)
            frame_end = pos + 7 + size
            if frame_end >= end:
                if frame_type == FRAME_BODY and self._take_cut_body(channel, buf, pos + 7, frame_end):
                    pos = end
                break
            if buf[frame_end] != FRAME_END:
                raise AMQPConnectionError(
                    FRAME_ERROR, f"frame end marker missing (type {frame_type}, channel {channel})")
            payload_start = pos + 7
            pos = frame_end + 1
            if frame_type == FRAME_METHOD:
                if size < 4:
                    raise AMQPConnectionError(FRAME_ERROR, "method frame too short")
                (method_id,) = _method_id.unpack_from(buf, payload_start)
                if channel and self.channels.get(channel) is _CHANNEL_OPEN and channel not in self._contents:
                    if self.stop_at_commitment and method_id in _COMMITMENTS:
                        self.stopped_at = (channel, method_id, buf[payload_start + 4:frame_end])
                        pos = payload_start - 7   # the frame's start: it stays unparsed
                        break
                    # Fast path: the hot methods on an open channel.
                    if method_id == BASIC_PUBLISH:
                        pos = self._publish_whole(channel, buf, payload_start + 4, frame_end, end, events)
                        continue
                    if method_id == BASIC_ACK:
                        tag, bits = self._ack_args(buf, payload_start, frame_end)
                        events.append((EV_ACK, channel, tag, bool(bits & 1)))
                        continue
                    if method_id == BASIC_NACK:
                        tag, bits = self._ack_args(buf, payload_start, frame_end)
                        events.append((EV_NACK, channel, tag, bool(bits & 1), bool(bits & 2)))
                        continue
                    if method_id == BASIC_REJECT:
                        tag, bits = self._ack_args(buf, payload_start, frame_end)
                        events.append((EV_REJECT, channel, tag, bool(bits & 1)))
                        continue
                self._on_method_frame(channel, method_id, buf[payload_start + 4:frame_end], events)
            elif frame_type == FRAME_BODY:
                self._on_body(channel, buf, payload_start, frame_end, events)
            elif frame_type == FRAME_HEADER:
                self._on_header(channel, buf[payload_start:frame_end], events)
            elif frame_type == FRAME_HEARTBEAT:
                if channel != 0:
                    raise AMQPConnectionError(FRAME_ERROR, f"heartbeat frame on channel {channel}")
                events.append((EV_HEARTBEAT, 0))
            else:
                raise AMQPConnectionError(FRAME_ERROR, f"unknown frame type {frame_type}")
        return pos

    def _after_protocol_header(self, buf: bytes) -> bytes | None:
        """The input after the protocol header; None while it is not whole yet."""
        if len(buf) < 8:
            self._buffer = buf
            if PROTOCOL_HEADER.startswith(bytes(buf)):
                return None
            raise BadProtocolHeader()
        if buf[:8] != PROTOCOL_HEADER:
            raise BadProtocolHeader()
        self.state = AWAIT_START_OK
        return buf[8:]

    @property
    def unparsed(self) -> bytes:
        """What was received and not yet parsed (a partial frame, or all from a stop on)."""
        return self._buffer

    def resume(self) -> None:
        """Parse on past a commitment and stop at none again; `receive_data(b"")` then
        parses what was left."""
        self.stop_at_commitment = False
        self.stopped_at = None

    @staticmethod
    def _ack_args(buf: bytes, payload_start: int, frame_end: int) -> tuple[int, int]:
        if frame_end - payload_start != 13:
            raise AMQPConnectionError(SYNTAX_ERROR, "malformed basic.ack/nack/reject arguments")
        return _ack_args.unpack_from(buf, payload_start + 4)

    @staticmethod
    def _publish_args(buf: bytes, start: int, stop: int) -> tuple[str, str, bool, bool]:
        # basic.publish: reserved short, exchange shortstr, routing-key shortstr, bits.
        try:
            at = start + 2
            length = buf[at]
            exchange = buf[at + 1:at + 1 + length].decode()
            at += 1 + length
            length = buf[at]
            routing_key = buf[at + 1:at + 1 + length].decode()
            at += 1 + length
            bits = buf[at]
        except (IndexError, UnicodeDecodeError):
            raise AMQPConnectionError(SYNTAX_ERROR, "malformed basic.publish arguments") from None
        if at + 1 != stop:
            raise AMQPConnectionError(SYNTAX_ERROR, "malformed basic.publish arguments")
        return exchange, routing_key, bool(bits & 1), bool(bits & 2)

    def _publish_whole(self, channel: int, buf: bytes, args_start: int, frame_end: int, end: int,
                       events: list) -> int:
        """A basic.publish whose arguments lie in ``buf[args_start:frame_end]``: when its content
        header and its one body frame follow whole in ``buf`` (the common case),
        the message's event straight away, the body sliced once from the buffer,
        and the offset after them; otherwise the content is awaited frame by
        frame (`_on_header`, `_on_body`, which say what is wrong with anything
        unusual) and the offset after the method frame is returned."""
        exchange, routing_key, mandatory, immediate = self._publish_args(buf, args_start, frame_end)
        pos = frame_end + 1
        if end - pos >= 7:
            frame_type, on_channel, size = _frame_header.unpack_from(buf, pos)
            header_end = pos + 7 + size
            if (frame_type == FRAME_HEADER and on_channel == channel and 14 <= size <= self.frame_max
                    and header_end < end and buf[header_end] == FRAME_END):
                class_id, _weight, body_size = _content_header.unpack_from(buf, pos + 7)
                if class_id == 60 and body_size <= self.max_message_size_bytes:
                    if body_size == 0:
                        events.append((EV_PUBLISH, channel, exchange, routing_key, mandatory, immediate,
                                       buf[pos + 19:header_end], b""))
                        return header_end + 1
                    body_at = header_end + 1
                    if end - body_at >= 7:
                        frame_type, on_channel, size = _frame_header.unpack_from(buf, body_at)
                        body_end = body_at + 7 + size
                        if (frame_type == FRAME_BODY and on_channel == channel and size == body_size
                                and size <= self.frame_max and body_end < end and buf[body_end] == FRAME_END):
                            events.append((EV_PUBLISH, channel, exchange, routing_key, mandatory, immediate,
                                           buf[pos + 19:header_end], buf[body_at + 7:body_end]))
                            return body_end + 1
        self._contents[channel] = _Content(exchange, routing_key, mandatory, immediate)
        return pos

    def _on_method_frame(self, channel: int, method_id: int, args: bytes, events: list) -> None:
        method_type = spec.INDEX_MAPPING.get(method_id)
        if method_type is None:
            raise AMQPConnectionError(
                NOT_IMPLEMENTED, f"unknown method class {method_id >> 16} method {method_id & 0xFFFF}",
                method_id >> 16, method_id & 0xFFFF)
        method = method_type()
        try:
            method.unmarshal(args)
        except Exception:  # pamqp raises many types on garbage; all mean the same.
            raise AMQPConnectionError(
                SYNTAX_ERROR, f"malformed arguments for {method.name}", method_id >> 16, method_id & 0xFFFF) from None
        if channel == 0:
            self._on_channel0_method(method, events)
            return
        if self.state != OPEN:
            if self.state == CLOSING:
                return
            raise AMQPConnectionError(
                CHANNEL_ERROR, f"unexpected method on channel {channel} in connection state {self.state}")
        channel_state = self.channels.get(channel)
        if channel_state is None:
            if not isinstance(method, spec.Channel.Open):
                raise AMQPConnectionError(CHANNEL_ERROR, "expected 'channel.open'", method_id >> 16, method_id & 0xFFFF)
            # RabbitMQ 3.x (rabbit_reader:create_channel) limits how many channels are
            # open, whatever their numbers; its error names no method.
            if len(self.channels) >= self.channel_max:
                raise AMQPConnectionError(
                    NOT_ALLOWED, f"number of channels opened ({len(self.channels)}) has reached the "
                    f"negotiated channel_max ({self.channel_max})")
            self.channels[channel] = _CHANNEL_OPEN
        elif channel_state is _CHANNEL_CLOSING:
            # §4.2.6: after sending channel.close, discard all but close/close-ok.
            if isinstance(method, spec.Channel.CloseOk):
                del self.channels[channel]
            elif isinstance(method, spec.Channel.Close):
                events.append((EV_METHOD, channel, method))
            return
        elif isinstance(method, spec.Channel.Open):
            raise AMQPConnectionError(CHANNEL_ERROR, "second 'channel.open' seen", 20, 10)
        elif channel in self._contents:
            raise AMQPConnectionError(
                UNEXPECTED_FRAME, "expected content header for class 60, got non content header frame instead")
        events.append((EV_METHOD, channel, method))

    def _on_channel0_method(self, method, events: list) -> None:
        state = self.state
        if state == CLOSING:
            if isinstance(method, (spec.Connection.CloseOk, spec.Connection.Close)):
                events.append((EV_METHOD, 0, method))
            return
        if isinstance(method, spec.Connection.Close):
            events.append((EV_METHOD, 0, method))
            return
        expected = _HANDSHAKE_EXPECTS.get(state)
        if expected is not None:
            if not isinstance(method, expected):
                raise AMQPConnectionError(
                    COMMAND_INVALID, f"expected '{expected.name.lower()}', got '{method.name.lower()}'")
            self.state = {AWAIT_START_OK: AWAIT_TUNE_OK, AWAIT_TUNE_OK: AWAIT_OPEN, AWAIT_OPEN: OPEN}[state]
        elif not isinstance(method, (spec.Connection.UpdateSecret, spec.Connection.Blocked,
                                     spec.Connection.Unblocked, spec.Connection.CloseOk)):
            # rabbit_reader:handle_method0's last clause (the state is always 'running' here)
            raise AMQPConnectionError(CHANNEL_ERROR, "unexpected method in connection state running")
        events.append((EV_METHOD, 0, method))

    def _on_header(self, channel: int, payload: bytes, events: list) -> None:
        content = self._content_for(channel, "content header")
        if content is None:
            return
        if content.properties is not None:
            raise AMQPConnectionError(
                UNEXPECTED_FRAME, "expected content body, got non content body frame instead")
        if len(payload) < 14:
            raise AMQPConnectionError(FRAME_ERROR, "content header frame too short")
        class_id, _weight, body_size = _content_header.unpack_from(payload, 0)
        if class_id != 60:
            raise AMQPConnectionError(
                UNEXPECTED_FRAME, f"expected content header for class 60, got class {class_id}")
        if body_size > self.max_message_size_bytes:
            del self._contents[channel]
            # Closing from here on: the body frames that follow (often in this same
            # read) are discarded instead of being taken for out-of-order frames.
            self.channels[channel] = _CHANNEL_CLOSING
            events.append((EV_CHANNEL_ERROR, channel, ChannelError(
                PRECONDITION_FAILED,
                f"message size {body_size} is larger than configured max size {self.max_message_size_bytes}",
                60, 40)))
            return
        content.properties = payload[12:]
        content.body_size = body_size
        if body_size == 0:
            self._complete(channel, content, b"", events)

    def _on_body(self, channel: int, buf: bytes, start: int, stop: int, events: list) -> None:
        content = self._content_for(channel, "content body")
        if content is None:
            return
        if content.properties is None:
            raise AMQPConnectionError(
                UNEXPECTED_FRAME, "expected content header for class 60, got non content header frame instead")
        content.received += stop - start
        if content.received > content.body_size:
            raise AMQPConnectionError(
                FRAME_ERROR, f"content body exceeds announced size {content.body_size}")
        if content.received == content.body_size and not content.parts:
            self._complete(channel, content, buf[start:stop], events)
            return
        content.parts.append(_part(buf, start, stop))
        if content.received == content.body_size:
            self._complete(channel, content, b"".join(content.parts), events)

    def _content_for(self, channel: int, what: str) -> _Content | None:
        content = self._contents.get(channel)
        if content is not None:
            return content
        if channel == 0:
            raise AMQPConnectionError(UNEXPECTED_FRAME, f"{what} frame on channel 0")
        channel_state = self.channels.get(channel)
        if channel_state is _CHANNEL_CLOSING or self.state == CLOSING:
            return None  # discarded while closing, §4.2.6
        if channel_state is None:
            raise AMQPConnectionError(CHANNEL_ERROR, "expected 'channel.open'")
        raise AMQPConnectionError(
            UNEXPECTED_FRAME, f"expected method frame, got non method frame instead ({what})")

    def _complete(self, channel: int, content: _Content, body: bytes, events: list) -> None:
        del self._contents[channel]
        events.append((EV_PUBLISH, channel, content.exchange, content.routing_key,
                       content.mandatory, content.immediate, content.properties, body))

    # -- output-driven transitions ---------------------------------------
    def tune(self, frame_max: int, channel_max: int) -> None:
        """Apply the values negotiated by connection.tune-ok."""
        self.frame_max = max(frame_max, FRAME_MIN_SIZE)
        self.channel_max = channel_max

    def close_channel(self, channel: int) -> None:
        """The server sent channel.close: ignore the channel until close-ok."""
        if channel in self.channels:
            self.channels[channel] = _CHANNEL_CLOSING
        self._contents.pop(channel, None)

    def channel_closed(self, channel: int) -> None:
        """The channel is gone (server sent close-ok, or got it)."""
        self.channels.pop(channel, None)
        self._contents.pop(channel, None)

    def start_closing(self) -> None:
        """The server sent connection.close: only close-ok matters now."""
        self.state = CLOSING
        self._contents.clear()
        self.channels.clear()  # nothing on any channel matters any more


def _part(buf: bytes, start: int, stop: int) -> bytes | memoryview:
    """`buf[start:stop]`, a part of a body to be joined: a view where copying it now would
    copy it twice (see _BODY_VIEW_MIN_BYTES), else the bytes."""
    size = stop - start
    if size >= _BODY_VIEW_MIN_BYTES and 4 * size >= len(buf):
        return memoryview(buf)[start:stop]
    return buf[start:stop]


def _frame_too_large(frame_type: int, size: int, frame_max: int) -> AMQPConnectionError:
    """RabbitMQ's words. Its limit is frame_max - 8 for the payload plus a FRAME_SIZE_FUDGE of
    8 more "since quite a few [clients] get it wrong": a payload up to frame_max passes."""
    limit = frame_max - FRAME_OVERHEAD_BYTES
    return AMQPConnectionError(
        FRAME_ERROR, f"type {frame_type}, all octets = <<>>: {{frame_too_large,{size},{limit}}}")


class BadProtocolHeader(Exception):
    """The peer did not open with AMQP 0-9-1's header; answer with ours and close."""

