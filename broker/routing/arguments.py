"""Validation of the queue arguments RabbitMQ knows (x-*), with its error texts.

Unknown arguments are kept as given; a known one with a bad value is a 406
PRECONDITION_FAILED naming the argument, the way RabbitMQ 3.10 words it (each
text measured beside it): ``invalid arg 'x-max-length' for queue 'q' in vhost
'/': "expected integer, got longstr"``.
"""
from __future__ import annotations

from warren.protocol.constants import PRECONDITION_FAILED
from warren.protocol.errors import ChannelError

QUEUE_TYPES = ("classic", "quorum", "stream")
OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
LEADER_LOCATORS = ("client-local", "balanced", "min-masters", "random", "least-leaders")


def _amqp_type(value: object) -> str:
    """RabbitMQ's name of the field type a client most likely sent: pika and py-amqp send
    an int that fits 32 bits as a signed int (the decoded value keeps no wire type)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if -2**31 <= value < 2**31 else "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, (str, bytes)):
        return "longstr"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    return "void" if value is None else type(value).__name__


def _non_negative_int(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f'"expected integer, got {_amqp_type(value)}"'
    if value < 0:
        return f"{{value_negative,{value}}}"
    return None


def _positive_int(value: object) -> str | None:
    problem = _non_negative_int(value)
    if problem is None and value == 0:
        return "{value_zero,0}"
    return problem


def _string_in(choices: tuple[str, ...], refusal: str | None = None):
    """One of `choices`; anything else is `refusal` where RabbitMQ names it so."""
    def check(value: object) -> str | None:
        if not isinstance(value, str):
            return f"{{unacceptable_type,{_amqp_type(value)}}}"
        if value not in choices:
            if refusal is not None:
                return refusal.format(value=value)
            return f"{{unacceptable_value,{value}}}" if value else "{unacceptable_value,<<>>}"
        return None
    return check


def _string(value: object) -> str | None:
    return None if isinstance(value, str) else f"{{unacceptable_type,{_amqp_type(value)}}}"


def _boolean(value: object) -> str | None:
    return None if isinstance(value, bool) else f"{{unacceptable_type,{_amqp_type(value)}}}"


def _priority(value: object) -> str | None:
    problem = _non_negative_int(value)
    if problem is None and value > 255:  # type: ignore[operator]
        return f"{{max_value_exceeded,{value}}}"
    return problem


QUEUE_ARGUMENT_CHECKS = {
    "x-message-ttl": _non_negative_int,
    "x-expires": _positive_int,
    "x-max-length": _non_negative_int,
    "x-max-length-bytes": _non_negative_int,
    "x-max-priority": _priority,
    "x-overflow": _string_in(OVERFLOW_MODES, "invalid_overflow"),
    "x-dead-letter-exchange": _string,
    "x-dead-letter-routing-key": _string,
    "x-dead-letter-strategy": _string_in(("at-most-once", "at-least-once"), "invalid_dlx_strategy"),
    "x-queue-type": _string_in(QUEUE_TYPES, '"unsupported queue type \'{value}\'"'),
    "x-queue-mode": _string_in(("default", "lazy"), '"unsupported queue mode \'{value}\'"'),
    "x-single-active-consumer": _boolean,
    "x-delivery-limit": _non_negative_int,
    "x-quorum-initial-group-size": _positive_int,
    "x-queue-leader-locator": _string_in(LEADER_LOCATORS, "invalid_queue_locator_arg"),
    "x-queue-master-locator": _string_in(LEADER_LOCATORS),
}

# Known arguments a new queue of the type refuses (RabbitMQ 3.10's queue type capabilities,
# measured: "invalid arg 'x-max-priority' for queue 'q' in vhost '/' of queue type
# rabbit_quorum_queue"); unknown ones are kept, as RabbitMQ keeps them.
_STREAM_ONLY = ("x-max-age", "x-stream-max-segment-size-bytes", "x-initial-cluster-size")
REFUSED_BY_TYPE = {
    "quorum": ("x-max-priority", "x-queue-mode", "x-queue-master-locator", "x-queue-version", *_STREAM_ONLY),
    "classic": ("x-max-in-memory-length", "x-max-in-memory-bytes", "x-dead-letter-strategy", "x-queue-leader-locator",
                "x-delivery-limit", "x-quorum-initial-group-size", *_STREAM_ONLY),
}
_TYPE_MODULES = {"quorum": "rabbit_quorum_queue", "classic": "rabbit_classic_queue"}


def check_type_arguments(arguments: dict, queue: str, vhost: str) -> None:
    """A new queue's arguments against its type, before their values (as RabbitMQ)."""
    kind = arguments.get("x-queue-type", "classic")
    for name in REFUSED_BY_TYPE.get(kind, ()):
        if name in arguments:
            raise ChannelError(PRECONDITION_FAILED, f"invalid arg '{name}' for queue '{queue}' in vhost '{vhost}' "
                                                    f"of queue type {_TYPE_MODULES[kind]}", 50, 10)


