"""Transcript tests of the pure Raft core (raft/core.py), in etcd-raft's manner.

Each test drives a `Cluster` (tests/unit/raftsim.py) by hand: nodes with
perfect storage and a network that delivers only when told. A transcript is
the list of messages delivered, one per line (`sender->to Kind fields`);
entries are written `index@term:payload`. The sequence is the spec.
"""
from __future__ import annotations

import random

import msgpack
import pytest

from tests.unit.raftsim import Cluster, show
from warren.raft.core import RaftNode
from warren.raft.messages import (
    AppendEntries,
    AppendEntriesResponse,
    ConfigChange,
    ConfigChangeOp,
    Entry,
    EntryKind,
    HardState,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    RequestVote,
    RequestVoteResponse,
    Role,
    Snapshot,
    TimeoutNow,
    from_wire,
    to_wire,
)


def entry(index: int, term: int, data: bytes = b"", kind: EntryKind = EntryKind.NORMAL) -> Entry:
    return Entry(term, index, kind, data)


def elect(cluster: Cluster, node_id: str) -> None:
    cluster[node_id].campaign()
    cluster.stabilize()
    assert cluster[node_id].role == Role.LEADER


# --- election ------------------------------------------------------------------------------

def test_election_with_pre_vote_then_no_op_commits():
    c = Cluster(["a", "b", "c"])
    c["a"].campaign()
    assert c.stabilize() == [
        # §9.6: the pre-vote asks about term 1 while a stays in term 0
        "a->b PreVote term=1 last=0@0",
        "a->c PreVote term=1 last=0@0",
        "b->a PreVoteResponse term=1 granted",
        "c->a PreVoteResponse term=1 granted",
        "a->b Vote term=1 last=0@0",
        "a->c Vote term=1 last=0@0",
        "b->a VoteResponse term=1 granted",
        "c->a VoteResponse term=1 granted",
        # §8: the new leader's no-op
        "a->b AppendEntries term=1 prev=0@0 commit=0 [1@1:noop]",
        "a->c AppendEntries term=1 prev=0@0 commit=0 [1@1:noop]",
        "b->a AppendEntriesResponse term=1 match=1",
        "c->a AppendEntriesResponse term=1 match=1",
        # the new commit index reaches the caught-up followers at once
        "a->b AppendEntries term=1 prev=1@1 commit=1 []",
        "a->c AppendEntries term=1 prev=1@1 commit=1 []",
        "b->a AppendEntriesResponse term=1 match=1",
        "c->a AppendEntriesResponse term=1 match=1",
    ]
    assert [(c[n].role, c[n].term, c[n].leader_id, c[n].commit_index) for n in "abc"] == [
        (Role.LEADER, 1, "a", 1), (Role.FOLLOWER, 1, "a", 1), (Role.FOLLOWER, 1, "a", 1)]


def test_the_vote_is_persisted_in_the_ready_that_sends_the_response():
    c = Cluster(["a", "b", "c"], pre_vote=False)
    c["a"].campaign()
    c.deliver()
    ready = c.readies["b"][-1]
    assert ready.hard_state == HardState(term=1, voted_for="a", commit_index=0)
    assert [show(m) for m in ready.messages] == ["b->a VoteResponse term=1 granted"]


def test_ticks_elect_exactly_one_leader_with_randomized_timeouts():
    c = Cluster(["a", "b", "c", "d", "e"], seed=3)
    timeouts = {c[n].randomized_election_timeout for n in "abcde"}
    assert all(10 <= t < 20 for t in timeouts) and len(timeouts) > 1
    for _ in range(40):
        for n in "abcde":
            c.tick(n)
        c.stabilize()
    leaders = [n for n in "abcde" if c[n].role == Role.LEADER]
    assert len(leaders) == 1
    assert {c[n].leader_id for n in "abcde"} == set(leaders)


