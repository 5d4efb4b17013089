"""How Raft groups live in the node's one WAL: the record format, what a
rollover re-writes, and rebuilding each group's `RecoveredState` at start.

Theory of operation (after rabbitmq/ra's LOG.md). Every group hosted on the
node writes to the node's WAL (`storage.wal`, through `storage.group_commit`)
under a log id of its own. What a `PersistItem` asks to make durable becomes
records of the format in `storage.records` -- (log_id, term, index, payload)
-- appended in the item's order: snapshot, entries, hard state.

Log ids. A group's log id is `RAFT_LOG_ID_BASE + n` (2**40 + n), n = 1, 2, ...
in the order this node first hosted its groups. Log ids are node-local (one
group has different log ids on different nodes); the GROUP record maps a log
id back to the group id. Every record of the WAL is a group's (the runtime is
the storage's only client, raft/node_log.py): a log id below 2**40 is what an
older Warren's broker journal wrote, and recovery refuses it. A removed
group's log id is never reused while any of its records can still be on disk.

Records. Two families, told apart by the index (and checked by the kind):

* entry records: index = the entry's index (>= 1), term = the entry's term,
  payload msgpack `[entry_kind, data]` with `entry_kind` an `EntryKind`
  (0 NORMAL, 1 CONFIG, 2 NOOP);
* control records: index = 0 (no entry has index 0), payload msgpack
  `[control_kind, ...]` with `control_kind` >= 16:
    GROUP      16  `[16, group_id, [member, ...], hosted_at, me]` term 0: this
                   log is that group's (its members as first hosted; `hosted_at`,
                   the host's mark of what hosted it, e.g. the broker's metadata
                   index, 0 if none; `me`, this replica's member id, "" for the
                   node's name (raft/member_ids.py); a record without them reads
                   as 0 and "")
    HARD_STATE 17  `[17, term, voted_for | nil, commit_index]` term = term
    SNAPSHOT   18  `[18, index, term, [voter, ...], data]` term = snapshot's
    REMOVED    19  `[19]` term 0: the group left this node; its log is dead

Replay (`RecoveryScan.visit`, records in file order: segments, then WAL
files, which is the order they were written):

* an entry at index i replaces the entry at i and drops every entry after
  it: a later write at an index replaces the tail, as in ra. That is how a
  follower's truncation of a conflicting suffix (Raft §5.3) reaches the disk:
  a Ready's `truncate_from` is always the index of its first entry;
* HARD_STATE: the latest wins. GROUP: the latest wins. REMOVED: forget it;
* SNAPSHOT: entries at or below its index are dropped; if the entry at its
  index was present with another term, all entries after it go too (Raft §7,
  InstallSnapshot receiver rule 6: keep the entries that follow a matching
  last included entry).

At the end each group's entries must run without a hole from the snapshot's
index + 1 (else `RaftLogCorrupt`), and its commit index is capped at its last
index: commit_index is volatile state in Raft (Figure 2), persisted only so
that a restart re-applies no less, and a rollover can make a hard state
durable ahead of the entries it counts (below). It may also lag: a hard state
that only raises the commit index is carried by the group's or any group's
next batch (`CarriedCommits.carry`, raft/carried_commits.py), never written alone, so the disk's
commit index is a lower bound that a leader's first commit in its term (or a
follower's leader) raises again.

Rollover. Control records have index 0, below every cursor, so the WAL never
copies them into segments; instead `GroupStorage.rollover_records()` writes
each live group's GROUP, SNAPSHOT and HARD_STATE again at the start of the new
WAL file, and a group's cursor is its snapshot's index + 1 (every entry after
the snapshot is still needed). What is written again is the state last
handed to the committer, which may be ahead of what is durable: persisting a
term, a vote or a snapshot (committed state) earlier than promised is safe,
and a commit index ahead of the entries is capped at recovery.

Snapshots. A SNAPSHOT record is written in two cases, both through the
committer: a follower's Ready that carries the leader's snapshot (Raft §7),
and `RaftRuntime.compact` after the group's state machine captured its
state (the core drops the entries up to it from memory at once). In both,
the record is appended first and `GroupStorage.snapshot`, hence the cursor,
moves after; nothing is dropped from disk until a rollover, which first
writes the newest snapshot at the start of the new WAL file (synced by
`LogStore.switch_wal` before `move_to_segments`) and only then leaves the
entries below the cursor out of the segments and deletes the old WAL files
and the segment files wholly below the cursor. One record is all or
nothing (its checksums): a crash at any point leaves the old snapshot with
its entries, or the new snapshot, and replay takes the last one it meets.
A SNAPSHOT record is encoded without copying its data, as an entry's record
is (`snapshot_record_pieces`, `entry_record`: pieces the WAL writes as they
are; a rollover's first batch joins them); the snapshot itself is held once, the same
bytes object shared by the core (to send to lagging followers) and
`GroupStorage`.

Cost: every rollover writes every hosted group's newest snapshot again, so
the WAL must be large compared with the sum of the snapshots (a first batch
larger than `wal_max_size_bytes` would make every batch roll the WAL over),
and one snapshot's record is limited to `records.RECORD_PAYLOAD_MAX_BYTES`.
Snapshot files of their own, as in ra, would remove both limits.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import msgpack

from warren.raft import packing
from warren.raft.core import RecoveredState
from warren.raft.group import GroupId, PersistItem
from warren.raft.messages import Entry, EntryKind, HardState, Snapshot
from warren.storage import records
from warren.storage.wal import Location

RAFT_LOG_ID_BASE = 1 << 40
CONTROL_INDEX = 0

GROUP = 16
HARD_STATE = 17
SNAPSHOT = 18
REMOVED = 19
CONTROL_KINDS = frozenset({GROUP, HARD_STATE, SNAPSHOT, REMOVED})
ENTRY_KINDS = frozenset(int(kind) for kind in EntryKind)

_ENTRY_ARRAY = b"\x92"   # msgpack's header of a two-element array: an entry's [kind, data]


class RaftLogCorrupt(Exception):
    """What recovery read does not make a Raft log (a hole, an orphan)."""


def log_id_of(group_number: int) -> int:
    assert group_number >= 1
    return RAFT_LOG_ID_BASE + group_number


_pack = packing.packb   # the function itself: no wrapper's call frame per Raft record
_bin_header = packing.bin_header


def _unpack(payload: bytes) -> list:
    value = msgpack.unpackb(payload, raw=False)
    assert isinstance(value, list) and value, "a Raft record's payload is a non-empty list"
    return value


_BIN_HEADERS = {0xC4: 1, 0xC5: 2, 0xC6: 4}   # msgpack bin 8/16/32: the bytes of its length


def entry_payload_data(payload: bytes | memoryview) -> bytes | memoryview | None:
    """The data of an entry record's payload, msgpack [kind, data] as `entry_record`
    writes it: a slice of `payload`, not a copy (a backlog read back for delivery is
    decoded from it once more); any other form through msgpack."""
    view = memoryview(payload)
    if len(view) > 3 and view[0] == 0x92 and view[1] < 0x80:   # two elements, kind a small int
        length_bytes = _BIN_HEADERS.get(view[2])
        if length_bytes is not None:
            start = 3 + length_bytes
            if start + int.from_bytes(view[3:start], "big") == len(view):
                return view[start:]
    return _unpack(payload)[1]


# --- encoding ----------------------------------------------------------------------------------

def entry_record(log_id: int, entry: Entry) -> records.Encoded:
    """The entry's record, as pieces around its data (`records.encode_split`): the
    payload is msgpack [kind, data], its data a command that holds a turn's
    published bodies, written as it is, not packed into the payload again and the
    payload into the record (each a copy of every body)."""
    assert entry.index >= 1
    data = entry.data
    data_type = type(data)
    if data_type is not bytes and data_type is not packing.Pieces:
        return records.encode(log_id, entry.term, entry.index, _pack([int(entry.kind), data]))
    payload_head = _ENTRY_ARRAY + _pack(int(entry.kind)) + _bin_header(len(data))
    # a command made around its large bodies (packing.Pieces): they too are written as they are
    return records.encode_split(log_id, entry.term, entry.index, payload_head,
                                data if data_type is bytes else data.parts)


def group_record(log_id: int, group_id: GroupId, members: tuple[str, ...], hosted_at: int = 0, me: str = "") -> bytes:
    return records.encode(log_id, 0, CONTROL_INDEX, _pack([GROUP, group_id, list(members), hosted_at, me]))


def hard_state_record(log_id: int, hard_state: HardState) -> bytes:
    payload = _pack([HARD_STATE, hard_state.term, hard_state.voted_for, hard_state.commit_index])
    return records.encode(log_id, hard_state.term, CONTROL_INDEX, payload)


def snapshot_record_pieces(log_id: int, snapshot: Snapshot) -> tuple[bytes, bytes]:
    """The SNAPSHOT record as (everything before the data, the data itself):
    their concatenation is byte for byte `records.encode(log_id, term, 0,
    msgpack [18, index, term, voters, data])`, but built without copying the
    data (a queue's snapshot may be large): msgpack's bin header is written
    here and the checksum runs over the pieces. The WAL writes them as they
    are; a rollover's first batch joins them (the one copy)."""
    data = snapshot.data
    if len(data) > 0xFFFFFFFF:
        raise ValueError(f"a snapshot of {len(data)} bytes does not fit a msgpack bin")
    packer = msgpack.Packer(use_bin_type=True)
    payload_head = b"".join((
        packer.pack_array_header(5), packer.pack(SNAPSHOT), packer.pack(snapshot.index),
        packer.pack(snapshot.term), packer.pack(list(snapshot.voters)), _bin_header(len(data))))
    return records.encode_split(log_id, snapshot.term, CONTROL_INDEX, payload_head, data)


def removed_record(log_id: int) -> bytes:
    return records.encode(log_id, 0, CONTROL_INDEX, _pack([REMOVED]))


@dataclass(slots=True)
class GroupStorage:
    """One hosted group's log id and the control state last handed to the
    committer (what a rollover writes again)."""
    log_id: int
    group_id: GroupId
    members: tuple[str, ...]
    hard_state: HardState = field(default_factory=HardState)
    snapshot: Snapshot | None = None
    # where each durable entry's record lies (index -> Location), so that entry data
    # can leave memory (RaftLog.evict) and be read back; pruned below the cursor
    locations: dict[int, Location] = field(default_factory=dict)
    hosted_at: int = 0   # the host's mark of what made it host this replica (GROUP record)
    me: str = ""         # this replica's member id, "" for the node's name (GROUP record)
    pruned_below: int = 0   # no location below this is left (`prune_locations`)

    def records_for(self, item: PersistItem) -> list[records.Encoded]:
        """The records for one group's Ready, in the order the core asks."""
        assert item.group_id == self.group_id
        # A truncation always comes with the entries that replace the tail:
        # replay relies on "a write at an index replaces the tail".
        assert item.truncate_from is None or (item.entries and item.entries[0].index == item.truncate_from), \
            f"group {self.group_id!r}: truncate_from {item.truncate_from} without entries from there"
        encoded: list[records.Encoded] = []
        if item.snapshot is not None:
            self.snapshot = item.snapshot
            encoded.append(snapshot_record_pieces(self.log_id, item.snapshot))
        for entry in item.entries:
            encoded.append(entry_record(self.log_id, entry))
        if item.hard_state is not None:
            self.hard_state = item.hard_state
            encoded.append(hard_state_record(self.log_id, item.hard_state))
        return encoded

    def cursor(self) -> int:
        """The WAL release cursor: entries below it are not needed any more."""
        return (self.snapshot.index if self.snapshot is not None else 0) + 1

    def prune_locations(self) -> range:
        """Forget where the entries below the cursor lie (a rollover drops them).
        Returns the indexes whose locations the caller is to pop from `locations`
        (at leisure: raft/released.py); only those that fell below since the last
        prune, as each location is a cold object on a big heap, unless a far jump
        (a snapshot from the leader) makes one pass over the map cheaper."""
        cursor = self.cursor()
        locations = self.locations
        below = range(self.pruned_below, cursor)
        if len(below) > len(locations):
            if locations and min(locations) < cursor:
                self.locations = {index: at for index, at in locations.items() if index >= cursor}
            below = range(0)
        self.pruned_below = max(cursor, self.pruned_below)
        return below

    def rollover_records(self) -> list[bytes]:
        """The group's control records for the start of a new WAL file, as
        byte strings to write in this order: GROUP, SNAPSHOT (in two pieces,
        see `snapshot_record_pieces`, so that joining the first batch copies
        the snapshot's data once), HARD_STATE."""
        encoded = [group_record(self.log_id, self.group_id, self.members, self.hosted_at, self.me)]
        if self.snapshot is not None:
            encoded.extend(snapshot_record_pieces(self.log_id, self.snapshot))
        if self.hard_state != HardState():
            encoded.append(hard_state_record(self.log_id, self.hard_state))
        return encoded


# --- recovery ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class RecoveredGroup:
    log_id: int
    group_id: GroupId
    members: tuple[str, ...]
    state: RecoveredState
    locations: dict[int, Location] = field(default_factory=dict)
    hosted_at: int = 0
    me: str = ""

    def storage(self) -> GroupStorage:
        return GroupStorage(self.log_id, self.group_id, self.members, self.state.hard_state, self.state.snapshot,
                            self.locations, self.hosted_at, self.me)


class LogScan:
    """One log id's records as replay meets them (see the module docstring)."""

    __slots__ = ("entries", "group_id", "hard_state", "hosted_at", "last_index", "locations", "log_id", "me", "members",
                 "removed", "snapshot")

    def __init__(self, log_id: int) -> None:
        self.log_id = log_id
        self.group_id: GroupId | None = None
        self.members: tuple[str, ...] = ()
        self.hosted_at = 0
        self.me = ""
        self.removed = False
        self.hard_state = HardState()
        self.snapshot: Snapshot | None = None
        self.entries: dict[int, Entry] = {}
        self.locations: dict[int, Location] = {}
        self.last_index = 0   # highest index in `entries`, 0 when empty

    def on_entry(self, record: records.Record, fields: list, location: Location | None = None) -> None:
        """A NORMAL entry whose location is known is kept without its data
        (read back through the group's RaftLog loader when needed), so that
        recovery does not hold every message body in memory at once."""
        kind, data = fields
        assert kind in ENTRY_KINDS, f"log {record.log_id}: unknown entry kind {kind}"
        index = record.index
        for later in range(index, self.last_index + 1):   # the write replaces the tail
            self.entries.pop(later, None)
            self.locations.pop(later, None)
        if location is not None and kind == EntryKind.NORMAL:
            self.entries[index] = Entry(record.term, index, EntryKind.NORMAL, None)
            self.locations[index] = location
        else:
            self.entries[index] = Entry(record.term, index, EntryKind(kind), bytes(data))
            if location is not None:
                self.locations[index] = location
        self.last_index = index

    def on_control(self, fields: list) -> None:
        match fields[0]:
            case 16:   # GROUP
                group_id, members = fields[1], fields[2]
                self.group_id = group_id
                self.members = tuple(members)
                self.hosted_at = fields[3] if len(fields) > 3 else 0
                self.me = fields[4] if len(fields) > 4 else ""
            case 17:   # HARD_STATE
                _, term, voted_for, commit_index = fields
                self.hard_state = HardState(term, voted_for, commit_index)
            case 18:   # SNAPSHOT
                _, index, term, voters, data = fields
                self.on_snapshot(Snapshot(index, term, tuple(voters), bytes(data)))
            case 19:   # REMOVED
                self.removed = True
            case kind:
                raise AssertionError(f"log {self.log_id}: unknown control record kind {kind}")

    def on_snapshot(self, snapshot: Snapshot) -> None:
        at_index = self.entries.get(snapshot.index)
        if at_index is not None and at_index.term != snapshot.term:
            self.entries.clear()
            self.locations.clear()
        else:
            for index in [i for i in self.entries if i <= snapshot.index]:
                del self.entries[index]
                self.locations.pop(index, None)
        self.last_index = max(self.entries, default=0)
        self.snapshot = snapshot

    def finish(self) -> RecoveredGroup:
        if self.group_id is None:
            raise RaftLogCorrupt(f"log {self.log_id}: records but no GROUP record")
        first = (self.snapshot.index if self.snapshot is not None else 0) + 1
        entries = []
        index = first
        while index in self.entries:
            entries.append(self.entries[index])
            index += 1
        beyond = sum(1 for i in self.entries if i >= first)
        if beyond != len(entries):
            raise RaftLogCorrupt(f"group {self.group_id!r} (log {self.log_id}): hole in the log at index {index}")
        last_index = entries[-1].index if entries else first - 1
        hard_state = self.hard_state
        if hard_state.commit_index > last_index:
            hard_state = HardState(hard_state.term, hard_state.voted_for, last_index)
        return RecoveredGroup(self.log_id, self.group_id, self.members,
                              RecoveredState(hard_state, self.snapshot, entries), self.locations, self.hosted_at,
                              self.me)


class RecoveryScan:
    """The visitor for `LogStore.recover`: every record of the node's WAL."""

    def __init__(self) -> None:
        self.logs: dict[int, LogScan] = {}
        self.records = 0

    def visit(self, record: records.Record, location: Location | None = None) -> None:
        if record.log_id < RAFT_LOG_ID_BASE:
            raise RaftLogCorrupt(f"log {record.log_id} is no Raft group's: a data directory of an older Warren "
                                 "(its broker journal); start from an empty one")
        self.records += 1
        scan = self.logs.get(record.log_id)
        if scan is None:
            scan = self.logs[record.log_id] = LogScan(record.log_id)
        fields = _unpack(record.payload)
        if record.index == CONTROL_INDEX:
            assert fields[0] in CONTROL_KINDS, f"log {record.log_id}: control record of kind {fields[0]}"
            scan.on_control(fields)
        else:
            scan.on_entry(record, fields, location)

    def next_group_number(self) -> int:
        """Above every log id seen, removed groups' included."""
        return max((log_id - RAFT_LOG_ID_BASE for log_id in self.logs), default=0) + 1

    def groups(self) -> Iterator[RecoveredGroup]:
        """Every group still hosted, in log id order (the order first hosted)."""
        for log_id in sorted(self.logs):
            scan = self.logs[log_id]
            if not scan.removed:
                yield scan.finish()
