"""The cluster link's wire protocol as a pure core: frame codec and handshake.

Theory of operation. Nodes talk over one TCP connection per pair. Every unit
on that connection is a frame: a u32 big-endian length, then that many bytes
of msgpack. A zero-length frame is a transport heartbeat (an empty payload is
never valid msgpack, so it cannot be confused with data). `FrameDecoder`
takes bytes as they arrive and hands back whole payloads; a length over the
limit is a `FrameError` as soon as the 4 header bytes are in, so a bad peer
cannot make us buffer more than one frame.

Before any data frame, the two ends authenticate each other with the shared
cluster secret, like Erlang's cookie but without ever sending it. The dialer
sends a hello at once: `[MAGIC, version, node_name, nonce, target]`, `target`
naming the node it means to reach; the acceptor answers with its own hello
(`target`: the dialer) once it has read the dialer's, so that whoever accepts
on a port shared by several of a node's processes can read whom the
connection is for and pass it on before answering
(broker/node/shared_cluster_port.py). Each then proves that it knows the
secret with

    HMAC-SHA256(secret, msgpack([DOMAIN, version, own_role,
                                 dialer_nonce, acceptor_nonce,
                                 dialer_name, acceptor_name]))

msgpack makes the concatenation unambiguous; the role stops a proof from
being reflected back at its author; fresh nonces from both sides stop a
recorded proof from being replayed. The order of the proofs matters: the
dialer proves first and the acceptor proves only once it has checked the
dialer's proof, so somebody who merely connects to a cluster port never
gets a proof to attack offline. Transcript (D = dialer, A = acceptor):

    D -> A  hello(D, to A)    A -> D  hello(A, to D)
    D -> A  proof(D)          (A checks it; wrong -> close)
    A -> D  proof(A)          (D checks it; wrong -> close)
    both: established; data frames may follow A's proof at once.

The node with the smaller name dials (see raft/transport.py), so the
acceptor also insists that the dialer's name sorts before its own and that
the dialer meant to reach it, and the dialer insists that the acceptor is
the node it meant to reach. Anything else is a `HandshakeError` with a
`reason` from `HANDSHAKE_REASONS`; the shell logs it and closes the
connection. No I/O, no clock, no randomness: the nonce is an argument.
"""
from __future__ import annotations

import hashlib
import hmac
import struct
from enum import Enum
from typing import Any

import msgpack

from warren.raft import packing

# 2: the hello names its target, and the acceptor's answers the dialer's (1: both at once).
PROTOCOL_VERSION = 2
MAGIC = "warren-cluster"
PROOF_TAG = "proof"
DOMAIN = "warren-cluster-auth"
NONCE_BYTES = 32
PROOF_BYTES = 32  # SHA-256
NODE_NAME_MAX_BYTES = 255
# Handshake frames are tiny; a stranger must not make us buffer a data frame's worth.
HANDSHAKE_FRAME_MAX_BYTES = 1024
FRAME_HEADER = struct.Struct(">I")
FRAME_HEADER_BYTES = FRAME_HEADER.size
HEARTBEAT_FRAME = FRAME_HEADER.pack(0)
# u32 length: no frame can say more than this.
FRAME_LENGTH_MAX_BYTES = 2**32 - 1

HANDSHAKE_REASONS = frozenset({
    "bad_frame",          # framing broken: a length over the handshake limit
    "bad_message",        # not msgpack, or not the shape of a hello/proof
    "wrong_version",      # the peer speaks another protocol version
    "unknown_node",       # the dialer's name is not a cluster member
    "unexpected_node",    # the acceptor is not the node we dialled, or the dialer meant another
    "wrong_direction",    # the dialer's name does not sort before ours
    "reflected_nonce",    # the peer sent our own nonce back
    "bad_proof",          # the peer does not know the secret (or replays)
    "closed",             # the connection ended mid-handshake
})