def test_a_voter_rejects_a_candidate_with_a_less_complete_log():
    c = Cluster(["a", "b", "c"], pre_vote=False)
    for node_id in "ac":
        c.restore(node_id, HardState(1, None, 0), [], ["a", "b", "c"])
    c.restore("b", HardState(1, None, 0), [entry(1, 1, b"x")], ["a", "b", "c"])   # from a lost leader
    c["a"].campaign()
    assert c.stabilize() == [
        "a->b Vote term=2 last=0@0",
        "a->c Vote term=2 last=0@0",
        "b->a VoteResponse term=2 rejected",   # §5.4.1
        "c->a VoteResponse term=2 granted",
        "a->b AppendEntries term=2 prev=0@0 commit=0 [1@2:noop]",
        "a->c AppendEntries term=2 prev=0@0 commit=0 [1@2:noop]",
        "b->a AppendEntriesResponse term=2 match=1",
        "c->a AppendEntriesResponse term=2 match=1",
        "a->b AppendEntries term=2 prev=1@2 commit=1 []",
        "a->c AppendEntries term=2 prev=1@2 commit=1 []",
        "b->a AppendEntriesResponse term=2 match=1",
        "c->a AppendEntriesResponse term=2 match=1",
    ]
    assert c["b"].log.entry(1) == entry(1, 2, kind=EntryKind.NOOP)  # its uncommitted entry was replaced


def test_a_restarted_node_keeps_its_term_and_vote():
    c = Cluster(["a", "b", "c"], pre_vote=False)
    c["a"].campaign()
    c.deliver()
    storage = c.nodes["b"].storage
    c.restore("b", storage.hard_state, storage.entries, ["a", "b", "c"])
    assert (c["b"].term, c["b"].voted_for) == (1, "a")
    c["b"].step(RequestVote(1, "c", "b", last_log_index=0, last_log_term=0))
    assert c.take()[-1] == "b->c VoteResponse term=1 rejected"   # §5.2: one vote per term


# --- pre-vote and check-quorum -----------------------------------------------------------------------

def test_pre_vote_stops_a_partitioned_node_from_disrupting_the_cluster_when_it_returns():
    c = Cluster(["a", "b", "c"])
    elect(c, "a")
    c.isolate("c")
    c["a"].propose(b"x")
    for _ in range(50):                  # c times out again and again, alone
        c.tick("c")
        c.tick("a")
        c.stabilize()
    assert (c["c"].term, c["c"].role) == (1, Role.PRE_CANDIDATE)   # the term never rose
    c.heal()
    c.tick("c", 20)
    assert c.stabilize() == [
        "c->a PreVote term=2 last=1@1",   # a leads and b hears from it:
        "c->b PreVote term=2 last=1@1",   # both ignore it (the lease, §4.2.3)
    ]
    c.tick("a")
    c.stabilize()
    assert (c["a"].role, c["a"].term) == (Role.LEADER, 1)
    assert (c["c"].role, c["c"].leader_id, c.applied("c")) == (Role.FOLLOWER, "a", [b"x"])


def test_without_pre_vote_the_returning_node_forces_an_election():
    c = Cluster(["a", "b", "c"], pre_vote=False, check_quorum=False)
    elect(c, "a")
    c.isolate("c")
    c.tick("c", 50)
    c.stabilize()
    assert c["c"].term > 1
    c.heal()
    c.tick("c", 20)
    c.stabilize()
    assert c["a"].term > 1                # deposed by c's higher term: a needless election
    assert c["a"].role != Role.LEADER or c["a"].term == c["c"].term


def test_followers_ignore_vote_requests_while_they_hear_from_a_leader():
    c = Cluster(["a", "b", "c"])
    elect(c, "a")
    c["b"].step(RequestVote(5, "c", "b", last_log_index=9, last_log_term=4))
    c["b"].step(RequestVote(5, "c", "b", last_log_index=9, last_log_term=4, pre_vote=True))
    assert c.take() == []                # §4.2.3: the lease; not even a rejection
    assert (c["b"].term, c["b"].voted_for) == (1, "a")
    c.tick("b", 10)                      # a full election timeout without the leader
    c["b"].step(RequestVote(5, "c", "b", last_log_index=9, last_log_term=4, pre_vote=True))
    assert c.take() == ["b->c PreVoteResponse term=5 granted"]
    assert c["b"].term == 1              # a pre-vote changes nothing


