"""Callbacks and back-references that do not keep their owner alive.

A queue's parts (route, client, replica) and a connection's parts call back into
their owner. Held strongly, each such call-back closes a reference cycle, and a
cycle is freed only by the cyclic collector, whose full collections the node puts
minutes apart (broker/node/gc_tuning.py): a deleted queue would keep its messages'
state in memory until then, and the collection that finally frees it stops the
node for as long as it takes to walk it. Held weakly, the owner's last reference
dropped frees it and its parts at once, by reference counting.

A long-lived holder of many short-lived objects (a channel and every queue it
published to, got from or consumed from) holds them weakly too: a queue deleted
while the channel lives on is freed at once, not when the channel closes.
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


class WeakIdentitySet:
    """Objects held weakly, by identity. Adding one already held costs a dict look-up
    (a channel adds its queue at every publish); the entries of freed objects are
    dropped whenever the set has doubled since the last time (or reached `PRUNE_FLOOR`),
    so it never holds more than twice what lived then."""

    PRUNE_FLOOR = 64
    __slots__ = ("_refs", "_prune_at")

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref] = {}
        self._prune_at = self.PRUNE_FLOOR

    def add(self, item: object) -> None:
        ref = self._refs.get(id(item))
        if ref is not None and ref() is item:
            return
        if len(self._refs) >= self._prune_at:
            self._refs = {key: held for key, held in self._refs.items() if held() is not None}
            self._prune_at = max(self.PRUNE_FLOOR, 2 * len(self._refs))
        self._refs[id(item)] = weakref.ref(item)   # a freed object's id may come back: replaced

    def alive(self) -> list[Any]:
        return [item for held in self._refs.values() if (item := held()) is not None]

    def clear(self) -> None:
        self._refs.clear()
        self._prune_at = self.PRUNE_FLOOR

    def __len__(self) -> int:
        return len(self._refs)
