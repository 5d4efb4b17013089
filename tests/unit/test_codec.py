"""protocol/codec.py against an independent decoder (pamqp).

Warren packs the hot frames by hand; pamqp must read them back exactly, with
bodies split into frames no larger than frame_max. The shortcuts that read a
raw property list without a full decode (is_persistent, headers_of) must agree
with pamqp's full decode for any properties.
"""
from __future__ import annotations

import datetime
import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import body as pamqp_body
from pamqp import commands as spec
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp import heartbeat as pamqp_heartbeat

from warren.protocol import codec
from warren.protocol.constants import FRAME_MIN_SIZE

PROPS = settings(max_examples=300, deadline=None)


def unmarshal_all(data: bytes, frame_max: int) -> list[tuple[int, object]]:
    """Every frame in data as (channel, pamqp frame); checks each fits frame_max."""
    frames = []
    offset = 0
    while offset < len(data):
        consumed, channel, value = pamqp_frame.unmarshal(data[offset:])
        assert consumed <= frame_max, f"frame {len(frames)} is {consumed} bytes, over frame_max {frame_max}"
        frames.append((channel, value))
        offset += consumed
    assert offset == len(data), f"{len(data) - offset} trailing bytes after the last frame"
    return frames


def full_decode(properties: bytes) -> spec.Basic.Properties:
    """pamqp's own decode of a raw property list."""
    header = pamqp_header.ContentHeader()
    header.unmarshal(struct.pack(">HHQ", 60, 0, 0) + properties)
    return header.properties


def as_dict(properties: spec.Basic.Properties) -> dict:
    return dict(properties)


def check_content(frames: list, channel: int, properties: bytes, body: bytes, frame_max: int) -> None:
    """frames[0] is the content header, the rest the body frames."""
    header_channel, header = frames[0]
    assert isinstance(header, pamqp_header.ContentHeader), f"expected a content header, got {header!r}"
    assert header_channel == channel, f"content header on channel {header_channel}, expected {channel}"
    assert header.class_id == 60, f"content header class {header.class_id}, expected 60"
    assert header.body_size == len(body), f"header announces {header.body_size} bytes, body has {len(body)}"
    assert as_dict(header.properties) == as_dict(full_decode(properties)), "properties changed on the way"
    bodies = frames[1:]
    assert all(isinstance(f, pamqp_body.ContentBody) for _, f in bodies), f"non-body frame after header: {bodies}"
    assert all(c == channel for c, _ in bodies), "body frame on the wrong channel"
    expected_count = math.ceil(len(body) / (frame_max - 8))
    assert len(bodies) == expected_count, (
        f"{len(body)} body bytes at frame_max {frame_max} should take {expected_count} body frames, took {len(bodies)}")
    assert all(len(f.value) > 0 for _, f in bodies), "an empty body frame was sent"
    assert b"".join(bytes(f.value) for _, f in bodies) == body, "reassembled body differs"


# -- strategies ---------------------------------------------------------------

short_text = st.text(max_size=20).filter(lambda s: len(s.encode()) <= 255)
field_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-2 ** 31, 2 ** 31 - 1), short_text,
    st.floats(allow_nan=False, allow_infinity=False, width=32, min_value=-1e6, max_value=1e6),
)
field_values = st.recursive(
    field_scalars,
    lambda children: st.one_of(st.lists(children, max_size=3),
                               st.dictionaries(st.text(min_size=1, max_size=8), children, max_size=3)),
    max_leaves=8,
)
headers_tables = st.dictionaries(st.text(min_size=1, max_size=10), field_values, max_size=5)
timestamps = st.datetimes(min_value=datetime.datetime(1970, 1, 2), max_value=datetime.datetime(2100, 1, 1)).map(
    lambda d: d.replace(microsecond=0, tzinfo=datetime.UTC))


def optional(strategy):
    return st.one_of(st.none(), strategy)