def test_a_follower_that_forgot_its_leader_grants_votes_inside_the_lease():
    """etcd-raft's ForgetLeader: the host's failure detector lost a's node.
    b forgets a (same term) and no longer ignores vote requests, so c is
    elected at once, without waiting out the lease or an election timeout."""
    c = Cluster(["a", "b", "c"])
    elect(c, "a")
    c.isolate("a")
    assert c["b"].forget_leader() is True
    assert (c["b"].role, c["b"].term, c["b"].leader_id, c["b"].voted_for) == (Role.FOLLOWER, 1, None, "a")
    assert c.take() == []                       # nothing to say: only the soft state changed
    assert c.readies["b"][-1].soft_state.leader_id is None and c.readies["b"][-1].hard_state is None
    c["c"].campaign()                           # c still follows a: its own lease never stops it
    assert c.stabilize() == [
        "c->a PreVote term=2 last=1@1  (dropped)",
        "c->b PreVote term=2 last=1@1",
        "b->c PreVoteResponse term=2 granted",  # inside the lease: granted, not ignored
        "c->a Vote term=2 last=1@1  (dropped)",
        "c->b Vote term=2 last=1@1",
        "b->c VoteResponse term=2 granted",
        "c->a AppendEntries term=2 prev=1@1 commit=1 [2@2:noop]  (dropped)",
        "c->b AppendEntries term=2 prev=1@1 commit=1 [2@2:noop]",
        "b->c AppendEntriesResponse term=2 match=2",
        "c->b AppendEntries term=2 prev=2@2 commit=2 []",   # a is probed, and waits for an answer
        "b->c AppendEntriesResponse term=2 match=2",
    ]
    assert (c["c"].role, c["c"].term, c["b"].leader_id) == (Role.LEADER, 2, "c")


def test_a_follower_that_forgot_its_leader_follows_it_again_on_its_next_message():
    c = Cluster(["a", "b", "c"])
    elect(c, "a")
    assert c["b"].forget_leader() is True
    assert c["b"].forget_leader() is False      # nothing left to forget
    c.tick("a")
    c.stabilize()                                # a's heartbeat
    assert (c["b"].leader_id, c["b"].term) == ("a", 1)
    c["b"].step(RequestVote(2, "c", "b", last_log_index=1, last_log_term=1, pre_vote=True))
    assert c.take() == []                        # back inside the lease


def test_forget_leader_leaves_leaders_and_candidates_as_they_are():
    c = Cluster(["a", "b", "c"])
    elect(c, "a")
    before = c["a"].status()
    assert c["a"].forget_leader() is False and c["a"].status() == before
    assert (c["a"].role, c["a"].leader_id) == (Role.LEADER, "a")
    c.isolate("b")
    c["b"].campaign()                            # pre-candidate: it has no leader to forget
    before = c["b"].status()
    assert before.role == Role.PRE_CANDIDATE and c["b"].forget_leader() is False and c["b"].status() == before
    c = Cluster(["a", "b", "c"], pre_vote=False)
    c["b"].campaign()
    assert c["b"].role == Role.CANDIDATE and c["b"].forget_leader() is False and c["b"].role == Role.CANDIDATE
    assert Cluster(["a", "b"])["a"].forget_leader() is False   # a fresh follower knows no leader


def test_status_is_a_read_only_view_of_the_node():
    c = Cluster(["a", "b", "c"])
    elect(c, "a")
    c.isolate("c")
    c["a"].propose(b"x")
    c.stabilize()
    status = c["a"].status()
    assert (status.node_id, status.term, status.voted_for, status.role, status.leader_id, status.voters) == (
        "a", 1, "a", Role.LEADER, "a", ("a", "b", "c"))
    assert (status.commit_index, status.last_applied, status.last_index, status.last_term) == (2, 2, 2, 1)
    assert (status.snapshot_index, status.log_entries, status.ready_outstanding, status.quorum) == (0, 2, False, 2)
    assert status.match_indexes == (("a", 2), ("b", 2), ("c", 1))   # c took the no-op only
    assert (status.match_index("b"), status.match_index("c"), status.match_index("z")) == (2, 1, None)
    with pytest.raises(AttributeError):
        status.term = 5
    follower = c["b"].status()
    assert (follower.role, follower.leader_id, follower.match_indexes, follower.match_index("a")) == (
        Role.FOLLOWER, "a", (), None)
    c["a"].propose(b"y")
    ready = c["a"].ready()
    assert c["a"].status().ready_outstanding and c["a"].awaiting_advance()
    c["a"].advance(ready)
    assert not c["a"].awaiting_advance()


def test_a_leader_is_idle_once_everything_is_committed_applied_and_acknowledged():
    c = Cluster(["a", "b", "c"])
    elect(c, "a")
    assert c["a"].is_idle() and not c["b"].is_idle()
    c.isolate("c")
    c["a"].propose(b"x")
    assert not c["a"].is_idle()                  # not even persisted yet
    c.stabilize()
    assert not c["a"].is_idle()                  # c has not acknowledged it
    assert c["a"].is_idle(unreachable={"c"})     # ... but c's node is down: a quorum holds it all
    assert not c["a"].is_idle(unreachable={"b", "c"})   # no quorum left to hold it
    c["a"].transfer_leadership("b")
    assert not c["a"].is_idle(unreachable={"c"})


