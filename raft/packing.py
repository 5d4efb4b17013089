"""msgpack encoding with one reused Packer.

`msgpack.packb` makes a new `Packer` per call, and each Packer allocates a
256 KiB buffer and frees it again. In a running node that costs far more than
the encoding: measured at 5k msg/s on one node, 6.4 µs per call on average
and 1,818 of 55,267 calls over 50 µs, against 2.1 µs and 131 with a reused
Packer (docs/performance.md). One Packer serves the process: the loop is the
one thread that encodes (the WAL writer's threads write bytes already encoded),
and `Packer.pack` of the plain values encoded here (lists, exact dicts, ints,
bytes, str) is one C call that holds the GIL throughout. A Packer resets its
buffer after an error, so a value that cannot be encoded leaves it usable. Its
buffer grows to the largest value packed and stays: after a value over
`KEEP_BUFFER_BYTES` (a large message's entry) a new Packer is made, so memory
stays bounded.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack

KEEP_BUFFER_BYTES = 1 << 20


class Pieces:
    """Bytes kept as the pieces whose concatenation they are: a queue's publish command
    built around its large bodies, which are not copied into it
    (`queue_codec.encode_publishes`). The WAL writes the pieces as they are
    (`raft_storage.entry_record`); `len()` is the bytes' length, and where the bytes
    must be whole (sent to another node or shard: `packb` packs them as their bin;
    decoded: `queue_codec`) they are joined then, the one copy. Equal to the bytes
    they join to."""

    __slots__ = ("parts", "size")

    def __init__(self, parts: tuple[bytes, ...]) -> None:
        self.parts = parts
        self.size = sum(map(len, parts))

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Pieces):
            return bytes(self) == bytes(other)
        return isinstance(other, (bytes, bytearray, memoryview)) and bytes(self) == other

    def __hash__(self) -> int:
        return hash(bytes(self))

    def __repr__(self) -> str:
        return f"Pieces({len(self.parts)} parts, {self.size} bytes)"


def bin_header(size: int) -> bytes:
    """msgpack's header of a bin of `size` bytes (what `packb` writes before bytes)."""
    if size < 1 << 8:
        return b"\xc4" + size.to_bytes(1, "big")
    if size < 1 << 16:
        return b"\xc5" + size.to_bytes(2, "big")
    return b"\xc6" + size.to_bytes(4, "big")


def _whole(value: Any) -> bytes:
    """msgpack's hook for a type it does not know: `Pieces` go as the bytes they join to."""
    if type(value) is Pieces:
        return bytes(value)
    if isinstance(value, int):   # msgpack asks about an int it cannot hold: as without the hook
        raise OverflowError("int too big to convert")
    raise TypeError(f"can not serialize {type(value).__name__!r} object")


def _new_pack() -> Callable[[Any], bytes]:
    return msgpack.Packer(use_bin_type=True, autoreset=True, default=_whole).pack


_pack = _new_pack()


def packb(value: Any) -> bytes:
    """`msgpack.packb(value, use_bin_type=True)`, without a Packer per call."""
    global _pack
    data = _pack(value)
    if len(data) > KEEP_BUFFER_BYTES:
        _pack = _new_pack()
    return data
