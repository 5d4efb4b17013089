"""Transcripts of the cluster handshake and the frame codec (raft/handshake.py).

Each handshake test is a conversation between a dialer and an acceptor, or a
scripted impostor, driven with plain bytes: the pure core never sees a socket.
"""
from __future__ import annotations

import random
import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warren.config.settings import Settings
from warren.raft.handshake import (
    HANDSHAKE_FRAME_MAX_BYTES,
    HANDSHAKE_REASONS,
    HEARTBEAT_FRAME,
    MAGIC,
    NONCE_BYTES,
    PROOF_TAG,
    PROTOCOL_VERSION,
    FrameDecoder,
    FrameError,
    Handshake,
    HandshakeError,
    HandshakeState,
    Role,
    compute_proof,
    decode_payload,
    encode_frame,
    encode_object,
    hello_message,
    hello_target,
)
from warren.raft.messages import AppendEntries, Entry, EntryKind, from_wire, to_wire
from warren.raft.transport import Backoff, TransportLimits

SECRET = b"the-cluster-cookie"
KNOWN = frozenset({"node-a", "node-b", "node-c"})
DIALER_NONCE = bytes([1]) * NONCE_BYTES
ACCEPTOR_NONCE = bytes([2]) * NONCE_BYTES


def dialer(secret: bytes = SECRET, name: str = "node-a", expected: str = "node-b",
           nonce: bytes = DIALER_NONCE, version: int = PROTOCOL_VERSION) -> Handshake:
    return Handshake(role=Role.DIALER, node_name=name, secret=secret, nonce=nonce,
                     known_nodes=KNOWN, expected_peer=expected, version=version)


def acceptor(secret: bytes = SECRET, name: str = "node-b", nonce: bytes = ACCEPTOR_NONCE,
             version: int = PROTOCOL_VERSION) -> Handshake:
    return Handshake(role=Role.ACCEPTOR, node_name=name, secret=secret, nonce=nonce,
                     known_nodes=KNOWN, version=version)


def frame_objects(data: bytes) -> list:
    decoder = FrameDecoder(1 << 20)
    decoder.feed(data)
    out = []
    while (payload := decoder.next_frame()) is not None:
        out.append(decode_payload(payload))
    return out


def rejects(side: Handshake, data: bytes, reason: str) -> HandshakeError:
    with pytest.raises(HandshakeError) as info:
        side.receive_data(data)
    assert info.value.reason == reason, f"expected {reason}, got {info.value}"
    assert side.state is HandshakeState.FAILED
    return info.value


def run_to_proofs(d: Handshake, a: Handshake) -> tuple[bytes, bytes, bytes]:
    """Both hellos, then the dialer's proof: (d_hello, a_hello, d_proof)."""
    d_hello = d.start()
    assert a.start() == b"", "the acceptor's hello answers the dialer's"
    a_hello = a.receive_data(d_hello)
    d_proof = d.receive_data(a_hello)
    return d_hello, a_hello, d_proof


# --- successful transcripts -----------------------------------------------------

def test_handshake_transcript_succeeds_on_both_sides():
    d, a = dialer(), acceptor()
    d_hello = d.start()
    assert frame_objects(d_hello) == [[MAGIC, PROTOCOL_VERSION, "node-a", DIALER_NONCE, "node-b"]]
    assert a.start() == b"", "the acceptor waits for the dialer's hello"
    a_hello = a.receive_data(d_hello)
    assert frame_objects(a_hello) == [[MAGIC, PROTOCOL_VERSION, "node-b", ACCEPTOR_NONCE, "node-a"]], \
        "the acceptor answers with its hello, and proves itself only after the dialer"
    assert a.state is HandshakeState.AWAIT_PROOF
    d_proof = d.receive_data(a_hello)
    expected = compute_proof(SECRET, Role.DIALER, DIALER_NONCE, ACCEPTOR_NONCE, "node-a", "node-b")
    assert frame_objects(d_proof) == [[PROOF_TAG, expected]]
    assert d.state is HandshakeState.AWAIT_PROOF

    a_proof = a.receive_data(d_proof)
    assert a.done and a.peer_name == "node-a"
    expected = compute_proof(SECRET, Role.ACCEPTOR, DIALER_NONCE, ACCEPTOR_NONCE, "node-a", "node-b")
    assert frame_objects(a_proof) == [[PROOF_TAG, expected]]
    assert d.receive_data(a_proof) == b""
    assert d.done and d.peer_name == "node-b"
    assert d.trailing_data() == b"" and a.trailing_data() == b""


