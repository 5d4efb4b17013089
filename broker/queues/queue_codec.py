"""The one codec of the queue vocabulary (broker/queues/queue_commands.py), for the
Raft log and the wire alike: a record is the msgpack array ``[TAG, field, ...]``,
its fields in declaration order. Bodies and properties stay the client's bytes
(msgpack bin), packed once and never re-packed.

This is the positional form every earlier version wrote (a command was
``[opcode, ...]`` with the same opcodes and positions), so an old log replays
through `decode` unchanged; `decode_positional` gives the bare list, for a
check that needs no record (a forwarded command's opcode).
"""
from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter, itemgetter
from typing import Any

import msgpack

from warren.broker.queues import queue_commands as qc
from warren.raft import packing

_RECORDS: tuple[Any, ...] = qc.COMMANDS + qc.EFFECTS   # record classes (TAG, __slots__)
BY_TAG: dict[int, Any] = {cls.TAG: cls for cls in _RECORDS}
assert len(BY_TAG) == len(_RECORDS), "every record has its own tag"
# Fields per tag (the arity of the positional form is this plus one, for the tag).
FIELDS: dict[int, tuple[str, ...]] = {cls.TAG: cls.__slots__ for cls in _RECORDS}
ARITY: dict[int, int] = {tag: len(fields) + 1 for tag, fields in FIELDS.items() if BY_TAG[tag] in qc.COMMANDS}
# Fields added to a record after logs were written with it: an older entry has fewer, and the
# record's defaults fill them (Checkout.exclusive, NodeGone.keep_consumers).
ADDED_FIELDS: dict[int, int] = {qc.Checkout.TAG: 1, qc.NodeGone.TAG: 1}
LIVENESS_TAGS = frozenset(tag for tag, cls in BY_TAG.items() if cls in qc.LIVENESS)


def _getter(fields: tuple[str, ...]) -> Callable[[Any], tuple]:
    if len(fields) == 1:
        name = fields[0]
        return lambda record: (getattr(record, name),)
    return attrgetter(*fields)


_VALUES: dict[type, Callable[[Any], tuple]] = {cls: _getter(cls.__slots__) for cls in _RECORDS}


def _tuples(value: Any) -> Any:
    """msgpack gives arrays back as lists; effects hold tuples (consumer ids, payloads)."""
    return tuple(_tuples(item) for item in value) if isinstance(value, list) else value


def _dequeued_to_wire(values: tuple) -> tuple:
    owner, request_id, dequeued = values
    if dequeued is None:
        return values
    payload = dequeued.payload
    return owner, request_id, [dequeued.msg_id, payload, dequeued.redelivered, dequeued.message_count,
                               dequeued.delivery_count]


def _dequeued_from_wire(values: list) -> list:
    owner, request_id, dequeued = values
    if dequeued is not None:
        msg_id, payload, redelivered, count, delivery_count = dequeued
        dequeued = qc.Dequeued(msg_id, _tuples(payload), redelivered, count, delivery_count)
    return [owner, request_id, dequeued]


# Effects whose fields are not plain msgpack values, both ways.
_TO_WIRE: dict[type, Callable[[tuple], tuple]] = {qc.Got: _dequeued_to_wire}
_FROM_WIRE: dict[type, Callable[[list], list]] = {
    qc.Got: _dequeued_from_wire,
    qc.Delivery: lambda values: [_tuples(values[0]), *values[1:3], _tuples(values[3]), *values[4:]],
    qc.DeadLettered: lambda values: [values[0], _tuples(values[1])],
}


class MalformedCommand(ValueError):
    """Bytes that are not a record of the vocabulary: a bug or a hostile peer."""


def encode(record: Any) -> bytes:
    kind = type(record)
    values = _VALUES[kind](record)
    if kind in _TO_WIRE:
        values = _TO_WIRE[kind](values)
    return packing.packb([record.TAG, *values])


# A published body this large is not copied into its command: the command is built
# around it (`encode_publishes`). Below it, copying costs less than the pieces do
# (docs/performance.md, "Large bodies referenced, not copied").
BODY_PIECE_MIN_BYTES = 16 * 1024
_body = itemgetter(3)


