"""broker/weak_callbacks.py: back-references and call-backs that do not keep their owner."""
from __future__ import annotations

import gc

from warren.broker.weak_callbacks import WeakAttribute, WeakIdentitySet, weak_method


class Owner:
    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.part = Part(self)

    def called(self, *args: object) -> str:
        self.calls.append(args)
        return "answered"


class Part:
    owner = WeakAttribute()

    def __init__(self, owner: Owner) -> None:
        self.owner = owner
        self.call_back = weak_method(owner.called)


def test_a_part_reaches_its_owner_while_it_lives():
    owner = Owner()
    assert owner.part.owner is owner
    assert owner.part.call_back(1, "a") == "answered" and owner.calls == [(1, "a")]


def test_an_owner_and_its_part_are_freed_by_reference_counting_alone():
    gc.disable()
    try:
        owner = Owner()
        part = owner.part
        del owner
        assert part.owner is None, "the part kept its owner alive: a reference cycle"
        assert part.call_back("late") is None, "a call-back of a freed owner does nothing"
    finally:
        gc.enable()


def test_the_attribute_is_per_instance():
    first, second = Owner(), Owner()
    assert first.part.owner is first and second.part.owner is second
    assert isinstance(Part.owner, WeakAttribute)


class Item:
    pass


def test_a_weak_identity_set_holds_what_lives_and_lets_go_of_what_is_freed():
    held = WeakIdentitySet()
    kept, dropped = Item(), Item()
    held.add(kept)
    held.add(kept)
    held.add(dropped)
    assert len(held) == 2
    del dropped
    assert held.alive() == [kept]
    held.clear()
    assert held.alive() == [] and len(held) == 0


def test_a_weak_identity_set_stays_within_twice_what_lives():
    held = WeakIdentitySet()
    kept = [Item() for _ in range(10)]
    for item in kept:
        held.add(item)
    for _ in range(100):
        batch = [Item() for _ in range(100)]   # queues declared, used, then deleted together
        for item in batch:
            held.add(item)
        del batch, item
        assert len(held) <= 2 * (len(kept) + 100) + 100
    assert set(map(id, held.alive())) == set(map(id, kept))
    assert len(held) >= len(kept)
