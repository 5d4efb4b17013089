"""Transcripts of the sans-I/O server connection (protocol/connection.py).

Each test is a short conversation: the bytes a client sends, and the events
(or the hard error) the parser must produce. Client frames are built with
pamqp, independently of Warren's own encoder.
"""
from __future__ import annotations

import struct

import pytest
from pamqp import commands as spec

from tests.unit.wire import (
    FRAME_MAX,
    HANDSHAKE,
    channel_open,
    connection_open,
    content_body,
    content_header,
    describe,
    heartbeat,
    method,
    new_connection,
    normalise,
    opened_connection,
    publish,
    raw_frame,
    start_ok,
    tune_ok,
)
from warren.protocol.connection import (
    AWAIT_OPEN,
    AWAIT_START_OK,
    AWAIT_TUNE_OK,
    OPEN,
    BadProtocolHeader,
)
from warren.protocol.constants import (
    CHANNEL_ERROR,
    COMMAND_INVALID,
    FRAME_BODY,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_METHOD,
    NOT_ALLOWED,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    PROTOCOL_HEADER,
    SYNTAX_ERROR,
    UNEXPECTED_FRAME,
)
from warren.protocol.errors import AMQPConnectionError


def hard_error(conn, data: bytes) -> AMQPConnectionError:
    """Feed data that must end the connection; return the error."""
    with pytest.raises(AMQPConnectionError) as info:
        events = conn.receive_data(data)
        pytest.fail(f"expected a hard error, got events {describe(events)}")
    return info.value


def assert_reply(error: AMQPConnectionError, code: int, what: str) -> None:
    assert error.reply_code == code, (
        f"{what}: expected reply code {code}, got {error.reply_code} ({error.text!r})")


def methods(events: list) -> list[tuple]:
    return [(e[1], e[2].name) for e in events]


# -- the connection handshake ---------------------------------------------------

def test_handshake_transcript_header_start_ok_tune_ok_open():
    conn = new_connection()
    assert conn.receive_data(PROTOCOL_HEADER) == [], "the protocol header alone produces no event"
    assert conn.state == AWAIT_START_OK, f"after the header the state should wait for start-ok, is {conn.state}"

    events = conn.receive_data(start_ok())
    assert methods(events) == [(0, "Connection.StartOk")], f"start-ok: {describe(events)}"
    assert events[0][2].mechanism == "PLAIN", "start-ok's mechanism not decoded"
    assert events[0][2].response == "\0guest\0guest", "start-ok's response not decoded"
    assert conn.state == AWAIT_TUNE_OK, f"after start-ok the state should be tune_ok, is {conn.state}"

    events = conn.receive_data(tune_ok(frame_max=8192, channel_max=10))
    assert methods(events) == [(0, "Connection.TuneOk")], f"tune-ok: {describe(events)}"
    assert (events[0][2].frame_max, events[0][2].channel_max) == (8192, 10), "tune-ok values not decoded"
    assert conn.state == AWAIT_OPEN, f"after tune-ok the state should be open-wait, is {conn.state}"

    events = conn.receive_data(connection_open())
    assert methods(events) == [(0, "Connection.Open")], f"open: {describe(events)}"
    assert conn.state == OPEN, f"after connection.open the connection should be open, is {conn.state}"

    events = conn.receive_data(channel_open(1))
    assert methods(events) == [(1, "Channel.Open")], f"channel.open: {describe(events)}"


def test_whole_handshake_in_one_chunk_gives_the_three_methods_in_order():
    conn = new_connection()
    events = conn.receive_data(HANDSHAKE + channel_open(1))
    assert methods(events) == [
        (0, "Connection.StartOk"), (0, "Connection.TuneOk"), (0, "Connection.Open"), (1, "Channel.Open"),
    ], f"one-chunk handshake: {describe(events)}"


@pytest.mark.parametrize("header", [
    b"AMQP\x00\x00\x09\x00",  # 0-9-0
    b"AMQP\x01\x01\x00\x09",  # 0-8 as sent by old clients
    b"AMQP\x00\x01\x00\x00",  # AMQP 1.0
    b"GET / HTTP/1.1\r\n\r\n",
    b"\x01\x00\x00\x00\x00\x00\x05\xce",  # a frame with no header at all
])
def test_wrong_protocol_header_raises_bad_protocol_header(header):
    conn = new_connection()
    with pytest.raises(BadProtocolHeader):
        events = conn.receive_data(header)
        pytest.fail(f"header {header!r} accepted, events {describe(events)}")


