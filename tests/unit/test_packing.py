"""The reused-Packer encoding (raft/packing.py) gives msgpack.packb's bytes."""
from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from warren.raft import packing

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


def test_a_large_value_is_not_left_in_the_packers_buffer():
    small = packing.packb(b"x")
    kept = packing._pack
    large = b"y" * (packing.KEEP_BUFFER_BYTES + 1)
    assert packing.packb([large]) == msgpack.packb([large], use_bin_type=True)
    assert packing._pack is not kept
    assert packing.packb(b"x") == small
    still = packing._pack
    packing.packb(b"z" * 1000)
    assert packing._pack is still


def test_pieces_are_packed_as_the_bytes_they_join_to():
    data = packing.Pieces((b"ab", b"c" * 300, b"d"))
    whole = bytes(data)
    assert packing.packb([1, data, {"x": data}]) == msgpack.packb([1, whole, {"x": whole}], use_bin_type=True)
    assert len(data) == 303 and data == bytes(data) and bytes(data) == data and data == packing.Pieces((bytes(data),))
    assert packing.packb(b"z") == msgpack.packb(b"z", use_bin_type=True), "the packer stays usable"
