"""Commands a peer forwards to a queue's leader are checked before they are proposed."""
from __future__ import annotations

import msgpack

from warren.broker.node.cluster import forwardable_op
from warren.broker.queues import queue_codec as qcodec
from warren.broker.queues import queue_commands as qc


def test_encoded_commands_are_well_formed():
    for record in (qc.EnqueueBatch("n/i/1/1", 1, 5, [["", "q", b"", b"x", None, 0]]),
                   qc.Settle("n/i/1/1", "t", 5, [[1, 1]]), qc.Tick(5)):
        assert forwardable_op(qcodec.encode(record)) == record.TAG, record


def test_garbage_is_not_proposed():
    for data in (b"", b"\xc1", b"garbage", msgpack.packb([]), msgpack.packb([99, 1]), msgpack.packb({"a": 1}),
                 msgpack.packb(["enqueue"]), msgpack.packb([qc.Tick.TAG]), None, 42):
        assert forwardable_op(data) is None, data


def test_liveness_commands_are_never_forwarded():
    """A node's up/down/gone is the current leader's own view: a deposed leader's
    NodeDown forwarded to the new leader would suspend consumers on live nodes."""
    for record in (qc.NodeDown("b@local", 5), qc.NodeUp("b@local", "inc", 5), qc.NodeGone("b@local", 5)):
        assert forwardable_op(qcodec.encode(record)) is None, record
