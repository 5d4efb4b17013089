"""The reused-Packer encoding (storage/packing.py) gives msgpack.packb's bytes."""
from __future__ import annotations

import threading

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from warren.storage import packing

values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2 ** 63), max_value=2 ** 64 - 1) | st.binary()
    | st.text() | st.floats(allow_nan=False),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=5), children, max_size=5),
    max_leaves=20)


@given(st.lists(values, min_size=1, max_size=5))
def test_a_run_of_values_packs_as_packb_does(run):
    for value in run:
        assert packing.packb(value) == msgpack.packb(value, use_bin_type=True)


def test_a_value_that_cannot_be_packed_leaves_the_packer_usable():
    with pytest.raises(TypeError):
        packing.packb([1, object()])
    with pytest.raises(OverflowError):
        packing.packb([1, 2 ** 70])
    assert packing.packb([1, b"ab"]) == msgpack.packb([1, b"ab"], use_bin_type=True)


def test_after_a_large_value_the_thread_starts_a_new_packer():
    packing.packb(b"x")
    kept = packing._per_thread.pack
    large = b"y" * (packing.KEEP_BUFFER_BYTES + 1)
    assert packing.packb([large]) == msgpack.packb([large], use_bin_type=True)
    assert getattr(packing._per_thread, "pack", None) is None
    assert packing.packb(b"z") == msgpack.packb(b"z", use_bin_type=True)
    assert packing._per_thread.pack is not kept


def test_each_thread_packs_with_its_own_packer():
    packers = []

    def pack_in_thread():
        packing.packb([1])
        packers.append(packing._per_thread.pack)

    threads = [threading.Thread(target=pack_in_thread) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    packing.packb([1])
    assert len({id(p.__self__) for p in packers + [packing._per_thread.pack]}) == 3