def test_proofs_differ_by_role_so_neither_can_be_reflected():
    args = (DIALER_NONCE, ACCEPTOR_NONCE, "node-a", "node-b")
    assert compute_proof(SECRET, Role.DIALER, *args) != compute_proof(SECRET, Role.ACCEPTOR, *args)


def test_handshake_byte_by_byte_and_data_frames_right_after_the_acceptor_proof():
    d, a = dialer(name="node-b", expected="node-c"), acceptor(name="node-c")
    d_hello = d.start()
    a.start()
    a_hello = b"".join(a.receive_data(bytes([byte])) for byte in d_hello)
    assert frame_objects(a_hello)[0][2] == "node-c"
    d_proof = b"".join(d.receive_data(bytes([byte])) for byte in a_hello)
    a_proof = b"".join(a.receive_data(bytes([byte])) for byte in d_proof)
    assert a.done and a.peer_name == "node-b"
    # The acceptor may send data at once: it arrives in the same read as its proof.
    data = encode_object(["hello", 1]) + HEARTBEAT_FRAME + encode_object([2])[:3]
    assert d.receive_data(a_proof + data) == b""
    assert d.done and d.peer_name == "node-c"
    assert d.trailing_data() == data


def test_acceptor_data_after_a_proof_in_one_read_is_kept_as_trailing_data():
    d, a = dialer(), acceptor()
    _, _, d_proof = run_to_proofs(d, a)
    a.receive_data(d_proof + b"\x00\x00\x00\x02\x91\x01")
    assert a.trailing_data() == b"\x00\x00\x00\x02\x91\x01"


def test_repr_never_shows_the_secret():
    assert SECRET.decode() not in repr(dialer()) + repr(acceptor())


# --- wrong secret ------------------------------------------------------------------

def test_dialer_with_wrong_secret_is_rejected_by_the_acceptor_which_proves_nothing():
    d, a = dialer(secret=b"wrong"), acceptor()
    _, _, d_proof = run_to_proofs(d, a)
    rejects(a, d_proof, "bad_proof")
    # The acceptor closes without a proof; the dialer sees the end mid-handshake.
    with pytest.raises(HandshakeError) as info:
        d.receive_eof()
    assert info.value.reason == "closed"


def test_acceptor_with_wrong_secret_rejects_the_honest_dialer():
    d, a = dialer(), acceptor(secret=b"wrong")
    _, _, d_proof = run_to_proofs(d, a)
    rejects(a, d_proof, "bad_proof")


def test_impostor_acceptor_proof_with_wrong_secret_is_rejected_by_the_dialer():
    d = dialer()
    d.start()
    d.receive_data(encode_object(hello_message("node-b", ACCEPTOR_NONCE, "node-a")))
    forged = compute_proof(b"wrong", Role.ACCEPTOR, DIALER_NONCE, ACCEPTOR_NONCE, "node-a", "node-b")
    rejects(d, encode_object([PROOF_TAG, forged]), "bad_proof")


def test_impostor_acceptor_reflecting_the_dialer_proof_is_rejected():
    d = dialer()
    d.start()
    d_proof = d.receive_data(encode_object(hello_message("node-b", ACCEPTOR_NONCE, "node-a")))
    rejects(d, d_proof, "bad_proof")


# --- names, versions, nonces -------------------------------------------------------

def test_unknown_node_name_is_rejected_by_the_acceptor():
    d, a = dialer(name="node-0"), acceptor()  # "node-0" sorts first but is no member
    a.start()
    rejects(a, d.start(), "unknown_node")


def test_dialer_claiming_the_acceptors_own_name_is_rejected():
    a = acceptor()
    a.start()
    rejects(a, encode_object(hello_message("node-b", DIALER_NONCE, "node-b")), "unknown_node")


def test_dialer_whose_name_sorts_after_the_acceptor_is_rejected():
    d, a = dialer(name="node-c", expected="node-b"), acceptor()
    a.start()
    rejects(a, d.start(), "wrong_direction")


def test_dialer_reaching_another_node_than_it_dialled_rejects_it():
    d = dialer(expected="node-b")
    d.start()
    rejects(d, encode_object(hello_message("node-c", ACCEPTOR_NONCE, "node-a")), "unexpected_node")


def test_acceptor_reached_by_a_dialer_that_meant_another_node_rejects_it():
    d, a = dialer(expected="node-c"), acceptor(name="node-b")
    a.start()
    rejects(a, d.start(), "unexpected_node")


