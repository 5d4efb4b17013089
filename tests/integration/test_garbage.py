"""Garbage on the wire, over real sockets.

Bad protocol headers get the server's header and a closed socket (AMQP
0-9-1 §4.2.2); malformed frames after the handshake get connection.close with
501 FRAME_ERROR / 502 SYNTAX_ERROR / 505 UNEXPECTED_FRAME and then a closed
socket; a storm of garbage connections leaves a well-behaved client and the
server unharmed; a silent client is dropped after the handshake timeout.
"""
from __future__ import annotations

import asyncio
import random
import struct
import time

import pika
import pytest
from pamqp import commands as spec
from pamqp.header import ProtocolHeader

from tests.integration.raw_async_amqp import PROTOCOL_HEADER, Closed, RawClient, parse_frames
from tests.serverproc import make_server

pytestmark = pytest.mark.timeout(90)

FRAME_ERROR, SYNTAX_ERROR, COMMAND_INVALID, CHANNEL_ERROR, UNEXPECTED_FRAME = 501, 502, 503, 504, 505
# The server waits CLOSE_OK_TIMEOUT_SECONDS (3 s) for close-ok before dropping the socket.
SOCKET_CLOSE_SECONDS = 6.0
GARBAGE_SEED = 424242
GARBAGE_CONNECTIONS = 100


def frame(frame_type: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([end])


def method_payload(class_id: int, method_id: int, arguments: bytes = b"") -> bytes:
    return struct.pack(">HH", class_id, method_id) + arguments


# -- (a) garbage instead of the protocol header ------------------------------

@pytest.mark.parametrize("garbage", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"\x00" * 8,
    b"AMQP\x00\x00\x09\x00",          # wrong revision
    b"AMQP\x01\x01\x00\x0a",          # AMQP 0-10
    b"AMQP\x00\x01\x00\x00",          # AMQP 1.0
    b"\x01\x00\x00\x00\x00\x00\x04\xce\xce\xce\xce",  # a frame before any header
], ids=["http", "zeros", "0-9-0", "0-10", "1.0", "frame-first"])
async def test_bad_protocol_header_gets_server_header_and_close(server, garbage):
    client = await RawClient.connect(server.amqp_port)
    try:
        await client.send(garbage)
        received = await client.wait_for_eof(SOCKET_CLOSE_SECONDS)
        assert received == PROTOCOL_HEADER, \
            f"sent {garbage!r}: expected the server to answer {PROTOCOL_HEADER!r} and close, got {received!r}"
    finally:
        await client.close()


async def test_random_garbage_before_header(server):
    rng = random.Random(GARBAGE_SEED)
    for attempt in range(20):
        garbage = bytes([rng.choice(b"BCDEFGHIJKLMNOPQRSTUVWXYZ\x00\xff")]) + rng.randbytes(rng.randint(7, 600))
        client = await RawClient.connect(server.amqp_port)
        try:
            await client.send(garbage)
            received = await client.wait_for_eof(SOCKET_CLOSE_SECONDS)
            assert received == PROTOCOL_HEADER, \
                f"seed {GARBAGE_SEED} attempt {attempt}: sent {garbage[:40]!r}..., got {received!r}"
        finally:
            await client.close()


# -- (b) garbage after a valid handshake -------------------------------------

AFTER_HANDSHAKE = {
    # A frame type that does not exist (AMQP 0-9-1 §4.2.3: 1, 2, 3, 8 only).
    "unknown-frame-type": (frame(9, 0, b"xyz"), {FRAME_ERROR}),
    # A well-sized method frame whose frame-end octet is not 0xCE.
    "bad-frame-end": (frame(1, 0, method_payload(10, 50), end=0x00), {FRAME_ERROR}),
    # A frame header announcing more than frame_max.
    "oversized-frame": (struct.pack(">BHI", 1, 0, 0xFFFFFFF0) + b"\x00" * 16, {FRAME_ERROR}),
    "oversized-body": (struct.pack(">BHI", 3, 1, 10 * 1024 * 1024), {FRAME_ERROR}),
    # A method frame too short to hold class and method ids.
    "truncated-method": (frame(1, 0, b"\x00"), {FRAME_ERROR, SYNTAX_ERROR}),
    # connection.close with its arguments cut off.
    "truncated-arguments": (frame(1, 0, method_payload(10, 50, b"\x00")), {FRAME_ERROR, SYNTAX_ERROR}),
    # A content body on channel 0 (RabbitMQ: 505 UNEXPECTED_FRAME).
    # rabbit_reader:handle_frame/4: a non-method, non-heartbeat frame on channel 0 is 505.
    "body-on-channel-0": (frame(3, 0, b"body"), {UNEXPECTED_FRAME}),
    "content-header-on-channel-0": (frame(2, 0, struct.pack(">HHQH", 60, 0, 4, 0)), {UNEXPECTED_FRAME}),
    # A heartbeat on a channel other than 0: RabbitMQ says 505, AMQP 0-9-1 §4.2.7 says 501.
    "heartbeat-on-channel-1": (frame(1, 1, method_payload(20, 10, b"\x00")) + frame(8, 1, b""),
                               {FRAME_ERROR, UNEXPECTED_FRAME}),
    # A content header with no basic.publish before it, on an open channel.
    "header-without-method": (
        frame(1, 1, method_payload(20, 10, b"\x00")) + frame(2, 1, struct.pack(">HHQH", 60, 0, 4, 0)),
        {UNEXPECTED_FRAME}),
    # A second protocol header in the middle of the connection.
    "header-again": (PROTOCOL_HEADER, {FRAME_ERROR, SYNTAX_ERROR, UNEXPECTED_FRAME}),
}


