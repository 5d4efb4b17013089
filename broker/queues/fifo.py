"""The queue as a pure, deterministic state machine (after RabbitMQ's rabbit_fifo).

Theory of operation. ``apply(command, state)`` mutates ``state`` and returns
``(reply, effects)``; the commands and effects are the typed records of
broker/queues/queue_commands.py, the one vocabulary of every queue. It never
does I/O and never reads a clock: the time is the command's ``now_ms``.
Every replica that applies the same commands in the same order reaches the
same state; only the leader performs the effects. broker/queues/quorum_machine.py
wraps it with what replication needs (enqueuer sessions, message ids, node
liveness) and hands it each released message through ``enqueue``.

A message is known by its id, given by the caller. The state keeps, per
message, the opaque payload and its size; payloads are handed back in
``Delivery`` effects. Messages wait in ``ready`` (a FIFO) or, when
returned by a consumer, in ``returns`` (a heap by id, served first, so a
requeued message goes back to its original place in line as far as that is
possible). In a priority queue (x-max-priority) every waiting message is in
``returns``, keyed by priority first. A consumer is ``(owner, consumer_tag)``; the owner is the channel
that made it, so ``Down(owner)`` can return everything a closed channel held.
Each consumer numbers its deliveries 1, 2, 3... and keeps the seq of each
message it holds, so a new leader can resend them and a stale
``[msg_id, seq]`` settle cannot touch a later delivery.

Consumers are served by priority (highest first), round-robin within a
priority, each up to its prefetch (0: unlimited). A no-ack consumer's
deliveries are settled as they leave.
"""
from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from warren.broker.queues import queue_commands as qc
from warren.broker.queues.message_table import SIZE_BITS, SIZE_MASK, MessageTable, packed, unpacked
from warren.broker.queues.queue_commands import DeadLettered, Delivery, Dequeued

DROP_HEAD = "drop-head"
REJECT_PUBLISH = "reject-publish"
REJECT_PUBLISH_DLX = "reject-publish-dlx"


# -- replies --------------------------------------------------------------
ACCEPTED = "accepted"
REJECTED = "rejected"
IN_EXCLUSIVE_USE = "in exclusive use"   # a checkout refused: the channel answers 403 ACCESS_REFUSED


# -- state ----------------------------------------------------------------
@dataclass(slots=True)
class ConsumerState:
    prefetch: int
    priority: int
    no_ack: bool
    # msg_id -> the seq it was delivered with (0: taken by basic.get); insertion order is seq order
    checked_out: dict[int, int] = field(default_factory=dict)
    cancelled: bool = False
    suspended: bool = False
    in_service: bool = False
    # Entries in the service deques are (consumer_id, consumer, ticket); only the
    # one carrying the current ticket counts, so leaving and re-entering service
    # never gives a consumer two turns per round.
    ticket: int = 0
    last_seq: int = 0  # the consumer's deliveries are numbered 1, 2, 3...
    exclusive: bool = False   # basic.consume's exclusive flag: no other consumer while it lives

    def has_credit(self) -> bool:
        return self.prefetch == 0 or len(self.checked_out) < self.prefetch


@dataclass(slots=True)
class QueueLimits:
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = DROP_HEAD
    message_ttl_ms: int | None = None  # x-message-ttl
    # x-single-active-consumer: only the oldest live consumer gets messages
    single_active_consumer: bool = False
    # x-max-priority: messages wait in the ``returns`` heap keyed by priority, then id
    max_priority: int | None = None
    # x-delivery-limit: a message returned more often than this is dead-lettered
    delivery_limit: int | None = None


