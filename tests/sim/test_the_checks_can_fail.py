"""The cluster simulation catches the queue machine's known mistakes, put back by monkeypatch
(the cases the hand-written copy of the node it replaces, tests/unit/quorumsim.py, was shown to catch)."""
from __future__ import annotations

from tests.sim.history import SimulationFailure
from tests.sim.world import SCENARIOS, World, replay_command
from warren.broker.node.cluster import Cluster
from warren.broker.node.metadata_state import QueueRecord
from warren.broker.queues import queue_snapshots
from warren.broker.queues import quorum_machine as qm
from warren.broker.queues.queue_client import QueueClient
from warren.raft.log import RaftLog
from warren.raft.runtime import RaftRuntime


def first_failure(scenario: str, seeds: int = 12) -> str | None:
    for seed in range(seeds):
        try:
            World(SCENARIOS[scenario], seed).run()
        except SimulationFailure as failure:
            assert f"seed={seed}" in str(failure) and replay_command(scenario, seed) in str(failure)
            return str(failure)
    return None


def test_a_machine_that_enqueues_resends_again(monkeypatch):
    def without_sessions(self, enqueuer, seq, message, effects):
        return [self._enqueue_one(enqueuer, seq, message, effects)]
    monkeypatch.setattr(qm.QuorumMachine, "_on_enqueue", without_sessions)
    failure = first_failure("faults") or ""
    # a duplicate delivery: without its redelivered flag, to the channel that acked the first,
    # or, as a first delivery, behind later messages of its publisher
    assert ("without the redelivered flag" in failure or "again on the channel that acked it" in failure
            or "(first delivery) after seq" in failure), failure


def test_a_stale_settle_of_a_later_delivery(monkeypatch):
    def ignoring_seqs(self, consumer, items):
        return tuple(item if isinstance(item, int) else item[0] for item in items)
    monkeypatch.setattr(qm.QuorumMachine, "_select", ignoring_seqs)
    # seed 3 until queue groups stopped sending lone commit indexes, 4 until METADATA_APPLIED named the peers
    # a node reaches (20 until a leader sent what was proposed while its last batch was written; seeds 0-11
    # until clients waited for a restarted node's metadata catch-up, as the server's listeners do)
    failure = failure_of("faults", 4)
    assert failure is not None and "again on the channel that acked it" in failure, failure


def test_a_snapshot_that_loses_the_sessions(monkeypatch):
    restore = qm.QuorumMachine.restore

    def forgetful(data):
        machine = restore(data)
        machine._sessions.clear()
        return machine
    monkeypatch.setattr(qm.QuorumMachine, "restore", staticmethod(forgetful))
    assert first_failure("snapshots") is not None


def test_a_release_cursor_that_cuts_below_a_kept_message(monkeypatch):
    """Messages are references into the log: compacting to the state now,
    while it still refers to entries at or below it, loses their bodies."""
    def eager(self, index, machine):
        return index, machine.snapshot()
    monkeypatch.setattr(queue_snapshots.ReleaseCursor, "offer", eager)
    assert first_failure("snapshots") is not None


def test_votes_for_a_candidate_missing_committed_entries(monkeypatch):
    """Raft's election restriction off (§5.4.1): a leader without committed entries is caught
    (faults seed 16; any of 0-11 until queue groups stopped sending lone commit indexes)."""
    monkeypatch.setattr(RaftLog, "is_up_to_date", lambda self, last_index, last_term: True)
    failure = failure_of("faults", 16)
    assert failure is not None and ("leads" in failure or "applies" in failure), failure


def test_a_consumer_checked_out_after_its_channels_down(monkeypatch):
    """Without the client's second DOWN, a CHECKOUT forwarded past its channel's DOWN
    leaves a consumer nobody closes, holding its prefetch for good (issue 11 item 5)."""
    monkeypatch.setattr(QueueClient, "_down_again", lambda self, owner: None)
    # seed 1 until queue groups stopped sending lone commit indexes, 11 until METADATA_APPLIED named the peers a node
    # reaches; 0-5 until Raft and node messages shared one frame
    failure = failure_of("slow-forwards", 10)
    assert failure is not None and "confirmed messages never delivered" in failure, failure


def failure_of(scenario: str, seed: int) -> str | None:
    try:
        World(SCENARIOS[scenario], seed).run()
    except SimulationFailure as failure:
        return str(failure)
    return None