def test_short_wrong_prefix_is_refused_without_waiting_for_eight_bytes():
    conn = new_connection()
    with pytest.raises(BadProtocolHeader):
        conn.receive_data(b"GET")


@pytest.mark.parametrize("cut", range(1, 8))
def test_partial_header_is_buffered_until_complete(cut):
    conn = new_connection()
    assert conn.receive_data(PROTOCOL_HEADER[:cut]) == [], f"first {cut} header bytes gave events"
    assert conn.state != AWAIT_START_OK, "state advanced before the header was complete"
    events = conn.receive_data(PROTOCOL_HEADER[cut:] + start_ok())
    assert methods(events) == [(0, "Connection.StartOk")], f"header split at {cut}: {describe(events)}"


def test_header_fed_byte_by_byte_then_start_ok():
    conn = new_connection()
    for i, byte in enumerate(PROTOCOL_HEADER):
        assert conn.receive_data(bytes((byte,))) == [], f"header byte {i} produced events"
    assert conn.state == AWAIT_START_OK, f"after all 8 header bytes state is {conn.state}"
    assert methods(conn.receive_data(start_ok())) == [(0, "Connection.StartOk")]


@pytest.mark.parametrize("sent_before, wrong, name", [
    (b"", tune_ok(), "tune-ok before start-ok"),
    (b"", connection_open(), "open before start-ok"),
    (start_ok(), start_ok(), "start-ok twice"),
    (start_ok(), connection_open(), "open before tune-ok"),
    (start_ok() + tune_ok(), tune_ok(), "tune-ok twice"),
    (start_ok() + tune_ok(), start_ok(), "start-ok after tune-ok"),
    (b"", method(0, spec.Channel.Open()), "channel.open on channel 0"),
    (b"", method(0, spec.Basic.Qos(prefetch_count=1)), "basic.qos on channel 0 in handshake"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_handshake_methods_out_of_order_are_command_invalid(sent_before, wrong, name):
    conn = new_connection()
    conn.receive_data(PROTOCOL_HEADER + sent_before)
    error = hard_error(conn, wrong)
    assert_reply(error, COMMAND_INVALID, name)


@pytest.mark.parametrize("sent_before", [b"", start_ok(), start_ok() + tune_ok()],
                         ids=["after-header", "after-start-ok", "after-tune-ok"])
def test_channel_open_before_connection_open_is_channel_error(sent_before):
    conn = new_connection()
    conn.receive_data(PROTOCOL_HEADER + sent_before)
    error = hard_error(conn, channel_open(1))
    assert_reply(error, CHANNEL_ERROR, f"channel.open in state {conn.state}")


def test_connection_close_is_accepted_during_the_handshake():
    conn = new_connection()
    events = conn.receive_data(PROTOCOL_HEADER + start_ok() + method(0, spec.Connection.Close(
        reply_code=200, reply_text="bye", class_id=0, method_id=0)))
    assert methods(events) == [(0, "Connection.StartOk"), (0, "Connection.Close")], describe(events)


@pytest.mark.parametrize("wrong", [spec.Basic.Ack(delivery_tag=1), spec.Channel.Open(), spec.Connection.Open(),
                                   spec.Connection.TuneOk(channel_max=1, frame_max=4096, heartbeat=0),
                                   spec.Connection.StartOk(mechanism="PLAIN", response="\0guest\0guest")],
                         ids=lambda m: m.name)
def test_an_unexpected_method_on_channel_0_of_an_open_connection_is_504(wrong):
    """rabbit_reader:handle_method0's last clause: 504 CHANNEL_ERROR "unexpected method in
    connection state running", blaming no method (aiormq's own tests send basic.ack there)."""
    conn = opened_connection(1)
    error = hard_error(conn, method(0, wrong))
    assert_reply(error, CHANNEL_ERROR, f"{wrong.name} on channel 0")
    assert error.reply_text == "CHANNEL_ERROR - unexpected method in connection state running", error.reply_text
    assert (error.class_id, error.method_id) == (0, 0)


# -- channels -------------------------------------------------------------------

def test_method_on_unopened_channel_is_channel_error():
    conn = opened_connection(1)
    error = hard_error(conn, method(2, spec.Basic.Qos(prefetch_count=10)))
    assert_reply(error, CHANNEL_ERROR, "basic.qos on channel 2, never opened")


@pytest.mark.parametrize("frame, what", [
    (method(2, spec.Basic.Ack(delivery_tag=1)), "basic.ack"),
    (method(2, spec.Basic.Publish(exchange="", routing_key="q")), "basic.publish"),
    (content_header(2, 3), "content header"),
    (content_body(2, b"abc"), "content body"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_hot_frames_on_unopened_channel_are_channel_error(frame, what):
    conn = opened_connection(1)
    error = hard_error(conn, frame)
    assert_reply(error, CHANNEL_ERROR, f"{what} on channel 2, never opened")


def test_second_channel_open_is_channel_error():
    conn = opened_connection(1)
    error = hard_error(conn, channel_open(1))
    assert_reply(error, CHANNEL_ERROR, "second channel.open on channel 1")
    assert (error.class_id, error.method_id) == (20, 10), (
        f"the error should blame channel.open (20, 10), blames {(error.class_id, error.method_id)}")


def test_channel_max_limits_open_channels_not_channel_numbers():
    """RabbitMQ 3.x (rabbit_reader:create_channel): only the count of open channels is limited."""
    conn = opened_connection(*range(1, 16))  # channel_max 16
    assert methods(conn.receive_data(channel_open(65535))) == [(65535, "Channel.Open")], "channel 65535 refused"
    error = hard_error(conn, channel_open(17))
    assert_reply(error, NOT_ALLOWED, "a 17th open channel with channel_max 16")
    assert error.text == "number of channels opened (16) has reached the negotiated channel_max (16)", error.text
    assert (error.class_id, error.method_id) == (0, 0), f"error blames {(error.class_id, error.method_id)}"


def test_channels_are_independent():
    conn = opened_connection(1, 2)
    events = conn.receive_data(
        method(2, spec.Basic.Qos(prefetch_count=5)) + method(1, spec.Basic.Qos(prefetch_count=7)))
    assert [(e[1], e[2].prefetch_count) for e in events] == [(2, 5), (1, 7)], describe(events)


# -- content assembly -------------------------------------------------------------

@pytest.mark.parametrize("frame, what", [
    (content_header(1, 3), "content header"),
    (content_body(1, b"abc"), "content body"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_content_without_publish_is_unexpected_frame(frame, what):
    conn = opened_connection(1)
    error = hard_error(conn, frame)
    assert_reply(error, UNEXPECTED_FRAME, f"{what} with no basic.publish before it")


def test_method_while_publish_awaits_its_header_is_unexpected_frame():
    conn = opened_connection(1)
    assert conn.receive_data(method(1, spec.Basic.Publish(exchange="", routing_key="q"))) == []
    error = hard_error(conn, method(1, spec.Basic.Qos(prefetch_count=1)))
    assert_reply(error, UNEXPECTED_FRAME, "basic.qos where the content header was due")


def test_hot_ack_while_publish_awaits_its_header_is_unexpected_frame():
    conn = opened_connection(1)
    conn.receive_data(method(1, spec.Basic.Publish(exchange="", routing_key="q")))
    error = hard_error(conn, method(1, spec.Basic.Ack(delivery_tag=1)))
    assert_reply(error, UNEXPECTED_FRAME, "basic.ack where the content header was due")


def test_second_publish_while_first_awaits_its_body_is_unexpected_frame():
    conn = opened_connection(1)
    conn.receive_data(method(1, spec.Basic.Publish(exchange="", routing_key="q")) + content_header(1, 10))
    error = hard_error(conn, method(1, spec.Basic.Publish(exchange="", routing_key="q")))
    assert_reply(error, UNEXPECTED_FRAME, "basic.publish where a body frame was due")


def test_second_content_header_is_unexpected_frame():
    conn = opened_connection(1)
    conn.receive_data(method(1, spec.Basic.Publish(exchange="", routing_key="q")) + content_header(1, 10))
    error = hard_error(conn, content_header(1, 10))
    assert_reply(error, UNEXPECTED_FRAME, "content header where a body frame was due")


def test_body_beyond_announced_size_is_frame_error():
    conn = opened_connection(1)
    conn.receive_data(method(1, spec.Basic.Publish(exchange="", routing_key="q")) + content_header(1, 3))
    error = hard_error(conn, content_body(1, b"abcd"))
    assert_reply(error, FRAME_ERROR, "4 body bytes for an announced size of 3")


def test_other_channels_and_heartbeats_may_interleave_with_content():
    conn = opened_connection(1, 2)
    events = conn.receive_data(
        method(1, spec.Basic.Publish(exchange="x", routing_key="k"))
        + content_header(1, 6)
        + heartbeat()
        + content_body(1, b"abc")
        + method(2, spec.Basic.Qos(prefetch_count=3))
        + content_body(1, b"def"))
    assert describe(events) == [
        ("heartbeat", 0),
        ("method", 2, "Basic.Qos"),
        ("publish", 1, "x", "k", False, False, "6 body bytes"),
    ], "interleaved frames of other channels must not disturb content assembly"
    assert events[-1][7] == b"abcdef", f"assembled body is {events[-1][7]!r}"


def test_publish_assembled_from_header_and_several_body_frames():
    conn = opened_connection(1)
    body = bytes(range(256)) * 40  # 10240 bytes
    properties = spec.Basic.Properties(content_type="text/plain", delivery_mode=2, headers={"a": 1})
    events = conn.receive_data(publish(1, body, exchange="amq.topic", routing_key="a.b",
                                       properties=properties, chunk=3000, mandatory=True))
    assert len(events) == 1, f"one publish expected, got {describe(events)}"
    kind, channel, exchange, routing_key, mandatory, immediate, props, got_body = normalise(events[0])
    assert (kind, channel, exchange, routing_key) == ("publish", 1, "amq.topic", "a.b"), describe(events)
    assert (mandatory, immediate) == (True, False), f"flags decoded as mandatory={mandatory} immediate={immediate}"
    assert got_body == body, f"body of {len(got_body)} bytes differs from the {len(body)} sent in 4 frames"
    assert props == properties.marshal(), "raw properties differ from what the client encoded"


def test_publish_with_zero_size_body_completes_at_the_header():
    conn = opened_connection(1)
    events = conn.receive_data(method(1, spec.Basic.Publish(exchange="", routing_key="q")) + content_header(1, 0))
    assert describe(events) == [("publish", 1, "", "q", False, False, "0 body bytes")], describe(events)
    assert events[0][7] == b"", "zero-size body should be b''"
    events = conn.receive_data(method(1, spec.Basic.Qos(prefetch_count=1)))
    assert methods(events) == [(1, "Basic.Qos")], "a method right after an empty publish must be accepted"


def test_empty_body_frames_do_not_complete_a_message():
    conn = opened_connection(1)
    events = conn.receive_data(method(1, spec.Basic.Publish(exchange="", routing_key="q"))
                               + content_header(1, 2) + content_body(1, b"") + content_body(1, b"a"))
    assert events == [], f"message completed early: {describe(events)}"
    events = conn.receive_data(content_body(1, b"b"))
    assert [e[7] for e in events] == [b"ab"], describe(events)


def test_many_publishes_in_one_chunk_keep_their_order():
    conn = opened_connection(1)
    data = b"".join(publish(1, f"m{i}".encode(), routing_key=f"k{i}") for i in range(50))
    events = conn.receive_data(data)
    assert [(e[3], e[7]) for e in events] == [(f"k{i}", f"m{i}".encode()) for i in range(50)], describe(events)


@pytest.mark.parametrize("body_frame, code, what", [
    (content_body(2, b"abc"), UNEXPECTED_FRAME, "a body frame of another channel"),
    (content_body(1, b"abcd"), FRAME_ERROR, "a body frame longer than announced"),
], ids=["body-on-another-channel", "body-longer-than-announced"])
def test_a_publish_arriving_whole_is_checked_as_one_arriving_frame_by_frame(body_frame, code, what):
    """The parser takes a publish whose frames arrive together in one step: the
    same checks must hold as when they arrive one by one."""
    data = method(1, spec.Basic.Publish(exchange="", routing_key="q")) + content_header(1, 3) + body_frame
    assert_reply(hard_error(opened_connection(1, 2), data), code, what + ", in one chunk")
    conn = opened_connection(1, 2)
    events = conn.receive_data(data[:-len(body_frame)])
    assert events == [], f"no event before the body: {describe(events)}"
    assert_reply(hard_error(conn, body_frame), code, what + ", in its own chunk")


# -- message size limit -------------------------------------------------------------

def test_body_over_max_message_size_is_a_406_channel_error_event_at_the_header():
    conn = opened_connection(1, 2, max_message_size=100)
    events = conn.receive_data(method(1, spec.Basic.Publish(exchange="", routing_key="q")) + content_header(1, 101))
    assert describe(events) == [("channel-error", 1, PRECONDITION_FAILED, 60, 40)], (
        f"oversized message should give one 406 channel error blaming basic.publish: {describe(events)}")
    # The shell then closes the channel; the rest of the message is discarded.
    conn.close_channel(1)
    assert conn.receive_data(content_body(1, b"x" * 101)) == [], "body of a refused message was not discarded"
    assert methods(conn.receive_data(method(2, spec.Basic.Qos(prefetch_count=1)))) == [(2, "Basic.Qos")]


def test_body_over_max_message_size_sent_with_its_body_in_one_chunk_is_still_a_channel_error():
    """A client writes publish + header + body in one go; the parser must not turn
    the soft 406 into a hard error because the body frame follows in the same read."""
    conn = opened_connection(1, 2, max_message_size=100)
    data = publish(1, b"x" * 101, exchange="", routing_key="q") + method(2, spec.Basic.Qos(prefetch_count=1))
    try:
        events = conn.receive_data(data)
    except AMQPConnectionError as error:
        pytest.fail(f"oversized publish whose body arrived in the same chunk raised a hard error "
                    f"{error.reply_code} {error.text!r} instead of a 406 channel error; "
                    f"events before it: {describe(conn.pending_events)}")
    assert describe(events)[0] == ("channel-error", 1, PRECONDITION_FAILED, 60, 40), describe(events)
    assert ("method", 2, "Basic.Qos") in describe(events), f"channel 2 was disturbed: {describe(events)}"


def test_body_at_max_message_size_is_accepted():
    conn = opened_connection(1, max_message_size=100)
    events = conn.receive_data(publish(1, b"x" * 100))
    assert [len(e[7]) for e in events] == [100], describe(events)


# -- frame-level errors -------------------------------------------------------------

def test_frame_larger_than_frame_max_is_frame_error():
    conn = opened_connection(1)
    conn.receive_data(method(1, spec.Basic.Publish(exchange="", routing_key="q")) + content_header(1, 10000))
    error = hard_error(conn, content_body(1, b"x" * (FRAME_MAX + 1)))  # 9 bytes over: past RabbitMQ's fudge
    assert_reply(error, FRAME_ERROR, f"body frame of {FRAME_MAX + 9} bytes with frame_max {FRAME_MAX}")
    assert error.text == f"type 3, all octets = <<>>: {{frame_too_large,{FRAME_MAX + 1},{FRAME_MAX - 8}}}"


@pytest.mark.parametrize("over_bytes", [0, 1, 8])
def test_frame_up_to_eight_bytes_over_frame_max_is_accepted(over_bytes):
    """RabbitMQ's FRAME_SIZE_FUDGE: clients often count frame_max without the 8 bytes of framing."""
    conn = opened_connection(1)
    body = b"x" * (FRAME_MAX - 8 + over_bytes)
    events = conn.receive_data(method(1, spec.Basic.Publish(exchange="", routing_key="q"))
                               + content_header(1, len(body)) + content_body(1, body))
    assert [len(e[7]) for e in events] == [len(body)], f"frame {over_bytes} over frame_max refused: {describe(events)}"


def test_oversized_frame_is_refused_from_its_header_alone():
    """The parser must not wait for (and buffer) 4 GiB before refusing."""
    conn = opened_connection(1)
    error = hard_error(conn, struct.pack(">BHI", FRAME_BODY, 1, 0xFFFFFFFF))
    assert_reply(error, FRAME_ERROR, "7-byte frame header announcing 4 GiB")


def test_frame_max_applies_before_tune_ok():
    conn = new_connection(frame_max=FRAME_MAX)
    conn.receive_data(PROTOCOL_HEADER)
    error = hard_error(conn, struct.pack(">BHI", FRAME_METHOD, 0, FRAME_MAX + 1))
    assert_reply(error, FRAME_ERROR, "huge method frame during handshake")


@pytest.mark.parametrize("end", [0x00, 0xCD, 0xCF, 0xFF])
def test_bad_frame_end_octet_is_frame_error(end):
    conn = opened_connection(1)
    payload = struct.pack(">I", (60 << 16) | 10) + spec.Basic.Qos(prefetch_count=1).marshal()
    error = hard_error(conn, raw_frame(FRAME_METHOD, 1, payload, end=end))
    assert_reply(error, FRAME_ERROR, f"frame-end octet {end:#x}")


@pytest.mark.parametrize("frame_type", [0, 4, 5, 7, 9, 65, 255])
def test_unknown_frame_type_is_frame_error(frame_type):
    conn = opened_connection(1)
    error = hard_error(conn, raw_frame(frame_type, 1, b"abc"))
    assert_reply(error, FRAME_ERROR, f"frame type {frame_type}")


def test_heartbeat_on_a_channel_other_than_zero_is_frame_error():
    conn = opened_connection(1)
    error = hard_error(conn, raw_frame(8, 1, b""))
    assert_reply(error, FRAME_ERROR, "heartbeat on channel 1")


def test_heartbeats_are_events_on_channel_zero():
    conn = opened_connection()
    assert describe(conn.receive_data(heartbeat() + heartbeat())) == [("heartbeat", 0)] * 2


def test_method_frame_shorter_than_a_method_id_is_frame_error():
    conn = opened_connection(1)
    error = hard_error(conn, raw_frame(FRAME_METHOD, 1, b"\x00\x3c"))
    assert_reply(error, FRAME_ERROR, "2-byte method frame")


def test_content_header_shorter_than_fourteen_bytes_is_frame_error():
    conn = opened_connection(1)
    conn.receive_data(method(1, spec.Basic.Publish(exchange="", routing_key="q")))
    error = hard_error(conn, raw_frame(FRAME_HEADER, 1, struct.pack(">HHQ", 60, 0, 1)))
    assert_reply(error, FRAME_ERROR, "12-byte content header (no property flags)")


def test_content_header_of_another_class_is_unexpected_frame():
    conn = opened_connection(1)
    conn.receive_data(method(1, spec.Basic.Publish(exchange="", routing_key="q")))
    error = hard_error(conn, raw_frame(FRAME_HEADER, 1, struct.pack(">HHQH", 50, 0, 1, 0)))
    assert_reply(error, UNEXPECTED_FRAME, "content header of class 50")


@pytest.mark.parametrize("class_id, method_id, channel", [
    (99, 1, 1),    # unknown class
    (60, 999, 1),  # known class, unknown method
    (10, 77, 0),   # unknown connection method on channel 0
    (0, 0, 1),
])
def test_unknown_class_or_method_is_not_implemented(class_id, method_id, channel):
    conn = opened_connection(1)
    error = hard_error(conn, raw_frame(FRAME_METHOD, channel, struct.pack(">HH", class_id, method_id)))
    assert_reply(error, NOT_IMPLEMENTED, f"method {class_id}.{method_id}")
    assert (error.class_id, error.method_id) == (class_id, method_id), (
        f"error blames {(error.class_id, error.method_id)}, should blame {(class_id, method_id)}")


@pytest.mark.parametrize("class_id, method_id, args, what", [
    (50, 10, b"\x00", "queue.declare with 1 argument byte"),
    (60, 10, b"\x00\x00", "basic.qos cut short"),
    (60, 80, b"\x00" * 8, "basic.ack without its bits octet"),
    (60, 80, b"\x00" * 10, "basic.ack with a trailing byte"),
    (60, 120, b"\x00" * 3, "basic.nack cut short"),
    (60, 90, b"", "basic.reject with no arguments"),
    (60, 40, b"\x00\x00\x05ab", "basic.publish with a truncated exchange name"),
    (60, 40, b"\x00\x00\x00\x00\x00\x00", "basic.publish with a trailing byte"),
    (60, 40, b"\x00\x00\x02\xff\xfe\x00\x00", "basic.publish with an invalid UTF-8 exchange"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_malformed_method_arguments_are_syntax_error(class_id, method_id, args, what):
    conn = opened_connection(1)
    error = hard_error(conn, raw_frame(FRAME_METHOD, 1, struct.pack(">HH", class_id, method_id) + args))
    assert_reply(error, SYNTAX_ERROR, what)


def test_events_before_a_hard_error_stay_in_pending_events():
    conn = opened_connection(1)
    with pytest.raises(AMQPConnectionError):
        conn.receive_data(method(1, spec.Basic.Ack(delivery_tag=7)) + raw_frame(9, 1, b""))
    assert describe(conn.pending_events) == [("ack", 1, 7, False)], (
        f"the ack parsed before the bad frame is lost: {describe(conn.pending_events)}")


# -- the hot methods, decoded by hand -------------------------------------------

@pytest.mark.parametrize("tag", [0, 1, 255, 2 ** 32, 2 ** 64 - 1])
@pytest.mark.parametrize("multiple", [False, True])
def test_hot_ack_decoding(tag, multiple):
    conn = opened_connection(3)
    # pamqp refuses tags above 2**63-1 (signed), so the frame is built by hand.
    frame = raw_frame(FRAME_METHOD, 3, struct.pack(">HHQB", 60, 80, tag, multiple))
    if tag < 2 ** 63:
        assert frame == method(3, spec.Basic.Ack(delivery_tag=tag, multiple=multiple)), "hand-built ack differs"
    events = conn.receive_data(frame)
    assert describe(events) == [("ack", 3, tag, multiple)], describe(events)


@pytest.mark.parametrize("multiple", [False, True])
@pytest.mark.parametrize("requeue", [False, True])
def test_hot_nack_decoding(multiple, requeue):
    conn = opened_connection(3)
    events = conn.receive_data(method(3, spec.Basic.Nack(delivery_tag=42, multiple=multiple, requeue=requeue)))
    assert describe(events) == [("nack", 3, 42, multiple, requeue)], describe(events)


@pytest.mark.parametrize("requeue", [False, True])
def test_hot_reject_decoding(requeue):
    conn = opened_connection(3)
    events = conn.receive_data(method(3, spec.Basic.Reject(delivery_tag=9, requeue=requeue)))
    assert describe(events) == [("reject", 3, 9, requeue)], describe(events)


def test_hot_publish_decodes_names_and_flags():
    conn = opened_connection(1)
    for mandatory in (False, True):
        for immediate in (False, True):
            # pamqp refuses non-ASCII exchange names, so basic.publish is built by hand.
            args = (b"\x00\x00" + bytes((len("ëx".encode()),)) + "ëx".encode() + b"\xff" + b"r" * 255
                    + bytes((mandatory | immediate << 1,)))
            events = conn.receive_data(raw_frame(FRAME_METHOD, 1, struct.pack(">HH", 60, 40) + args)
                                       + content_header(1, 1) + content_body(1, b"b"))
            assert describe(events) == [("publish", 1, "ëx", "r" * 255, mandatory, immediate, "1 body bytes")], (
                f"mandatory={mandatory} immediate={immediate}: {describe(events)}")


# -- splitting: the same bytes in any chunks give the same events -----------------

def _transcript_bytes() -> bytes:
    properties = spec.Basic.Properties(content_type="application/json", headers={"k": "v"}, priority=3)
    return (HANDSHAKE
            + channel_open(1) + channel_open(2)
            + method(1, spec.Basic.Qos(prefetch_count=10))
            + method(1, spec.Confirm.Select())
            + publish(1, b"hello", exchange="", routing_key="q1")
            + publish(2, bytes(range(200)) * 3, exchange="amq.direct", routing_key="k",
                      properties=properties, chunk=128, mandatory=True)
            + heartbeat()
            + method(2, spec.Basic.Ack(delivery_tag=5, multiple=True))
            + method(2, spec.Basic.Nack(delivery_tag=6, multiple=False, requeue=True))
            + method(1, spec.Basic.Reject(delivery_tag=7, requeue=False))
            + publish(1, b"", exchange="", routing_key="empty")
            + method(2, spec.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)))


def _feed_chunks(chunks: list[bytes]) -> list[tuple]:
    conn = new_connection()
    events = []
    for chunk in chunks:
        events.extend(conn.receive_data(chunk))
    return [normalise(e) for e in events]


EXPECTED_KINDS = [
    ("method", 0), ("method", 0), ("method", 0), ("method", 1), ("method", 2), ("method", 1), ("method", 1),
    ("publish", 1), ("publish", 2), ("heartbeat", 0), ("ack", 2), ("nack", 2), ("reject", 1), ("publish", 1),
    ("method", 2),
]


def test_transcript_in_one_chunk():
    events = _feed_chunks([_transcript_bytes()])
    assert [e[:2] for e in events] == EXPECTED_KINDS, f"events of the reference transcript: {events}"


def test_transcript_fed_byte_by_byte_gives_the_same_events():
    data = _transcript_bytes()
    whole = _feed_chunks([data])
    by_byte = _feed_chunks([data[i:i + 1] for i in range(len(data))])
    assert by_byte == whole, "feeding one byte at a time changed the events"


def test_transcript_split_at_every_boundary_gives_the_same_events():
    data = _transcript_bytes()
    whole = _feed_chunks([data])
    for cut in range(1, len(data)):
        split = _feed_chunks([data[:cut], data[cut:]])
        assert split == whole, f"splitting the stream at byte {cut} of {len(data)} changed the events"


def test_empty_chunks_are_harmless():
    data = _transcript_bytes()
    chunks = []
    for i in range(0, len(data), 100):
        chunks += [b"", data[i:i + 100], b""]
    assert _feed_chunks(chunks) == _feed_chunks([data]), "empty reads changed the events"


# -- closing ---------------------------------------------------------------------

def test_after_close_channel_only_close_and_close_ok_are_looked_at():
    conn = opened_connection(1, 2)
    conn.close_channel(1)  # the server sent channel.close on channel 1
    discarded = (method(1, spec.Basic.Qos(prefetch_count=1))
                 + method(1, spec.Basic.Ack(delivery_tag=1))
                 + method(1, spec.Basic.Nack(delivery_tag=1))
                 + method(1, spec.Basic.Reject(delivery_tag=1))
                 + publish(1, b"payload")
                 + content_header(1, 4) + content_body(1, b"abcd")
                 + method(1, spec.Channel.Open()))
    events = conn.receive_data(discarded)
    assert events == [], f"frames on a closing channel should be discarded, got {describe(events)}"

    events = conn.receive_data(method(1, spec.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0)))
    assert methods(events) == [(1, "Channel.Close")], f"channel.close crossing ours must be seen: {describe(events)}"

    events = conn.receive_data(method(1, spec.Channel.CloseOk()) + method(2, spec.Basic.Qos(prefetch_count=2)))
    assert methods(events) == [(2, "Basic.Qos")], (
        f"close-ok ends the channel silently; channel 2 unaffected: {describe(events)}")

    error = hard_error(conn, method(1, spec.Basic.Qos(prefetch_count=1)))
    assert_reply(error, CHANNEL_ERROR, "method on channel 1 after its close-ok")


def test_channel_can_be_reopened_after_close_ok():
    conn = opened_connection(1)
    conn.close_channel(1)
    conn.receive_data(method(1, spec.Channel.CloseOk()))
    events = conn.receive_data(channel_open(1) + method(1, spec.Basic.Ack(delivery_tag=3)))
    assert describe(events) == [("method", 1, "Channel.Open"), ("ack", 1, 3, False)], describe(events)


def test_close_channel_drops_a_half_received_message():
    conn = opened_connection(1)
    conn.receive_data(method(1, spec.Basic.Publish(exchange="", routing_key="q")) + content_header(1, 10))
    conn.close_channel(1)
    assert conn.receive_data(content_body(1, b"0123456789")) == [], "rest of the dropped message produced events"
    conn.receive_data(method(1, spec.Channel.CloseOk()))
    events = conn.receive_data(channel_open(1) + publish(1, b"new"))
    assert [e[7] for e in events[1:]] == [b"new"], f"old content leaked into the reopened channel: {describe(events)}"


def test_client_channel_close_is_an_event():
    conn = opened_connection(1)
    close = spec.Channel.Close(reply_code=200, reply_text="done", class_id=0, method_id=0)
    events = conn.receive_data(method(1, close))
    assert methods(events) == [(1, "Channel.Close")], describe(events)


def test_after_start_closing_channel_zero_accepts_only_close_and_close_ok():
    conn = opened_connection(1)
    conn.start_closing()
    events = conn.receive_data(method(0, spec.Connection.Open()) + method(1, spec.Basic.Qos(prefetch_count=1))
                               + method(0, spec.Connection.CloseOk()))
    assert methods(events) == [(0, "Connection.CloseOk")], f"while closing: {describe(events)}"


@pytest.mark.parametrize("frames, what", [
    (method(1, spec.Basic.Ack(delivery_tag=1)), "basic.ack"),
    (method(1, spec.Basic.Nack(delivery_tag=1)), "basic.nack"),
    (method(1, spec.Basic.Reject(delivery_tag=1)), "basic.reject"),
    (publish(1, b"late"), "basic.publish with its content"),
], ids=["ack", "nack", "reject", "publish"])
def test_after_start_closing_hot_methods_on_open_channels_are_discarded(frames, what):
    """connection.close sent: 'only close-ok matters now' (start_closing's contract)."""
    conn = opened_connection(1)
    conn.start_closing()
    events = conn.receive_data(frames)
    assert events == [], f"{what} on channel 1 after the server sent connection.close produced {describe(events)}"
