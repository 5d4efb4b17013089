"""The queue's message table (broker/queues/message_table.py): a dict's behaviour over
chunks that never hold more than CHUNK ids and shrink as their messages go; in id order
when new ids come in increasing order, as a fifo's do (a dict's insertion order)."""
from __future__ import annotations

import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from warren.broker.queues.message_table import CHUNK_BITS, MessageTable

CHUNK = 1 << CHUNK_BITS

# ids near chunk edges and far apart, so that chunks are made, emptied and made again
ids = st.one_of(st.integers(0, 3 * CHUNK), st.integers(0, 40).map(lambda k: k * CHUNK - 1 if k else 0))
operations = st.lists(st.tuples(st.sampled_from(["set", "pop", "pop_default", "get", "del"]), ids,
                                st.integers(0, 1 << 62)), max_size=300)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_the_table_answers_as_a_dict_in_id_order(steps):
    table, model, newest = MessageTable(), {}, -1
    for operation, msg_id, value in steps:
        if operation == "set" and (msg_id in model or msg_id > newest):   # a new id above every id before it
            table[msg_id] = value
            model[msg_id] = value
            newest = max(newest, msg_id)
        elif operation == "set":
            continue
        elif operation == "pop":
            assert (msg_id in table) == (msg_id in model)
            if msg_id in model:
                assert table.pop(msg_id) == model.pop(msg_id)
        elif operation == "pop_default":
            assert table.pop(msg_id, "none") == model.pop(msg_id, "none")
        elif operation == "get":
            assert table.get(msg_id) == model.get(msg_id)
        elif msg_id in model:
            del table[msg_id]
            del model[msg_id]
        assert len(table) == len(model) and bool(table) == bool(model)
    ordered = list(model.items())
    assert ordered == sorted(ordered) and list(table.items()) == ordered, "not in id order"
    assert list(table) == list(table.keys()) == [msg_id for msg_id, _ in ordered]
    assert list(table.values()) == [value for _, value in ordered]
    assert table == model and model == table
    assert MessageTable.from_columns([k for k, _ in ordered], [v for _, v in ordered]) == table


def test_a_queue_that_grows_never_has_a_chunk_over_chunk_ids():
    table = MessageTable.from_columns(list(range(10 * CHUNK)), [7] * (10 * CHUNK))
    for msg_id in range(10 * CHUNK, 20 * CHUNK):
        table[msg_id] = msg_id
    chunk_sizes = [len(chunk) for chunk in table._chunks.values()]
    assert chunk_sizes == [CHUNK] * 20, chunk_sizes


def test_a_chunk_left_with_a_few_long_unacked_messages_gives_its_table_back():
    table = MessageTable.from_columns(list(range(CHUNK)), list(range(CHUNK)))
    full = sys.getsizeof(table._chunks[0])
    for msg_id in range(CHUNK - 10):
        table.pop(msg_id)
    left = table._chunks[0]
    assert sys.getsizeof(left) * 20 < full, f"{sys.getsizeof(left)} B kept for 10 messages (full: {full} B)"
    assert list(table) == list(range(CHUNK - 10, CHUNK))
    for msg_id in range(CHUNK - 10, CHUNK):
        table.pop(msg_id)
    assert not table._chunks and len(table) == 0


def test_ids_out_of_order_or_repeated_make_the_dict_of_them():
    table = MessageTable.from_columns([9000, 3, 9000, 1], ["a", "b", "c", "d"])
    assert table == {1: "d", 3: "b", 9000: "c"} and len(table) == 3
    table.pop(1)
    table.pop(3)   # its chunk goes...
    table[3 * CHUNK + 5] = "e"
    table[5] = "f"   # ...and is made again below newer ones: chunks still come in id order
    assert list(table.items()) == [(5, "f"), (9000, "c"), (3 * CHUNK + 5, "e")]
