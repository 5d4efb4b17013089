"""One frame per peer per turn (issue 11, item 4): the production node over the simulation,
every frame a node hands its transport counted against the Raft turn that sent it."""
from __future__ import annotations

from collections import Counter

import pytest

from tests.sim.node import SimTransport
from tests.sim.world import SCENARIOS, World
from warren.broker.node import cluster as cluster_module
from warren.raft import frames


def count_frames(monkeypatch, scenario: str, seed: int) -> tuple[World, Counter, Counter]:
    """Run the world; (world, frames per (node, incarnation, peer, turn), frames by what they carry)."""
    per_turn: Counter = Counter()
    carrying: Counter = Counter()
    worlds: list[World] = []
    send = SimTransport.send

    def counted(self, peer, frame, now=False):
        node = worlds[0].nodes[self.node]
        turns = node.cluster.runtime.turns
        assert turns.in_turn, f"{self.node} sent a frame to {peer} outside a Raft turn"
        per_turn[(self.node, node.incarnations, peer, turns.turns_run)] += 1
        carrying[tuple(sorted(frame))] += 1
        return send(self, peer, frame, now)
    monkeypatch.setattr(SimTransport, "send", counted)
    worlds.append(World(SCENARIOS[scenario], seed))
    return worlds[0].run(), per_turn, carrying


def test_raft_and_node_messages_share_one_frame_per_peer_per_turn(monkeypatch):
    world, per_turn, carrying = count_frames(monkeypatch, "calm", 0)
    assert per_turn and max(per_turn.values()) == 1, per_turn.most_common(3)
    both = carrying[(frames.HOST, frames.RAFT)]
    # Two frames each before: one of Raft items, one of the node's messages.
    assert both > 100, carrying
    assert world.history.counts["confirms"] > 100


def test_a_frame_is_split_only_past_its_bounds():
    raft = {"b": [[["g", 1]], [["g", 2]]], "c": [[["g", 3]]]}
    host = {"c": [[1], [2], [3]], "d": [[4]]}
    shards = {"b": [[5]], "e": [[6], [7], [8]]}   # the shard link's part (broker/node/shard_link.py)
    sent = list(frames.assemble(raft, {frames.HOST: host, "s": shards}, host_max=2))
    assert sent == [("b", {"r": [["g", 1]], "s": [[5]]}), ("b", {"r": [["g", 2]]}),
                    ("c", {"r": [["g", 3]], "a": [[1], [2]]}), ("c", {"a": [[3]]}), ("d", {"a": [[4]]}),
                    ("e", {"s": [[6], [7]]}), ("e", {"s": [[8]]})]
    assert frames.raft_items(sent[2][1]) == [["g", 3]] and frames.raft_items(sent[4][1]) == []
    assert frames.has_host_parts(sent[2][1]) and not frames.has_host_parts(sent[1][1])
    assert frames.has_host_parts(sent[5][1])


@pytest.mark.parametrize(("scenario", "seed"), [("calm", 0), ("faults", 0), ("faults", 1), ("faults", 2)])
def test_deliveries_in_frames_of_their_own_as_they_are_made_keep_the_checks(monkeypatch, scenario, seed):
    """Every delivery to another node leaves in a frame of its own the moment it is made
    (EARLY_FRAME_BYTES 1, broker/node/cluster.py), ahead of the turn's Raft messages: the
    world's checks still hold (nothing confirmed lost, each consumer's order kept), and
    frames did leave in the middle of turns. (A consumer's node puts deliveries back in
    their sequence and asks for what it misses, so even a dropped or reordered early frame
    would pass here: the unit test, tests/unit/test_early_frames.py, holds the order.)"""
    monkeypatch.setattr(cluster_module, "EARLY_FRAME_BYTES", 1)
    sent_now: Counter = Counter()
    send = SimTransport.send

    def counted(self, peer, frame, now=False):
        sent_now[now] += 1
        return send(self, peer, frame, now)
    monkeypatch.setattr(SimTransport, "send", counted)
    world = World(SCENARIOS[scenario], seed).run()
    assert sent_now[True] > 50, sent_now
    assert world.history.counts["confirms"] > 50, dict(world.history.counts)
    if scenario == "calm":
        assert world.history.counts["deliveries"] == world.history.counts["confirms"], dict(world.history.counts)
