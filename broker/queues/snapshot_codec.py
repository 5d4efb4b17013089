"""The fifo state of a quorum queue's machine (broker/queues/fifo.py) in the
form its snapshots hold (broker/queues/quorum_machine.py packs it with msgpack).

Version 3 keeps every per-message table as flat columns of ints (one list per
field: ids, references, sizes...) instead of a list per message: a snapshot
of a queue holding 700k messages built 700k lists (~1 s of the event loop
with the collections they set off, docs/performance.md), while a column is
built by C-level iterators and msgpack writes each int in the fewest bytes
(it beat ``array`` columns of fixed-width ints, which need a Python int per
element on the way in and were no smaller). Payloads are log references
(ints) in a replicated queue; a machine without a log keeps them inline,
listed apart by position. Version 2 (a list per message) is still read.
"""
from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Mapping
from typing import Any

from warren.broker.queues import fifo, message_table
from warren.broker.queues import queue_commands as qc
from warren.raft import packing


def int_map(mapping: Mapping[int, int]) -> list:
    """An int -> int dict (or message table) as two columns, keys and values, in its order."""
    return [list(mapping.keys()), list(mapping.values())]


def int_map_from(wire: list) -> dict[int, int]:
    keys, values = wire
    return dict(zip(keys, values))


# -- the message table ---------------------------------------------------------------------
def _messages_to_wire(ids: list[int], held: list[Any]) -> list:
    """[ids, refs, sizes, inline]: columns of the table's keys and values (`captured`
    copies, in id order); an inline payload (no log) is [position, list(payload)] in
    `inline`, 0 in refs."""
    refs, sizes = message_table.held_columns(held)
    inline: list[list] = []
    if set(map(type, refs)) - {int}:   # a C-level look first: inline payloads are rare
        inline = [[position, list(payload)] for position, payload in enumerate(refs) if type(payload) is not int]
        for position, _ in inline:
            refs[position] = 0
    return [ids, refs, sizes, inline]


def _messages_from_wire(wire: list) -> message_table.MessageTable:
    ids, refs, sizes, inline = wire
    messages = message_table.packed_table(ids, refs, sizes)
    for position, payload in inline:   # the key is there already: its place is kept
        messages[ids[position]] = message_table.packed(tuple(payload), sizes[position])
    return messages


# -- the whole fifo ---------------------------------------------------------------------------
def fifo_to_wire(state: fifo.FifoState) -> list:
    return finish(capture(state))


def capture(state: fifo.FifoState) -> list:
    """The fifo's wire form as of now, sharing nothing mutable with `state`, but with
    its message table still as C-level copies of its keys and values: `finish` turns
    those into columns (Python-level work per message, and most of a snapshot's cost),
    so a release cursor candidate costs that only if it is ever promoted."""
    limits = {f.name: getattr(state.limits, f.name) for f in dataclasses.fields(fifo.QueueLimits)}
    by_id: dict[Any, fifo.ConsumerState] = state.consumers   # ids are (owner, tag) tuples
    consumers = [[list(cid), c.prefetch, c.priority, c.no_ack, list(c.checked_out), c.cancelled, c.suspended,
                  c.in_service, c.ticket, c.exclusive] for cid, c in by_id.items()]
    messages = (list(state.messages.keys()), list(state.messages.values()))
    return [limits, messages, int_map(state.delivery_counts), list(state.ready), list(state.returns),
            state.ready_bytes, state.message_bytes, int_map(state.expiries), int_map(state.message_priorities),
            state.now_ms, consumers, _service_to_wire(state)]


def finish(captured: list) -> list:
    """A `capture` as the snapshot holds it (version 3)."""
    limits, messages, *rest = captured
    return [limits, _messages_to_wire(*messages), *rest]


