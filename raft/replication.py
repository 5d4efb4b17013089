"""Log replication (Raft §5.3, §5.4.2, §7): the leader's side and the
follower's answer to AppendEntries. Functions of a `RaftNode`, split out of
core.py to keep modules small.

Theory of operation. Proposals only append to the leader's log and mark a
broadcast pending; `flush` (run when the caller takes a Ready) sends each
follower what it lacks, so many proposals of one event-loop turn travel in
one AppendEntries of up to `max_message_bytes`. In REPLICATE state the leader
pipelines: it sends the next batch without waiting, up to the in-flight
window. A rejection carries the follower's conflict hint; the leader skips
back a whole term at a time and probes again. A follower that needs entries
the leader has compacted gets the snapshot. Heartbeats keep followers from
campaigning and tell them a commit index they are known to hold; their
answers unpause probing and feed check-quorum. Every election timeout the
leader also restarts a follower that has not moved while behind, which is
what recovers from dropped messages.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from warren.raft.messages import (
    AppendEntries,
    AppendEntriesResponse,
    EntryKind,
    Heartbeat,
    HeartbeatResponse,
    InstallSnapshot,
    Message,
    Role,
    TimeoutNow,
)
from warren.raft.progress import ProgressState

if TYPE_CHECKING:
    from warren.raft.core import RaftNode


# --- leader: sending -------------------------------------------------------------------

def flush(node: RaftNode) -> None:
    """Send what the proposals and commits since the last Ready call for."""
    if not (node.broadcast_pending or node.commit_broadcast_pending):
        return
    for peer in node.progress:
        if peer == node.node_id:
            continue
        progress = node.progress[peer]
        sent = send_appends(node, peer)
        # A new commit index reaches caught-up followers at once (`eager_commit`);
        # the others get it with their next entries or heartbeat. Not eager, a
        # group's followers apply later (up to a heartbeat later once proposals
        # stop) and the leader saves a frame per commit and its answer.
        caught_up = progress.state == ProgressState.REPLICATE and not progress.inflights.sent
        if not sent and node.commit_broadcast_pending and caught_up and node.eager_commit:
            send_append(node, peer, send_if_empty=True)
    node.broadcast_pending = False
    node.commit_broadcast_pending = False


def send_appends(node: RaftNode, to: str) -> bool:
    """Send `to` as much as its progress state allows; whether anything went."""
    progress = node.progress[to]
    sent = False
    while send_append(node, to):
        sent = True
        if progress.state != ProgressState.REPLICATE or progress.next_index > node.log.last_index():
            break
    return sent


def send_append(node: RaftNode, to: str, send_if_empty: bool = False) -> bool:
    progress = node.progress[to]
    if progress.is_paused():
        return False
    prev_log_index = progress.next_index - 1
    prev_log_term = node.log.term(prev_log_index)
    entries = node.log.slice(progress.next_index, node.max_message_bytes)
    if prev_log_term is None or entries is None:
        return send_snapshot(node, to)
    if not entries and not send_if_empty:
        return False
    size_bytes = sum(entry.size_bytes() for entry in entries)
    node.send(AppendEntries(node.term, node.node_id, to, prev_log_index, prev_log_term,
                            tuple(entries), node.log.commit_index))
    progress.on_sent(entries[-1].index if entries else prev_log_index, size_bytes, len(entries))
    return True


def send_snapshot(node: RaftNode, to: str) -> bool:
    """Raft §7: the follower needs entries that are compacted away. Only to a
    follower that answers, so a dead node does not cost snapshot transfers."""
    progress = node.progress[to]
    if not progress.recent_active:
        return False
    node.send(InstallSnapshot(node.term, node.node_id, to, node.log.snapshot))
    progress.become_snapshot(node.log.snapshot_index)
    return True


def take_pipelined(node: RaftNode) -> list[Message]:
    """A leader's messages while its last Ready is still being written: the
    AppendEntries for what was proposed (or answered) since go out now, not
    after that write, so a proposal does not wait for the previous batch's
    fsync before it reaches the followers (the pipelining etcd-raft's
    asynchronous storage writes allow). Like a Ready's early messages
    (`RaftSystem.may_send_before_persist`) they promise nothing durable: the
    leader counts an entry toward a quorum only once a later Ready wrote it.
    Never while the term or the vote is not durable yet."""
    if not has_pipelined(node):
        return []
    flush(node)
    messages, node.messages = node.messages, []
    return messages


def has_pipelined(node: RaftNode) -> bool:
    """Whether `take_pipelined` has something (cheap, no side effects)."""
    if node.role != Role.LEADER or node.outstanding is None:
        return False
    durable = node.prev_hard_state
    return (node.term == durable.term and node.voted_for == durable.voted_for
            and bool(node.messages or node.broadcast_pending or node.commit_broadcast_pending))


def broadcast_heartbeat(node: RaftNode) -> None:
    for peer, progress in node.progress.items():
        if peer != node.node_id:
            commit_index = min(node.log.commit_index, progress.match_index)
            node.send(Heartbeat(node.term, node.node_id, peer, commit_index))


# --- leader: answers ---------------------------------------------------------------------

def on_append_entries_response(node: RaftNode, message: AppendEntriesResponse) -> None:
    if node.role != Role.LEADER or message.sender not in node.progress:
        return
    progress = node.progress[message.sender]
    progress.recent_active = True
    if not message.success:
        if progress.maybe_decrease_to(message.reject_index, next_index_from_hint(node, message)):
            send_appends(node, message.sender)
        return
    updated = progress.maybe_update(message.match_index)
    probe_succeeded = progress.state == ProgressState.PROBE and progress.match_index == message.match_index
    if not (updated or probe_succeeded):
        return
    if progress.state == ProgressState.PROBE:
        progress.become_replicate()
    elif progress.state == ProgressState.SNAPSHOT:
        if progress.match_index >= progress.pending_snapshot_index:
            progress.become_replicate()
    else:
        progress.inflights.free_to(progress.match_index)
    maybe_commit(node)
    if node.role != Role.LEADER:
        return  # it committed its own removal
    if message.sender == node.lead_transferee and progress.match_index == node.log.last_index():
        node.send(TimeoutNow(node.term, node.node_id, message.sender))  # §3.10
    send_appends(node, message.sender)


def next_index_from_hint(node: RaftNode, message: AppendEntriesResponse) -> int:
    """Raft §5.3 (end): if the leader has entries of the conflicting term,
    retry just after its last one; else skip the follower's whole run of it."""
    if message.conflict_term:
        index = node.log.last_index_of_term(message.conflict_term, message.reject_index)
        if index is not None:
            return index + 1
    return message.conflict_index


