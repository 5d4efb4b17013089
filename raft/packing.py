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


def _new_pack() -> Callable[[Any], bytes]:
    return msgpack.Packer(use_bin_type=True, autoreset=True).pack


_pack = _new_pack()


def packb(value: Any) -> bytes:
    """`msgpack.packb(value, use_bin_type=True)`, without a Packer per call."""
    global _pack
    data = _pack(value)
    if len(data) > KEEP_BUFFER_BYTES:
        _pack = _new_pack()
    return data
