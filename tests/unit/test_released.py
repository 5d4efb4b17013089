"""What a compaction drops is freed a piece per turn (raft/released.py), all of it in the end."""
from __future__ import annotations

import gc
import weakref

from hypothesis import given, settings
from hypothesis import strategies as st

from warren.raft.released import FREE_PER_TURN_MIN, FREE_SHARE_PER_TURN, Released


class Thing:
    pass


def test_dropped_objects_and_keys_are_freed_in_pieces_and_all_of_them_in_the_end():
    released = Released()
    things = [Thing() for _ in range(1000)]
    alive = [weakref.ref(thing) for thing in things]
    mapping = {index: Thing() for index in range(500)}
    released.add(things)
    released.drop_keys(mapping, range(100, 400))
    del things
    released.free_some()
    first_turn = max(FREE_PER_TURN_MIN, 1300 // FREE_SHARE_PER_TURN)
    assert sum(ref() is not None for ref in alive) == 1000 - first_turn, "a turn frees its piece, no more"
    turns = 0
    while released.pending:
        released.free_some()
        turns += 1
        assert turns < 100, "what waits does not drain"
    gc.collect()
    assert not any(ref() for ref in alive)
    assert sorted(mapping) == [*range(100), *range(400, 500)]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3000)), max_size=30))
def test_what_waits_stays_within_a_few_turns_of_what_comes(additions):
    released = Released()
    for is_list, size in additions:
        if is_list:
            released.add([None] * size)
        else:
            released.drop_keys({}, range(size))
        released.free_some()
    waiting = released.pending
    turns = 0
    while released.pending:
        released.free_some()
        turns += 1
    assert turns <= 64 * 8 + waiting // FREE_PER_TURN_MIN
    assert not released._lists and not released._keys