@dataclass(slots=True)
class FifoState:
    limits: QueueLimits = field(default_factory=QueueLimits)
    messages: MessageTable = field(default_factory=MessageTable)   # msg_id -> `packed(payload, size)`
    delivery_counts: dict[int, int] = field(default_factory=dict)
    ready: deque[int] = field(default_factory=deque)
    returns: list[int] = field(default_factory=list)
    ready_bytes: int = 0
    # bytes of every message held, ready or checked out (the node's memory alarm reads it)
    message_bytes: int = 0
    # msg_id -> time (ms) after which it expires; only messages with a TTL (a backlog's worth
    # in a queue with a TTL: a table, not a dict, for the same reason as `messages`)
    expiries: MessageTable = field(default_factory=MessageTable)
    # msg_id -> priority, for messages above 0 in a priority queue
    message_priorities: dict[int, int] = field(default_factory=dict)
    now_ms: int = 0  # the time of the command being applied
    consumers: dict[tuple, ConsumerState] = field(default_factory=dict)
    service: dict[int, deque] = field(default_factory=dict)
    priorities: list[int] = field(default_factory=list)

    @property
    def ready_count(self) -> int:
        return len(self.ready) + len(self.returns)

    @property
    def unacked_count(self) -> int:
        return len(self.messages) - self.ready_count


def apply(command: Any, state: FifoState) -> tuple[Any, list]:
    """Apply a consumer-side record of broker/queues/queue_commands.py (Settle,
    Return and Discard with bare msg ids). Time never goes back: a command
    stamped earlier than the last one runs at the last one's time."""
    handler = _APPLY.get(type(command))
    if handler is None:
        raise AssertionError(f"unknown fifo command {command!r}")
    if command.now_ms > state.now_ms:
        state.now_ms = command.now_ms
    effects: list = []
    return handler(command, state, effects), effects


def payload_of(state: FifoState, msg_id: int) -> Any:
    held = state.messages[msg_id]
    return held >> SIZE_BITS if type(held) is int else held[0]


def size_of(state: FifoState, msg_id: int) -> int:
    held = state.messages[msg_id]
    return held & SIZE_MASK if type(held) is int else held[1]


def enqueue(state: FifoState, msg_id: int, now_ms: int, payload: Any, size: int, ttl_ms: int | None,
            priority: int, effects: list) -> bool:
    """One message, as its enqueuer's session releases it (a function, not a
    record: the hot path makes no object per message). False: refused (overflow)."""
    if now_ms > state.now_ms:
        state.now_ms = now_ms
    limits = state.limits
    if limits.overflow != DROP_HEAD and _would_overflow(state, size):
        if limits.overflow == REJECT_PUBLISH_DLX:
            effects.append(DeadLettered("maxlen", (payload,)))
        return False
    state.messages[msg_id] = packed(payload, size)
    ttl = effective_ttl(limits.message_ttl_ms, ttl_ms)
    if ttl is not None:
        state.expiries[msg_id] = state.now_ms + ttl
    if limits.max_priority is None:
        state.ready.append(msg_id)
    else:
        priority = min(priority, limits.max_priority)
        if priority:
            state.message_priorities[msg_id] = priority
        heapq.heappush(state.returns, _heap_key(state, msg_id))
    state.ready_bytes += size
    state.message_bytes += size
    if limits.max_length is not None or limits.max_length_bytes is not None:
        _drop_head_over_limit(state, effects)
    if state.priorities:
        _service(state, effects)
    return True


def restore(state: FifoState, messages: list[tuple[int, Any, int]], priorities: dict[int, int] | None = None) -> None:
    """Recovery: put (msg_id, payload, size) back as ready, in id order, in bulk.

    The same state as `enqueue` at each id with no consumers and no
    length limit (callers with limits replay through ``apply`` instead).
    """
    assert state.limits.max_length is None and state.limits.max_length_bytes is None
    assert not state.consumers, "restore before any consumer attaches"
    for msg_id, payload, size in messages:
        state.messages[msg_id] = packed(payload, size)
        state.ready_bytes += size
        state.message_bytes += size
    max_priority = state.limits.max_priority
    if max_priority is None:
        state.ready.extend(msg_id for msg_id, _, _ in messages)
        return
    for msg_id, priority in (priorities or {}).items():
        if msg_id in state.messages and priority:
            state.message_priorities[msg_id] = min(priority, max_priority)
    state.returns.extend(_heap_key(state, msg_id) for msg_id, _, _ in messages)
    heapq.heapify(state.returns)


