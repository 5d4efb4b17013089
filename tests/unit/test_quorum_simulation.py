"""A quorum queue replicated by Raft under the seeded simulator (tests/unit/quorumsim.py).

Every scenario runs WARREN_QQ_SEEDS seeds (default 40). A failure names its
seed and the command that replays it, printing the recent events:

    WARREN_QQ_SEED=<seed> .venv/bin/pytest tests/unit/test_quorum_simulation.py -k 'replay and <scenario>'
"""
from __future__ import annotations

import os
from collections import Counter

import pytest

from tests.unit.quorumsim import QUEUE_SCENARIOS, QueueSimulation, SimulationFailure
from warren.broker.queues import quorum_machine as qm
from warren.broker.queues.queue_snapshots import ReleaseCursor

SEEDS = int(os.environ.get("WARREN_QQ_SEEDS", "40"))
REPLAY_SEED = os.environ.get("WARREN_QQ_SEED")

# What each scenario must have exercised over its seeds, so that a change that
# quietly turns a fault or a recovery path off shows up.
COMMON = {"crash", "restart", "leader", "duplicates", "held", "resent deliveries",
          "dropped duplicate deliveries", "gaps filled", "suspects", "ups"}
EXPECTED = {
    "faults": COMMON | {"partition", "heal", "truncates", "gone"},
    "snapshots": COMMON | {"compacts", "installs"},
}


@pytest.mark.parametrize("scenario", sorted(QUEUE_SCENARIOS))
def test_simulation(scenario):
    stats: Counter[str] = Counter()
    confirmed = 0
    for seed in range(SEEDS):
        simulation = QueueSimulation(QUEUE_SCENARIOS[scenario], seed).run()
        stats += simulation.stats
        confirmed += len(simulation.confirmed)
    assert confirmed > SEEDS * 50, f"{scenario}: few publishes were confirmed ({confirmed})"
    if SEEDS >= 20:
        missing = EXPECTED[scenario] - set(stats)
        assert not missing, f"{scenario}: never exercised {sorted(missing)} in {SEEDS} seeds: {dict(stats)}"


@pytest.mark.skipif(REPLAY_SEED is None, reason="set WARREN_QQ_SEED to replay one seed")
@pytest.mark.parametrize("scenario", sorted(QUEUE_SCENARIOS))
def test_replay(scenario):
    simulation = QueueSimulation(QUEUE_SCENARIOS[scenario], int(REPLAY_SEED))
    try:
        simulation.run()
    finally:
        print("\n".join(simulation.events))


def test_a_seed_replays_identically():
    first = QueueSimulation(QUEUE_SCENARIOS["snapshots"], 5).run()
    second = QueueSimulation(QUEUE_SCENARIOS["snapshots"], 5).run()
    assert list(first.events) == list(second.events)
    assert first.confirmed == second.confirmed and first.stats == second.stats


def test_a_restarted_replica_rebuilds_the_same_machine_from_its_log():
    simulation = QueueSimulation(QUEUE_SCENARIOS["faults"], 3)
    for _ in range(150):
        simulation.step()
    simulation.heal()
    while not simulation.quiescent():
        simulation.step()
    leader = simulation.leaders()[0]
    follower = next(n for n in simulation.nodes.values() if n is not leader)
    simulation.crash(follower, torn=False)
    simulation.start(follower)       # its machine: the snapshot's, or empty; the log is applied again
    snapshot = follower.storage.snapshot
    assert follower.applied_index == (snapshot.index if snapshot is not None else 0)
    assert follower.applied_index < leader.raft.commit_index
    for _ in range(200):
        if follower.applied_index == leader.raft.commit_index:
            break
        simulation.step()
    assert simulation.machines[follower.node_id].snapshot() == simulation.machines[leader.node_id].snapshot()


# --- the checks can fail ----------------------------------------------------------------------------

def first_failure(scenario: str, seeds: int = 20) -> str | None:
    for seed in range(seeds):
        try:
            QueueSimulation(QUEUE_SCENARIOS[scenario], seed).run()
        except SimulationFailure as failure:
            assert f"seed={seed}" in str(failure) and f"WARREN_QQ_SEED={seed}" in str(failure)
            return str(failure)
    return None


def test_the_simulation_catches_a_machine_that_enqueues_resends_again(monkeypatch):
    def without_sessions(self, enqueuer, seq, message, effects):
        return [self._enqueue_one(enqueuer, seq, message, effects)]
    monkeypatch.setattr(qm.QuorumMachine, "_on_enqueue", without_sessions)
    assert "enqueued twice" in (first_failure("faults") or "")


def test_the_simulation_catches_a_stale_return_of_a_later_delivery(monkeypatch):
    def ignoring_seqs(self, consumer, items):
        return tuple(item if isinstance(item, int) else item[0] for item in items)
    monkeypatch.setattr(qm.QuorumMachine, "_select", ignoring_seqs)
    assert "again after settling it" in (first_failure("faults") or "")


def test_the_simulation_catches_a_snapshot_that_loses_the_sessions(monkeypatch):
    restore = qm.QuorumMachine.restore

    def forgetful(data):
        machine = restore(data)
        machine._sessions.clear()
        return machine
    monkeypatch.setattr(qm.QuorumMachine, "restore", staticmethod(forgetful))
    assert first_failure("snapshots") is not None


def test_the_simulation_catches_a_release_cursor_that_cuts_below_a_kept_message(monkeypatch):
    """Messages are references into the log: compacting to the state now,
    while it still refers to entries at or below it, loses their bodies."""
    def eager(self, index, machine):
        return index, machine.snapshot()
    monkeypatch.setattr(ReleaseCursor, "offer", eager)
    failure = first_failure("snapshots")
    assert failure is not None and ("body" in failure or "never delivered" in failure or "confirmed" in failure), \
        failure
