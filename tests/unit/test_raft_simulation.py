"""The Raft core under the seeded simulator (tests/unit/raftsim.py).

Every scenario runs WARREN_RAFT_SEEDS seeds (default 34: about 200 runs in
all). A failure names its seed and the command that replays it:

    WARREN_RAFT_SEED=<seed> .venv/bin/pytest tests/unit/test_raft_simulation.py -k 'replay and <scenario>'
"""
from __future__ import annotations

import os
from collections import Counter

import pytest

from tests.unit.raftsim import SCENARIOS, Simulation, SimulationFailure
from warren.raft.log import RaftLog
from warren.raft.messages import Role

SEEDS = int(os.environ.get("WARREN_RAFT_SEEDS", "34"))
REPLAY_SEED = os.environ.get("WARREN_RAFT_SEED")

# What each scenario must have exercised over its seeds, so that a change that
# quietly turns a fault off shows up.
EXPECTED = {
    "three": {"crash", "restart", "partition", "heal", "leader", "truncates"},
    "five": {"crash", "restart", "partition", "heal", "leader"},
    "membership": {"proposes", "compacts", "installs", "leader"},
    "snapshots": {"compacts", "installs", "crash", "restart"},
    "transfer": {"transfers", "leader", "partition"},
    "chaos": {"crash", "restart", "leader", "truncates"},
    "forget": {"forgets", "campaigns", "crash", "restart", "partition", "leader"},
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_simulation(scenario):
    stats: Counter[str] = Counter()
    acknowledged = 0
    for seed in range(SEEDS):
        simulation = Simulation(SCENARIOS[scenario], seed).run()
        stats += simulation.stats
        acknowledged += len(simulation.acknowledged)
    assert acknowledged > SEEDS * 20, f"{scenario}: the client got few proposals committed ({acknowledged})"
    if SEEDS >= 20:
        missing = EXPECTED[scenario] - set(stats)
        assert not missing, f"{scenario}: never exercised {sorted(missing)} in {SEEDS} seeds: {dict(stats)}"


@pytest.mark.skipif(REPLAY_SEED is None, reason="set WARREN_RAFT_SEED to replay one seed")
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_replay(scenario):
    simulation = Simulation(SCENARIOS[scenario], int(REPLAY_SEED))
    try:
        simulation.run()
    finally:
        print("\n".join(simulation.events))


def test_a_seed_replays_identically():
    first = Simulation(SCENARIOS["membership"], 11).run()
    second = Simulation(SCENARIOS["membership"], 11).run()
    assert list(first.events) == list(second.events)
    assert first.acknowledged == second.acknowledged and first.leader_of_term == second.leader_of_term


def test_the_simulation_catches_a_voter_that_ignores_log_completeness(monkeypatch):
    """The checks can fail: with §5.4.1's vote restriction gone, a leader
    without committed entries gets elected and the run says which seed."""
    monkeypatch.setattr(RaftLog, "is_up_to_date", lambda self, index, term: True)
    failures = []
    for seed in range(60):
        try:
            Simulation(SCENARIOS["three"], seed).run()
        except SimulationFailure as failure:
            failures.append(str(failure))
            break
    assert failures, "60 seeds without noticing a broken vote rule"
    assert f"seed={seed}" in failures[0] and f"WARREN_RAFT_SEED={seed}" in failures[0]


def test_the_simulation_catches_a_follower_that_skips_the_consistency_check(monkeypatch):
    monkeypatch.setattr(RaftLog, "match_term", lambda self, index, term: index <= self.last_index())
    with pytest.raises(SimulationFailure, match="replay"):
        for seed in range(60):
            Simulation(SCENARIOS["three"], seed).run()


def test_a_crash_loses_what_was_not_persisted():
    simulation = Simulation(SCENARIOS["three"], 1)
    while not simulation.leaders():
        simulation.step()
    leader = simulation.leaders()[0]
    simulation.process_ready(leader)
    index = leader.raft.propose(b"never persisted")
    assert index == leader.raft.log.last_index()
    simulation.crash(leader, torn=False)       # before the Ready is taken
    simulation.start(leader)
    assert leader.raft.log.last_index() == index - 1
    assert leader.raft.role == Role.FOLLOWER