def test_a_pre_candidate_counts_only_pre_votes_for_the_term_it_asks_about():
    c = Cluster(["a", "b", "c"], pre_vote=True)
    c.restore("a", HardState(4, None, 0), [], ["a", "b", "c"])
    c["a"].campaign()
    assert c["a"].role == Role.PRE_CANDIDATE
    c["a"].step(RequestVoteResponse(4, "b", "a", True, pre_vote=True))   # from a round for term 4
    assert c["a"].role == Role.PRE_CANDIDATE
    c["a"].step(RequestVoteResponse(5, "b", "a", True, pre_vote=True))
    assert (c["a"].role, c["a"].term) == (Role.CANDIDATE, 5)


def test_a_node_outside_the_configuration_never_campaigns():
    c = Cluster(["a", "b"], spares=["d"])
    c.tick("d", 100)
    assert c.take() == [] and c["d"].role == Role.FOLLOWER and c["d"].term == 0


def test_check_quorum_makes_a_cut_off_leader_step_down():
    c = Cluster(["a", "b", "c"])
    elect(c, "a")
    c.isolate("a")
    for _ in range(19):                  # at tick 10 it had heard from b and c in the
        c.tick("a")                      # last election timeout (they elected it)
        c.stabilize()
    assert c["a"].role == Role.LEADER
    c.tick("a")                          # tick 20: no answer for a whole timeout (§6.2)
    assert (c["a"].role, c["a"].leader_id, c["a"].term) == (Role.FOLLOWER, None, 1)
    assert c["a"].propose(b"x") is None


def test_a_leader_that_hears_from_a_quorum_stays():
    c = Cluster(["a", "b", "c"])
    elect(c, "a")
    c.cut = {frozenset(("a", "c"))}
    for _ in range(35):
        c.tick("a")
        c.stabilize()
    assert c["a"].role == Role.LEADER


def test_a_stale_leader_learns_the_new_term_from_the_answer_to_its_heartbeat():
    c = Cluster(["a", "b", "c"], check_quorum=False)
    elect(c, "a")
    c.isolate("a")
    for _ in range(20):
        c.tick("b")
        c.tick("c")
        c.stabilize()
    new_leader = "b" if c["b"].role == Role.LEADER else "c"
    assert c[new_leader].role == Role.LEADER and c[new_leader].term == 2
    assert c["a"].role == Role.LEADER      # without check-quorum, it does not know
    c.heal()
    c.tick("a")
    assert c.stabilize()[:4] == [
        "a->b Heartbeat term=1 commit=1",
        "a->c Heartbeat term=1 commit=1",
        "b->a AppendEntriesResponse term=2 reject=0 hint=0@0",
        "c->a AppendEntriesResponse term=2 reject=0 hint=0@0",
    ]
    assert (c["a"].role, c["a"].term) == (Role.FOLLOWER, 2)


# --- replication -------------------------------------------------------------------------------

def test_proposals_of_one_turn_travel_in_one_append_entries_and_commit_on_a_quorum():
    c = Cluster(["a", "b", "c"])
    elect(c, "a")
    assert [c["a"].propose(p) for p in (b"x", b"y", b"z")] == [2, 3, 4]
    assert c["b"].propose(b"no") is None                 # only the leader takes proposals
    c.isolate("c")
    assert c.stabilize() == [
        "a->b AppendEntries term=1 prev=1@1 commit=1 [2@1:x 3@1:y 4@1:z]",
        "a->c AppendEntries term=1 prev=1@1 commit=1 [2@1:x 3@1:y 4@1:z]  (dropped)",
        "b->a AppendEntriesResponse term=1 match=4",
        "a->b AppendEntries term=1 prev=4@1 commit=4 []",
        "b->a AppendEntriesResponse term=1 match=4",
    ]
    assert (c["a"].commit_index, c["a"].last_applied, c.applied("a")) == (4, 4, [b"x", b"y", b"z"])
    assert c.applied("b") == [b"x", b"y", b"z"] and c.applied("c") == []


