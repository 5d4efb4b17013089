"""Callbacks and back-references that do not keep their owner alive.

A queue's parts (route, client, replica) and a connection's parts call back into
their owner. Held strongly, each such call-back closes a reference cycle, and a
cycle is freed only by the cyclic collector, whose full collections the node puts
minutes apart (broker/node/gc_tuning.py): a deleted queue would keep its messages'
state in memory until then, and the collection that finally frees it stops the
node for as long as it takes to walk it. Held weakly, the owner's last reference
dropped frees it and its parts at once, by reference counting.
"""
from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any


def weak_method(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method` (bound), called while its object lives; a no-op returning None after."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> Any:
        bound = ref()
        return None if bound is None else bound(*args)
    return call


class WeakAttribute:
    """A back-reference held weakly: assign the owner, read the owner back while it
    lives (None after). Declared on the class: `queue = WeakAttribute()`."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = f"_weak_{name}"

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return getattr(instance, self.slot)()

    def __set__(self, instance: object, value: object) -> None:
        setattr(instance, self.slot, weakref.ref(value))
