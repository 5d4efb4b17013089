"""The runtime's Raft storage work: the system's Readies made WAL records,
snapshots and compaction, and what a rollover writes again.

Theory of operation. `persist(items)` turns every group's Ready into WAL
records (raft/raft_storage.py documents the format and the log ids), all of
an item encoded before any is appended (a group whose records cannot be
encoded fails alone), and appends them to the node's `GroupCommitter`: they
all go into one batch, one fdatasync, shared with whatever else the node
writes that turn. The token is the number of the batch the last record went
into; when that batch is durable the committer calls back (`on_durable`), once
per batch however many turns share it, and the runtime reports it to the
system. Where each entry record went is noted for raft/entry_locations.py.

Snapshots and compaction. The state machine of a group that has applied
through `index` hands its serialized state there to `compact(group_id,
index, data)`: the core drops the entries up to `index` from memory
(`RaftSystem.compact`, raft/log.py) and keeps the snapshot (the same bytes
object, never copied: it is what a lagging follower is sent), and the
runtime appends a SNAPSHOT record to the committer in the group's log id,
then moves the group's release cursor (`GroupStorage.cursor()`) to
`index + 1`. From the next rollover on the WAL drops the group's entries at
or below `index` from WAL files and segments; that rollover first writes the
SNAPSHOT again at the start of the new WAL file (`prepare_rollover`, synced
before any old entry is dropped), so a crash at any point leaves the old
snapshot and its entries or the new snapshot on disk (raft/raft_storage.py).
`compact` may be called from inside `apply` (as ra's release cursor is an
effect of applying): the core counts a Ready's entries as applied only once
they all are, so such a call is carried out at the end of the turn.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from warren.raft.group import GroupId, PersistItem
from warren.raft.messages import Snapshot
from warren.raft.raft_storage import GroupStorage, snapshot_record_pieces
from warren.raft.released import Released
from warren.storage import records

if TYPE_CHECKING:
    from warren.raft.entry_locations import EntryLocations
    from warren.raft.system import RaftSystem
    from warren.storage.group_commit import GroupCommitter


class RaftPersistence:
    """Writes the Readies, snapshots and rollover records of the groups in
    `groups` (group id -> storage, kept current by the runtime) to `committer`.
    `system` is set once the runtime has built it (it is given `persist`)."""

    def __init__(self, committer: GroupCommitter, groups: dict[GroupId, GroupStorage], locations: EntryLocations,
                 report_durable: Callable[[int, bool], None], request_turn: Callable[[], None]) -> None:
        self.committer = committer
        self.groups = groups
        self.locations = locations
        self.report_durable = report_durable
        self.request_turn = request_turn
        self.released = Released()   # dropped entries and locations, freed at the end of turns
        self.system: RaftSystem | None = None
        self.awaited_batches: set[int] = set()
        # compact() calls made inside `apply`, carried out at the end of the turn: group -> (index, data)
        self.compactions: dict[GroupId, tuple[int, bytes]] = {}
        self.rolled_cursors: dict[int, int] = {}   # log id -> release cursor, at the last rollover

    def persist(self, items: list[PersistItem]) -> int:
        batch = 0
        for item in items:
            encoded = self.encode_item(item)
            if encoded is not None:
                batch = self.append_item(item, encoded)
        if batch == 0:
            # Every item's group failed and nothing was written: acknowledge at
            # once (token 0), so the system forgets the Readies of this call.
            self.system.on_persisted(0)
            return 0
        if batch not in self.awaited_batches:
            # Several turns may share one batch (appended while the previous one syncs): one callback.
            self.awaited_batches.add(batch)
            self.committer.when_durable(batch, lambda ok, token=batch: self.on_durable(token, ok))
        return batch

    def encode_item(self, item: PersistItem) -> list[records.Encoded] | None:
        """The item's records (snapshot, entries, hard state), all encoded
        before any is appended: a group whose records cannot be encoded
        fails alone and leaves nothing half written; None then."""
        try:
            # process_ready persists hosted groups only (RaftSystem.still_hosted)
            return list(self.groups[item.group_id].records_for(item))
        except Exception as error:  # noqa: BLE001 -- the group's failure, logged by on_group_failed
            self.system.fail_group(item.group_id, error)
            return None

    def append_item(self, item: PersistItem, encoded: list[records.Encoded]) -> int:
        """Append one group's records; note where its entries go. The batch number."""
        storage = self.groups[item.group_id]
        committer = self.committer
        entries = item.entries
        first_entry = 1 if item.snapshot is not None else 0   # records: snapshot, entries, hard state
        batch = 0
        for position, record in enumerate(encoded):
            batch = committer.append(record)
            entry_position = position - first_entry
            if 0 <= entry_position < len(entries):
                self.locations.note(batch, storage, entries[entry_position].index, committer.last_offset_in_batch,
                                    records.record_size(record))
        return batch

    def on_durable(self, token: int, ok: bool) -> None:
        """The committer's news of the batch `token`: forget it, then report it."""
        self.awaited_batches.discard(token)
        if not ok:
            self.locations.on_batch_lost(token)
        self.report_durable(token, ok)

    def compact(self, group_id: GroupId, index: int, snapshot_data: bytes) -> bool:
        """`RaftRuntime.compact` of a running runtime (see the module docstring)."""
        storage = self.groups.get(group_id)
        if storage is None or group_id not in self.system:
            return False
        status = self.system.status(group_id)
        if index <= status.snapshot_index:
            return False
        assert index <= status.commit_index, \
            f"group {group_id!r}: compact({index}) beyond the commit index {status.commit_index}"
        if index > status.last_applied:
            self.compactions[group_id] = (index, snapshot_data)
            self.request_turn()
            return True
        self.compactions.pop(group_id, None)
        self.write_snapshot(storage, self.system.compact(group_id, index, snapshot_data))
        return True

    def write_snapshot(self, storage: GroupStorage, snapshot: Snapshot) -> None:
        """Append the SNAPSHOT record, then move the cursor. A rollover that
        comes first writes the snapshot again at the start of the new WAL
        file before it drops anything below the cursor."""
        assert storage.snapshot is None or snapshot.index > storage.snapshot.index
        self.committer.append(snapshot_record_pieces(storage.log_id, snapshot))
        storage.snapshot = snapshot
        # what the compaction dropped is freed a piece per turn (raft/released.py)
        self.released.drop_keys(storage.locations, storage.prune_locations())
        self.released.add(self.system.groups[storage.group_id].raft.log.take_dropped())

    def run_deferred_compactions(self) -> None:
        """The `compact` calls made inside `apply`, now that the turn's
        Readies are advanced (the core counts their entries as applied)."""
        for group_id, (index, data) in list(self.compactions.items()):
            storage = self.groups.get(group_id)
            if storage is None or group_id not in self.system:
                del self.compactions[group_id]
                continue
            try:
                self.run_deferred_compaction(storage, index, data)
            except Exception as error:  # noqa: BLE001 -- the group's failure, logged by on_group_failed
                self.compactions.pop(group_id, None)
                self.system.fail_group(group_id, error)

    def run_deferred_compaction(self, storage: GroupStorage, index: int, data: bytes) -> None:
        group_id = storage.group_id
        status = self.system.status(group_id)
        if index <= status.snapshot_index:
            del self.compactions[group_id]
        elif index <= status.last_applied:
            del self.compactions[group_id]
            self.write_snapshot(storage, self.system.compact(group_id, index, data))

    def prepare_rollover(self) -> tuple[dict[int, int], bytes]:
        """For the committer's `prepare_rollover`: every hosted group's cursor,
        and its control records to start the new WAL file with."""
        cursors: dict[int, int] = {}
        encoded: list[bytes] = []
        for storage in self.groups.values():
            for index in storage.prune_locations():
                storage.locations.pop(index, None)
            cursors[storage.log_id] = storage.cursor()
            encoded.extend(storage.rollover_records())
        self.rolled_cursors = cursors
        return cursors, b"".join(encoded)

    def release_space(self) -> bool:
        """The disk is short (its alarm is on): roll the WAL over now if a group's release
        cursor moved, or a group went, since the last rollover, or if it failed (once its
        retry is due: storage/group_commit.py). What a log no longer needs leaves the WAL
        files and segments only at a rollover, and the publishers the alarm blocks no longer
        fill the WAL: without one the space never came back and the alarm never cleared.
        True if a rollover was asked for."""
        cursors = {storage.log_id: storage.cursor() for storage in self.groups.values()}
        if cursors == self.rolled_cursors and not self.committer.rollover_retry_due:
            return False
        self.committer.rollover_soon()
        return True