def test_without_eager_commit_a_new_commit_index_waits_for_the_next_entries_or_heartbeat():
    """A queue's group (eager_commit=False): a commit sends no AppendEntries of its own; the
    follower learns it with the next entries, or a heartbeat once proposals stop."""
    c = Cluster(["a", "b", "c"], eager_commit=False)
    elect(c, "a")
    c.isolate("c")
    c["a"].propose(b"x")
    assert c.stabilize() == [
        "a->b AppendEntries term=1 prev=1@1 commit=1 [2@1:x]",
        "a->c AppendEntries term=1 prev=1@1 commit=1 [2@1:x]  (dropped)",
        "b->a AppendEntriesResponse term=1 match=2",
    ]
    assert (c["a"].commit_index, c["b"].commit_index, c.applied("b")) == (2, 1, [])
    c["a"].propose(b"y")
    assert c.stabilize()[0] == "a->b AppendEntries term=1 prev=2@1 commit=2 [3@1:y]"
    assert c.applied("b") == [b"x"]
    c["a"].tick_heartbeat()
    c.stabilize()
    assert (c["b"].commit_index, c.applied("b")) == (3, [b"x", b"y"])


def test_the_leader_pipelines_within_the_in_flight_window():
    c = Cluster(["a", "b"], max_inflight_messages=2)
    elect(c, "a")
    for payload in (b"x", b"y", b"z"):
        c["a"].propose(payload)
        c.process()                       # one Ready per proposal: one message each
    assert c.take() == [
        "a->b AppendEntries term=1 prev=1@1 commit=1 [2@1:x]",
        "a->b AppendEntries term=1 prev=2@1 commit=1 [3@1:y]",   # sent without waiting
    ]                                    # z waits: two messages are in flight
    assert c.stabilize() == [
        "a->b AppendEntries term=1 prev=1@1 commit=1 [2@1:x]",
        "a->b AppendEntries term=1 prev=2@1 commit=1 [3@1:y]",
        "b->a AppendEntriesResponse term=1 match=2",
        "b->a AppendEntriesResponse term=1 match=3",
        "a->b AppendEntries term=1 prev=3@1 commit=2 [4@1:z]",
        "b->a AppendEntriesResponse term=1 match=4",
        "a->b AppendEntries term=1 prev=4@1 commit=4 []",
        "b->a AppendEntriesResponse term=1 match=4",
    ]


def test_messages_are_split_at_max_message_bytes():
    c = Cluster(["a", "b"], max_message_bytes=40)
    elect(c, "a")
    for payload in (b"0123456789", b"abcdefghij", b"ABCDEFGHIJ"):
        c["a"].propose(payload)
    sent = c.take()
    assert sent == [
        "a->b AppendEntries term=1 prev=1@1 commit=1 [2@1:0123456789]",
        "a->b AppendEntries term=1 prev=2@1 commit=1 [3@1:abcdefghij]",
        "a->b AppendEntries term=1 prev=3@1 commit=1 [4@1:ABCDEFGHIJ]",
    ]                                     # 26 bytes each with overhead: one per message


def test_a_conflicting_follower_suffix_is_truncated_with_one_round_trip_per_term():
    c = Cluster(["a", "b", "c"])
    peers = ["a", "b", "c"]
    # b holds uncommitted entries of an old term-2 leader; a led term 3 briefly.
    c.restore("a", HardState(3, "a", 2), [entry(1, 1, b"w"), entry(2, 1, b"x"), entry(3, 3, b"y")], peers)
    c.restore("b", HardState(2, None, 2), [entry(1, 1, b"w"), entry(2, 1, b"x"), entry(3, 2, b"q"),
                                           entry(4, 2, b"r"), entry(5, 2, b"s")], peers)
    c.restore("c", HardState(3, "a", 2), [entry(1, 1, b"w"), entry(2, 1, b"x"), entry(3, 3, b"y")], peers)
    c.isolate("b")
    elect(c, "a")
    c.heal()
    c.tick("a")
    assert c.stabilize() == [
        "a->b Heartbeat term=4 commit=0",
        "a->c Heartbeat term=4 commit=4",
        "b->a HeartbeatResponse term=4",
        "c->a HeartbeatResponse term=4",
        "a->b AppendEntries term=4 prev=3@3 commit=4 [4@4:noop]",
        # b has 3@2: the hint says its term-2 run starts at 3, a has no term 2
        "b->a AppendEntriesResponse term=4 reject=3 hint=3@2",
        "a->b AppendEntries term=4 prev=2@1 commit=4 [3@3:y 4@4:noop]",
        "b->a AppendEntriesResponse term=4 match=4",
    ]
    truncating = c.readies["b"][-1]
    assert truncating.truncate_from == 3
    # the acknowledgement leaves only after these entries are persisted
    assert [show(m) for m in truncating.messages] == ["b->a AppendEntriesResponse term=4 match=4"]
    assert [e.index for e in truncating.entries] == [3, 4]
    assert [e.index for e in c.nodes["b"].storage.entries] == [1, 2, 3, 4]
    assert c.applied("b") == [b"w", b"x", b"y"]


