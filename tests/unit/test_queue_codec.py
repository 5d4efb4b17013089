"""broker/queues/queue_codec.py: the one encoding of the queue vocabulary, for the
Raft log and the wire; and the positional form earlier versions logged."""
from __future__ import annotations

import msgpack
import pytest

from warren.broker.node.cluster import forwardable_op
from warren.broker.queues import queue_codec as qcodec
from warren.broker.queues import queue_commands as qc
from warren.broker.queues.quorum_machine import QuorumMachine, entry_messages
from warren.raft import packing

P1 = "n1/i1/1/1"
MESSAGE = ["ex", "rk", b"\x00\x00props", b"body", None, 0]

COMMANDS = [
    qc.Enqueue(P1, 1, 5, "ex", "rk", b"props", b"body", 100, 2),
    qc.Checkout("o", "t", 5, 10, 1, True, False),
    qc.Cancel("o", "t", 5),
    qc.Settle("o", "t", 5, [1, [2, 7]]),
    qc.Return("o", None, 5, [3]),
    qc.Discard("o", "t", 5, []),
    qc.Suspend("o", "t", 5, False),
    qc.Dequeue("o", 9, 5, True),
    qc.Purge("o", 9, 5),
    qc.Down("o", 5),
    qc.NodeDown("n1", 5),
    qc.NodeUp("n1", "i2", 5),
    qc.NodeGone("n1", 5),
    qc.Tick(5),
    qc.EnqueueBatch(P1, 3, 5, [MESSAGE, ["", "q", b"", b"", 7, 9]]),
    qc.DropTransient(5),
    qc.DropTransientBefore(7, 5),
    qc.Stat("o", 5),
    qc.Checkout("o", "t", 5, 10, 1, True, False, True),   # exclusive
]
EFFECTS = [
    qc.Delivery(("o", "t"), 3, 12, 7 << 16, True, 2),
    qc.Delivery(("o", "t"), 1, 1, ("ex", "rk", b"p", b"b"), False, 0),
    qc.Applied(P1, 4, False, True),
    qc.Got("o", 2, qc.Dequeued(5, ("ex", "rk", b"p", b"b"), True, 3, 1)),
    qc.Got("o", 3, None),
    qc.Purged("o", 4, 10),
    qc.DeadLettered("maxlen", (("ex", "rk", b"p", b"b"), 9 << 16)),
]

# What the encode_* functions of earlier versions wrote: [opcode, fields...], msgpack with bin type.
OLD_FORMS = [
    ([1, P1, 1, 5, "ex", "rk", b"props", b"body", 100, 2], COMMANDS[0]),
    ([2, "o", "t", 5, 10, 1, True, False], COMMANDS[1]),
    ([3, "o", "t", 5], COMMANDS[2]),
    ([4, "o", "t", 5, [1, [2, 7]]], COMMANDS[3]),
    ([5, "o", None, 5, [3]], COMMANDS[4]),
    ([6, "o", "t", 5, []], COMMANDS[5]),
    ([7, "o", "t", 5, False], COMMANDS[6]),
    ([8, "o", 9, 5, True], COMMANDS[7]),
    ([9, "o", 9, 5], COMMANDS[8]),
    ([10, "o", 5], COMMANDS[9]),
    ([11, "n1", 5], COMMANDS[10]),
    ([12, "n1", "i2", 5], COMMANDS[11]),
    ([13, "n1", 5], COMMANDS[12]),
    ([14, 5], COMMANDS[13]),
    ([15, P1, 3, 5, [MESSAGE, ["", "q", b"", b"", 7, 9]]], COMMANDS[14]),
    ([16, 5], COMMANDS[15]),
    ([17, 7, 5], COMMANDS[16]),
    ([18, "o", 5], COMMANDS[17]),
]


def test_every_command_and_effect_round_trips():
    assert {type(c) for c in COMMANDS} == set(qc.COMMANDS)
    assert {type(e) for e in EFFECTS} == set(qc.EFFECTS)
    for record in COMMANDS + EFFECTS:
        data = qcodec.encode(record)
        assert isinstance(data, bytes)
        assert qcodec.decode(data) == record, record


def test_tags_are_distinct_and_the_form_is_the_tag_then_the_fields_in_order():
    assert len({cls.TAG for cls in qc.COMMANDS + qc.EFFECTS}) == len(qc.COMMANDS + qc.EFFECTS)
    data = qcodec.encode(qc.Cancel("o", "t", 5))
    assert msgpack.unpackb(data, raw=False) == [qc.Cancel.TAG, "o", "t", 5]


def test_bodies_stay_the_clients_bytes():
    body = bytes(range(256)) * 4
    record = qc.EnqueueBatch(P1, 1, 5, [["", "q", b"\x01\x02", body, None, 0]])
    data = qcodec.encode(record)
    assert body in data, "a body is packed once, as msgpack bin, not re-encoded"
    assert qcodec.decode(data).messages[0][3] == body


def test_the_positional_form_of_earlier_versions_decodes_to_the_same_records():
    assert {type(record) for _, record in OLD_FORMS} == set(qc.COMMANDS)
    assert COMMANDS[1].exclusive is False, "a Checkout logged before `exclusive` existed is not exclusive"
    for old, record in OLD_FORMS:
        assert qcodec.decode(msgpack.packb(old, use_bin_type=True)) == record, old


