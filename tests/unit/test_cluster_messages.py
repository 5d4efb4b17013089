"""Commands a peer forwards to a queue's leader are checked before they are proposed."""
from __future__ import annotations

import msgpack

from warren.broker.node.cluster import forwardable_op
from warren.broker.queues import quorum_machine as qm


def test_encoded_commands_are_well_formed():
    for data in (qm.encode_enqueue_batch("n/i/1/1", 1, 5, [["", "q", b"", b"x", None, 0]]),
                 qm.encode_settle("n/i/1/1", "t", 5, [[1, 1]]), qm.encode_tick(5)):
        assert forwardable_op(data) == qm.decode(data)[0], qm.decode(data)


def test_garbage_is_not_proposed():
    for data in (b"", b"\xc1", b"garbage", msgpack.packb([]), msgpack.packb([99, 1]), msgpack.packb({"a": 1}),
                 msgpack.packb(["enqueue"]), msgpack.packb([qm.TICK]), None, 42):
        assert forwardable_op(data) is None, data


def test_liveness_commands_are_never_forwarded():
    """A node's up/down/gone is the current leader's own view: a deposed leader's
    NODE_DOWN forwarded to the new leader would suspend consumers on live nodes."""
    for data in (qm.encode_node_down("b@local", 5), qm.encode_node_up("b@local", "inc", 5),
                 qm.encode_node_gone("b@local", 5)):
        assert forwardable_op(data) is None, qm.decode(data)