def test_entries_of_an_earlier_term_commit_only_with_one_of_the_current_term():
    """Raft §5.4.2, Figure 8: a majority holding 2@2 is not enough for leader
    a of term 3; 2@2 commits when 3@3 (the no-op) reaches a majority."""
    peers = ["a", "b", "c"]
    c = Cluster(peers, max_message_bytes=1)              # one entry per message
    c.restore("a", HardState(2, "a", 1), [entry(1, 1, b"w"), entry(2, 2, b"x")], peers)
    c.restore("b", HardState(2, "a", 1), [entry(1, 1, b"w")], peers)
    c.restore("c", HardState(2, "a", 1), [entry(1, 1, b"w")], peers)
    c["a"].campaign()
    c.deliver(), c.deliver(), c.deliver()
    c.isolate("c")
    assert c.deliver() == [
        "b->a VoteResponse term=3 granted",
        "c->a VoteResponse term=3 granted  (dropped)",
    ]
    assert c.deliver() == [
        "a->b AppendEntries term=3 prev=2@2 commit=1 [3@3:noop]",
        "a->c AppendEntries term=3 prev=2@2 commit=1 [3@3:noop]  (dropped)",
    ]
    assert c.deliver() == ["b->a AppendEntriesResponse term=3 reject=2 hint=2@0"]
    assert c.deliver() == ["a->b AppendEntries term=3 prev=1@1 commit=1 [2@2:x]"]
    assert c.deliver() == ["b->a AppendEntriesResponse term=3 match=2"]
    assert c["a"].commit_index == 1        # 2@2 is on a and b, yet not committed
    assert c.deliver() == ["a->b AppendEntries term=3 prev=2@2 commit=1 [3@3:noop]"]
    assert c.deliver() == ["b->a AppendEntriesResponse term=3 match=3"]
    assert c["a"].commit_index == 3
    assert c.applied("a") == [b"w", b"x"]


def test_a_follower_behind_a_dropped_message_is_caught_up():
    c = Cluster(["a", "b", "c"])
    elect(c, "a")
    c["a"].propose(b"x")
    c.cut = {frozenset(("a", "c"))}
    c.stabilize()
    c["a"].propose(b"y")
    c.heal()
    assert c.stabilize()[:3] == [
        "a->b AppendEntries term=1 prev=2@1 commit=2 [3@1:y]",
        "a->c AppendEntries term=1 prev=2@1 commit=2 [3@1:y]",
        "b->a AppendEntriesResponse term=1 match=3",
    ]
    for _ in range(12):                    # heartbeats, then the stall check at 10 ticks
        c.tick("a")
        c.stabilize()
    assert c.applied("c") == [b"x", b"y"]


# --- snapshots --------------------------------------------------------------------------------

def test_a_lagging_follower_gets_the_snapshot_after_the_leader_compacted():
    c = Cluster(["a", "b", "c"])
    elect(c, "a")
    c.isolate("c")
    for payload in (b"x", b"y"):
        c["a"].propose(payload)
    for _ in range(20):                    # c is silent for an election timeout:
        c.tick("a")                        # the leader will probe it afresh
        c.stabilize()
    snapshot = c.compact("a")
    assert (snapshot.index, snapshot.term, snapshot.voters) == (3, 1, ("a", "b", "c"))
    assert c["a"].log.entries == [] and c.nodes["a"].storage.entries == []
    c.heal()
    c.tick("a")
    assert c.stabilize() == [
        "a->b Heartbeat term=1 commit=3",
        "a->c Heartbeat term=1 commit=1",
        "b->a HeartbeatResponse term=1",
        "c->a HeartbeatResponse term=1",
        # c has up to 1@1, and 2 is compacted away on a (Raft §7)
        "a->c InstallSnapshot term=1 snapshot=3@1",
        "c->a AppendEntriesResponse term=1 match=3",
    ]
    ready = [r for r in c.readies["c"] if r.snapshot is not None][-1]
    assert ready.snapshot.index == 3 and ready.hard_state.commit_index == 3
    assert (c["c"].last_applied, c.applied("c")) == (3, [b"x", b"y"])
    assert c.nodes["c"].storage.snapshot == snapshot and c.nodes["c"].storage.entries == []
    c["a"].propose(b"z")
    assert c.stabilize()[:2] == [
        "a->b AppendEntries term=1 prev=3@1 commit=3 [4@1:z]",
        "a->c AppendEntries term=1 prev=3@1 commit=3 [4@1:z]",
    ]
    assert c.applied("c") == [b"x", b"y", b"z"]