def test_an_old_release_replayed_at_a_restart(monkeypatch):
    """Without the replica's hosted_at, a restart that re-applies an old ReleaseReplica drops
    a replica hosted again since, which had acknowledged entries: its leader's heartbeat then
    carries a commit index beyond the log it restarts with (membership seed 6; 7 until
    queue groups stopped sending lone commit indexes, 1 until METADATA_APPLIED named the peers a node
    reaches, 11 until leaders pipelined their AppendEntries, 0 until pauses and partitions
    outlasted the gone timeout)."""
    monkeypatch.setattr(RaftRuntime, "hosted_at", lambda self, group: 0)
    assert "heartbeat commit beyond our log" in (failure_of("membership", 6) or "")


def test_a_node_added_again_as_the_voter_it_was(monkeypatch):
    """Without member ids (raft/member_ids.py), a replica made empty when its node is added
    again votes as the voter it was, which had voted in that term before: two leaders in one
    term (membership seed 7, found once clients waited for a restarted node's catch-up). The
    faults of the simulation changed since (pauses and partitions past the gone timeout):
    membership seed 452 was the first of 0-599 to fail with member ids put back, since
    leaders pipeline their AppendEntries (raft/replication.py take_pipelined) seed 174 was
    the first of 0-299, since METADATA_APPLIED names the peers a node reaches seed 401 was the
    first of 0-599, and since queue groups stopped sending lone commit indexes seed 628 is the
    first of 0-799 to fail so; it passes without."""
    monkeypatch.setattr(QueueRecord, "member_ids", lambda self: list(self.members))
    failure = failure_of("membership", 628) or ""
    assert ("two leaders in term" in failure or "applied elsewhere" in failure
            or "did not follow its members" in failure), failure


def test_an_exception_a_node_catches_and_logs(monkeypatch):
    """A turn's hook that raises is logged and the node goes on, half working (its frames
    never leave): the world fails the seed with the exception, not with a later symptom."""
    def broken(self):
        raise RuntimeError("no frame this turn")
    monkeypatch.setattr(Cluster, "host_parts", broken)
    failure = failure_of("calm", 0) or ""
    assert "a node logged an exception it caught: raft.turn_hook_failed" in failure, failure
    assert "RuntimeError: no frame this turn" in failure, failure


def test_a_gap_left_by_messages_taken_back_from_a_cut_off_node(monkeypatch):
    """Without RESENT (a resend's answer naming the highest seq given), a consumer whose
    node was cut off past the gone timeout waits for good for the seqs its leader took
    back: everything after them is held, its window fills, it gets nothing more
    (faults seed 826, 144 before queue groups stopped sending lone commit indexes, 125 before
    METADATA_APPLIED named the peers a node reaches, 88 before leaders pipelined; warren-chaos
    seed 23 from outside). At 826 the run's end finds what it held: the consumer's node never
    delivered the messages after the seqs taken back."""
    monkeypatch.setattr(QueueClient, "on_resent", lambda self, owner, tag, horizon, checked_out: None)
    failure = failure_of("faults", 826) or ""
    assert "got nothing of the final round" in failure or "confirmed messages never delivered" in failure, failure


def test_a_leader_woken_from_a_pause_delivers_from_the_past(monkeypatch):
    """Without the stall step-down, a leader paused past the gone timeout applies on
    waking, as leader, an entry that checked a message out to its node's consumer,
    which the new leader had since taken back, given to another and had settled
    (faults seed 4, 54 before queue groups stopped sending lone commit indexes, 107 before METADATA_APPLIED
    named the peers a node reaches, 122 before leaders pipelined)."""
    monkeypatch.setattr(RaftRuntime, "check_stall", lambda self: False)
    failure = failure_of("faults", 4) or ""
    assert "again after settling it" in failure, failure


def test_a_node_woken_from_a_pause_reads_what_its_links_held(monkeypatch):
    """Without dropping its links unread, a node paused past the gone timeout hands its
    consumer, as it wakes, a delivery its kernel took at the start of the pause: of a
    message the leader took back since, gave to another consumer and had settled
    (faults seed 4, 54 before queue groups stopped sending lone commit indexes, 107 before METADATA_APPLIED
    named the peers a node reaches, 28 before leaders pipelined; 122 unflagged duplicates in
    warren-chaos seed 43)."""
    check_stall = RaftRuntime.check_stall

    def stepping_down_only(self):
        transport, self.transport = self.transport, None
        try:
            return check_stall(self)
        finally:
            self.transport = transport
    monkeypatch.setattr(RaftRuntime, "check_stall", stepping_down_only)
    failure = failure_of("faults", 4) or ""
    assert "again after settling it" in failure or "without the redelivered flag" in failure, failure
