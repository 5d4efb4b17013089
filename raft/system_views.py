"""What a Raft system shows of its groups (metrics, status, roles): read-only views,
a base of `raft.system.RaftSystem`."""
from __future__ import annotations

from collections.abc import Iterator

from warren.raft.core import Status
from warren.raft.group import Group, GroupId, GroupMetrics
from warren.raft.member_ids import node_of
from warren.raft.messages import Role


class SystemViews:
    groups: dict[GroupId, Group]
    active: dict[GroupId, Group]

    def group_metrics(self, group_id: GroupId) -> GroupMetrics:
        return self.groups[group_id].metrics()

    def all_group_metrics(self) -> Iterator[GroupMetrics]:
        for group in self.groups.values():
            yield group.metrics()

    def status(self, group_id: GroupId) -> Status:
        """The group's core status (snapshot index, last applied, ...)."""
        return self.groups[group_id].raft.status()

    def role(self, group_id: GroupId) -> Role:
        return self.groups[group_id].raft.role

    def leader_id(self, group_id: GroupId) -> str | None:
        """The node of the leader this replica knows of."""
        leader = self.groups[group_id].raft.leader_id
        return leader and node_of(leader)

    def is_quiescent(self, group_id: GroupId) -> bool:
        return self.groups[group_id].quiescent

    @property
    def group_count(self) -> int:
        return len(self.groups)

    @property
    def active_count(self) -> int:
        return len(self.active)
