"""The queue as a pure, deterministic state machine (after RabbitMQ's rabbit_fifo).

Theory of operation. ``apply(meta, command, state)`` mutates ``state`` and
returns ``(reply, effects)``. It never does I/O and never reads a clock: the
log index and the time arrive in ``meta``. Every replica that applies the same
commands in the same order reaches the same state; only the leader (for now,
the node that owns the queue) performs the effects.

A message is known by its id, the log index of the command that enqueued it.
The state keeps, per message, the opaque payload and its size; payloads are
handed back in ``Deliver`` effects. Messages wait in ``ready`` (a FIFO) or, when
returned by a consumer, in ``returns`` (a heap by id, served first, so a
requeued message goes back to its original place in line as far as that is
possible). In a priority queue (x-max-priority) every waiting message is in
``returns``, keyed by priority first. A consumer is ``(owner, consumer_tag)``; the owner is the channel
that made it, so ``Down(owner)`` can return everything a closed channel held.

Consumers are served by priority (highest first), round-robin within a
priority, each up to its prefetch (0: unlimited). A no-ack consumer's
deliveries are settled as they leave.
"""
from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

DROP_HEAD = "drop-head"
REJECT_PUBLISH = "reject-publish"
REJECT_PUBLISH_DLX = "reject-publish-dlx"


# -- commands -------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Meta:
    index: int
    time_ms: int


@dataclass(frozen=True, slots=True)
class Enqueue:
    payload: Any
    size: int
    ttl_ms: int | None = None  # per-message TTL (the expiration property)
    priority: int = 0  # the priority property (used by queues with x-max-priority)


@dataclass(frozen=True, slots=True)
class Checkout:
    consumer: Hashable
    prefetch: int
    priority: int = 0
    no_ack: bool = False
    active: bool = True  # False: created suspended (its channel is at its global prefetch)


@dataclass(frozen=True, slots=True)
class Cancel:
    consumer: Hashable


@dataclass(frozen=True, slots=True)
class Settle:
    consumer: Hashable
    msg_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Return:
    consumer: Hashable
    msg_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Discard:
    consumer: Hashable
    msg_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Dequeue:
    consumer: Hashable
    no_ack: bool


@dataclass(frozen=True, slots=True)
class Purge:
    pass


