"""The in-memory view of one group's Raft log.

Theory of operation. The log is a snapshot (index, term, voters, data) followed
by the entries after it. Indices start at 1; index `snapshot_index` stands for
everything the snapshot covers (index 0, term 0 when there is none). Three
cursors move over it:

    snapshot_index <= applied_index <= commit_index <= last_index
    stable_index (persisted) <= last_index

Entries above `stable_index` are *unstable*: they are handed to the caller in
a Ready to persist, and become stable on `advance`. When a follower replaces a
conflicting suffix (Raft §5.3) that may already be on disk, `stable_index`
drops below the cut and the next Ready tells the storage to drop its entries
from there (`truncate_from`). A snapshot that arrives from the leader
(Raft §7) replaces the whole log and waits in `pending_snapshot` until it is
persisted. Committed entries are never truncated: that is asserted.

Entry data on disk. An entry that is persisted and applied need not keep its
data in memory: `evict(through)` replaces the data of NORMAL entries up to
`through` by None, and every reader here (`entry`, `slice`,
`committed_unapplied`) reads it back through `loader(index)`, the host's read
of its own stable storage (etcd-raft's Storage.Entries). Only stable entries
are evicted, never config entries; a log without a loader evicts nothing.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable

from warren.raft.messages import ConfigChange, Entry, EntryKind, Snapshot

# Reads an evicted entry's data back from stable storage.
EntryLoader = Callable[[int], bytes]

# The data of the committed entries one Ready hands over to apply (etcd-raft's
# MaxCommittedSizePerReady): at least one entry, then up to this many bytes; the rest
# the next turn. A node restarted with 700 MB of queued messages in its log had all of
# them read back into one Ready's list: 1 GB at the peak, and the heap kept it (820 MB
# resident after recovery against 140 MB before the kill).
COMMITTED_BYTES_PER_READY = 4 * 1024 * 1024


class RaftLog:
    def __init__(self, snapshot: Snapshot, entries: list[Entry], commit_index: int) -> None:
        self.snapshot = snapshot
        self.entries: list[Entry] = list(entries)
        for offset, entry in enumerate(self.entries):
            assert entry.index == snapshot.index + 1 + offset, f"log hole at {entry.index}"
        self.stable_index = self.last_index()       # recovered entries are on disk
        self.storage_last_index = self.last_index()  # highest index the storage holds
        self.pending_snapshot: Snapshot | None = None
        self.commit_index = max(commit_index, snapshot.index)
        assert self.commit_index <= self.last_index(), "recovered commit_index beyond the log"
        self.applied_index = snapshot.index
        self.loader: EntryLoader | None = None
        self.evicted_through = snapshot.index   # evict() has looked at the entries up to here
        # the indexes of the CONFIG entries in `entries`, ascending: `config_at` finds the one in
        # force without walking the log (a walk touches every entry since the snapshot, and on a
        # big heap each cold entry costs microseconds: a compaction stalled the loop for ~10 ms)
        self.config_indexes: list[int] = [entry.index for entry in self.entries if entry.kind == EntryKind.CONFIG]
        # what the last compaction dropped, for the host to free at leisure (`take_dropped`, raft/released.py)
        self.dropped: list[Entry] | None = None

    # --- reading -----------------------------------------------------------------

    @property
    def snapshot_index(self) -> int:
        return self.snapshot.index

    def last_index(self) -> int:
        return self.entries[-1].index if self.entries else self.snapshot.index

    def last_term(self) -> int:
        return self.entries[-1].term if self.entries else self.snapshot.term

    def term(self, index: int) -> int | None:
        """The term of the entry at `index`, None if compacted away or absent."""
        if index == self.snapshot.index:
            return self.snapshot.term
        if index < self.snapshot.index or index > self.last_index():
            return None
        return self.entries[index - self.snapshot.index - 1].term

    def entry(self, index: int) -> Entry:
        entry = self.entries[index - self.snapshot.index - 1]
        assert entry.index == index
        return entry if entry.data is not None else self._loaded(entry)

    def _loaded(self, entry: Entry) -> Entry:
        assert self.loader is not None, f"entry {entry.index} evicted without a loader"
        return Entry(entry.term, entry.index, entry.kind, self.loader(entry.index))

    def match_term(self, index: int, term: int) -> bool:
        return self.term(index) == term

    def is_up_to_date(self, last_log_index: int, last_log_term: int) -> bool:
        """Raft §5.4.1: a voter denies a candidate whose log is less complete."""
        if last_log_term != self.last_term():
            return last_log_term > self.last_term()
        return last_log_index >= self.last_index()

    def slice(self, low: int, max_bytes: int) -> list[Entry] | None:
        """Entries from `low` on, at least one and then up to `max_bytes`;
        None if `low` is compacted into the snapshot."""
        if low <= self.snapshot.index:
            return None
        return self._with_data(low - self.snapshot.index - 1, len(self.entries), max_bytes)

    def unstable_entries(self) -> list[Entry]:
        return self.entries[self.stable_index - self.snapshot.index:]

    def committed_unapplied(self, after_index: int, max_bytes: int = COMMITTED_BYTES_PER_READY) -> list[Entry]:
        """Committed entries after `after_index`, with their data: at least one, then up
        to `max_bytes` of data (evicted ones are read back only as far as that)."""
        return self._with_data(max(after_index, self.snapshot.index) - self.snapshot.index,
                               self.commit_index - self.snapshot.index, max_bytes)

    def _with_data(self, start: int, stop: int, max_bytes: int) -> list[Entry]:
        """The entries at positions start..stop-1 with their data: at least one, then
        up to `max_bytes` (evicted ones read back only as far as that)."""
        entries = self.entries
        taken: list[Entry] = []
        size_bytes = 0
        for position in range(start, stop):
            entry = entries[position]
            if entry.data is None:
                entry = self._loaded(entry)
            size_bytes += entry.size_bytes()
            if taken and size_bytes > max_bytes:
                break
            taken.append(entry)
        return taken

    def last_index_of_term(self, term: int, at_most: int) -> int | None:
        """The highest index <= at_most whose entry has `term` (terms only grow
        along the log, so the scan stops early)."""
        index = min(at_most, self.last_index())
        while index > self.snapshot.index:
            entry_term = self.entries[index - self.snapshot.index - 1].term
            if entry_term == term:
                return index
            if entry_term < term:
                return None
            index -= 1
        return None

    def first_index_of_term(self, index: int) -> int:
        """The first index of the run of entries with the term of `index`."""
        term = self.term(index)
        while index - 1 > self.snapshot.index and self.entries[index - self.snapshot.index - 2].term == term:
            index -= 1
        return index

    def config_at(self, index: int) -> tuple[int, tuple[str, ...]]:
        """The configuration in force at `index` and the index of its entry:
        the latest config entry at or before it (thesis §4.1: a server uses
        the latest configuration in its log, committed or not), else the
        snapshot's."""
        found = bisect_right(self.config_indexes, min(index, self.last_index()))
        if found:
            config_index = self.config_indexes[found - 1]
            entry = self.entries[config_index - self.snapshot.index - 1]
            return config_index, ConfigChange.decode(entry.data).voters
        return self.snapshot.index, self.snapshot.voters

    # --- changing ------------------------------------------------------------------

    def append(self, entries: list[Entry] | tuple[Entry, ...]) -> None:
        """Append entries that follow the last one or replace a conflicting
        suffix starting at entries[0].index (Raft §5.3, receiver rule 3)."""
        if not entries:
            return
        first = entries[0].index
        assert first > self.commit_index, f"truncating committed entry {first} <= {self.commit_index}"
        assert first <= self.last_index() + 1, f"log hole: {first} after {self.last_index()}"
        del self.entries[first - self.snapshot.index - 1:]
        del self.config_indexes[bisect_left(self.config_indexes, first):]
        self.stable_index = min(self.stable_index, first - 1)
        self.entries.extend(entries)
        self.config_indexes.extend(entry.index for entry in entries if entry.kind == EntryKind.CONFIG)

    def commit_to(self, index: int) -> bool:
        if index <= self.commit_index:
            return False
        assert index <= self.last_index(), f"commit {index} beyond last index {self.last_index()}"
        self.commit_index = index
        return True

    def restore(self, snapshot: Snapshot) -> None:
        """Raft §7: the snapshot replaces the whole log; it is persisted
        through the next Ready."""
        assert snapshot.index > self.commit_index, "restoring a snapshot older than the commit index"
        self.snapshot = snapshot
        self.entries = []
        self.config_indexes = []
        self.stable_index = snapshot.index
        self.storage_last_index = snapshot.index  # persisting a snapshot drops every stored entry
        self.commit_index = snapshot.index
        self.evicted_through = snapshot.index
        self.pending_snapshot = snapshot

    def compact(self, snapshot: Snapshot) -> None:
        """The application captured everything up to snapshot.index: drop it."""
        assert snapshot.index <= self.applied_index, "compacting beyond what is applied"
        assert snapshot.index <= self.stable_index, "compacting entries not yet persisted"
        assert snapshot.index > self.snapshot.index, "compacting backwards"
        assert self.term(snapshot.index) == snapshot.term
        # The kept (recent) entries are copied out and cut off the old list, which is left
        # holding only the dropped (cold) ones, untouched, for the host to free in pieces
        # (a later compaction's replaces it).
        dropped = self.entries
        kept_from = snapshot.index - self.snapshot.index
        self.entries = dropped[kept_from:]
        del dropped[kept_from:]
        self.dropped = dropped
        del self.config_indexes[:bisect_right(self.config_indexes, snapshot.index)]
        self.snapshot = snapshot

    def take_dropped(self) -> list[Entry] | None:
        """The list the last compaction left (it holds the dropped entries), once."""
        dropped, self.dropped = self.dropped, None
        return dropped

    def evict(self, through: int) -> int:
        """Drop from memory the data of the NORMAL entries up to `through`
        (capped at what is stable and applied); it is read back through the
        loader when needed. Returns how many entries lost their data."""
        if self.loader is None:
            return 0
        through = min(through, self.stable_index, self.applied_index, self.last_index())
        evicted = 0
        base = self.snapshot.index + 1
        for position in range(max(self.evicted_through, self.snapshot.index) + 1 - base, through + 1 - base):
            entry = self.entries[position]
            if entry.kind == EntryKind.NORMAL and entry.data is not None:
                self.entries[position] = Entry(entry.term, entry.index, entry.kind, None)
                evicted += 1
        self.evicted_through = max(self.evicted_through, through)
        return evicted

    def stable_to(self, index: int, term: int) -> None:
        """Entries up to `index` were persisted, unless the log has moved on
        (the entry there was replaced since the Ready was taken)."""
        if self.term(index) == term and index > self.stable_index:
            self.stable_index = index