def encode_publishes(command: qc.EnqueueBatch) -> bytes | packing.Pieces:
    """`encode(command)`; when one of its bodies has `BODY_PIECE_MIN_BYTES` or more, the
    same bytes as `packing.Pieces` that hold each such body itself, not a copy (the
    WAL writes them as they are): the msgpack around the bodies, the bodies between."""
    messages = command.messages
    if not messages or max(map(len, map(_body, messages))) < BODY_PIECE_MIN_BYTES:
        return encode(command)
    pack = packing.packb
    around = pack([command.TAG, command.enqueuer, command.first_seq, command.now_ms, []])[:-1]
    parts: list[bytes] = []
    pending = [around, _array_header(len(messages))]   # msgpack not yet cut into a part
    small: list = []                                   # a run of messages packed whole
    for message in messages:
        body = message[3]
        if len(body) < BODY_PIECE_MIN_BYTES:
            small.append(message)
            continue
        if small:
            pending.append(_array_items(pack(small), len(small)))
            small = []
        exchange, routing_key, properties, _, ttl_ms, priority = message
        head = _array_items(pack([exchange, routing_key, properties]), 3)
        pending += (_ARRAY_OF_SIX, head, packing.bin_header(len(body)))
        parts += (b"".join(pending), body)
        pending = [pack(ttl_ms), pack(priority)]
    if small:
        pending.append(_array_items(pack(small), len(small)))
    parts.append(b"".join(pending))
    return packing.Pieces(tuple(parts))


_ARRAY_OF_SIX = b"\x96"


def _array_header(count: int) -> bytes:
    return bytes((0x90 | count,)) if count < 16 else b"\xdc" + count.to_bytes(2, "big")


def _array_items(packed: bytes, count: int) -> bytes:
    """The items of a packed array, without its header."""
    return packed[1 if count < 16 else 3:]


def decode(data: bytes) -> Any:
    return from_positional(_record_value(data))


def decode_read_back(data: bytes) -> Any:
    """`decode` for a log entry read back to deliver its messages: arrays come out as
    tuples, so a message's (exchange, routing_key, properties, body) is one slice of
    it, not a list sliced and copied into a tuple (a backlog's drain does it per message)."""
    return from_positional(_record_value(data, use_list=False))


def decode_positional(data: bytes) -> list:
    """The bare ``[tag, field, ...]`` list of an encoded record."""
    return _record_value(data)


def _record_value(data: bytes, use_list: bool = True) -> Any:
    if type(data) is packing.Pieces:
        data = bytes(data)   # a command this node built around its bodies: whole to be decoded
    try:
        value = msgpack.unpackb(data, raw=False, use_list=use_list)
    except Exception as exc:  # noqa: BLE001 -- msgpack raises several kinds for bad bytes
        raise MalformedCommand(f"not msgpack: {exc}") from exc
    if type(value) is not (list if use_list else tuple) or not value:
        raise MalformedCommand(f"a record is a non-empty list, not {value!r}")
    return value


def from_positional(value: list) -> Any:
    """A record from its positional form (as every version has logged commands; a tuple
    for `decode_read_back`)."""
    tag = value[0]
    cls = BY_TAG.get(tag) if isinstance(tag, int) else None
    if cls is None or not 0 <= len(FIELDS[tag]) + 1 - len(value) <= ADDED_FIELDS.get(tag, 0):
        raise MalformedCommand(f"malformed command {value!r}")
    values = value[1:]
    if cls in _FROM_WIRE:
        values = _FROM_WIRE[cls](values)
    return cls(*values)


def forwardable_tag(data: Any) -> int | None:
    """The tag of a queue command a peer may forward: well formed, a command, and not
    a liveness statement (a node's up/down/gone is stated by the current leader's own
    view only, never forwarded). None if not."""
    try:
        value = decode_positional(data)
        from_positional(value)
    except (MalformedCommand, TypeError):
        return None
    tag = value[0]
    return tag if tag in ARITY and tag not in LIVENESS_TAGS else None