@dataclass(frozen=True, slots=True)
class Down:
    owner: Hashable


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passes: expire messages at the head whose TTL ran out."""


@dataclass(frozen=True, slots=True)
class Suspend:
    """Stop (or, with active=True, resume) deliveries to one consumer."""

    consumer: Hashable
    active: bool


# -- effects --------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Deliver:
    consumer: Hashable
    msg_id: int
    payload: Any
    redelivered: bool
    delivery_count: int = 0  # earlier deliveries (quorum queues show it as x-delivery-count)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    reason: str  # "rejected" | "maxlen" | "expired" | "delivery_limit" (RabbitMQ's x-death reasons)
    payloads: tuple


# -- replies --------------------------------------------------------------
ACCEPTED = "accepted"
REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class Dequeued:
    msg_id: int
    payload: Any
    redelivered: bool
    message_count: int
    delivery_count: int = 0


# -- state ----------------------------------------------------------------
@dataclass(slots=True)
class ConsumerState:
    prefetch: int
    priority: int
    no_ack: bool
    checked_out: dict[int, None] = field(default_factory=dict)
    cancelled: bool = False
    suspended: bool = False
    in_service: bool = False
    # Entries in the service deques are (consumer_id, consumer, ticket); only the
    # one carrying the current ticket counts, so leaving and re-entering service
    # never gives a consumer two turns per round.
    ticket: int = 0

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
    messages: dict[int, tuple[Any, int]] = field(default_factory=dict)
    delivery_counts: dict[int, int] = field(default_factory=dict)
    ready: deque[int] = field(default_factory=deque)
    returns: list[int] = field(default_factory=list)
    ready_bytes: int = 0
    # bytes of every message held, ready or checked out (the node's memory alarm reads it)
    message_bytes: int = 0
    # msg_id -> time (ms) after which it expires; only messages with a TTL
    expiries: dict[int, int] = field(default_factory=dict)
    # msg_id -> priority, for messages above 0 in a priority queue
    message_priorities: dict[int, int] = field(default_factory=dict)
    now_ms: int = 0  # the time of the command being applied
    consumers: dict[Hashable, ConsumerState] = field(default_factory=dict)
    service: dict[int, deque] = field(default_factory=dict)
    priorities: list[int] = field(default_factory=list)

    @property
    def ready_count(self) -> int:
        return len(self.ready) + len(self.returns)

    @property
    def unacked_count(self) -> int:
        return len(self.messages) - self.ready_count


def apply(meta: Meta, command: Any, state: FifoState) -> tuple[Any, list]:
    effects: list = []
    state.now_ms = meta.time_ms
    match command:
        case Enqueue():
            reply = _on_enqueue(meta, command, state, effects)
        case Settle():
            reply = _on_settle(command, state, effects)
        case Return():
            reply = _on_return(command, state, effects)
        case Checkout():
            reply = _on_checkout(command, state, effects)
        case Cancel():
            reply = _on_cancel(command, state, effects)
        case Discard():
            reply = _on_discard(command, state, effects)
        case Dequeue():
            reply = _on_dequeue(command, state, effects)
        case Purge():
            reply = _on_purge(state)
        case Down():
            reply = _on_down(command, state, effects)
        case Suspend():
            reply = _on_suspend(command, state, effects)
        case Tick():
            _expire_heads(state, effects)
            reply = ACCEPTED
        case _:
            raise AssertionError(f"unknown fifo command {command!r}")
    return reply, effects


def _on_enqueue(meta: Meta, command: Enqueue, state: FifoState, effects: list) -> str:
    limits = state.limits
    if limits.overflow != DROP_HEAD and _would_overflow(state, command.size):
        if limits.overflow == REJECT_PUBLISH_DLX:
            effects.append(DeadLetter("maxlen", (command.payload,)))
        return REJECTED
    msg_id = meta.index
    state.messages[msg_id] = (command.payload, command.size)
    ttl = effective_ttl(limits.message_ttl_ms, command.ttl_ms)
    if ttl is not None:
        state.expiries[msg_id] = meta.time_ms + ttl
    if limits.max_priority is None:
        state.ready.append(msg_id)
    else:
        priority = min(command.priority, limits.max_priority)
        if priority:
            state.message_priorities[msg_id] = priority
        heapq.heappush(state.returns, _heap_key(state, msg_id))
    state.ready_bytes += command.size
    state.message_bytes += command.size
    if limits.max_length is not None or limits.max_length_bytes is not None:
        _drop_head_over_limit(state, effects)
    if state.priorities:
        _service(state, effects)
    return ACCEPTED


def restore(state: FifoState, messages: list[tuple[int, Any, int]], priorities: dict[int, int] | None = None) -> None:
    """Recovery: put (msg_id, payload, size) back as ready, in id order, in bulk.

    The same state as applying ``Enqueue`` at each id with no consumers and no
    length limit (callers with limits replay through ``apply`` instead).
    """
    assert state.limits.max_length is None and state.limits.max_length_bytes is None
    assert not state.consumers, "restore before any consumer attaches"
    for msg_id, payload, size in messages:
        state.messages[msg_id] = (payload, size)
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
    gone = [msg_id for msg_id in state.ready if doomed(state.messages[msg_id][0])]
    gone += [key & MSG_ID_MASK for key in state.returns if doomed(state.messages[key & MSG_ID_MASK][0])]
    if not gone:
        return 0
    doomed_ids = set(gone)
    state.ready = deque(msg_id for msg_id in state.ready if msg_id not in doomed_ids)
    state.returns = [key for key in state.returns if key & MSG_ID_MASK not in doomed_ids]
    heapq.heapify(state.returns)
    for msg_id in gone:
        state.ready_bytes -= state.messages[msg_id][1]
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
        effects.append(DeadLetter("maxlen", tuple(dropped)))


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
        effects.append(DeadLetter("expired", tuple(expired)))


def _forget(state: FifoState, msg_id: int) -> Any:
    """Remove a message for good; returns its payload."""
    payload, size = state.messages.pop(msg_id)
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
    state.ready_bytes -= state.messages[msg_id][1]
    return msg_id


def _service(state: FifoState, effects: list) -> None:
    """Hand ready messages to consumers with credit, by priority, round-robin."""
    messages = state.messages
    counts = state.delivery_counts
    while state.ready or state.returns:
        if state.expiries:
            _expire_heads(state, effects)
            if not (state.ready or state.returns):
                return
        consumer_id = _next_in_service(state)
        if consumer_id is None:
            return
        consumer = state.consumers[consumer_id]
        msg_id = _take_next(state)
        payload = messages[msg_id][0]
        delivery_count = counts.get(msg_id, 0)
        if consumer.no_ack:
            _forget(state, msg_id)
        else:
            consumer.checked_out[msg_id] = None
        effects.append(Deliver(consumer_id, msg_id, payload, delivery_count > 0, delivery_count))
        if consumer.has_credit():
            state.service[consumer.priority].append((consumer_id, consumer, consumer.ticket))
        else:
            consumer.in_service = False


def _next_in_service(state: FifoState) -> Hashable | None:
    for priority in state.priorities:
        waiting = state.service[priority]
        while waiting:
            consumer_id, consumer, ticket = waiting.popleft()
            if consumer.in_service and ticket == consumer.ticket and state.consumers.get(consumer_id) is consumer:
                return consumer_id
    return None


def _enter_service(state: FifoState, consumer_id: Hashable, consumer: ConsumerState) -> None:
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


def _active_consumer(state: FifoState) -> Hashable | None:
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


def _leave_service(state: FifoState, consumer: ConsumerState) -> None:
    # Lazily removed: _next_in_service skips consumers no longer in service.
    consumer.in_service = False


def _on_checkout(command: Checkout, state: FifoState, effects: list) -> str:
    consumer = ConsumerState(command.prefetch, command.priority, command.no_ack, suspended=not command.active)
    previous = state.consumers.get(command.consumer)
    if previous is not None:
        # A tag reused after basic.cancel: what the old consumer still holds stays
        # checked out (the channel's delivery tags for it remain valid).
        previous.in_service = False
        consumer.checked_out = previous.checked_out
    state.consumers[command.consumer] = consumer
    _enter_service(state, command.consumer, consumer)
    _service(state, effects)
    return ACCEPTED


def _on_cancel(command: Cancel, state: FifoState, effects: list) -> str:
    consumer = state.consumers.get(command.consumer)
    if consumer is None:
        return REJECTED
    consumer.cancelled = True
    _leave_service(state, consumer)
    if not consumer.checked_out:
        _remove_consumer(state, command.consumer)
    _activate_next(state, effects)
    return ACCEPTED


def _remove_consumer(state: FifoState, consumer_id: Hashable) -> None:
    consumer = state.consumers.pop(consumer_id)
    consumer.in_service = False
    if not any(c.priority == consumer.priority for c in state.consumers.values()):
        state.service.pop(consumer.priority, None)
        state.priorities = sorted(state.service, reverse=True)


def _checked_out_by(state: FifoState, consumer_id: Hashable, msg_ids: tuple[int, ...]):
    consumer = state.consumers.get(consumer_id)
    if consumer is None:
        return None, ()
    held = consumer.checked_out
    return consumer, list(dict.fromkeys(m for m in msg_ids if m in held))  # each id once


def _after_release(state: FifoState, consumer_id: Hashable, consumer: ConsumerState, effects: list) -> None:
    if consumer.cancelled and not consumer.checked_out:
        _remove_consumer(state, consumer_id)
    else:
        _enter_service(state, consumer_id, consumer)
    _service(state, effects)


def _on_settle(command: Settle, state: FifoState, effects: list) -> int:
    consumer, msg_ids = _checked_out_by(state, command.consumer, command.msg_ids)
    if consumer is None:
        return 0
    held = consumer.checked_out
    for msg_id in msg_ids:
        del held[msg_id]
        _forget(state, msg_id)
    _after_release(state, command.consumer, consumer, effects)
    return len(msg_ids)


def _on_return(command: Return, state: FifoState, effects: list) -> int:
    consumer, msg_ids = _checked_out_by(state, command.consumer, command.msg_ids)
    if consumer is None:
        return 0
    _requeue(state, consumer, msg_ids, effects)
    _after_release(state, command.consumer, consumer, effects)
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
        state.ready_bytes += state.messages[msg_id][1]
    if over_limit:
        effects.append(DeadLetter("delivery_limit", tuple(over_limit)))


def _on_discard(command: Discard, state: FifoState, effects: list) -> int:
    consumer, msg_ids = _checked_out_by(state, command.consumer, command.msg_ids)
    if consumer is None:
        return 0
    payloads = []
    for msg_id in msg_ids:
        del consumer.checked_out[msg_id]
        payloads.append(_forget(state, msg_id))
    if payloads:
        effects.append(DeadLetter("rejected", tuple(payloads)))
    _after_release(state, command.consumer, consumer, effects)
    return len(msg_ids)


def _on_dequeue(command: Dequeue, state: FifoState, effects: list) -> Dequeued | None:
    _expire_heads(state, effects)
    if not state.ready_count:
        return None
    msg_id = _take_next(state)
    payload = state.messages[msg_id][0]
    delivery_count = state.delivery_counts.get(msg_id, 0)
    if command.no_ack:
        _forget(state, msg_id)
    else:
        consumer = state.consumers.get(command.consumer)
        if consumer is None:
            # basic.get with manual ack: a consumer that is never served.
            consumer = ConsumerState(prefetch=0, priority=0, no_ack=False, cancelled=True)
            state.consumers[command.consumer] = consumer
        consumer.checked_out[msg_id] = None
    return Dequeued(msg_id, payload, delivery_count > 0, state.ready_count, delivery_count)


def _on_purge(state: FifoState) -> int:
    count = state.ready_count
    for msg_id in state.ready:
        _forget(state, msg_id)
    for key in state.returns:
        _forget(state, key & MSG_ID_MASK)
    state.ready.clear()
    state.returns.clear()
    state.ready_bytes = 0
    return count


def _on_down(command: Down, state: FifoState, effects: list) -> int:
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


def _on_suspend(command: Suspend, state: FifoState, effects: list) -> str:
    consumer = state.consumers.get(command.consumer)
    if consumer is None:
        return REJECTED
    consumer.suspended = not command.active
    if command.active:
        _enter_service(state, command.consumer, consumer)
        _service(state, effects)
    else:
        _leave_service(state, consumer)
    return ACCEPTED
