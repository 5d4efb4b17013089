"""Raft (one pure core per queue group, a node-wide system): the quorum-queue issue.

- `raft.core`: `RaftNode`, one Raft group as a pure state machine, and the
  `Ready` it hands out (persist, send, apply, `advance`).
- `raft.replication`: the leader's replication pacing and the follower's
  AppendEntries rules (functions of a RaftNode).
- `raft.log`: the in-memory log view; `raft.progress`: per-follower progress.
- `raft.messages`: entries, snapshots, hard state, the RPC messages and their
  msgpack-friendly wire form.
"""
