"""A leader applies the publish commands it proposed without decoding them again
(broker/queues/queue_routes.py `ProposedCommands`): the production node over the
simulation, every command taken back checked against what decoding its bytes gives,
and the world's checks (nothing confirmed lost, order kept) holding through leader
changes, crashes and lost entries."""
from __future__ import annotations

import pytest

from tests.sim.world import SCENARIOS, World
from warren.broker.queues import queue_codec
from warren.broker.queues import queue_commands as qc
from warren.broker.queues.queue_routes import PROPOSED_KEPT, ProposedCommands
from warren.raft import packing


@pytest.mark.parametrize(("scenario", "seed"), [("calm", 0), ("faults", 0), ("faults", 5)])
def test_a_leader_applies_the_commands_it_proposed_as_they_decode(monkeypatch, scenario, seed):
    taken, missed = [], []
    take = ProposedCommands.take

    def checked(self, data):
        command = take(self, data)
        if command is None:
            missed.append(1)
        else:
            assert command == queue_codec.decode(data), "taken back: not what its bytes decode to"
            taken.append(command)
        return command
    monkeypatch.setattr(ProposedCommands, "take", checked)
    world = World(SCENARIOS[scenario], seed).run()
    assert world.history.counts["confirms"] > 100
    assert len(taken) > 50, (len(taken), len(missed))
    assert all(type(command) is qc.EnqueueBatch for command in taken)


@pytest.mark.parametrize(("scenario", "seed"), [("faults", 1), ("faults", 5), ("snapshots", 2)])
def test_commands_built_around_their_bodies_are_replicated_recovered_and_applied_as_their_bytes(
        monkeypatch, scenario, seed):
    """Every publish command as `packing.Pieces` (the piece threshold down to one byte): the
    leader's Raft log holds them, its WAL writes them as pieces, the transport packs them whole
    for followers and a decode joins them; the world's checks hold through the faults."""
    built = []
    encode_publishes = queue_codec.encode_publishes

    def counted(command):
        data = encode_publishes(command)
        assert type(data) is packing.Pieces and bytes(data) == queue_codec.encode(command)
        built.append(1)
        return data
    monkeypatch.setattr(queue_codec, "BODY_PIECE_MIN_BYTES", 1)
    monkeypatch.setattr(queue_codec, "encode_publishes", counted)
    world = World(SCENARIOS[scenario], seed).run()
    assert world.history.counts["confirms"] > 100
    assert len(built) > 100, len(built)


def test_only_the_very_bytes_proposed_are_taken_and_past_the_bound_the_oldest_go():
    proposed = ProposedCommands()
    data = [queue_codec.encode(qc.EnqueueBatch("o", i, 0, [["", "q", b"", b"x", None, 0]])) for i in range(1, 4)]
    proposed.note(data[0], "first")
    assert proposed.take(bytes(bytearray(data[0]))) is None, "equal bytes, another object: decoded"
    assert proposed.take(data[0]) == "first"
    assert proposed.take(data[0]) is None, "taken once"
    kept = [bytes([i % 256]) * 3 + bytes(i // 256) for i in range(PROPOSED_KEPT + 2)]
    for i, item in enumerate(kept):
        proposed.note(item, i)
    assert proposed.take(kept[0]) is None and proposed.take(kept[1]) is None
    assert proposed.take(kept[-1]) == PROPOSED_KEPT + 1
    proposed.clear()
    assert proposed.take(kept[-2]) is None, "a leader that steps down lets go of what it proposed"
