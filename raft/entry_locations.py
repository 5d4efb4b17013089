"""Where the runtime's groups' entries lie: in memory while recent, else in
the node's WAL or its segments, read back on demand.

Theory of operation. The runtime appends each group's entry records to the
node's `GroupCommitter` (raft/raft_storage.py has the format) and notes, per
batch, where inside the batch each entry record lies (`note`). When that batch
is durable the committer reports the file and offset it went to
(`on_batch_written`), before the entries count as stable, so an evictable
entry always has a location (`GroupStorage.locations`). A rollover that copies
groups' records from an old WAL file into segments reports where they moved
(`on_relocated`). Applied entries a group keeps in memory with their data (for
followers a little behind, and deliveries of what was just enqueued) are the
last `KEEP_RECENT_ENTRIES`; older ones leave memory at the end of the turn
that applied them (`evict_applied`, `RaftLog.evict`) and the group's RaftLog
reads them back through the loader attached here (`attach_loader`).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from warren.raft.group import GroupId
from warren.raft.messages import Entry
from warren.raft.raft_storage import GroupStorage, entry_payload_data
from warren.storage.group_commit import BatchWritten
from warren.storage.wal import Location, Relocation

if TYPE_CHECKING:
    from warren.raft.group import Group
    from warren.raft.log import RaftLog
    from warren.storage.wal import LogStore

# Applied entries a group keeps in memory with their data (for followers a
# little behind, and deliveries of what was just enqueued); older ones are
# read back from the WAL or segments (RaftLog.evict).
KEEP_RECENT_ENTRIES = 16

Apply = Callable[[GroupId, Entry], None]


class EntryLocations:
    """The locations of the entry records of the groups in `groups_by_log`
    (log id -> storage, kept current by the runtime), read back from `store`."""

    def __init__(self, store: LogStore, groups_by_log: dict[int, GroupStorage], apply: Apply) -> None:
        self.store = store
        self.groups_by_log = groups_by_log
        self.apply = apply
        # batch -> where its entry records lie inside it: (group storage, index, offset, length)
        self._unwritten: dict[int, list[tuple[GroupStorage, int, int, int]]] = {}
        self._applied_groups: set[GroupId] = set()
        self.entries_read = 0   # entry data read back from disk

    def note(self, batch: int, storage: GroupStorage, index: int, offset: int, length: int) -> None:
        """The group's entry at `index` went into `batch`, at `offset` inside it."""
        self._unwritten.setdefault(batch, []).append((storage, index, offset, length))

    def on_batch_lost(self, batch: int) -> None:
        self._unwritten.pop(batch, None)

    def on_batch_written(self, written: BatchWritten) -> None:
        """A batch is durable: note where its entry records lie (before the
        entries count as stable, so an evictable entry always has a location)."""
        for storage, index, offset, length in self._unwritten.pop(written.batch, ()):
            storage.locations[index] = Location(written.path, written.start_offset + offset, length)

    def on_relocated(self, moved: list[Relocation]) -> None:
        """A rollover copied groups' records from an old WAL file into
        segments: read them there from now on. An entry written again since
        (into the current WAL file) keeps its new location."""
        current_wal = self.store.wal_path
        for relocation in moved:
            storage = self.groups_by_log.get(relocation.log_id)
            if storage is None:
                continue
            locations = storage.locations
            for index, location in relocation.locations():
                known = locations.get(index)
                if known is not None and known.path != current_wal:
                    locations[index] = location

    def read_entry(self, location: Location) -> bytes:
        """An entry record's data, read back from disk."""
        data = self._entry_view(location)
        return data if data is None or type(data) is bytes else bytes(data)

    def _entry_view(self, location: Location) -> bytes | memoryview | None:
        """The same, as a view of the file block read (`RealFiles.read_at`), not a copy."""
        self.entries_read += 1
        return entry_payload_data(self.store.read_payload(location))

    def attach_loader(self, storage: GroupStorage, raft_log: RaftLog) -> None:
        """The group's RaftLog may drop applied entries' data; it reads them
        back through the locations noted here."""
        raft_log.loader = lambda index: self.read_entry(storage.locations[index])

    def entry_data(self, storage: GroupStorage, raft_log: RaftLog, index: int) -> bytes | memoryview | None:
        """The data of the group's entry at `index`: from memory, or read
        back from the WAL or a segment (a view of the file block read, which it
        keeps alive: decode it and let it go); None if it is not in the group's log
        here (compacted away, not yet received)."""
        if not raft_log.snapshot_index < index <= raft_log.last_index():
            # Outside the log, a noted location may be of an entry a leader's snapshot replaced.
            return None
        data = raft_log.entries[index - raft_log.snapshot_index - 1].data
        if data is not None:
            return data
        return self._entry_view(storage.locations[index])   # evicted entries are stable: located

    def apply_noting(self, group_id: GroupId, entry: Entry) -> None:
        self._applied_groups.add(group_id)
        self.apply(group_id, entry)

    @property
    def applied_any(self) -> bool:
        return bool(self._applied_groups)

    def evict_applied(self, groups: dict[GroupId, Group]) -> None:
        """Entry data of this turn's applying groups leaves memory, but for the
        last KEEP_RECENT_ENTRIES (RaftLog.evict)."""
        for group_id in self._applied_groups:
            group = groups.get(group_id)
            if group is not None:
                raft_log = group.raft.log
                raft_log.evict(raft_log.applied_index - KEEP_RECENT_ENTRIES)
        self._applied_groups.clear()
