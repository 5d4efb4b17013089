"""Raft (one pure core per queue group, a node-wide system): the quorum-queue issue."""
