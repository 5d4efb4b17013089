"""The cluster transport's bounds and its reconnect backoff (raft/transport.py)."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class TransportLimits:
    """Every bound of the transport, with its unit in its name."""
    frame_max_bytes: int = 64 * MIB
    peer_outbound_max_bytes: int = 64 * MIB
    handshake_timeout_seconds: float = 5.0
    heartbeat_seconds: float = 0.25
    reconnect_initial_seconds: float = 0.1
    reconnect_max_seconds: float = 5.0
    connect_timeout_seconds: float = 5.0
    # The socket's write buffer above which we stop draining a peer's queue.
    write_buffer_high_bytes: int = 4 * MIB
    # Inbound connections that have not finished their handshake yet.
    pending_handshakes_max: int = 64

    def __post_init__(self) -> None:
        assert self.frame_max_bytes > 0
        assert self.frame_max_bytes <= 2**32 - 1
        assert self.peer_outbound_max_bytes > 0
        assert self.handshake_timeout_seconds > 0
        assert self.heartbeat_seconds > 0
        assert 0 < self.reconnect_initial_seconds <= self.reconnect_max_seconds
        assert self.connect_timeout_seconds > 0
        assert self.write_buffer_high_bytes > 0
        assert self.pending_handshakes_max > 0

    @classmethod
    def from_settings(cls, settings: Any) -> TransportLimits:
        """The configured cluster_* limits; the rest keep their defaults."""
        return cls(
            frame_max_bytes=settings.cluster_frame_max_bytes,
            peer_outbound_max_bytes=settings.peer_outbound_max_bytes,
            handshake_timeout_seconds=settings.cluster_handshake_timeout_seconds,
            heartbeat_seconds=settings.cluster_heartbeat_seconds,
        )


class Backoff:
    """Capped exponential backoff with "equal jitter": the n-th delay is
    uniform in [d/2, d] with d = min(max, initial * 2**n)."""

    ATTEMPTS_MAX = 32  # 2**32 * any sane initial delay is far past any cap

    def __init__(self, initial_seconds: float, max_seconds: float, rng: random.Random):
        assert 0 < initial_seconds <= max_seconds
        self.initial_seconds = initial_seconds
        self.max_seconds = max_seconds
        self._rng = rng
        self.attempt = 0

    def next_delay(self) -> float:
        ceiling = min(self.max_seconds, self.initial_seconds * 2**self.attempt)
        self.attempt = min(self.attempt + 1, self.ATTEMPTS_MAX)
        delay = ceiling * self._rng.uniform(0.5, 1.0)
        assert 0 < delay <= self.max_seconds
        return delay

    def reset(self) -> None:
        self.attempt = 0