def drop_ready(state: FifoState, doomed: Callable[[Any], bool]) -> int:
    """Remove every ready message whose payload is `doomed` (a restarted
    node's transient messages); checked-out ones stay with their consumers.
    Returns how many went."""
    gone = [msg_id for msg_id in state.ready if doomed(payload_of(state, msg_id))]
    gone += [key & MSG_ID_MASK for key in state.returns if doomed(payload_of(state, key & MSG_ID_MASK))]
    if not gone:
        return 0
    doomed_ids = set(gone)
    state.ready = deque(msg_id for msg_id in state.ready if msg_id not in doomed_ids)
    state.returns = [key for key in state.returns if key & MSG_ID_MASK not in doomed_ids]
    heapq.heapify(state.returns)
    for msg_id in gone:
        state.ready_bytes -= size_of(state, msg_id)
        _forget(state, msg_id)
    return len(gone)


def _would_overflow(state: FifoState, size: int) -> bool:
    limits = state.limits
    if limits.max_length is not None and state.ready_count + 1 > limits.max_length:
        return True
    return limits.max_length_bytes is not None and state.ready_bytes + size > limits.max_length_bytes


def _drop_head_over_limit(state: FifoState, effects: list) -> None:
    limits = state.limits
    dropped = []
    while state.ready_count and (
        (limits.max_length is not None and state.ready_count > limits.max_length)
        or (limits.max_length_bytes is not None and state.ready_bytes > limits.max_length_bytes)
    ):
        dropped.append(_forget(state, _take_next(state)))
    if dropped:
        effects.append(DeadLettered("maxlen", tuple(dropped)))


# Keys of the ``returns`` heap: the message id in the low bits; in a priority queue
# the priority, inverted so that the highest comes first, above them.
MSG_ID_BITS = 48
MSG_ID_MASK = (1 << MSG_ID_BITS) - 1


def _heap_key(state: FifoState, msg_id: int) -> int:
    assert msg_id <= MSG_ID_MASK, "message id beyond the heap key's range"
    max_priority = state.limits.max_priority
    if max_priority is None:
        return msg_id
    return ((max_priority - state.message_priorities.get(msg_id, 0)) << MSG_ID_BITS) | msg_id


def effective_ttl(queue_ttl: int | None, message_ttl: int | None) -> int | None:
    """The shorter of the queue's and the message's TTL (RabbitMQ's rule)."""
    if queue_ttl is None:
        return message_ttl
    return queue_ttl if message_ttl is None else min(queue_ttl, message_ttl)


def _expire_heads(state: FifoState, effects: list) -> None:
    """Dead-letter expired messages at the head (as RabbitMQ: only the head expires)."""
    expiries = state.expiries
    if not expiries:
        return
    expired = []
    while state.ready or state.returns:
        head = state.returns[0] & MSG_ID_MASK if state.returns else state.ready[0]
        expiry = expiries.get(head)
        # TTL 0 still allows a delivery at the moment of enqueue: expire strictly after
        if expiry is None or expiry >= state.now_ms:
            break
        expired.append(_forget(state, _take_next(state)))
    if expired:
        effects.append(DeadLettered("expired", tuple(expired)))


def _forget(state: FifoState, msg_id: int) -> Any:
    """Remove a message for good; returns its payload."""
    payload, size = unpacked(state.messages.pop(msg_id))
    state.message_bytes -= size
    if state.expiries:
        state.expiries.pop(msg_id, None)
    if state.message_priorities:
        state.message_priorities.pop(msg_id, None)
    if state.delivery_counts:
        state.delivery_counts.pop(msg_id, None)
    return payload


def _take_next(state: FifoState) -> int:
    msg_id = heapq.heappop(state.returns) & MSG_ID_MASK if state.returns else state.ready.popleft()
    state.ready_bytes -= size_of(state, msg_id)
    return msg_id


def _service(state: FifoState, effects: list) -> None:
    """Hand ready messages to consumers with credit, by priority, round-robin."""
    while state.ready or state.returns:
        if state.expiries:
            _expire_heads(state, effects)
            if not (state.ready or state.returns):
                return
        consumer_id = _next_in_service(state)
        if consumer_id is None:
            return
        consumer = state.consumers[consumer_id]
        if not (state.returns or state.expiries or any(state.service.values())):
            _deliver_run(state, consumer_id, consumer, effects)   # alone in service: no turns to take
        else:
            _deliver_one(state, consumer_id, consumer, effects)