def _service_to_wire(state: fifo.FifoState) -> list:
    """The service deques without their stale entries (fifo removes entries
    lazily; a stale entry never becomes valid again, so dropping it changes nothing)."""
    service: list[tuple[int, list]] = []
    for priority, waiting in state.service.items():
        live = [list(cid) for cid, consumer, ticket in waiting
                if consumer.in_service and ticket == consumer.ticket and state.consumers.get(cid) is consumer]
        service.append((priority, live))
    in_service = sum(1 for c in state.consumers.values() if c.in_service)
    assert in_service == sum(len(live) for _, live in service), "one service turn per consumer in service"
    return service


def fifo_from_wire(wire: list, version: int) -> fifo.FifoState:
    """The fifo of a version 3 snapshot, or of a version 2 one (a list per message)."""
    (limits, messages, counts, ready, returns, ready_bytes, message_bytes, expiries, priorities, now_ms,
     consumers, service) = wire
    state = fifo.FifoState(limits=fifo.QueueLimits(**limits))
    if version == 2:
        state.messages = message_table.MessageTable(
            (msg_id, message_table.packed(payload if type(payload) is int else tuple(payload), size))
            for msg_id, payload, size in messages)
        state.delivery_counts, state.message_priorities = dict(counts), dict(priorities)
        state.expiries = message_table.MessageTable(dict(expiries).items())
    else:
        state.messages = _messages_from_wire(messages)
        state.delivery_counts = int_map_from(counts)
        state.expiries = message_table.MessageTable.from_columns(*expiries)
        state.message_priorities = int_map_from(priorities)
    state.ready, state.returns = deque(ready), returns
    # `returns` is already a heap: kept in the same order
    state.ready_bytes, state.message_bytes, state.now_ms = ready_bytes, message_bytes, now_ms
    # a consumer's `exclusive` came later: a snapshot written before has none (not exclusive)
    for cid, prefetch, priority, no_ack, checked_out, cancelled, suspended, in_service, ticket, *exclusive \
            in consumers:
        state.consumers[tuple(cid)] = fifo.ConsumerState(
            prefetch, priority, no_ack, dict.fromkeys(checked_out, 0), cancelled, suspended, in_service, ticket,
            exclusive=bool(exclusive and exclusive[0]))
    for priority, live in service:
        entries = [(tuple(cid), state.consumers[tuple(cid)]) for cid in live]
        state.service[priority] = deque((cid, consumer, consumer.ticket) for cid, consumer in entries)
    state.priorities = sorted(state.service, reverse=True)
    return state


# -- the whole machine ---------------------------------------------------------------------
class CapturedSnapshot:
    """A quorum machine's state captured for a snapshot (`QuorumMachine.capture`: its
    wire form with the fifo as a `capture`), packed into the snapshot's bytes only by
    `pack`. A release cursor candidate (broker/queues/queue_snapshots.py) is taken
    while a queue holds many messages and promoted, if ever, only once all of them are
    settled: packing a queue of 200k messages stopped the loop for ~50 ms as a backlog
    began to drain, capturing it for a sixth of that (docs/performance.md)."""

    __slots__ = ("_wire",)

    def __init__(self, wire: list) -> None:
        self._wire = wire

    def pack(self) -> bytes:
        version, next_msg_id, fifo_state, *rest = self._wire
        return packing.packb([version, next_msg_id, finish(fifo_state), *rest])


def gets_to_wire(gets: Mapping[str, tuple[int, qc.Dequeued | None]]) -> list:
    """The answers to basic.gets kept per owner, for a resent request (quorum_machine)."""
    return [[owner, request_id, None if got is None else
             [got.msg_id, got.payload if type(got.payload) is int else list(got.payload), got.redelivered,
              got.message_count, got.delivery_count]]
            for owner, (request_id, got) in gets.items()]


def gets_from_wire(wire: list) -> dict[str, tuple[int, qc.Dequeued | None]]:
    gets: dict[str, tuple[int, qc.Dequeued | None]] = {}
    for owner, request_id, got in wire:
        if got is not None:
            msg_id, payload, redelivered, count, delivery_count = got
            got = qc.Dequeued(msg_id, payload if type(payload) is int else tuple(payload), redelivered,
                              count, delivery_count)
        gets[owner] = (request_id, got)
    return gets