def on_heartbeat_response(node: RaftNode, message: HeartbeatResponse) -> None:
    if node.role != Role.LEADER or message.sender not in node.progress:
        return
    progress = node.progress[message.sender]
    progress.recent_active = True
    if progress.state == ProgressState.PROBE:
        progress.paused = False
    elif progress.state == ProgressState.REPLICATE and progress.inflights.full():
        progress.inflights.free_first()  # let one message through a window of lost ones
    if progress.match_index < node.log.last_index():
        send_appends(node, message.sender)


def maybe_commit(node: RaftNode) -> bool:
    """Raft §5.3/§5.4.2: commit the highest index a quorum of the current
    configuration holds, but only by counting replicas of an entry of the
    current term; earlier entries commit with it."""
    matches = sorted((node.progress[v].match_index for v in node.voters if v in node.progress), reverse=True)
    if len(matches) < node.quorum():
        return False
    quorum_index = matches[node.quorum() - 1]
    if quorum_index <= node.log.commit_index or node.log.term(quorum_index) != node.term:
        return False
    node.log.commit_to(quorum_index)
    node.commit_broadcast_pending = True
    if node.node_id not in node.voters and node.log.commit_index >= node.config_index:
        # Thesis §4.2.2: a leader removed from the configuration steps down
        # once the change is committed.
        node.become_follower(node.term, None)
    assert node.role in (Role.LEADER, Role.FOLLOWER)
    return True


def quorum_recently_active(node: RaftNode) -> bool:
    """Thesis §6.2 check-quorum; clears the marks for the next round. A
    follower silent for a whole round is probed afresh when it is back: what
    was sent to it meanwhile is likely lost."""
    active = 0
    for voter in node.voters:
        progress = node.progress.get(voter)
        if voter == node.node_id or (progress is not None and progress.recent_active):
            active += 1
    for peer, progress in node.progress.items():
        if peer != node.node_id and not progress.recent_active and progress.state != ProgressState.PROBE:
            progress.become_probe()
        progress.recent_active = peer == node.node_id
    return active >= node.quorum()


def restart_stalled(node: RaftNode) -> None:
    """A follower behind the leader whose match_index has not moved for a whole
    election timeout lost a message (or its snapshot): probe it afresh."""
    last_index = node.log.last_index()
    for peer, progress in node.progress.items():
        if peer == node.node_id:
            continue
        stalled = progress.match_index < last_index and progress.match_index == progress.match_at_last_check
        if stalled and progress.state != ProgressState.PROBE:
            progress.become_probe()
            send_appends(node, peer)
        progress.match_at_last_check = progress.match_index


# --- follower ---------------------------------------------------------------------------

def handle_append_entries(node: RaftNode, message: AppendEntries) -> AppendEntriesResponse:
    """Raft §5.3, the receiver's rules; the answer to send back."""
    log = node.log
    if message.prev_log_index < log.commit_index:
        # Everything up to commit_index matches any leader's log (§5.4).
        return AppendEntriesResponse(node.term, node.node_id, message.sender, True, log.commit_index)
    if not log.match_term(message.prev_log_index, message.prev_log_term):
        return reject(node, message)
    last_new_index = message.prev_log_index + len(message.entries)
    for position, entry in enumerate(message.entries):
        if log.term(entry.index) != entry.term:
            replaced = entry.index <= log.last_index()
            new_entries = message.entries[position:]
            log.append(new_entries)
            if replaced or any(e.kind == EntryKind.CONFIG for e in new_entries):
                node.config_index, node.voters = log.config_at(log.last_index())
            break
    log.commit_to(min(message.leader_commit, last_new_index))
    return AppendEntriesResponse(node.term, node.node_id, message.sender, True, last_new_index)


def reject(node: RaftNode, message: AppendEntries) -> AppendEntriesResponse:
    log = node.log
    if message.prev_log_index > log.last_index():
        conflict_index, conflict_term = log.last_index() + 1, 0
    else:
        conflict_term = log.term(message.prev_log_index)
        conflict_index = log.first_index_of_term(message.prev_log_index)
    return AppendEntriesResponse(node.term, node.node_id, message.sender, False,
                                 reject_index=message.prev_log_index,
                                 conflict_index=conflict_index, conflict_term=conflict_term)
