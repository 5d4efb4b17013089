"""How a queue's message table (`fifo.FifoState.messages`) holds a message: its
payload and size in one int where it can, else the pair; the table to and from
columns, for snapshots; and the table itself (`MessageTable`, also the queue's
expiry times), a dict by message id in chunks."""
from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, MutableMapping
from itertools import chain
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


def packed_table(ids: list[int], payloads: list[Any], sizes: list[int]) -> MessageTable:
    """The message table from columns (a snapshot's), as `packed` makes it one message at
    a time; in C-level loops when every message packs into an int (the usual case)."""
    if (payloads and not set(map(type, payloads)) - {int} and min(payloads) >= 0
            and min(sizes) >= 0 and max(sizes) <= SIZE_MASK):
        return MessageTable.from_columns(ids, [payload << SIZE_BITS | size for payload, size in zip(payloads, sizes)])
    return MessageTable.from_columns(ids, [packed(payload, size) for payload, size in zip(payloads, sizes)])


def held_columns(values: list[Any]) -> tuple[list[Any], list[int]]:
    """(payloads, sizes) of a message table's values (in its order): `unpacked` for each."""
    if set(map(type, values)) - {int}:   # a C-level look first: tuples (a transient queue's) are rare
        pairs = list(map(unpacked, values))
        return [payload for payload, _ in pairs], [size for _, size in pairs]
    return [held >> SIZE_BITS for held in values], [held & SIZE_MASK for held in values]


# A queue's table is a dict per run of CHUNK consecutive ids, not one dict: one dict of a
# whole queue doubles its hash table now and then, rehashing every message with the loop
# stopped, and a queue that only grows meets that at 87k, 175k, 350k... messages: 13, 21 and
# 44 ms here, each a stall of every confirm in flight (the backlog case's confirm p99,
# docs/performance.md). A chunk's table never outgrows CHUNK entries; the dict of chunks has
# one entry per CHUNK messages.
CHUNK_BITS = 12
# A chunk whose messages went down to one of these counts is copied into a table its size:
# dicts never shrink as keys go, and a few long-unacked messages must not each keep a chunk's
# whole table (about 150 KB).
SHRINK_AT = frozenset({1024, 128, 16})


class MessageTable(MutableMapping):
    """msg_id -> a value (a message as `packed` holds it, an expiry time), with a dict's
    interface (the fifo and tests use it as one); in id order when new ids come in
    increasing order, as a fifo's do (where a dict keeps insertion order)."""

    __slots__ = ("_chunks", "_count", "_last_chunk", "_in_order")

    def __init__(self, items: Iterable[tuple[int, Any]] = ()) -> None:
        self._chunks: dict[int, dict[int, Any]] = {}
        self._count = 0
        self._last_chunk = -1
        self._in_order = True   # `_chunks` was filled in increasing chunk order (as a fifo's ids go)
        for msg_id, held in items:
            self[msg_id] = held

    @classmethod
    def from_columns(cls, ids: list[int], values: list[Any]) -> MessageTable:
        """The table of `ids[i] -> values[i]`; a chunk at a time in C when `ids` increase
        (a snapshot's do), one by one otherwise."""
        if len(set(ids)) != len(ids) or ids != sorted(ids):
            return cls(zip(ids, values))
        table = cls()
        start = 0
        while start < len(ids):
            key = ids[start] >> CHUNK_BITS
            stop = bisect_left(ids, (key + 1) << CHUNK_BITS, start)
            table._chunks[key] = dict(zip(ids[start:stop], values[start:stop]))
            table._last_chunk = key
            start = stop
        table._count = len(ids)
        return table

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, msg_id: int) -> Any:
        try:
            return self._chunks[msg_id >> CHUNK_BITS][msg_id]
        except KeyError:
            raise KeyError(msg_id) from None

    def get(self, msg_id: int, default: Any = None) -> Any:
        chunk = self._chunks.get(msg_id >> CHUNK_BITS)
        return default if chunk is None else chunk.get(msg_id, default)

    def __contains__(self, msg_id: object) -> bool:
        if type(msg_id) is not int:
            return False
        chunk = self._chunks.get(msg_id >> CHUNK_BITS)
        return chunk is not None and msg_id in chunk

    def __setitem__(self, msg_id: int, held: Any) -> None:
        key = msg_id >> CHUNK_BITS
        try:
            chunk = self._chunks[key]
        except KeyError:
            chunk = self._chunks[key] = {}
            if key < self._last_chunk:
                self._in_order = False
            self._last_chunk = key
        before = len(chunk)
        chunk[msg_id] = held
        self._count += len(chunk) - before

    _MISSING = object()

    def pop(self, msg_id: int, default: Any = _MISSING) -> Any:
        key = msg_id >> CHUNK_BITS
        try:
            chunk = self._chunks[key]
            held = chunk.pop(msg_id)
        except KeyError:
            if default is MessageTable._MISSING:
                raise KeyError(msg_id) from None
            return default
        self._count -= 1
        left = len(chunk)
        if left in SHRINK_AT:
            self._chunks[key] = dict(chunk)
        elif not left:
            del self._chunks[key]
        return held

    def __delitem__(self, msg_id: int) -> None:
        self.pop(msg_id)

    def clear(self) -> None:
        self._chunks.clear()
        self._count = 0
        self._last_chunk = -1
        self._in_order = True

    def _ordered_chunks(self) -> Iterable[dict[int, Any]]:
        if self._in_order:
            return self._chunks.values()
        return [self._chunks[key] for key in sorted(self._chunks)]

    def __iter__(self) -> Iterator[int]:
        return chain.from_iterable(self._ordered_chunks())

    # keys, values and items are iterators for one pass in C (a snapshot reads 700k at once), not views
    def keys(self) -> Iterator[int]:   # type: ignore[override]
        return iter(self)

    def values(self) -> Iterator[Any]:   # type: ignore[override]
        return chain.from_iterable([chunk.values() for chunk in self._ordered_chunks()])

    def items(self) -> Iterator[tuple[int, Any]]:   # type: ignore[override]
        return chain.from_iterable([chunk.items() for chunk in self._ordered_chunks()])

    def __repr__(self) -> str:
        return f"MessageTable({dict(self.items())!r})"
