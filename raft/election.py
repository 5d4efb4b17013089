"""Elections (Raft §5.1, §5.2, §5.4.1) with pre-vote (§9.6), the leader's lease
(§4.2.3) and leadership transfer's TimeoutNow (§3.10): functions of a
`RaftNode`, split out of core.py to keep modules small, as replication.py is.

Theory of operation. A message of a higher term makes a node a follower of
that term, except a vote request inside a live leader's lease (dropped, so a
partitioned node coming back cannot depose a working leader) and pre-vote
traffic (which changes nobody's term). A stale message is dropped, but its
sender is told the term. A (pre-)candidate counts the answers of its
configuration's voters; a quorum of grants wins the round (a pre-vote round
then becomes a real election), a quorum of refusals makes it a follower. The
role transitions themselves (`become_*`) stay in core.py.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from warren.raft.messages import (
    AppendEntries,
    AppendEntriesResponse,
    Heartbeat,
    InstallSnapshot,
    Message,
    RequestVote,
    RequestVoteResponse,
    Role,
    TimeoutNow,
)

if TYPE_CHECKING:
    from warren.raft.core import RaftNode


def on_higher_term(node: RaftNode, message: Message) -> bool:
    """Raft §5.1: a higher term makes us a follower -- except for vote
    requests inside a leader's lease (§4.2.3, §9.6), which are dropped,
    and pre-vote traffic, which changes nobody's term. Returns whether to
    go on handling the message."""
    if isinstance(message, RequestVote):
        lease = node.check_quorum or (node.pre_vote and message.pre_vote)
        in_lease = lease and node.leader_id is not None and node.election_elapsed < node.election_ticks
        if in_lease and not message.transfer:
            return False
        if message.pre_vote:
            return True
        node.become_follower(message.term, None)
        return True
    if isinstance(message, RequestVoteResponse) and message.pre_vote and message.vote_granted:
        return True
    leader = message.sender if isinstance(message, (AppendEntries, Heartbeat, InstallSnapshot)) else None
    node.become_follower(message.term, leader)
    return True


def on_lower_term(node: RaftNode, message: Message) -> None:
    """A stale message is dropped, but a stale leader or pre-candidate is
    told the term, so that a node whose term rose while it was cut off
    (and whose vote requests are now ignored under the lease) gets the
    cluster to hold an election it can take part in."""
    if (node.check_quorum or node.pre_vote) and isinstance(message, (AppendEntries, Heartbeat)):
        node.send(AppendEntriesResponse(node.term, node.node_id, message.sender, success=False))
    elif isinstance(message, RequestVote) and message.pre_vote:
        node.send(RequestVoteResponse(node.term, node.node_id, message.sender, False, pre_vote=True))


def on_request_vote(node: RaftNode, message: RequestVote) -> None:
    # §5.2: one vote per term, first come first served; §5.4.1: only for a
    # log at least as up to date; §9.6: a pre-vote is a promise of nothing.
    can_vote = (node.voted_for == message.sender
                or (node.voted_for is None and node.leader_id is None)
                or (message.pre_vote and message.term > node.term))
    if can_vote and node.log.is_up_to_date(message.last_log_index, message.last_log_term):
        node.send(RequestVoteResponse(message.term, node.node_id, message.sender, True, message.pre_vote))
        if not message.pre_vote:
            node.voted_for = message.sender
            node.election_elapsed = 0
    else:
        node.send(RequestVoteResponse(node.term, node.node_id, message.sender, False, message.pre_vote))


def on_request_vote_response(node: RaftNode, message: RequestVoteResponse) -> None:
    if message.pre_vote != (node.role == Role.PRE_CANDIDATE):
        return
    if node.role not in (Role.PRE_CANDIDATE, Role.CANDIDATE):
        return
    if message.pre_vote and message.vote_granted and message.term != node.term + 1:
        return  # granted in an earlier pre-vote round, for another term
    node.votes.setdefault(message.sender, message.vote_granted)
    outcome = count_votes(node)
    if outcome == "won":
        on_election_won(node)
    elif outcome == "lost":
        node.become_follower(node.term, None)


def count_votes(node: RaftNode) -> str:
    granted = sum(1 for voter in node.voters if node.votes.get(voter) is True)
    rejected = sum(1 for voter in node.voters if node.votes.get(voter) is False)
    if granted >= node.quorum():
        return "won"
    if rejected >= node.quorum():
        return "lost"
    return "pending"


def request_votes(node: RaftNode, pre_vote: bool, transfer: bool) -> None:
    node.votes = {node.node_id: True}
    if count_votes(node) == "won":
        on_election_won(node)
        return
    # A pre-vote asks about the term we would campaign in (§9.6).
    vote_term = node.term + 1 if pre_vote else node.term
    for voter in node.voters:
        if voter != node.node_id:
            node.send(RequestVote(vote_term, node.node_id, voter, node.log.last_index(),
                                  node.log.last_term(), pre_vote=pre_vote, transfer=transfer))


def on_election_won(node: RaftNode) -> None:
    if node.role == Role.PRE_CANDIDATE:
        node.become_candidate()
        request_votes(node, pre_vote=False, transfer=False)
    else:
        node.become_leader()


def on_timeout_now(node: RaftNode, message: TimeoutNow) -> None:
    if node.role == Role.FOLLOWER:
        node.campaign(transfer=True)