@pytest.mark.parametrize("case", sorted(AFTER_HANDSHAKE))
async def test_garbage_after_handshake_closes_connection_with_frame_error(server, case):
    garbage, codes = AFTER_HANDSHAKE[case]
    client = await RawClient.connect(server.amqp_port)
    try:
        await client.handshake()
        await client.send(garbage)
        frames = []
        close = None
        while close is None:
            try:
                channel, value = await client.read_frame(SOCKET_CLOSE_SECONDS, f"connection.close after {case}")
            except Closed as error:
                pytest.fail(f"{case}: sent {garbage[:40]!r}, server closed the socket without connection.close "
                            f"(frames before: {frames!r}): {error}")
            frames.append((channel, value))
            if isinstance(value, spec.Connection.Close):
                close = value
        assert channel == 0, f"connection.close on channel {channel}"
        assert close.reply_code in codes, \
            f"{case}: sent {garbage[:40]!r}, expected reply code in {sorted(codes)}, " \
            f"got {close.reply_code} {close.reply_text!r}"
        await client.send_frame(0, spec.Connection.CloseOk())
        await client.wait_for_eof(SOCKET_CLOSE_SECONDS)
    finally:
        await client.close()


async def test_socket_closes_after_frame_error_even_without_close_ok(server):
    client = await RawClient.connect(server.amqp_port)
    try:
        await client.handshake()
        await client.send(frame(9, 0, b""))
        close = await client.expect(spec.Connection.Close)
        assert close.reply_code == FRAME_ERROR, f"got {close.reply_code} {close.reply_text!r}"
        await client.wait_for_eof(SOCKET_CLOSE_SECONDS)
    finally:
        await client.close()


# -- (c) a garbage storm next to a well-behaved client -----------------------

def garbage_cases(rng: random.Random) -> list[tuple[str, bytes]]:
    cases = []
    for index in range(GARBAGE_CONNECTIONS):
        kind = index % 5
        noise = rng.randbytes(rng.randint(1, 2000))
        if kind == 0:
            cases.append(("no-header", b"X" + noise + b"\x00" * 8))
        elif kind == 1:
            cases.append(("header+noise", PROTOCOL_HEADER + noise))
        elif kind == 2:
            size = rng.choice([0xFFFFFFFF, 0x7FFFFFFF, 1 << 24, 131073])
            cases.append(("header+oversized-frame",
                          PROTOCOL_HEADER + struct.pack(">BHI", rng.choice([1, 2, 3]), rng.randint(0, 65535), size)))
        elif kind == 3:
            cases.append(("header+bad-type", PROTOCOL_HEADER + frame(rng.choice([0, 4, 7, 9, 200]),
                                                                     rng.randint(0, 65535), noise[:100])))
        else:
            cut = rng.randint(1, 7)
            cases.append(("truncated-header", PROTOCOL_HEADER[:cut]))
    return cases


async def one_garbage_connection(port: int, kind: str, garbage: bytes) -> None:
    """Send the garbage; whatever the server answers must be well-formed AMQP."""
    client = await RawClient.connect(port)
    try:
        await client.send(garbage)
        received = bytearray()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 0.5  # observe, do not wait for: some garbage leaves the server waiting for more
        while loop.time() < deadline:
            try:
                chunk = await asyncio.wait_for(client.reader.read(65536), deadline - loop.time())
            except (TimeoutError, ConnectionError):
                break
            if not chunk:
                break
            received += chunk
    finally:
        await client.close()
    frames = parse_frames(bytes(received))
    if kind == "no-header":
        assert [type(v) for _, v in frames] == [ProtocolHeader], f"{kind}: got {frames!r}"
    for _, value in frames:
        if isinstance(value, spec.Connection.Close):
            assert 500 <= value.reply_code < 600, f"{kind}: close with {value.reply_code} {value.reply_text!r}"
    if kind == "header+oversized-frame":
        closes = [v for _, v in frames if isinstance(v, spec.Connection.Close)]
        assert closes and closes[0].reply_code == FRAME_ERROR, f"{kind}: expected close 501, got {frames!r}"


