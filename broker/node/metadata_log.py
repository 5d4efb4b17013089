"""The metadata group's log on this node: its first entry, its snapshots.

Theory of operation. The metadata Raft group's log is the only record of
the node's topology and definitions (there is no other journal): a restart
installs the group's newest snapshot, which rebuilds the read model from
nothing, and re-applies the committed entries after it, as any group does.

* First entry. On an empty metadata log (a new data directory) the node
  proposes the config's vhosts, users (their passwords hashed here) and
  permissions as one `SeedDefinitions`; the machine applies only the first
  one (`MetaState.seeded`), so in a new cluster whichever node's seed
  commits first wins and the others change nothing, and a node that joins
  with an empty data directory takes the cluster's. From then on the log is
  the truth (README "Users and vhosts"). Until its state is seeded the
  node serves the config's definitions provisionally (a node that cannot
  reach the group still lets its administrator in); then the log's replace
  them (`take_definitions_once`).
* Snapshots and compaction, as a queue's log: after applying at least
  `max(SNAPSHOT_ENTRIES_MIN, 2 x the objects in the state)` entries since
  the last snapshot, the machine's state (broker/node/metadata_state.py,
  `snapshot`) at the entry just applied is handed to `RaftRuntime.compact`,
  which writes it as the group's SNAPSHOT record and moves its release
  cursor; the next WAL rollover drops the entries below it. The cost of a
  snapshot (O(state)) is amortised over at least twice as many entries.
* Installing one (at start, or a follower sent the leader's, Raft §7): the
  effects from the state performed so far to the snapshot's
  (broker/node/metadata_diff.py) are performed like an entry's.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from warren.broker.admin.auth import AccessControl
from warren.broker.node import metadata_commands as mc
from warren.broker.node import metadata_diff
from warren.broker.node.metadata_state import MetaState, restore, snapshot

if TYPE_CHECKING:
    from warren.broker.node.metadata import Metadata
    from warren.config import Settings
    from warren.raft.messages import Snapshot

log = structlog.get_logger("warren.metadata")

SNAPSHOT_ENTRIES_MIN = 256


def seed_command(settings: "Settings") -> mc.SeedDefinitions:
    """The config's vhosts, users and permissions as the metadata log's first entry."""
    access = AccessControl.from_settings(settings)
    return mc.SeedDefinitions(
        tuple(settings.vhosts),
        tuple((user.name, user.password_hash, tuple(user.tags)) for user in access.users.values()),
        tuple((user, vhost, *permission.row()) for (user, vhost), permission in access.permissions.items()))


def object_count(state: MetaState) -> int:
    """What a snapshot's size grows with."""
    return (len(state.users) + len(state.permissions)
            + sum(len(v.exchanges) + len(v.queues) + len(v.bindings) + 1 for v in state.vhosts.values()))


class MetadataLog:
    def __init__(self, metadata: "Metadata", group: str) -> None:
        self.metadata = metadata
        self.group = group
        self.applied_since_snapshot = 0
        self.took_definitions = False   # the config's definitions are provisional until then

    def take_definitions_once(self) -> None:
        """Once the state is seeded, the log's users, vhosts and permissions replace
        the config's the node started with, extras included (the log is the truth)."""
        if not self.took_definitions and self.metadata.state.seeded:
            self.took_definitions = True
            self.metadata.broker.definitions.take(self.metadata.state)

    def seed_if_empty(self) -> mc.SeedDefinitions | None:
        """After the runtime recovered the group: the seed to propose if its log is empty."""
        status = self.metadata.cluster.runtime.status(self.group)
        if status is None or status.last_index > 0 or self.metadata.state.seeded:
            return None
        return seed_command(self.metadata.broker.settings)

    def applied(self, index: int) -> None:
        """Entry `index` was applied: compact the log up to it when due."""
        self.applied_since_snapshot += 1
        state = self.metadata.state
        self.take_definitions_once()
        if self.applied_since_snapshot >= max(SNAPSHOT_ENTRIES_MIN, 2 * object_count(state)):
            self.applied_since_snapshot = 0
            self.metadata.cluster.runtime.compact(self.group, index, snapshot(state))

    def install(self, installed: "Snapshot") -> None:
        """Take the state of `installed`: perform the changes from the state held so far."""
        new = restore(installed.data)
        effects = metadata_diff.changes(self.metadata.state, new)
        self.metadata.state = new
        self.metadata.applied_index = installed.index
        self.applied_since_snapshot = 0
        self.metadata.perform_all(effects, installed.index)
        self.take_definitions_once()
        log.info("metadata.snapshot_installed", index=installed.index, changes=len(effects))
