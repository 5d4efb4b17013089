"""Fuzzing the sans-I/O parser with hypothesis.

Whatever bytes arrive, ``ServerConnection.receive_data`` may only
* return a list of well-formed event tuples, or
* raise AMQPConnectionError (with a known reply code) or BadProtocolHeader.
Any other exception is a parser bug (it would reach the shell as a crash, not
as a connection.close the client can read). And chunking must not matter: the
same bytes in any pieces give the same events and the same error.
"""
from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands as spec

from tests.unit.wire import (
    HANDSHAKE,
    channel_open,
    check_well_formed,
    content_body,
    content_header,
    heartbeat,
    method,
    new_connection,
    normalise,
    opened_connection,
    publish,
)
from warren.protocol.connection import BadProtocolHeader
from warren.protocol.constants import REPLY_NAMES
from warren.protocol.errors import AMQPConnectionError

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run(conn, chunks: list[bytes]) -> tuple[list[tuple], object]:
    """Feed chunks until an allowed error; return (events, outcome). Fail on anything else."""
    events: list[tuple] = []
    for chunk in chunks:
        try:
            got = conn.receive_data(chunk)
        except BadProtocolHeader:
            return events, "bad-header"
        except AMQPConnectionError as error:
            assert error.reply_code in REPLY_NAMES, f"hard error with unknown reply code {error.reply_code}"
            assert isinstance(error.text, str) and error.text, "hard error without a text"
            pending = conn.pending_events
            assert isinstance(pending, list), f"pending_events is {type(pending)}"
            for event in pending:
                check_well_formed(event)
            events.extend(normalise(e) for e in pending)
            return events, ("hard", error.reply_code)
        except Exception as error:  # noqa: BLE001 - the point of the test
            raise AssertionError(
                f"receive_data raised {type(error).__name__}: {error!r} on chunk {chunk[:80]!r}...; "
                f"only AMQPConnectionError and BadProtocolHeader are allowed") from error
        assert isinstance(got, list), f"receive_data returned {type(got)}, not a list"
        for event in got:
            check_well_formed(event)
        events.extend(normalise(e) for e in got)
    return events, "ok"


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts}) if data else []
    pieces, last = [], 0
    for point in points:
        pieces.append(data[last:point])
        last = point
    pieces.append(data[last:])
    return pieces


# -- a valid stream to mutate ------------------------------------------------------

def _valid_stream() -> bytes:
    props = spec.Basic.Properties(content_type="text/plain", headers={"x": [1, "two", {"n": None}]},
                                  delivery_mode=2, message_id="m-1")
    return (channel_open(1) + channel_open(2)
            + method(1, spec.Basic.Qos(prefetch_count=3))
            + method(2, spec.Queue.Declare(queue="q", durable=True, arguments={"x-max-length": 10}))
            + publish(1, b"abc" * 50, exchange="", routing_key="q", properties=props, chunk=64)
            + publish(2, b"", exchange="amq.fanout", routing_key="")
            + heartbeat()
            + method(1, spec.Basic.Ack(delivery_tag=1, multiple=True))
            + method(2, spec.Basic.Nack(delivery_tag=2, requeue=False))
            + method(1, spec.Basic.Reject(delivery_tag=3, requeue=True))
            + method(1, spec.Basic.Consume(queue="q", consumer_tag="c1"))
            + method(2, spec.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
            + method(0, spec.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)))


VALID_AFTER_HANDSHAKE = _valid_stream()
VALID_FROM_SCRATCH = HANDSHAKE + VALID_AFTER_HANDSHAKE


def test_the_unmutated_stream_is_accepted():
    events, outcome = run(new_connection(), [VALID_FROM_SCRATCH])
    assert outcome == "ok", f"the reference stream itself failed: {outcome}"
    assert len(events) == 16, f"reference stream gave {len(events)} events: {[e[:3] for e in events]}"


@st.composite
def mutated(draw, base: bytes) -> bytes:
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "set", "duplicate"]))
        if not data:
            data += draw(st.binary(min_size=1, max_size=8))
            continue
        at = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[at:]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[at:at + draw(st.integers(1, 16))]
        elif kind == "set":
            data[at] = draw(st.sampled_from([0x00, 0xFF, 0xCE, 0x01, 0x02, 0x03, 0x08, 0x7F]))
        else:
            span = draw(st.integers(1, 64))
            data[at:at] = data[at:at + span]
    return bytes(data)


cuts = st.lists(st.integers(0, 10_000), max_size=12)


@FUZZ
@given(data=st.binary(max_size=300), cut_points=cuts)
def test_arbitrary_bytes_from_scratch(data, cut_points):
    run(new_connection(), chunked(data, cut_points))


@FUZZ
@given(data=st.binary(max_size=300), cut_points=cuts)
def test_arbitrary_bytes_after_a_valid_handshake(data, cut_points):
    run(opened_connection(1, 2), chunked(data, cut_points))


@FUZZ
@given(data=mutated(VALID_AFTER_HANDSHAKE), cut_points=cuts)
def test_mutated_valid_stream_after_handshake(data, cut_points):
    run(opened_connection(), chunked(data, cut_points))


@FUZZ
@given(data=mutated(VALID_FROM_SCRATCH), cut_points=cuts)
def test_mutated_valid_stream_from_scratch(data, cut_points):
    run(new_connection(), chunked(data, cut_points))