class WireError(Exception):
    """Bad input on a cluster connection; `reason` is a short fixed word."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class FrameError(WireError):
    """A frame over the size limit or a payload that is not msgpack."""


class HandshakeError(WireError):
    def __init__(self, reason: str, detail: str = ""):
        assert reason in HANDSHAKE_REASONS, reason
        super().__init__(reason, detail)


# --- frames -------------------------------------------------------------------

def encode_frame(payload: bytes) -> bytes:
    assert len(payload) <= FRAME_LENGTH_MAX_BYTES
    return FRAME_HEADER.pack(len(payload)) + payload


def encode_object(obj: Any) -> bytes:
    """A whole frame for a msgpack-able object."""
    return encode_frame(packing.packb(obj))


def decode_payload(payload: bytes) -> Any:
    """The object in a non-empty frame payload; FrameError if it is not msgpack."""
    assert payload, "an empty payload is a heartbeat, not data"
    try:
        # Map keys may be ints (strict_map_key=False); sizes are capped by the payload's length.
        return msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, TypeError, OverflowError, msgpack.UnpackException) as exc:
        raise FrameError("undecodable", type(exc).__name__) from None


class FrameDecoder:
    """Bytes in, whole frame payloads out. Holds at most one partial frame,
    whose announced length has already been checked against the limit."""

    def __init__(self, frame_max_bytes: int):
        assert 0 < frame_max_bytes <= FRAME_LENGTH_MAX_BYTES
        self.frame_max_bytes = frame_max_bytes
        self._buffer = bytearray()
        self._offset = 0

    def feed(self, data: bytes) -> None:
        if self._offset:
            del self._buffer[:self._offset]
            self._offset = 0
        self._buffer += data

    def next_frame(self) -> bytes | None:
        """The next whole payload (b"" for a heartbeat), or None if more bytes are needed."""
        available = len(self._buffer) - self._offset
        if available < FRAME_HEADER_BYTES:
            return None
        (length,) = FRAME_HEADER.unpack_from(self._buffer, self._offset)
        if length > self.frame_max_bytes:
            raise FrameError("frame_too_large", f"{length} bytes > {self.frame_max_bytes}")
        if available < FRAME_HEADER_BYTES + length:
            return None
        start = self._offset + FRAME_HEADER_BYTES
        self._offset = start + length
        return bytes(self._buffer[start:self._offset])

    def take_buffer(self) -> bytes:
        """Everything not yet returned as a frame; the decoder is empty afterwards."""
        rest = bytes(self._buffer[self._offset:])
        self._buffer.clear()
        self._offset = 0
        return rest

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer) - self._offset


# --- handshake ----------------------------------------------------------------

class Role(str, Enum):
    DIALER = "dialer"
    ACCEPTOR = "acceptor"


class HandshakeState(str, Enum):
    AWAIT_HELLO = "await_hello"
    AWAIT_PROOF = "await_proof"
    DONE = "done"
    FAILED = "failed"


def hello_message(node_name: str, nonce: bytes, target: str, version: int = PROTOCOL_VERSION) -> list:
    return [MAGIC, version, node_name, nonce, target]


def hello_target(head: bytes) -> str | None:
    """Whom a dialer's connection is for, from the bytes it sent first: None until
    its hello is whole; HandshakeError if they are not a hello of our version."""
    if len(head) < FRAME_HEADER_BYTES:
        return None
    (length,) = FRAME_HEADER.unpack_from(head)
    if length > HANDSHAKE_FRAME_MAX_BYTES:
        raise HandshakeError("bad_frame", f"{length} bytes > {HANDSHAKE_FRAME_MAX_BYTES}")
    if len(head) < FRAME_HEADER_BYTES + length:
        return None
    if length == 0:
        raise HandshakeError("bad_message", "heartbeat before the handshake finished")
    return parse_hello(_decode_handshake_message(head[FRAME_HEADER_BYTES:FRAME_HEADER_BYTES + length]))[2]


def compute_proof(secret: bytes, role: Role, dialer_nonce: bytes, acceptor_nonce: bytes,
                  dialer_name: str, acceptor_name: str, version: int = PROTOCOL_VERSION) -> bytes:
    message = msgpack.packb([DOMAIN, version, role.value, dialer_nonce, acceptor_nonce,
                             dialer_name, acceptor_name], use_bin_type=True)
    return hmac.new(secret, message, hashlib.sha256).digest()


class Handshake:
    """One side of the handshake. `start()` gives the hello to send (the dialer's;
    b"" for the acceptor, whose hello answers the dialer's);
    `receive_data(bytes)` gives bytes to send (maybe b"") or raises
    HandshakeError; once `state` is DONE, `trailing_data()` holds whatever
    arrived after the handshake (the first data frames, possibly partial)."""

    def __init__(self, *, role: Role, node_name: str, secret: bytes, nonce: bytes,
                 known_nodes: frozenset[str] | set[str], expected_peer: str | None = None,
                 version: int = PROTOCOL_VERSION):
        assert secret, "the cluster secret must not be empty"
        assert len(nonce) == NONCE_BYTES
        assert 0 < len(node_name.encode()) <= NODE_NAME_MAX_BYTES
        assert (role is Role.DIALER) == (expected_peer is not None), "a dialer knows whom it dials"
        self.role = role
        self.node_name = node_name
        self._secret = secret
        self.nonce = nonce
        self.known_nodes = frozenset(known_nodes)
        self.expected_peer = expected_peer
        self.version = version
        self.state = HandshakeState.AWAIT_HELLO
        self.peer_name: str | None = None
        self.peer_nonce: bytes | None = None
        self._decoder = FrameDecoder(HANDSHAKE_FRAME_MAX_BYTES)
        self._started = False

    def __repr__(self) -> str:  # never show the secret
        return f"Handshake(role={self.role.value}, node={self.node_name}, state={self.state.value})"

    @property
    def done(self) -> bool:
        return self.state is HandshakeState.DONE

    def start(self) -> bytes:
        assert not self._started
        self._started = True
        if self.role is Role.ACCEPTOR:
            return b""
        assert self.expected_peer is not None
        return encode_object(hello_message(self.node_name, self.nonce, self.expected_peer, self.version))

    def receive_data(self, data: bytes) -> bytes:
        assert self._started, "start() first"
        assert self.state in (HandshakeState.AWAIT_HELLO, HandshakeState.AWAIT_PROOF), self.state
        self._decoder.feed(data)
        out: list[bytes] = []
        try:
            while self.state is not HandshakeState.DONE:
                payload = self._next_payload()
                if payload is None:
                    break
                out.append(self._on_message(_decode_handshake_message(payload)))
        except HandshakeError:
            self.state = HandshakeState.FAILED
            raise
        return b"".join(out)

    def receive_eof(self) -> None:
        """The peer closed the connection: fine once DONE, an error before."""
        if self.state is not HandshakeState.DONE:
            self.state = HandshakeState.FAILED
            raise HandshakeError("closed", "connection closed during the handshake")

    def trailing_data(self) -> bytes:
        assert self.done
        return self._decoder.take_buffer()

    def _next_payload(self) -> bytes | None:
        try:
            payload = self._decoder.next_frame()
        except FrameError as exc:
            raise HandshakeError("bad_frame", exc.detail) from None
        if payload == b"":
            raise HandshakeError("bad_message", "heartbeat before the handshake finished")
        return payload

    def _on_message(self, message: Any) -> bytes:
        match self.state:
            case HandshakeState.AWAIT_HELLO:
                return self._on_hello(message)
            case HandshakeState.AWAIT_PROOF:
                return self._on_proof(message)
        raise AssertionError(f"no message expected in state {self.state}")

    def _on_hello(self, message: Any) -> bytes:
        peer_name, peer_nonce, target = parse_hello(message, self.version)
        self._check_peer_name(peer_name)
        if target != self.node_name:
            raise HandshakeError("unexpected_node", f"{peer_name!r} meant to reach {target!r}, not {self.node_name!r}")
        if peer_nonce == self.nonce:
            raise HandshakeError("reflected_nonce")
        self.peer_name = peer_name
        self.peer_nonce = peer_nonce
        self.state = HandshakeState.AWAIT_PROOF
        if self.role is Role.DIALER:
            return encode_object([PROOF_TAG, self._proof(Role.DIALER)])
        # The acceptor answers with its hello and proves itself only after the dialer has.
        return encode_object(hello_message(self.node_name, self.nonce, peer_name, self.version))

    def _on_proof(self, message: Any) -> bytes:
        proof = parse_proof(message)
        peer_role = Role.ACCEPTOR if self.role is Role.DIALER else Role.DIALER
        if not hmac.compare_digest(proof, self._proof(peer_role)):
            raise HandshakeError("bad_proof", f"{self.peer_name} does not prove the cluster secret "
                                 "(another cluster_secret, or another node_processes)")
        self.state = HandshakeState.DONE
        if self.role is Role.ACCEPTOR:
            return encode_object([PROOF_TAG, self._proof(Role.ACCEPTOR)])
        return b""

    def _check_peer_name(self, peer_name: str) -> None:
        if self.role is Role.DIALER:
            if peer_name != self.expected_peer:
                raise HandshakeError("unexpected_node", f"dialled {self.expected_peer}, reached {peer_name!r}")
            return
        if peer_name not in self.known_nodes or peer_name == self.node_name:
            raise HandshakeError("unknown_node", f"{peer_name!r} is not a cluster member")
        if not peer_name < self.node_name:
            raise HandshakeError("wrong_direction", f"{peer_name!r} must wait for {self.node_name!r} to dial")

    def _proof(self, role: Role) -> bytes:
        assert self.peer_name is not None and self.peer_nonce is not None
        if self.role is Role.DIALER:
            dialer = (self.node_name, self.nonce)
            acceptor = (self.peer_name, self.peer_nonce)
        else:
            dialer = (self.peer_name, self.peer_nonce)
            acceptor = (self.node_name, self.nonce)
        return compute_proof(self._secret, role, dialer[1], acceptor[1], dialer[0], acceptor[0], self.version)


def _decode_handshake_message(payload: bytes) -> Any:
    try:
        return decode_payload(payload)
    except FrameError as exc:
        raise HandshakeError("bad_message", exc.detail) from None


def parse_hello(message: Any, version: int = PROTOCOL_VERSION) -> tuple[str, bytes, str]:
    """(node_name, nonce, target) of a hello. The version is checked before the rest,
    so that a later version may change the shape of what follows it."""
    if not isinstance(message, list) or len(message) < 2 or message[0] != MAGIC:
        raise HandshakeError("bad_message", "not a cluster hello")
    peer_version = message[1]
    if type(peer_version) is not int:
        raise HandshakeError("bad_message", "hello without a version")
    if peer_version != version:
        raise HandshakeError("wrong_version", f"peer speaks version {peer_version}, we speak {version}")
    if len(message) != 5:
        raise HandshakeError("bad_message", "hello has the wrong number of fields")
    _, _, name, nonce, target = message
    if not isinstance(name, str) or not 0 < len(name.encode()) <= NODE_NAME_MAX_BYTES:
        raise HandshakeError("bad_message", "hello without a valid node name")
    if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES:
        raise HandshakeError("bad_message", "hello without a valid nonce")
    if not isinstance(target, str) or not 0 < len(target.encode()) <= NODE_NAME_MAX_BYTES:
        raise HandshakeError("bad_message", "hello without a valid target node name")
    return name, nonce, target


def parse_proof(message: Any) -> bytes:
    if (not isinstance(message, list) or len(message) != 2 or message[0] != PROOF_TAG
            or not isinstance(message[1], bytes) or len(message[1]) != PROOF_BYTES):
        raise HandshakeError("bad_message", "not a proof")
    return message[1]