def test_an_old_log_replays_into_the_same_state_as_a_new_one():
    old_log = [[15, P1, 1, 5, [MESSAGE, MESSAGE]], [2, "n1/i1/2/1", "t", 6, 1, 0, False, True],
               [4, "n1/i1/2/1", "t", 7, [[1, 1]]], [1, P1, 3, 8, "", "q", b"", b"x", None, 0], [14, 9]]
    replayed, current = QuorumMachine(), QuorumMachine()
    for index, old in enumerate(old_log, start=1):
        data = msgpack.packb(old, use_bin_type=True)
        record = qcodec.decode(data)
        assert replayed.apply(record, index) == current.apply(qcodec.decode(qcodec.encode(record)), index)
    assert replayed.snapshot() == current.snapshot()
    assert replayed.ready_count == 1 and replayed.unacked_count == 1   # the second went to the consumer


def test_malformed_bytes_are_refused():
    for data in (b"", b"\xc1", msgpack.packb([]), msgpack.packb([99, 1]), msgpack.packb({"a": 1}),
                 msgpack.packb(["enqueue"]), msgpack.packb([qc.Tick.TAG]), msgpack.packb([qc.Tick.TAG, 1, 2]),
                 msgpack.packb([qc.Checkout.TAG, "o", "t", 5, 10, 1, True]),   # one field short of the old form
                 msgpack.packb([qc.Checkout.TAG, "o", "t", 5, 10, 1, True, False, False, 1])):
        with pytest.raises(qcodec.MalformedCommand):
            qcodec.decode(data)
        with pytest.raises(qcodec.MalformedCommand):
            qcodec.decode_read_back(data)


def test_an_entry_read_back_names_the_same_messages_as_tuples():
    """What a delivery reads back from the log: the messages `decode` gives, each a
    tuple whose first four fields are the delivery's payload."""
    for record in (qc.EnqueueBatch(P1, 3, 5, [MESSAGE, ["", "q", b"", b"", 7, 9]]),
                   qc.Enqueue(P1, 1, 5, "ex", "rk", b"props", b"body", 100, 2)):
        data = qcodec.encode(record)
        read_back = entry_messages(qcodec.decode_read_back(data))
        assert [list(m) for m in read_back] == [list(m) for m in entry_messages(qcodec.decode(data))]
        assert all(type(m) is tuple and type(m[:4]) is tuple for m in read_back)


def test_forwardable_commands_are_well_formed_commands_but_no_liveness_statements():
    for record in COMMANDS:
        data = qcodec.encode(record)
        expected = None if type(record) in qc.LIVENESS else record.TAG
        assert qcodec.forwardable_tag(data) == expected, record
        assert forwardable_op(data) == expected, record   # broker/node/cluster.py's check agrees
    for record in EFFECTS:
        assert qcodec.forwardable_tag(qcodec.encode(record)) is None, record
    for data in (b"", b"garbage", msgpack.packb([99, 1]), None, 42):
        assert qcodec.forwardable_tag(data) is None



def publishes(seed: int) -> qc.EnqueueBatch:
    """A batch of publishes of every body size class around the piece threshold and
    msgpack's bin and array header sizes, from a seed."""
    import random
    rng = random.Random(seed)
    sizes = [0, 5, 255, 256, qcodec.BODY_PIECE_MIN_BYTES - 1, qcodec.BODY_PIECE_MIN_BYTES, 65535, 65536, 200_000]
    messages = [[rng.choice(["", "amq.direct", "ex-é"]), "q" * rng.randint(0, 40), bytes(rng.randint(0, 300)),
                 bytes([n % 256]) * rng.choice(sizes), rng.choice([None, 0, 5, 100_000]), rng.choice([0, 1, 9])]
                for n in range(rng.choice([1, 2, 15, 16, 17, 300]))]
    return qc.EnqueueBatch(f"n1/i1/{seed}", rng.randint(1, 2**40), rng.randint(0, 2**45), messages)


@pytest.mark.parametrize("seed", range(40))
def test_publishes_with_large_bodies_are_their_bytes_built_around_the_bodies_uncopied(seed):
    command = publishes(seed)
    encoded = qcodec.encode_publishes(command)
    assert bytes(encoded) == qcodec.encode(command), "the same bytes as the command packed whole"
    large = [m[3] for m in command.messages if len(m[3]) >= qcodec.BODY_PIECE_MIN_BYTES]
    if not large:
        assert type(encoded) is bytes
        return
    assert type(encoded) is packing.Pieces and len(encoded) == len(qcodec.encode(command))
    held = {id(part) for part in encoded.parts}
    assert all(id(body) in held for body in large), "a large body is a piece of the command, not copied into it"
    assert qcodec.decode(encoded) == qcodec.decode(qcodec.encode(command))
    assert qcodec.decode_read_back(encoded) == qcodec.decode_read_back(qcodec.encode(command))


def test_publishes_with_only_small_bodies_are_packed_whole():
    command = qc.EnqueueBatch("o", 1, 0, [["", "q", b"", bytes(qcodec.BODY_PIECE_MIN_BYTES - 1), None, 0]] * 3)
    assert qcodec.encode_publishes(command) == qcodec.encode(command)
    assert type(qcodec.encode_publishes(command)) is bytes