def test_a_follower_that_holds_the_snapshot_prefix_just_commits():
    c = Cluster(["a", "b"])
    elect(c, "a")
    c["a"].propose(b"x")
    c.stabilize()
    c["b"].step(InstallSnapshot(1, "a", "b", Snapshot(2, 1, ("a", "b"), b"ignored")))
    assert c.take() == ["b->a AppendEntriesResponse term=1 match=2"]
    assert c.readies["b"][-1].snapshot is None


def test_compact_refuses_an_index_not_yet_applied():
    c = Cluster(["a"])
    elect(c, "a")
    with pytest.raises(AssertionError):
        c["a"].compact(5, b"")


# --- membership ------------------------------------------------------------------------------

def test_add_a_member_then_remove_one():
    c = Cluster(["a", "b", "c"], spares=["d"])
    elect(c, "a")
    assert c["d"].voters == () and not c["d"].is_promotable()
    index = c["a"].propose_conf_change("add", "d")
    assert index == 2
    assert c["a"].voters == ("a", "b", "c", "d")          # in force once appended (§4.1)
    assert c["a"].propose_conf_change("remove", "b") is None   # one change at a time
    c.stabilize()
    c.tick("a")
    c.stabilize()
    assert c["d"].voters == ("a", "b", "c", "d") and c["d"].leader_id == "a"
    assert c["a"].commit_index == 2 and c["d"].commit_index == 2
    assert c["a"].propose_conf_change("add", "d") is None     # already a member
    assert c["a"].propose_conf_change("remove", "b") == 3
    c.stabilize()
    assert all(c[n].voters == ("a", "c", "d") for n in "acd")
    c.tick("a")
    assert all("->b" not in line for line in c.stabilize())  # b gets nothing more
    c["a"].propose(b"x")
    c.isolate("c")                          # a and d alone are a quorum of {a, c, d}
    c.stabilize()
    assert c.applied("d") == [b"x"]


def test_a_leader_that_removes_itself_steps_down_once_the_change_commits():
    c = Cluster(["a", "b", "c"])
    elect(c, "a")
    c["a"].propose_conf_change(ConfigChangeOp.REMOVE, "a")
    assert c["a"].role == Role.LEADER          # it still leads until the change commits
    c.stabilize()
    assert (c["a"].role, c["a"].is_promotable()) == (Role.FOLLOWER, False)
    for _ in range(30):
        for n in "abc":
            c.tick(n)
        c.stabilize()
    assert c["a"].role == Role.FOLLOWER
    assert any(c[n].role == Role.LEADER for n in "bc")


def test_a_config_entry_that_is_truncated_reverts_the_configuration():
    peers = ["a", "b", "c"]
    change = ConfigChange(ConfigChangeOp.ADD, "d", ("a", "b", "c", "d")).encode()
    c = Cluster(peers, spares=["d"])
    # b holds an uncommitted config entry of a term-1 leader; a and c moved on in term 2
    c.restore("b", HardState(1, None, 0), [entry(1, 1, change, EntryKind.CONFIG)], peers)
    assert c["b"].voters == ("a", "b", "c", "d")
    c.restore("a", HardState(2, None, 0), [entry(1, 2, b"x")], peers)
    c.restore("c", HardState(2, None, 0), [entry(1, 2, b"x")], peers)
    elect(c, "a")
    assert c.readies["b"][-1].truncate_from == 1
    assert c["b"].voters == ("a", "b", "c")


# --- leadership transfer -------------------------------------------------------------------------