def _deliver_one(state: FifoState, consumer_id: tuple, consumer: ConsumerState, effects: list) -> None:
    """The round-robin's step: the next message to this consumer, which goes back in line."""
    msg_id = _take_next(state)
    payload = payload_of(state, msg_id)
    delivery_count = state.delivery_counts.get(msg_id, 0)
    seq = consumer.last_seq = consumer.last_seq + 1
    if consumer.no_ack:
        _forget(state, msg_id)
    else:
        consumer.checked_out[msg_id] = seq
    effects.append(Delivery(consumer_id, seq, msg_id, payload, delivery_count > 0, delivery_count))
    _back_in_line(state, consumer_id, consumer)


def _deliver_run(state: FifoState, consumer_id: tuple, consumer: ConsumerState, effects: list) -> None:
    """`_deliver_one` for the one consumer in service, from `ready` without expiries: the
    same deliveries, one after another up to its credit, without the round-robin's steps
    per message (a backlog's drain hands each settling consumer its next window this way)."""
    ready, messages, counts, checked_out = state.ready, state.messages, state.delivery_counts, consumer.checked_out
    credit = consumer.prefetch - len(checked_out) if consumer.prefetch else len(ready)
    seq = consumer.last_seq
    for _ in range(min(credit, len(ready))):
        msg_id = ready.popleft()
        held = messages[msg_id]
        if type(held) is int:
            payload, size = held >> SIZE_BITS, held & SIZE_MASK
        else:
            payload, size = held
        state.ready_bytes -= size
        delivery_count = counts.get(msg_id, 0) if counts else 0
        seq += 1
        if consumer.no_ack:
            _forget(state, msg_id)
        else:
            checked_out[msg_id] = seq
        effects.append(Delivery(consumer_id, seq, msg_id, payload, delivery_count > 0, delivery_count))
    consumer.last_seq = seq
    _back_in_line(state, consumer_id, consumer)


def _back_in_line(state: FifoState, consumer_id: tuple, consumer: ConsumerState) -> None:
    """A consumer just served waits for its next turn while it has credit."""
    if consumer.has_credit():
        state.service[consumer.priority].append((consumer_id, consumer, consumer.ticket))
    else:
        consumer.in_service = False


def _next_in_service(state: FifoState) -> tuple | None:
    for priority in state.priorities:
        waiting = state.service[priority]
        while waiting:
            consumer_id, consumer, ticket = waiting.popleft()
            if consumer.in_service and ticket == consumer.ticket and state.consumers.get(consumer_id) is consumer:
                return consumer_id
    return None


def _enter_service(state: FifoState, consumer_id: tuple, consumer: ConsumerState) -> None:
    if consumer.in_service or consumer.cancelled or consumer.suspended or not consumer.has_credit():
        return
    if state.limits.single_active_consumer and consumer_id != _active_consumer(state):
        return  # waits until the consumers registered before it are gone
    consumer.in_service = True
    consumer.ticket += 1
    waiting = state.service.get(consumer.priority)
    if waiting is None:
        waiting = state.service[consumer.priority] = deque()
        state.priorities = sorted(state.service, reverse=True)
    waiting.append((consumer_id, consumer, consumer.ticket))


def _active_consumer(state: FifoState) -> tuple | None:
    """Single active consumer: the oldest consumer not cancelled."""
    for consumer_id, consumer in state.consumers.items():
        if not consumer.cancelled:
            return consumer_id
    return None


def _activate_next(state: FifoState, effects: list) -> None:
    """Single active consumer: the active one left; the next in line takes over."""
    if not state.limits.single_active_consumer:
        return
    consumer_id = _active_consumer(state)
    if consumer_id is not None:
        _enter_service(state, consumer_id, state.consumers[consumer_id])
        _service(state, effects)