properties_strategy = st.builds(
    spec.Basic.Properties,
    content_type=optional(short_text),
    content_encoding=optional(short_text),
    headers=optional(headers_tables),
    delivery_mode=optional(st.sampled_from([1, 2])),  # pamqp refuses other values
    priority=optional(st.integers(0, 255)),
    correlation_id=optional(short_text),
    reply_to=optional(short_text),
    expiration=optional(short_text),
    message_id=optional(short_text),
    timestamp=optional(timestamps),
    message_type=optional(short_text),
    user_id=optional(short_text),
    app_id=optional(short_text),
)
frame_maxes = st.sampled_from([FRAME_MIN_SIZE, FRAME_MIN_SIZE + 1, 5000, 8192])
_PATTERN = bytes(range(251))
bodies = st.one_of(st.binary(max_size=300),
                   st.integers(0, 20_000).map(lambda n: (_PATTERN * (n // 251 + 1))[:n]))
tags = st.integers(0, 2 ** 63 - 1)
names = st.text(alphabet="abcxyz.-_:", max_size=30)


# -- hot frames -----------------------------------------------------------------

@PROPS
@given(channel=st.integers(1, 65535), consumer_tag=names, delivery_tag=tags, redelivered=st.booleans(),
       exchange=names, routing_key=names, properties=properties_strategy, body=bodies, frame_max=frame_maxes)
def test_encode_deliver_round_trips_through_pamqp(channel, consumer_tag, delivery_tag, redelivered, exchange,
                                                   routing_key, properties, body, frame_max):
    raw_props = codec.encode_properties(properties)
    data = codec.encode_deliver(channel, codec.shortstr(consumer_tag), delivery_tag, redelivered,
                                codec.shortstr(exchange) + codec.shortstr(routing_key), raw_props, body, frame_max)
    frames = unmarshal_all(data, frame_max)
    method_channel, deliver = frames[0]
    assert isinstance(deliver, spec.Basic.Deliver), f"first frame is {deliver!r}, expected basic.deliver"
    assert method_channel == channel, f"deliver on channel {method_channel}, expected {channel}"
    got = (deliver.consumer_tag, deliver.delivery_tag, deliver.redelivered, deliver.exchange, deliver.routing_key)
    assert got == (consumer_tag, delivery_tag, redelivered, exchange, routing_key), f"deliver decoded as {got}"
    check_content(frames[1:], channel, raw_props, body, frame_max)


@PROPS
@given(channel=st.integers(1, 65535), consumer_tag=names, deliveries=st.lists(
    st.tuples(tags, st.booleans(), properties_strategy, bodies), min_size=1, max_size=4),
    exchange=names, routing_key=names, frame_max=frame_maxes)
def test_deliver_frames_in_parts_are_encode_delivers_bytes(channel, consumer_tag, deliveries, exchange, routing_key,
                                                           frame_max):
    """A run of deliveries added as parts joins to each one's `encode_deliver`, and the
    sizes it reports are theirs (the connection counts its output by them)."""
    exchange_and_key = codec.shortstr(exchange) + codec.shortstr(routing_key)
    frames = codec.DeliverFrames(channel, codec.shortstr(consumer_tag), exchange_and_key)
    out: list = []
    for delivery_tag, redelivered, properties, body in deliveries:
        raw_props = codec.encode_properties(properties)
        expected = codec.encode_deliver(channel, codec.shortstr(consumer_tag), delivery_tag, redelivered,
                                        exchange_and_key, raw_props, body, frame_max)
        before = len(out)
        size = frames.add(out, delivery_tag, redelivered, raw_props, body, frame_max)
        assert b"".join(out[before:]) == expected, f"delivery {delivery_tag} ({len(body)} B body) encoded differently"
        assert size == len(expected), f"reported {size} bytes for {len(expected)}"


@PROPS
@given(channel=st.integers(1, 65535), delivery_tag=tags, redelivered=st.booleans(), exchange=names,
       routing_key=names, message_count=st.integers(0, 2 ** 32 - 1), properties=properties_strategy,
       body=bodies, frame_max=frame_maxes)
def test_encode_get_ok_round_trips_through_pamqp(channel, delivery_tag, redelivered, exchange, routing_key,
                                                  message_count, properties, body, frame_max):
    raw_props = codec.encode_properties(properties)
    data = codec.encode_get_ok(channel, delivery_tag, redelivered,
                               codec.shortstr(exchange) + codec.shortstr(routing_key), message_count,
                               raw_props, body, frame_max)
    frames = unmarshal_all(data, frame_max)
    _, get_ok = frames[0]
    assert isinstance(get_ok, spec.Basic.GetOk), f"first frame is {get_ok!r}, expected basic.get-ok"
    got = (get_ok.delivery_tag, get_ok.redelivered, get_ok.exchange, get_ok.routing_key, get_ok.message_count)
    assert got == (delivery_tag, redelivered, exchange, routing_key, message_count), f"get-ok decoded as {got}"
    check_content(frames[1:], channel, raw_props, body, frame_max)


@PROPS
@given(channel=st.integers(1, 65535), reply_code=st.sampled_from([312, 313]), reply_text=short_text,
       exchange=names, routing_key=names, properties=properties_strategy, body=bodies, frame_max=frame_maxes)
def test_encode_return_round_trips_through_pamqp(channel, reply_code, reply_text, exchange, routing_key,
                                                  properties, body, frame_max):
    raw_props = codec.encode_properties(properties)
    data = codec.encode_return(channel, reply_code, reply_text, exchange, routing_key, raw_props, body, frame_max)
    frames = unmarshal_all(data, frame_max)
    _, returned = frames[0]
    assert isinstance(returned, spec.Basic.Return), f"first frame is {returned!r}, expected basic.return"
    got = (returned.reply_code, returned.reply_text, returned.exchange, returned.routing_key)
    assert got == (reply_code, reply_text, exchange, routing_key), f"return decoded as {got}"
    check_content(frames[1:], channel, raw_props, body, frame_max)


@PROPS
@given(channel=st.integers(1, 65535), body=bodies, frame_max=frame_maxes, properties=properties_strategy)
def test_encode_content_splits_bodies_at_frame_max(channel, body, frame_max, properties):
    raw_props = codec.encode_properties(properties)
    frames = unmarshal_all(codec.encode_content(channel, raw_props, body, frame_max), frame_max)
    check_content(frames, channel, raw_props, body, frame_max)


def test_large_body_at_the_default_frame_max():
    body = (_PATTERN * 1700)[:400_000]
    raw_props = codec.encode_properties(spec.Basic.Properties(delivery_mode=2))
    frames = unmarshal_all(codec.encode_deliver(1, codec.shortstr("c"), 1, False, b"\x00\x01q", raw_props, body,
                                                131072), 131072)
    check_content(frames[1:], 1, raw_props, body, 131072)


@pytest.mark.parametrize("size, frames_expected", [
    (0, 0), (1, 1), (4088, 1), (4089, 2), (2 * 4088, 2), (2 * 4088 + 1, 3),
])
def test_body_frame_count_at_the_edges(size, frames_expected):
    body = bytes(size)
    frames = unmarshal_all(codec.encode_content(1, codec.EMPTY_PROPERTIES, body, 4096), 4096)
    assert len(frames) - 1 == frames_expected, (
        f"a {size}-byte body at frame_max 4096 (4088 payload bytes per frame) took {len(frames) - 1} body frames")


@given(channel=st.integers(1, 65535), delivery_tag=tags, multiple=st.booleans())
def test_encode_ack_round_trips(channel, delivery_tag, multiple):
    [(got_channel, ack)] = unmarshal_all(codec.encode_ack(channel, delivery_tag, multiple), FRAME_MIN_SIZE)
    assert isinstance(ack, spec.Basic.Ack), f"decoded {ack!r}, expected basic.ack"
    assert (got_channel, ack.delivery_tag, ack.multiple) == (channel, delivery_tag, multiple), (
        f"ack decoded as channel={got_channel} tag={ack.delivery_tag} multiple={ack.multiple}")
    assert codec.encode_ack(channel, delivery_tag, multiple) == pamqp_frame.marshal(
        spec.Basic.Ack(delivery_tag, multiple), channel), "ack bytes differ from pamqp's"


@given(channel=st.integers(1, 65535), delivery_tag=tags, multiple=st.booleans())
def test_encode_nack_round_trips_and_never_requeues(channel, delivery_tag, multiple):
    [(got_channel, nack)] = unmarshal_all(codec.encode_nack(channel, delivery_tag, multiple), FRAME_MIN_SIZE)
    assert isinstance(nack, spec.Basic.Nack), f"decoded {nack!r}, expected basic.nack"
    assert (got_channel, nack.delivery_tag, nack.multiple) == (channel, delivery_tag, multiple), (
        f"nack decoded as channel={got_channel} tag={nack.delivery_tag} multiple={nack.multiple}")
    assert nack.requeue is False, "a broker's nack must have requeue=false"


def test_heartbeat_frame_is_pamqps_heartbeat():
    [(channel, value)] = unmarshal_all(codec.HEARTBEAT_FRAME, FRAME_MIN_SIZE)
    assert isinstance(value, pamqp_heartbeat.Heartbeat) and channel == 0, f"decoded {value!r} on channel {channel}"


@pytest.mark.parametrize("method", [
    spec.Connection.Tune(channel_max=2047, frame_max=131072, heartbeat=60),
    spec.Channel.OpenOk(),
    spec.Queue.DeclareOk(queue="q", message_count=3, consumer_count=1),
    spec.Basic.ConsumeOk(consumer_tag="ctag"),
    spec.Channel.Close(reply_code=406, reply_text="PRECONDITION_FAILED - x", class_id=50, method_id=10),
], ids=lambda m: m.name)
def test_encode_method_matches_pamqp(method):
    assert codec.encode_method(7, method) == pamqp_frame.marshal(method, 7), f"{method.name} bytes differ from pamqp"


def test_shortstr_refuses_more_than_255_bytes():
    assert codec.shortstr("a" * 255)[0] == 255, "255-byte shortstr should be allowed"
    with pytest.raises(ValueError):
        codec.shortstr("é" * 128)  # 256 bytes in UTF-8


# -- properties ---------------------------------------------------------------

@PROPS
@given(properties=properties_strategy)
def test_decode_properties_agrees_with_pamqp(properties):
    raw = codec.encode_properties(properties)
    assert raw == properties.marshal(), "encode_properties differs from pamqp's marshal"
    ours = as_dict(codec.decode_properties(raw))
    theirs = as_dict(full_decode(raw))
    assert ours == theirs, f"decode_properties gave {ours}, pamqp {theirs}"


@PROPS
@given(properties=properties_strategy)
def test_properties_round_trip(properties):
    decoded = as_dict(codec.decode_properties(codec.encode_properties(properties)))
    original = as_dict(properties)
    for name, value in original.items():
        if value is None or value == "":
            continue
        assert decoded[name] == value, f"property {name} went in as {value!r}, came out as {decoded[name]!r}"


@PROPS
@given(properties=properties_strategy)
def test_is_persistent_and_headers_of_agree_with_a_full_decode(properties):
    raw = codec.encode_properties(properties)
    full = full_decode(raw)
    assert codec.is_persistent(raw) == (full.delivery_mode == 2), (
        f"is_persistent={codec.is_persistent(raw)} but delivery_mode={full.delivery_mode}")
    assert codec.headers_of(raw) == full.headers, f"headers_of={codec.headers_of(raw)!r}, full={full.headers!r}"


def test_empty_properties():
    assert codec.encode_properties(spec.Basic.Properties()) == codec.EMPTY_PROPERTIES, "no properties: 2 zero bytes"
    assert codec.is_persistent(codec.EMPTY_PROPERTIES) is False, "no delivery_mode is not persistent"
    assert codec.headers_of(codec.EMPTY_PROPERTIES) is None, "no headers flag: headers_of should be None"


@pytest.mark.parametrize("mode, persistent", [(1, False), (2, True), (0, False), (3, False)])
def test_is_persistent_fast_path(mode, persistent):
    raw = b"\x10\x00" + bytes((mode,))  # delivery_mode only (pamqp refuses to encode 0 and 3)
    assert codec.is_persistent(raw) is persistent, f"delivery_mode {mode}: is_persistent should be {persistent}"


def test_property_flags_continuation_word_is_followed():
    # delivery_mode flag + continuation bit, then an empty second flag word.
    raw = struct.pack(">HH", 0x1000 | 1, 0) + b"\x02"
    assert codec.decode_properties(raw).delivery_mode == 2, "delivery_mode lost behind a continuation flag word"
    assert codec.is_persistent(raw) is True, "is_persistent ignored the continuation flag word"


def test_decode_table():
    from pamqp import encode
    table = {"a": 1, "b": "two", "c": {"d": [1, 2]}}
    assert codec.decode_table(encode.field_table(table)) == table, "decode_table does not invert pamqp's field_table"


def test_shortstr_cache_stays_bounded_and_right():
    names = [f"reply-{i}" for i in range(codec.SHORTSTR_CACHE_MAX + 10)]
    for name in names + names[:5]:
        assert codec.shortstr(name) == bytes((len(name),)) + name.encode(), f"shortstr({name!r}) is wrong"
    assert len(codec._shortstrs) <= codec.SHORTSTR_CACHE_MAX, f"cache grew to {len(codec._shortstrs)}"
    with pytest.raises(ValueError):
        codec.shortstr("x" * 256)