def test_leadership_transfer_catches_the_target_up_then_sends_timeout_now():
    c = Cluster(["a", "b", "c"])
    elect(c, "a")
    c.isolate("b")
    c["a"].propose(b"x")
    for _ in range(20):
        c.tick("a")
        c.stabilize()
    c.heal()
    assert c["a"].transfer_leadership("b")
    assert c["a"].propose(b"refused") is None            # §3.10: no proposals meanwhile
    assert c.stabilize()[:6] == [
        "a->b AppendEntries term=1 prev=1@1 commit=2 [2@1:x]",
        "b->a AppendEntriesResponse term=1 match=2",
        "a->b TimeoutNow term=1",                          # b is caught up
        "b->a Vote term=2 last=2@1 transfer",
        "b->c Vote term=2 last=2@1 transfer",
        "a->b VoteResponse term=2 granted",
    ]
    assert (c["b"].role, c["b"].term) == (Role.LEADER, 2)
    assert c["a"].role == Role.FOLLOWER and c["a"].leader_id == "b"


def test_leadership_transfer_transcript():
    c = Cluster(["a", "b", "c"])
    elect(c, "a")
    c["a"].transfer_leadership("b")
    assert c.stabilize() == [
        "a->b TimeoutNow term=1",
        # no pre-vote, and the flag gets through the voters' leases
        "b->a Vote term=2 last=1@1 transfer",
        "b->c Vote term=2 last=1@1 transfer",
        "a->b VoteResponse term=2 granted",
        "c->b VoteResponse term=2 granted",
        "b->a AppendEntries term=2 prev=1@1 commit=1 [2@2:noop]",
        "b->c AppendEntries term=2 prev=1@1 commit=1 [2@2:noop]",
        "a->b AppendEntriesResponse term=2 match=2",
        "c->b AppendEntriesResponse term=2 match=2",
        "b->a AppendEntries term=2 prev=2@2 commit=2 []",
        "b->c AppendEntries term=2 prev=2@2 commit=2 []",
        "a->b AppendEntriesResponse term=2 match=2",
        "c->b AppendEntriesResponse term=2 match=2",
    ]


def test_a_transfer_to_an_unreachable_target_is_aborted_after_an_election_timeout():
    c = Cluster(["a", "b", "c"])
    elect(c, "a")
    c.isolate("b")
    c["a"].propose(b"x")
    c.stabilize()
    c["a"].transfer_leadership("b")
    assert c["a"].propose(b"y") is None
    for _ in range(10):
        c.tick("a")
        c.stabilize()
    assert c["a"].role == Role.LEADER and c["a"].propose(b"y") is not None


# --- single node, Ready contract, wire, purity ---------------------------------------------------------

def test_a_single_node_commits_its_own_entries_once_persisted():
    c = Cluster(["a"])
    c["a"].campaign()
    first = c["a"].ready()
    assert first.soft_state.role == "leader" and [e.kind for e in first.entries] == [EntryKind.NOOP]
    assert first.committed_entries == ()                 # not durable yet
    c["a"].advance(first)
    second = c["a"].ready()
    assert second.hard_state.commit_index == 1 and [e.index for e in second.committed_entries] == [1]
    c["a"].advance(second)
    assert c["a"].ready() is None


def test_ready_must_be_advanced_before_the_next():
    node = RaftNode("a", ["a"], random.Random(0))
    node.campaign()
    node.ready()
    with pytest.raises(AssertionError):
        node.ready()


ALL_MESSAGES = [
    RequestVote(3, "a", "b", 7, 2, pre_vote=True, transfer=False),
    RequestVoteResponse(3, "b", "a", True, True),
    AppendEntries(3, "a", "b", 6, 2, (entry(7, 3, b"\x00\xff"), entry(8, 3, kind=EntryKind.NOOP)), 5),
    AppendEntriesResponse(3, "b", "a", False, 0, 6, 4, 2),
    Heartbeat(3, "a", "b", 5),
    HeartbeatResponse(3, "b", "a"),
    InstallSnapshot(3, "a", "b", Snapshot(9, 3, ("a", "b", "c"), b"state")),
    TimeoutNow(3, "a", "b"),
]


@pytest.mark.parametrize("message", ALL_MESSAGES, ids=lambda m: type(m).__name__)
def test_messages_round_trip_through_msgpack(message):
    packed = msgpack.packb(to_wire(message))
    assert from_wire(msgpack.unpackb(packed)) == message


def test_config_change_round_trip():
    change = ConfigChange(ConfigChangeOp.REMOVE, "b", ("a", "c"))
    assert ConfigChange.decode(change.encode()) == change
