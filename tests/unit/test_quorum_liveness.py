"""A quorum queue's node-liveness commands and delivery resends, as one node's
shell (broker/queues/quorum.py) handles them, over a fake cluster that records what
it proposes, submits and sends."""
from __future__ import annotations

from warren.broker.node.cluster import DELIVERIES, RESEND
from warren.broker.queues import queue_codec as qcodec
from warren.broker.queues import queue_commands as qc
from warren.broker.queues.queue_factory import Placement, make_queue
from warren.broker.queues.quorum import LocalConsumer, QuorumQueue

LIVENESS = qc.LIVENESS


class FakeCluster:
    def __init__(self, node: str, leading: bool) -> None:
        self.node, self.incarnation, self.leading = node, "i1", leading
        self.down_since: dict[str, float] = {}
        self.peer_incarnations: dict[str, str] = {}
        self.proposed: list[list] = []     # straight into this node's log, in its term
        self.submitted: list[list] = []    # kept, forwarded and resent until answered
        self.sent: list[tuple[str, list]] = []
        self.runtime = self

    def propose(self, group, data):
        if not self.leading:
            return None
        self.proposed.append(qcodec.decode(data))
        return len(self.proposed)

    def submit(self, group, data, callback=None):
        self.submitted.append(qcodec.decode(data))

    def is_leader(self, group):
        return self.leading

    def app_send(self, peer, message):
        self.sent.append((peer, message))

    def owner_key(self, owner):
        return f"{self.node}/{self.incarnation}/{owner[0]}/{owner[1]}"


class FakeVhost:
    name = "/"


def queue_on(node: str, leading: bool) -> QuorumQueue:
    return make_queue(FakeVhost(), "q", {"x-queue-type": "quorum"}, durable=True, exclusive_owner=None,
                      auto_delete=False, placement=Placement(FakeCluster(node, leading), "g", ("a", "b", "c")))


def test_liveness_commands_are_only_proposed_by_a_leader_in_its_own_term_never_submitted():
    leader = queue_on("a", leading=True)
    leader.on_node_down("b")
    leader.on_node_up("b", "i2")
    leader.on_node_gone("c")
    assert [type(c) for c in leader.cluster.proposed] == [qc.NodeDown, qc.NodeUp, qc.NodeGone]
    assert not leader.cluster.submitted, "a liveness command must never be resent to another leader"
    deposed = queue_on("a", leading=False)
    deposed.on_node_down("b")
    deposed.on_node_gone("c")
    assert not deposed.cluster.proposed and not deposed.cluster.submitted


def test_a_new_leader_states_its_own_view_in_its_own_term():
    queue = queue_on("a", leading=True)
    queue.cluster.down_since = {"c": 0.0}
    queue.cluster.peer_incarnations = {"b": "ib", "c": "ic"}
    queue.on_leader_change("a", True)
    assert [(type(c), c.node) for c in queue.cluster.proposed] == [(qc.NodeUp, "a"), (qc.NodeDown, "c"),
                                                                    (qc.NodeUp, "b")]
    assert not [c for c in queue.cluster.submitted if type(c) in LIVENESS]


def test_a_leader_resends_what_is_checked_out_to_a_peers_consumers_when_its_link_comes_up():
    queue = queue_on("a", leading=True)
    machine = queue.machine
    machine.apply(qc.Checkout("b/ib/1/1", "t", 1, 5), 1)
    machine.apply(qc.Checkout("c/ic/1/1", "t", 1, 5), 2)
    for seq in (1, 2, 3, 4):
        machine.apply(qcodec.decode(qcodec.encode(qc.Enqueue("a/i1/1/1", seq, 1, "", "q", b"\x00\x00", b"m%d" % seq))))
    queue.on_link_up("b")
    delivered = [(peer, m[2], d[0]) for peer, m in queue.cluster.sent if m[0] == DELIVERIES for d in m[4]]
    assert delivered == [("b", "b/ib/1/1", 1), ("b", "b/ib/1/1", 2)], "b's consumer's two, again; not c's"


def test_a_consumers_node_asks_a_new_leader_for_what_it_has_checked_out():
    queue = queue_on("c", leading=False)
    queue.leader_hint = "a"
    queue.local_consumers[("c/i1/1/1", "t")] = LocalConsumer(sink=None, consumer_id=((1, 1), "t"), last_seq=3)
    queue.on_leader_change("b", False)
    assert queue.cluster.sent == [("b", [RESEND, "g", "c/i1/1/1", "t", 3])]
    queue.on_leader_change("b", False)
    assert len(queue.cluster.sent) == 1, "asked once per leader change"