def step_aside(state: FifoState, consumer_ids: list[tuple], effects: list) -> None:
    """Single active consumer: these consumers (suspended: their node is gone) go behind
    the others, and the next in line takes over (RabbitMQ returns them to waiting)."""
    if not state.limits.single_active_consumer:
        return
    for consumer_id in consumer_ids:
        state.consumers[consumer_id] = state.consumers.pop(consumer_id)
    _activate_next(state, effects)


def _leave_service(state: FifoState, consumer: ConsumerState) -> None:
    # Lazily removed: _next_in_service skips consumers no longer in service.
    consumer.in_service = False


def _on_checkout(command: qc.Checkout, state: FifoState, effects: list) -> str:
    consumer_id = (command.owner, command.tag)
    if _exclusivity_refuses(state, consumer_id, command.exclusive):
        return IN_EXCLUSIVE_USE
    consumer = ConsumerState(command.prefetch, command.priority, command.no_ack, suspended=not command.active,
                             exclusive=command.exclusive)
    previous = state.consumers.get(consumer_id)
    if previous is not None:
        # A tag reused after basic.cancel: what the old consumer still holds stays
        # checked out (the channel's delivery tags for it remain valid), and its
        # deliveries go on being numbered after the old ones.
        previous.in_service = False
        consumer.checked_out, consumer.last_seq = previous.checked_out, previous.last_seq
    state.consumers[consumer_id] = consumer
    _enter_service(state, consumer_id, consumer)
    _service(state, effects)
    return ACCEPTED


def _exclusivity_refuses(state: FifoState, consumer_id: tuple, exclusive: bool) -> bool:
    """As a RabbitMQ classic queue (rabbit_queue_consumers): an exclusive consumer only
    on a queue without live consumers, and none beside a live exclusive one. Judged
    here, where every node's and every shard's consumers meet (the channel's own view
    sees only its node's); a tag reused by its own channel is not another consumer."""
    return any((exclusive or other.exclusive) and not other.cancelled
               for other_id, other in state.consumers.items() if other_id != consumer_id)


def _on_cancel(command: qc.Cancel, state: FifoState, effects: list) -> str:
    consumer_id = (command.owner, command.tag)
    consumer = state.consumers.get(consumer_id)
    if consumer is None:
        return REJECTED
    consumer.cancelled = True
    _leave_service(state, consumer)
    if not consumer.checked_out:
        _remove_consumer(state, consumer_id)
    _activate_next(state, effects)
    return ACCEPTED


def _remove_consumer(state: FifoState, consumer_id: tuple) -> None:
    consumer = state.consumers.pop(consumer_id)
    consumer.in_service = False
    if not any(c.priority == consumer.priority for c in state.consumers.values()):
        state.service.pop(consumer.priority, None)
        state.priorities = sorted(state.service, reverse=True)


def _checked_out_by(state: FifoState, consumer_id: tuple, msg_ids: Sequence[int]):
    consumer = state.consumers.get(consumer_id)
    if consumer is None:
        return None, ()
    held = consumer.checked_out
    return consumer, list(dict.fromkeys(m for m in msg_ids if m in held))  # each id once


def _after_release(state: FifoState, consumer_id: tuple, consumer: ConsumerState, effects: list) -> None:
    if consumer.cancelled and not consumer.checked_out:
        _remove_consumer(state, consumer_id)
    else:
        _enter_service(state, consumer_id, consumer)
    _service(state, effects)


def _on_settle(command: qc.Settle, state: FifoState, effects: list) -> int:
    consumer_id = (command.owner, command.tag)
    consumer, msg_ids = _checked_out_by(state, consumer_id, command.msg_ids)
    if consumer is None:
        return 0
    held = consumer.checked_out
    for msg_id in msg_ids:
        del held[msg_id]
        _forget(state, msg_id)
    _after_release(state, consumer_id, consumer, effects)
    return len(msg_ids)


def _on_return(command: qc.Return, state: FifoState, effects: list) -> int:
    consumer_id = (command.owner, command.tag)
    consumer, msg_ids = _checked_out_by(state, consumer_id, command.msg_ids)
    if consumer is None:
        return 0
    _requeue(state, consumer, msg_ids, effects)
    _after_release(state, consumer_id, consumer, effects)
    return len(msg_ids)


