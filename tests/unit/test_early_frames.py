"""A Raft turn that delivers a consumer's window to another node (or shard) sends it in
frames as it is made, not all in the turn's one frame (broker/node/cluster.py,
`Cluster._maybe_early_frame`): the peer hands the first deliveries to its client while
the turn makes the rest. The node's messages to each peer still leave once each and in
the order they were made, early frames first, the turn's frame with the rest."""
from __future__ import annotations

from types import SimpleNamespace

from tests.unit.test_node_core import FakeRaft
from warren.broker.node.cluster import DELIVERY_OVERHEAD_BYTES, EARLY_FRAME_BYTES, Cluster, run_bytes
from warren.broker.node.node_core import APPLIED, DELIVERIES, NodeCore
from warren.raft.frames import HOST


class RecordingRuntime:
    """What the cluster uses of its runtime here: the turn flag and the frames it is handed."""

    def __init__(self, in_turn: bool) -> None:
        self.turns = SimpleNamespace(in_turn=in_turn, loop=object())
        self.sent: list[tuple[str, dict, bool]] = []
        self.turns_asked = 0

    def send_frame(self, peer: str, frame: dict, now: bool = False) -> None:
        self.sent.append((peer, frame, now))

    def request_turn(self) -> None:
        self.turns_asked += 1

    def halted(self) -> bool:
        return False


def cluster_with(runtime: RecordingRuntime) -> Cluster:
    cluster = Cluster.__new__(Cluster)   # the parts the frames use, without a broker and its disk
    cluster.runtime = runtime
    cluster.core = NodeCore("n1", "inc1", ["n1", "n2", "n3"], FakeRaft({}), 10.0)
    cluster.broker = SimpleNamespace(shard_link=None)
    cluster.early_frame_bytes = {}
    return cluster


def deliver(seq: int, body_size: int) -> list:
    """A run of one delivery (a turn's runs to a consumer of a peer are each this or larger)."""
    return [DELIVERIES, "g1", "n2/inc2/7/1", "ctag", [(seq, seq, ("", "rk", {}, b"x" * body_size), False, 0)]]


def bodies(messages: list[list]) -> int:
    return sum(len(d[2][3]) for m in messages if m[0] == DELIVERIES for d in m[4])


def estimated_size(messages: list[list]) -> int:
    return sum(run_bytes(m[4]) for m in messages if m[0] == DELIVERIES)


def test_a_window_of_deliveries_leaves_in_frames_as_it_is_made():
    runtime = RecordingRuntime(in_turn=True)
    cluster = cluster_with(runtime)
    made: dict[str, list[list]] = {"n2": [], "n3": []}
    for seq in range(1, 257):
        message = deliver(seq, 1024)
        cluster.app_send("n2", message)
        made["n2"].append(message)
        if seq % 50 == 0:   # a confirm between them stays in its place
            confirm = [APPLIED, "g1", "n2/inc2/9", seq, seq, []]
            cluster.app_send("n2", confirm)
            made["n2"].append(confirm)
    small = deliver(1, 16)
    cluster.app_send("n3", small)
    made["n3"].append(small)

    early = list(runtime.sent)
    turn_end = cluster.host_parts()[HOST]

    assert early, "the window went only at the turn's end"
    assert all(peer == "n2" and now and set(frame) == {HOST} for peer, frame, now in early), early[:1]
    sizes = [estimated_size(frame[HOST]) for _, frame, _ in early]
    assert all(EARLY_FRAME_BYTES <= size < EARLY_FRAME_BYTES + 1024 + DELIVERY_OVERHEAD_BYTES for size in sizes), sizes
    sent_to_n2 = [m for _, frame, _ in early for m in frame[HOST]] + turn_end.get("n2", [])
    assert sent_to_n2 == made["n2"], "every message once, in the order made"
    assert bodies(sent_to_n2) - bodies(turn_end.get("n2", [])) >= 3 * bodies(made["n2"]) // 4, \
        "most of the window left before the turn's end"
    assert turn_end["n3"] == made["n3"], "a peer with little for it waits for the turn's frame"


def test_a_small_turn_and_input_between_turns_go_in_one_frame():
    for in_turn, count in ((True, 16), (False, 256)):
        runtime = RecordingRuntime(in_turn=in_turn)
        cluster = cluster_with(runtime)
        made = [deliver(seq, 1024) for seq in range(1, count + 1)]
        for message in made:
            cluster.app_send("n2", message)
        assert runtime.sent == [], (in_turn, count)
        assert cluster.host_parts()[HOST]["n2"] == made


def test_the_count_starts_again_each_turn():
    runtime = RecordingRuntime(in_turn=True)
    cluster = cluster_with(runtime)
    per_turn = EARLY_FRAME_BYTES // 1024 // 2   # half a frame's worth a turn
    for turn in range(4):
        for seq in range(per_turn):
            cluster.app_send("n2", deliver(turn * per_turn + seq, 1024))
        assert len(cluster.host_parts()[HOST]["n2"]) == per_turn
    assert runtime.sent == []