def test_dialer_answered_by_a_hello_meant_for_another_node_rejects_it():
    d = dialer()
    d.start()
    rejects(d, encode_object(hello_message("node-b", ACCEPTOR_NONCE, "node-c")), "unexpected_node")


@pytest.mark.parametrize("side", ["dialer", "acceptor"])
def test_wrong_version_is_rejected_on_both_sides(side):
    if side == "dialer":
        me, other_hello = dialer(), [MAGIC, PROTOCOL_VERSION + 1, "node-b", ACCEPTOR_NONCE, "node-a"]
    else:
        me, other_hello = acceptor(), [MAGIC, PROTOCOL_VERSION + 1, "node-a", DIALER_NONCE, "node-b"]
    me.start()
    error = rejects(me, encode_object(other_hello), "wrong_version")
    assert str(PROTOCOL_VERSION + 1) in error.detail


def test_a_future_version_may_reshape_its_hello_and_is_still_reported_as_a_version():
    a = acceptor()
    a.start()
    rejects(a, encode_object([MAGIC, PROTOCOL_VERSION + 1, {"name": "node-a"}]), "wrong_version")


def test_reflected_nonce_is_rejected():
    a = acceptor()
    a.start()
    rejects(a, encode_object(hello_message("node-a", ACCEPTOR_NONCE, "node-b")), "reflected_nonce")


def test_a_recorded_proof_does_not_work_with_fresh_nonces():
    """Replay: an eavesdropper replays the whole recorded dialer side to an
    acceptor with a fresh nonce, and separately to a dialer with a fresh nonce."""
    d, a = dialer(), acceptor()
    d_hello, a_hello, d_proof = run_to_proofs(d, a)
    a_proof = a.receive_data(d_proof)
    assert d.receive_data(a_proof) == b"" and d.done

    fresh_acceptor = acceptor(nonce=bytes([3]) * NONCE_BYTES)
    fresh_acceptor.start()
    fresh_acceptor.receive_data(d_hello)
    rejects(fresh_acceptor, d_proof, "bad_proof")

    fresh_dialer = dialer(nonce=bytes([4]) * NONCE_BYTES)
    fresh_dialer.start()
    fresh_dialer.receive_data(a_hello)
    rejects(fresh_dialer, a_proof, "bad_proof")


# --- truncated and garbage input at every stage -----------------------------------

def staged(role: str, stage: str) -> tuple[Handshake, bytes]:
    """A handshake of the given role waiting at the given stage, and the
    honest bytes it would receive next."""
    d, a = dialer(), acceptor()
    d_hello = d.start()
    a.start()
    if role == "acceptor" and stage == "hello":
        return a, d_hello
    a_hello = a.receive_data(d_hello)
    if stage == "hello":
        return d, a_hello
    d_proof = d.receive_data(a_hello)
    if role == "acceptor":
        return a, d_proof
    return d, a.receive_data(d_proof)


STAGES = [(role, stage) for role in ("dialer", "acceptor") for stage in ("hello", "proof")]


@pytest.mark.parametrize("role,stage", STAGES)
def test_truncated_input_waits_then_fails_as_closed(role, stage):
    _, honest = staged(role, stage)
    for cut in range(len(honest)):
        side, _ = staged(role, stage)
        state = side.state
        assert side.receive_data(honest[:cut]) == b""
        assert side.state is state, f"cut at {cut} changed the state"
        with pytest.raises(HandshakeError) as info:
            side.receive_eof()
        assert info.value.reason == "closed"
    side, _ = staged(role, stage)
    side.receive_data(honest)  # and the whole message is accepted
    assert side.state is not HandshakeState.FAILED


def not_msgpack() -> bytes:
    return encode_frame(b"\xc1")  # 0xc1 is never used by msgpack