def _requeue(state: FifoState, consumer: ConsumerState, msg_ids, effects: list) -> None:
    limit = state.limits.delivery_limit
    over_limit = []
    for msg_id in msg_ids:
        del consumer.checked_out[msg_id]
        count = state.delivery_counts[msg_id] = state.delivery_counts.get(msg_id, 0) + 1
        if limit is not None and count > limit:
            over_limit.append(_forget(state, msg_id))
            continue
        heapq.heappush(state.returns, _heap_key(state, msg_id))
        state.ready_bytes += size_of(state, msg_id)
    if over_limit:
        effects.append(DeadLettered("delivery_limit", tuple(over_limit)))


def _on_discard(command: qc.Discard, state: FifoState, effects: list) -> int:
    consumer_id = (command.owner, command.tag)
    consumer, msg_ids = _checked_out_by(state, consumer_id, command.msg_ids)
    if consumer is None:
        return 0
    payloads = []
    for msg_id in msg_ids:
        del consumer.checked_out[msg_id]
        payloads.append(_forget(state, msg_id))
    if payloads:
        effects.append(DeadLettered("rejected", tuple(payloads)))
    _after_release(state, consumer_id, consumer, effects)
    return len(msg_ids)


def _on_dequeue(command: qc.Dequeue, state: FifoState, effects: list) -> Dequeued | None:
    """basic.get; its pseudo-consumer is (owner, None)."""
    _expire_heads(state, effects)
    if not state.ready_count:
        return None
    msg_id = _take_next(state)
    payload = payload_of(state, msg_id)
    delivery_count = state.delivery_counts.get(msg_id, 0)
    if command.no_ack:
        _forget(state, msg_id)
    else:
        consumer_id = (command.owner, None)
        consumer = state.consumers.get(consumer_id)
        if consumer is None:
            # basic.get with manual ack: a consumer that is never served.
            consumer = ConsumerState(prefetch=0, priority=0, no_ack=False, cancelled=True)
            state.consumers[consumer_id] = consumer
        consumer.checked_out[msg_id] = 0   # no delivery seq: answered by the Got
    return Dequeued(msg_id, payload, delivery_count > 0, state.ready_count, delivery_count)


def _on_purge(command: qc.Purge, state: FifoState, effects: list) -> int:
    count = state.ready_count
    for msg_id in state.ready:
        _forget(state, msg_id)
    for key in state.returns:
        _forget(state, key & MSG_ID_MASK)
    state.ready.clear()
    state.returns.clear()
    state.ready_bytes = 0
    return count


def _on_down(command: qc.Down, state: FifoState, effects: list) -> int:
    """The owner (a channel) is gone: return what its consumers held."""
    returned = 0
    for consumer_id in [c for c in state.consumers if c[0] == command.owner]:
        consumer = state.consumers[consumer_id]
        returned += len(consumer.checked_out)
        _requeue(state, consumer, list(consumer.checked_out), effects)
        _remove_consumer(state, consumer_id)
    if returned:
        _service(state, effects)
    _activate_next(state, effects)
    return returned


def _on_suspend(command: qc.Suspend, state: FifoState, effects: list) -> str:
    consumer_id = (command.owner, command.tag)
    consumer = state.consumers.get(consumer_id)
    if consumer is None:
        return REJECTED
    consumer.suspended = not command.active
    if command.active:
        _enter_service(state, consumer_id, consumer)
        _service(state, effects)
    else:
        _leave_service(state, consumer)
    return ACCEPTED


def _on_tick(command: qc.Tick, state: FifoState, effects: list) -> str:
    """Time passes: expire messages at the head whose TTL ran out."""
    _expire_heads(state, effects)
    return ACCEPTED


_APPLY: dict[type, Callable[[Any, FifoState, list], Any]] = {
    qc.Checkout: _on_checkout, qc.Cancel: _on_cancel, qc.Settle: _on_settle, qc.Return: _on_return,
    qc.Discard: _on_discard, qc.Dequeue: _on_dequeue, qc.Purge: _on_purge, qc.Down: _on_down,
    qc.Suspend: _on_suspend, qc.Tick: _on_tick,
}
