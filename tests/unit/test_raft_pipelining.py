"""A leader's AppendEntries while its last Ready is still being written
(raft/replication.py `take_pipelined`): proposals of later turns reach the
followers at once, and commit on their answers, yet the leader applies an
entry only from a Ready that wrote it."""
from __future__ import annotations

from tests.unit.raftsim import Cluster, show
from tests.unit.test_raft_system import Recorder
from warren.raft import replication
from warren.raft.core import RaftNode
from warren.raft.messages import (
    AppendEntriesResponse,
    HardState,
    Message,
    RequestVoteResponse,
    Role,
    from_wire,
    to_wire,
)


def elected() -> Cluster:
    cluster = Cluster(["a", "b", "c"])
    cluster["a"].campaign()
    cluster.stabilize()
    assert cluster["a"].role == Role.LEADER
    return cluster


def answers(follower: RaftNode, messages: list[Message]) -> list[Message]:
    """The follower steps `messages` and writes them: its answers, in order."""
    for message in messages:
        follower.step(message)
    ready = follower.ready()
    follower.advance(ready)
    return list(ready.messages)


def test_a_proposal_made_while_the_last_batch_is_written_goes_out_at_once_and_commits_on_the_followers():
    cluster = elected()
    leader = cluster["a"]
    leader.propose(b"x")
    writing = leader.ready()   # x is being written: the Ready is outstanding
    assert [show(m) for m in writing.messages] == [
        "a->b AppendEntries term=1 prev=1@1 commit=1 [2@1:x]", "a->c AppendEntries term=1 prev=1@1 commit=1 [2@1:x]"]
    leader.propose(b"y")
    pipelined = replication.take_pipelined(leader)
    assert [show(m) for m in pipelined] == [
        "a->b AppendEntries term=1 prev=2@1 commit=1 [3@1:y]", "a->c AppendEntries term=1 prev=2@1 commit=1 [3@1:y]"]
    for peer in ("b", "c"):
        to_peer = [m for m in list(writing.messages) + pipelined if m.to == peer]
        for answer in answers(cluster[peer], to_peer):
            leader.step(answer)
    # Both followers hold x and y: committed, though the leader has written neither yet.
    assert leader.log.commit_index == 3 and leader.log.stable_index == 1
    leader.advance(writing)
    writes_y = leader.ready()
    assert [e.data for e in writes_y.entries] == [b"y"]
    # x and y are applied from the Ready that writes y, after it is durable: never before the leader holds them.
    assert [e.data for e in writes_y.committed_entries] == [b"x", b"y"]


def test_only_a_leader_with_a_ready_outstanding_pipelines():
    cluster = elected()
    leader, follower = cluster["a"], cluster["b"]
    leader.propose(b"x")
    assert replication.take_pipelined(leader) == []   # nothing outstanding: the next Ready carries it
    writing = leader.ready()
    assert [show(m) for m in writing.messages][0] == "a->b AppendEntries term=1 prev=1@1 commit=1 [2@1:x]"
    follower.step(writing.messages[0])
    follower.ready()   # the follower's answer waits for its write, pipelined or not
    assert follower.awaiting_advance() and replication.take_pipelined(follower) == []


def test_a_leader_whose_term_is_not_durable_yet_sends_nothing_ahead():
    cluster = elected()
    leader = cluster["a"]
    leader.propose(b"x")
    leader.ready()
    leader.propose(b"y")
    durable = leader.prev_hard_state
    leader.prev_hard_state = HardState(0, None, 0)   # as if its term-1 vote were not written yet
    assert replication.take_pipelined(leader) == []
    leader.prev_hard_state = durable
    assert [show(m) for m in replication.take_pipelined(leader)][0].endswith("[3@1:y]")


# --- the system: a proposal of a later turn does not wait for the batch being written -------------

def leading_recorder() -> Recorder:
    """Node a of group 1 (members a, b, c), leader in term 1 with b's votes, its
    followers caught up with the no-op, every batch so far durable."""
    r = Recorder()
    system = r.system
    system.add_group(1, ["a", "b", "c"])
    system.campaign(1)
    system.process_ready()
    for pre_vote in (True, False):
        system.step("b", [[1, to_wire(RequestVoteResponse(1, "b", "a", True, pre_vote=pre_vote))]])
        system.process_ready()
        system.on_persisted(len(r.persisted))
        system.process_ready()
    assert system.role(1) == Role.LEADER
    for peer in ("b", "c"):
        system.step(peer, [[1, to_wire(AppendEntriesResponse(1, peer, "a", True, 1))]])
    system.process_ready()
    assert r.applied == [(1, 1)], "the no-op is committed and applied"
    r.frames.clear()
    r.applied.clear()
    return r


def sent_entries(r: Recorder) -> list[tuple[str, list[bytes]]]:
    sent = [(peer, [entry.data for item in frame for entry in from_wire(item[1]).entries]) for peer, frame in r.frames]
    r.frames.clear()
    return sent


def test_the_system_sends_a_proposal_while_the_leaders_previous_batch_is_being_written():
    r = leading_recorder()
    system = r.system
    system.propose(1, b"x")
    system.process_ready()
    writing = len(r.persisted)
    assert sent_entries(r) == [("b", [b"x"]), ("c", [b"x"])]   # with its own batch (may_send_before_persist)
    system.propose(1, b"y")
    system.process_ready()
    assert len(r.persisted) == writing, "y waits for x's batch to be written here ..."
    assert sent_entries(r) == [("b", [b"y"]), ("c", [b"y"])], "... but not to reach the followers"
    for peer in ("b", "c"):
        system.step(peer, [[1, to_wire(AppendEntriesResponse(1, peer, "a", True, 3))]])
    system.process_ready()
    assert r.applied == [], "committed on the followers, but the leader applies nothing it has not written"
    system.on_persisted(writing)
    system.process_ready()
    assert [[entry.data for entry in item.entries] for item in r.persisted[-1]] == [[b"y"]]
    assert r.applied == [], "x and y are applied from the Ready that writes y, once it is durable"
    system.on_persisted(len(r.persisted))
    system.process_ready()
    assert r.applied == [(1, 2), (1, 3)]