GARBAGE = {
    "not_msgpack": (not_msgpack(), "bad_message"),
    "trailing_bytes_in_payload": (encode_frame(msgpack.packb([1]) + b"x"), "bad_message"),
    "heartbeat": (HEARTBEAT_FRAME, "bad_message"),
    "http_request": (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "bad_frame"),
    "oversize_length": (struct.pack(">I", HANDSHAKE_FRAME_MAX_BYTES + 1), "bad_frame"),
    "an_int": (encode_object(7), "bad_message"),
    "a_map": (encode_object({"name": "node-a"}), "bad_message"),
    "empty_list": (encode_object([]), "bad_message"),
    "wrong_magic": (encode_object(["rabbit", PROTOCOL_VERSION, "node-a", DIALER_NONCE, "node-b"]), "bad_message"),
    "bool_version": (encode_object([MAGIC, True, "node-a", DIALER_NONCE, "node-b"]), "bad_message"),
    "str_version": (encode_object([MAGIC, "1", "node-a", DIALER_NONCE, "node-b"]), "bad_message"),
    "version_1_hello": (encode_object([MAGIC, 1, "node-a", DIALER_NONCE]), "wrong_version"),
    "extra_field": (encode_object(hello_message("node-a", DIALER_NONCE, "node-b") + [1]), "bad_message"),
    "no_target": (encode_object([MAGIC, PROTOCOL_VERSION, "node-a", DIALER_NONCE]), "bad_message"),
    "name_not_str": (encode_object([MAGIC, PROTOCOL_VERSION, 5, DIALER_NONCE, "node-b"]), "bad_message"),
    "empty_name": (encode_object([MAGIC, PROTOCOL_VERSION, "", DIALER_NONCE, "node-b"]), "bad_message"),
    "short_nonce": (encode_object([MAGIC, PROTOCOL_VERSION, "node-a", b"x" * 8, "node-b"]), "bad_message"),
    "nonce_as_str": (encode_object([MAGIC, PROTOCOL_VERSION, "node-a", "x" * NONCE_BYTES, "node-b"]), "bad_message"),
    "target_not_str": (encode_object([MAGIC, PROTOCOL_VERSION, "node-a", DIALER_NONCE, 7]), "bad_message"),
    "proof_tag_only": (encode_object([PROOF_TAG]), "bad_message"),
    "short_proof": (encode_object([PROOF_TAG, b"x" * 16]), "bad_message"),
    "proof_as_str": (encode_object([PROOF_TAG, "x" * 32]), "bad_message"),
}


@pytest.mark.parametrize("role,stage", STAGES)
@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_garbage_at_every_stage_is_a_defined_error(role, stage, kind):
    side, _ = staged(role, stage)
    data, reason = GARBAGE[kind]
    with pytest.raises(HandshakeError) as info:
        side.receive_data(data)
    # A valid hello where a proof is due (or the reverse) is just a bad message.
    assert info.value.reason in (reason, "bad_message"), info.value
    assert side.state is HandshakeState.FAILED


@pytest.mark.parametrize("role", ["dialer", "acceptor"])
def test_a_second_hello_where_the_proof_is_due_is_rejected(role):
    side, _ = staged(role, "proof")
    rejects(side, encode_object(hello_message("node-a", bytes([9]) * NONCE_BYTES, "node-b")), "bad_message")


def test_the_target_of_a_dialers_hello_is_read_before_any_answer():
    """What a shared cluster port's acceptor reads to pass the connection on."""
    hello = dialer(expected="node-c").start()
    for cut in range(len(hello)):
        assert hello_target(hello[:cut]) is None, f"a hello cut at {cut} names no target yet"
    assert hello_target(hello) == "node-c"
    assert hello_target(hello + encode_object([PROOF_TAG, b"x" * 32])) == "node-c"


@pytest.mark.parametrize("kind", ["not_msgpack", "heartbeat", "http_request", "oversize_length", "wrong_magic",
                                  "version_1_hello", "no_target", "target_not_str"])
def test_a_head_that_is_no_hello_of_ours_names_no_target(kind):
    data, reason = GARBAGE[kind]
    with pytest.raises(HandshakeError) as info:
        hello_target(data + b"\x00" * 64)
    assert info.value.reason == reason


def test_all_error_reasons_are_documented():
    assert {"bad_proof", "wrong_version", "unknown_node", "closed"} <= HANDSHAKE_REASONS


# --- fuzz ---------------------------------------------------------------------------

msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=20)
    | st.binary(max_size=40) | st.sampled_from([MAGIC, PROOF_TAG, PROTOCOL_VERSION, "node-a"]),
    lambda children: st.lists(children, max_size=5),
    max_leaves=12)


def feed_only_defined_errors(side: Handshake, chunks: list[bytes]) -> None:
    try:
        for chunk in chunks:
            side.receive_data(chunk)
            if side.done:
                return
        side.receive_eof()
    except HandshakeError as error:
        assert error.reason in HANDSHAKE_REASONS
        assert side.state is HandshakeState.FAILED


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(STAGES), st.lists(st.binary(max_size=80), max_size=4))
def test_fuzz_arbitrary_bytes_give_only_defined_errors(role_stage, chunks):
    side, _ = staged(*role_stage)
    feed_only_defined_errors(side, chunks)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(STAGES), st.lists(msgpack_values, min_size=1, max_size=3))
