"""How a queue's message table (`fifo.FifoState.messages`) holds a message: its
payload and size in one int where it can, else the pair; and the table to and
from columns, for snapshots."""
from __future__ import annotations

from typing import Any

# A message is kept in `FifoState.messages` as one int, `payload << SIZE_BITS | size`, when its
# payload is a replicated queue's reference (an int): a dict that only ever held ints is never
# tracked by the cyclic collector, which otherwise walks the whole table in every collection
# of its generation, a pause that grows with the queue (docs/performance.md). Any other
# payload (a transient queue's message itself) as the tuple (payload, size).
SIZE_BITS = 40
SIZE_MASK = (1 << SIZE_BITS) - 1


def packed(payload: Any, size: int) -> Any:
    if type(payload) is int and payload >= 0 and 0 <= size <= SIZE_MASK:
        return payload << SIZE_BITS | size
    return (payload, size)


def unpacked(held: Any) -> tuple[Any, int]:
    """(payload, size) of a message as the table holds it."""
    return (held >> SIZE_BITS, held & SIZE_MASK) if type(held) is int else held


def packed_table(ids: list[int], payloads: list[Any], sizes: list[int]) -> dict[int, Any]:
    """The message table from columns (a snapshot's), as `packed` makes it one message at
    a time; in C-level loops when every message packs into an int (the usual case)."""
    if (payloads and not set(map(type, payloads)) - {int} and min(payloads) >= 0
            and min(sizes) >= 0 and max(sizes) <= SIZE_MASK):
        return dict(zip(ids, [payload << SIZE_BITS | size for payload, size in zip(payloads, sizes)]))
    return {msg_id: packed(payload, size) for msg_id, payload, size in zip(ids, payloads, sizes)}


def table_columns(messages: dict[int, Any]) -> tuple[list[Any], list[int]]:
    """(payloads, sizes) of the message table, in its order: `unpacked` for every message."""
    values = list(messages.values())
    if set(map(type, values)) - {int}:   # a C-level look first: tuples (a transient queue's) are rare
        pairs = list(map(unpacked, values))
        return [payload for payload, _ in pairs], [size for _, size in pairs]
    return [held >> SIZE_BITS for held in values], [held & SIZE_MASK for held in values]