# Frames with plausible headers but random payloads reach deeper than random bytes.
frame_types = st.sampled_from([1, 1, 1, 2, 3, 8, 4])
hot_method_ids = st.sampled_from([
    (60, 40), (60, 80), (60, 120), (60, 90), (20, 10), (20, 40), (20, 41), (50, 10), (60, 20), (10, 50), (85, 10),
])


@st.composite
def plausible_frame(draw) -> bytes:
    frame_type = draw(frame_types)
    channel = draw(st.sampled_from([0, 1, 2, 3]))
    if frame_type == 1:
        class_id, method_id = draw(hot_method_ids)
        payload = struct.pack(">HH", class_id, method_id) + draw(st.binary(max_size=40))
    elif frame_type == 2:
        payload = struct.pack(">HHQ", draw(st.sampled_from([60, 60, 50])), 0,
                              draw(st.integers(0, 300))) + draw(st.binary(max_size=30))
    else:
        payload = draw(st.binary(max_size=60))
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + b"\xce"


@FUZZ
@given(frames=st.lists(st.one_of(
    plausible_frame(),
    st.builds(lambda c, n: publish(c, b"z" * n), st.sampled_from([1, 2]), st.integers(0, 50)),
    st.builds(lambda c, n: content_header(c, n), st.sampled_from([1, 2]), st.integers(0, 50)),
    st.builds(lambda c, b: content_body(c, b), st.sampled_from([1, 2]), st.binary(max_size=50)),
), max_size=12), cut_points=cuts)
def test_plausible_frames_after_handshake(frames, cut_points):
    run(opened_connection(1, 2), chunked(b"".join(frames), cut_points))


@FUZZ
@given(data=st.one_of(mutated(VALID_FROM_SCRATCH), st.binary(max_size=200).map(lambda b: HANDSHAKE + b)),
       cut_points=cuts)
def test_chunking_never_changes_the_outcome(data, cut_points):
    """Same bytes, any chunks: same events, same error (the parser is a pure function of the stream)."""
    whole = run(new_connection(), [data])
    pieces = run(new_connection(), chunked(data, cut_points))
    assert pieces == whole, (
        f"chunking at {sorted(set(cut_points))} changed the outcome: whole={whole[1]} with {len(whole[0])} events, "
        f"chunked={pieces[1]} with {len(pieces[0])} events")


def test_a_read_that_completes_a_cut_frame_is_parsed_where_it_lies_not_copied_whole():
    """A read that ends inside a frame (a large message's reads nearly always do) leaves that
    frame's start; the next read completes it with just the bytes it lacks and is parsed in
    place: joined whole to the remainder, every byte of it was copied once more."""
    import tracemalloc
    bodies = [bytes([n]) * 60_000 for n in range(20)]
    stream = b"".join(publish(1, body, routing_key="q") for body in bodies)
    conn = opened_connection(1)
    cut = 70_000   # inside the second message's body frame
    got = conn.receive_data(stream[:cut])
    rest = stream[cut:]
    tracemalloc.start()
    try:
        more = conn.receive_data(rest)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [event[-1] for event in got + more] == bodies, "every body, whole and in order"
    sliced = sum(len(event[-1]) for event in more)
    assert peak < sliced + 2 * 65_536, (f"receiving {len(rest)} bytes took {peak} bytes of new objects for "
                                        f"{sliced} bytes of bodies: the read was copied, not only the bodies "
                                        "sliced out of it")


def _reads(data: bytes, size: int) -> list[bytes]:
    return [data[at:at + size] for at in range(0, len(data), size)]


def test_a_body_of_many_frames_is_copied_once_from_the_reads():
    """A body larger than a frame comes in frames that the socket's reads cut anywhere
    (uvloop reads 256 KiB): each frame's bytes are referenced where they were read and
    copied once, into the whole body. Sliced frame by frame, then joined (and a cut
    frame's start joined to its rest first), every byte was copied twice or three times."""
    import tracemalloc
    frame_max = 131_072
    bodies = [bytes([n]) * (1_000_000 + 7_777 * n) for n in range(4)]
    stream = b"".join(publish(1, body, routing_key="q", chunk=frame_max - 8) for body in bodies)
    conn = opened_connection(1, frame_max=frame_max, max_message_size=4 << 20)
    reads = _reads(stream, 262_144)
    tracemalloc.start()
    try:
        events = [event for data in reads for event in conn.receive_data(data)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [event[-1] for event in events] == bodies, "every body, whole and in order"
    assert all(type(event[-1]) is bytes for event in events), "a body is bytes"
    whole = sum(map(len, bodies))
    assert peak < whole + 262_144, (f"receiving {len(bodies)} bodies of {whole} bytes in all took {peak} bytes "
                                    "of new objects at the peak: a body's bytes were copied more than once")


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 40_000), min_size=1, max_size=5),
       read_size=st.integers(1_000, 70_000), cut_points=cuts)
def test_bodies_of_many_frames_come_out_whole_whatever_the_reads(sizes, read_size, cut_points):
    """Bodies of several frames, interleaved with other frames, read in pieces of any size
    (and cut anywhere besides): the same events as the stream read whole."""
    stream = b"".join(publish(1 + n % 2, bytes([n]) * size, routing_key="q", chunk=4_088)
                      + method(1, spec.Basic.Ack(delivery_tag=n + 1, multiple=False))
                      for n, size in enumerate(sizes))
    whole = run(opened_connection(1, 2), [stream])
    reads = [piece for read in _reads(stream, read_size) for piece in chunked(read, cut_points)]
    assert run(opened_connection(1, 2), reads) == whole, f"reads of {read_size} bytes changed the events"
    assert whole[1] == "ok"
