"""Commit indexes that wait for the next WAL batch instead of costing one.

A Ready whose only storage work is a higher commit index is not
written on its own: the commit index is volatile state (Raft §5,
Figure 2), so an fsync for it alone buys nothing. It waits, replacing
an older one of the group, for the next batch that writes anything
(its group's next Ready, or any group's) and goes in with it, so that
a restart re-applies most of the log at once. Until then the disk may
hold a lower commit index, as after a crash: a sole voter commits its
durable log again as soon as it leads (its own majority, §5.4.2: an
entry of its new term commits those before it), a member of a larger
group learns the commit index from its leader (§5.3). Its entries are
durable already: a commit-only Ready has no entries, and the group's
earlier Readies were advanced, i.e. durable.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from warren.raft.group import Group, GroupId, PersistItem


class CarriedCommits:
    def __init__(self) -> None:
        # group id -> (the group, its commit-only item)
        self.by_group: dict[GroupId, tuple[Group, PersistItem]] = {}

    def carry(self, group: Group, item: PersistItem) -> None:
        """Keep the commit-only `item` of `group` for the next batch (see the
        module docstring), replacing an older one of the group."""
        self.by_group[group.group_id] = (group, item)

    def drop(self, group_id: GroupId) -> None:
        self.by_group.pop(group_id, None)

    def with_carried(self, group: Group, item: PersistItem) -> PersistItem:
        """`item` with the group's carried commit index, if any, when it
        writes no hard state of its own (its own, when present, is newer)."""
        carried = self.by_group.pop(group.group_id, None)
        if carried is None or carried[0] is not group or item.hard_state is not None:
            return item
        return replace(item, hard_state=carried[1].hard_state)

    def take(self, still_hosted: Callable[[Group], bool]) -> list[PersistItem]:
        """Every commit index waiting for a batch, of groups `still_hosted`."""
        carried, self.by_group = self.by_group, {}
        return [item for group, item in carried.values() if still_hosted(group)]