# Arguments whose difference on redeclare is an error (RabbitMQ compares these).
EQUIVALENCE_CHECKED = (
    "x-message-ttl", "x-expires", "x-max-length", "x-max-length-bytes", "x-max-priority",
    "x-overflow", "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-queue-type",
    "x-single-active-consumer", "x-delivery-limit", "x-quorum-initial-group-size",
    "x-dead-letter-strategy",
)


def validate_queue_arguments(arguments: dict, queue: str, vhost: str) -> None:
    for name, value in arguments.items():
        check = QUEUE_ARGUMENT_CHECKS.get(name)
        if check is None:
            continue
        if check is _string and not isinstance(value, str):   # rabbit_amqqueue's own words for these
            raise ChannelError(PRECONDITION_FAILED, f"invalid type '{_amqp_type(value)}' for arg '{name}' in queue "
                                                    f"'{queue}' in vhost '{vhost}'", 50, 10)
        problem = check(value)
        if problem is not None:
            raise ChannelError(
                PRECONDITION_FAILED,
                f"invalid arg '{name}' for queue '{queue}' in vhost '{vhost}': {problem}", 50, 10)


def check_exchange_equivalent(existing: dict, received: dict, exchange: str, vhost: str) -> None:
    """rabbit_exchange:assert_args_equivalence: of an exchange's arguments only
    alternate-exchange is compared on redeclare."""
    old, new = existing.get("alternate-exchange"), received.get("alternate-exchange")
    if old != new:
        raise ChannelError(PRECONDITION_FAILED, f"inequivalent arg 'alternate-exchange' for exchange '{exchange}' in "
                                                f"vhost '{vhost}': received {_described(new)} but current is "
                                                f"{_described(old)}", 40, 10)


def _described(value: object) -> str:
    return "none" if value is None else f"the value '{value}' of type '{_amqp_type(value)}'"


def check_equivalent(existing: dict, received: dict, queue: str, vhost: str) -> None:
    """rabbit_amqqueue:assert_args_equivalence over the arguments the queue's type takes."""
    refused = REFUSED_BY_TYPE.get(existing.get("x-queue-type", "classic"), ())
    for name in EQUIVALENCE_CHECKED:
        if name in refused:
            continue
        old = existing.get(name)
        new = received.get(name)
        differs = old != new
        if name == "x-queue-type":   # classic is what an untyped declare means
            differs = (new or "classic") != (old or "classic")
        if not differs:
            continue
        if name == "x-queue-type" and old is not None and new is not None:   # RabbitMQ's words, type against type
            mismatch = f"received '{new}' but current is '{old}'"
        else:
            mismatch = f"received {_described(new)} but current is {_described(old)}"
        raise ChannelError(PRECONDITION_FAILED,
                           f"inequivalent arg '{name}' for queue '{queue}' in vhost '{vhost}': {mismatch}", 50, 10)
