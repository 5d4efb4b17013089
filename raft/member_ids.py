"""A replica's name in its group: the node it runs on, plus the epoch it was made in.

Raft assumes a voter never forgets: its vote, its log. A replica dropped when
its node left the group, and made again empty when the node joins once more,
has forgotten both; were it the same voter as before, a candidate with a stale
log and a stale configuration could win its vote and be elected beside the
real leader (tests/sim membership seed 7: two leaders in one term). So each
replica made empty is a new voter, as etcd's members get fresh ids: its member
id is `node` for the group's first members and `node!epoch` for a node added
later (the metadata index of the change that added it), and messages addressed
to another id of the same node are dropped (`RaftSystem.step`). Frames still go
node to node: `node_of` gives the node a member runs on. A node's name holds no
`!` (config/settings.py); `#` is the shards' (`node#k`, broker/node/shards.py).
"""
from __future__ import annotations

from collections.abc import Iterable

SEPARATOR = "!"


def member_id(node: str, epoch: int = 0) -> str:
    return node if not epoch else f"{node}{SEPARATOR}{epoch}"


def node_of(member: str) -> str:
    return member.partition(SEPARATOR)[0]


def on_node(members: Iterable[str], node: str) -> str | None:
    """The member among `members` that runs on `node`, None if none does."""
    return next((member for member in members if node_of(member) == node), None)