def test_fuzz_framed_msgpack_values_give_only_defined_errors(role_stage, values):
    side, _ = staged(*role_stage)
    feed_only_defined_errors(side, [encode_object(value) for value in values])
    assert not side.done, "random values must never complete a handshake"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_frame_decoder_and_payload_decoder_give_only_frame_errors(data):
    decoder = FrameDecoder(64)
    try:
        decoder.feed(data)
        while (payload := decoder.next_frame()) is not None:
            if payload:
                decode_payload(payload)
    except FrameError as error:
        assert error.reason in ("frame_too_large", "undecodable")


# --- frame codec ----------------------------------------------------------------------

SAMPLE_OBJECTS = [
    ["append", 1, b"\x00\xff" * 10],
    {"k": [1, 2, None, True], 7: "int keys are allowed"},
    "",
    [],
    to_wire(AppendEntries(3, "node-a", "node-b", 4, 2, (Entry(3, 5, EntryKind.NORMAL, b"body"),), 4)),
]


def sample_stream() -> tuple[bytes, list]:
    frames = [encode_object(obj) for obj in SAMPLE_OBJECTS]
    frames.insert(2, HEARTBEAT_FRAME)
    expected = [msgpack.unpackb(msgpack.packb(obj), strict_map_key=False) for obj in SAMPLE_OBJECTS]
    expected.insert(2, "heartbeat")
    return b"".join(frames), expected


def drain(decoder: FrameDecoder) -> list:
    out = []
    while (payload := decoder.next_frame()) is not None:
        out.append(decode_payload(payload) if payload else "heartbeat")
    return out


def test_frame_codec_split_at_every_byte_boundary():
    data, expected = sample_stream()
    for cut in range(len(data) + 1):
        decoder = FrameDecoder(1024)
        decoder.feed(data[:cut])
        received = drain(decoder)
        decoder.feed(data[cut:])
        received += drain(decoder)
        assert received == expected, f"split at {cut}"
        assert decoder.buffered_bytes == 0


def test_frame_codec_byte_by_byte():
    data, expected = sample_stream()
    decoder = FrameDecoder(1024)
    received = []
    for byte in data:
        decoder.feed(bytes([byte]))
        received += drain(decoder)
    assert received == expected


def test_raft_messages_survive_the_codec():
    message = AppendEntries(3, "node-a", "node-b", 4, 2, (Entry(3, 5, EntryKind.NORMAL, b"body"),), 4)
    decoder = FrameDecoder(1024)
    decoder.feed(encode_object(to_wire(message)))
    assert from_wire(decode_payload(decoder.next_frame())) == message


def test_oversize_frame_is_refused_as_soon_as_its_header_arrives():
    decoder = FrameDecoder(100)
    decoder.feed(struct.pack(">I", 101))
    with pytest.raises(FrameError) as info:
        decoder.next_frame()
    assert info.value.reason == "frame_too_large"
    exact = FrameDecoder(100)
    exact.feed(encode_frame(b"\x00" * 100))
    assert exact.next_frame() == b"\x00" * 100


def test_undecodable_payload_is_a_frame_error():
    with pytest.raises(FrameError) as info:
        decode_payload(b"\xc1")
    assert info.value.reason == "undecodable"


# --- shell helpers that are pure enough to test here ------------------------------------

def test_backoff_is_capped_jittered_and_deterministic_with_a_seed():
    first = Backoff(0.1, 2.0, random.Random(7))
    delays = [first.next_delay() for _ in range(40)]
    again = Backoff(0.1, 2.0, random.Random(7))
    assert [again.next_delay() for _ in range(40)] == delays
    for attempt, delay in enumerate(delays):
        ceiling = min(2.0, 0.1 * 2**attempt)
        assert ceiling / 2 <= delay <= ceiling
    first.reset()
    assert 0.05 <= first.next_delay() <= 0.1


def test_limits_come_from_settings_when_it_has_them():
    base = Settings(node_name="node-a")
    assert TransportLimits.from_settings(base) == TransportLimits()

    class WithLimits:
        cluster_frame_max_bytes = 1000
        peer_outbound_max_bytes = 2000
        cluster_handshake_timeout_seconds = 1.5
        cluster_heartbeat_seconds = 0.25

    limits = TransportLimits.from_settings(WithLimits())
    assert (limits.frame_max_bytes, limits.peer_outbound_max_bytes) == (1000, 2000)
    assert (limits.handshake_timeout_seconds, limits.heartbeat_seconds) == (1.5, 0.25)

