"""msgpack encoding with one reused Packer per thread.

`msgpack.packb` makes a new `Packer` per call, and each Packer allocates a
256 KiB buffer and frees it again. In a running node that costs far more than
the encoding: measured at 5k msg/s on one node, 6.4 µs per call on average
and 1,818 of 55,267 calls over 50 µs, against 2.1 µs and 131 with a reused
Packer (docs/performance.md). The Packer is per thread because the loop and
the WAL writer's threads may both encode; a Packer resets its buffer after an
error, so a value that cannot be encoded leaves it usable. Its buffer grows to
the largest value packed and stays: after a value over `KEEP_BUFFER_BYTES` (a
large message's entry) the thread's Packer is dropped, so memory stays bounded.
"""
from __future__ import annotations

import threading
from typing import Any

import msgpack

KEEP_BUFFER_BYTES = 1 << 20

_per_thread = threading.local()


def packb(value: Any) -> bytes:
    """`msgpack.packb(value, use_bin_type=True)`, without a Packer per call."""
    try:
        pack = _per_thread.pack
    except AttributeError:
        pack = _per_thread.pack = msgpack.Packer(use_bin_type=True, autoreset=True).pack
    data = pack(value)
    if len(data) > KEEP_BUFFER_BYTES:
        del _per_thread.pack
    return data