def well_behaved_client(url: str, queue: str, stop_at: float) -> int:
    """Publish and consume round trips until ``stop_at``; returns how many."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(queue, auto_delete=True)
        rounds = 0
        while time.monotonic() < stop_at or rounds < 50:
            body = f"round-{rounds}".encode()
            channel.basic_publish("", queue, body)
            method, _, got = channel.basic_get(queue, auto_ack=False)
            assert method is not None, f"round {rounds}: published {body!r} but basic.get found the queue empty"
            assert got == body, f"round {rounds}: expected {body!r}, got {got!r}"
            channel.basic_ack(method.delivery_tag)
            rounds += 1
        return rounds
    finally:
        connection.close()


async def test_garbage_storm_does_not_hurt_other_clients(fresh_server, name):
    rng = random.Random(GARBAGE_SEED)
    cases = garbage_cases(rng)
    loop = asyncio.get_running_loop()
    client_task = loop.run_in_executor(None, well_behaved_client, fresh_server.url, name, time.monotonic() + 3)
    limit = asyncio.Semaphore(25)

    async def bounded(kind: str, garbage: bytes) -> None:
        async with limit:
            await one_garbage_connection(fresh_server.amqp_port, kind, garbage)

    results = await asyncio.wait_for(
        asyncio.gather(*(bounded(kind, garbage) for kind, garbage in cases), return_exceptions=True), 60)
    failures = [(cases[i][0], r) for i, r in enumerate(results) if isinstance(r, BaseException)]
    rounds = await asyncio.wait_for(client_task, 60)
    assert not failures, f"seed {GARBAGE_SEED}: {len(failures)} garbage connections misbehaved: {failures[:5]!r}"
    assert rounds >= 50, f"the well-behaved client managed only {rounds} round trips"
    assert fresh_server.process.poll() is None, f"the server exited:\n{fresh_server.log()}"
    # Still accepting and serving new connections.
    rounds_after = await loop.run_in_executor(None, well_behaved_client, fresh_server.url, name, 0)
    assert rounds_after >= 50
    assert "Traceback" not in fresh_server.log() and "internal_error" not in fresh_server.log(), \
        f"the server logged an internal error for garbage input:\n{fresh_server.log()}"


# -- (d) a silent client -----------------------------------------------------

@pytest.fixture
def quick_handshake_server(tmp_path):
    process = make_server(tmp_path, WARREN_HANDSHAKE_TIMEOUT_SECONDS="1").start()
    yield process
    process.stop()


async def test_silent_client_is_dropped_after_handshake_timeout(quick_handshake_server):
    client = await RawClient.connect(quick_handshake_server.amqp_port)
    started = asyncio.get_running_loop().time()
    try:
        received = await client.wait_for_eof(5)
    finally:
        await client.close()
    elapsed = asyncio.get_running_loop().time() - started
    assert received == b"", f"a client that sent nothing was sent {received!r}"
    assert 0.8 <= elapsed <= 3.0, f"dropped after {elapsed:.2f}s, handshake timeout is 1 s"


async def test_client_stalled_mid_handshake_is_dropped(quick_handshake_server):
    client = await RawClient.connect(quick_handshake_server.amqp_port)
    started = asyncio.get_running_loop().time()
    try:
        await client.send(PROTOCOL_HEADER)
        await client.expect(spec.Connection.Start)
        await client.wait_for_eof(5)
    finally:
        await client.close()
    elapsed = asyncio.get_running_loop().time() - started
    assert elapsed <= 3.0, f"a client stalled after connection.start was dropped only after {elapsed:.2f}s"


async def test_completed_handshake_is_not_dropped_by_handshake_timeout(quick_handshake_server, name):
    client = await RawClient.connect(quick_handshake_server.amqp_port)
    try:
        await client.handshake()
        # Watch past the 1 s handshake timeout: nothing may arrive, the socket stays open.
        try:
            got = await client.read_frame(2.0, "nothing")
            pytest.fail(f"an opened connection received {got!r} past the handshake timeout")
        except AssertionError as error:
            if "no nothing within" not in str(error):
                raise
        except Closed as error:
            pytest.fail(f"an opened connection was dropped by the handshake timeout: {error}")
        await client.send_frame(1, spec.Channel.Open())
        await client.expect(spec.Channel.OpenOk)
    finally:
        await client.close()
