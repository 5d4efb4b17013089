"""Reading a quorum queue's messages back from its Raft log, and reading ahead.

The queue machine keeps a message as a reference into the log (log index, slot:
`quorum_machine.ref_location`); to deliver it, the leader reads the entry back and
decodes it. `DecodedEntries` keeps the last few decoded entries, so a run of
deliveries from one entry (an EnqueueBatch holds up to a turn's publishes of one
channel) reads and decodes it once, and a just-applied enqueue is delivered from
memory.

A backlog is read back from disk while it drains, and on one core that reading
(pread, checksum, decode: about a fifth of the drain's CPU) lay in the turn that
delivers, the turn every consumer's next window waits for. Meanwhile the loop sat
idle while the acks' settles went through the disk. `ReadAhead` moves the reading
into that wait: a queue whose turn delivered from entries read back from the log asks
for a read-ahead, and while the node's WAL writer has a batch (the loop would wait for
it) the queue decodes the entries of its next ready messages, one entry per loop
pass, so the batch's durable callback waits for one entry's reading at most.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

import structlog

from warren.broker.queues import fifo, queue_codec
from warren.broker.queues import quorum_machine as qm

log = structlog.get_logger("warren.quorum")

DECODED_ENTRIES_MAX = 8          # decoded entries a queue keeps...
DECODED_BYTES_MAX = 4 << 20      # ...and their encoded bytes at most (the newest one is always kept)
READ_AHEAD_MESSAGES = 512        # how far down the ready messages a read-ahead looks
READ_AHEAD_ENTRIES = DECODED_ENTRIES_MAX // 2   # the entries it reads at most: the one being delivered from stays
READ_AHEAD_STRIDE = 16           # it looks at every 16th message (a loop pass each: cheap)


class DecodedEntries:
    """A queue's decoded log entries: index -> (the messages of the Enqueue or
    EnqueueBatch there, [exchange, routing_key, properties, body, ...] each, the
    entry's encoded size, whether it was read back from the log). `entries` is read
    directly on the delivery path."""

    def __init__(self, read: Callable[[int], bytes | None]) -> None:
        self._read = read                                  # the log's entry at an index, or None
        self.entries: dict[int, tuple[list, int, bool]] = {}
        self.held_bytes = 0
        self.evicted = 0   # entries let go past the bounds, so far

    def read(self, index: int) -> list | None:
        """The entry's messages, read from the log and kept; None if the log no longer has it."""
        data = self._read(index)
        if data is None:
            return None
        messages = qm.entry_messages(queue_codec.decode_read_back(data))
        self.remember(index, messages, len(data), read_back=True)
        return messages

    def remember(self, index: int, messages: list, size: int, read_back: bool = False) -> None:
        """An entry decoded (read back, or the enqueue just applied). An enqueue applied
        replaces the one applied before it (a queue whose consumers keep up delivers
        each from its own apply: an idle queue holds one entry, as before reading
        ahead); past the bounds the one kept longest goes first (not the lowest index:
        while a backlog drains, the entries of the latest enqueues are the highest and
        the least needed)."""
        entries = self.entries
        if index in entries:
            self._drop(index)
        if not read_back:
            self._drop_all(read_back=False)
        entries[index] = (messages, size, read_back)
        self.held_bytes += size
        while len(entries) > DECODED_ENTRIES_MAX or (self.held_bytes > DECODED_BYTES_MAX and len(entries) > 1):
            self._drop(next(iter(entries)))
            self.evicted += 1

    def forget_read_back(self) -> None:
        self._drop_all(read_back=True)

    def _drop_all(self, read_back: bool) -> None:
        """Every entry read back (True), or every enqueue applied (False)."""
        for index in [i for i, held in self.entries.items() if held[2] is read_back]:
            self._drop(index)

    def _drop_passed(self, lowest_upcoming: int) -> None:
        for index in [i for i, held in self.entries.items() if i < lowest_upcoming and held[2]]:
            self._drop(index)

    def _drop(self, index: int) -> None:
        self.held_bytes -= self.entries.pop(index)[1]

    def read_ahead(self, indexes: Iterator[int]) -> bool:
        """Read the first entry at `indexes` (READ_AHEAD_ENTRIES of them at most) not
        held yet; False if there was none to read, or no more should be: past half the
        byte bound, or once a read let an entry go (large entries: reading on would
        evict the ones about to be delivered, and read them again, each pass). Entries
        read back below all of `indexes` are let go first: the delivery has passed them
        (a message returned later is read again), and a drain's entries of a few hundred
        messages each would otherwise hold the bound with entries delivered. (Not below
        the first: a returned message, at the front, may be of a higher entry than the
        next; its entry would go and be read again each pass.)"""
        upcoming = list(islice(indexes, READ_AHEAD_ENTRIES))
        if upcoming:
            self._drop_passed(min(upcoming))
        if self.held_bytes >= DECODED_BYTES_MAX // 2:
            return False
        for index in upcoming:
            if index in self.entries:
                continue
            evicted = self.evicted
            if self.read(index) is not None:
                return self.evicted == evicted
        return False


def upcoming_entries(state: fifo.FifoState, messages: int = READ_AHEAD_MESSAGES,
                     stride: int = READ_AHEAD_STRIDE) -> Iterator[int]:
    """The log indexes of every `stride`-th of the next `messages` ready messages, in
    delivery order, each once per run (a queue's transient messages, kept in the
    machine, have none). An entry holds a run of consecutive messages (a turn's
    publishes of one channel): sampling finds the large ones, which cost the most to
    read; one it skips is read when delivered, as without reading ahead."""
    last = None
    for msg_id in islice(state.ready, 0, messages, stride):
        payload = fifo.payload_of(state, msg_id)
        if type(payload) is not int:
            continue
        index = qm.ref_location(payload)[0]
        if index != last:
            last = index
            yield index


class ReadAhead:
    """The node's queues waiting to read ahead. While the WAL writer has a batch
    (`GroupCommitter.subscribe(on_writing=..., on_batch_written=...)`), one queue
    reads one entry per loop pass, the queues in turn; a queue with nothing left to
    read drops out until its deliveries read back from the log again."""

    def __init__(self, call_soon: Callable[[Callable[[], Any]], Any]) -> None:
        self._call_soon = call_soon
        self._wanting: dict[str, Callable[[], bool]] = {}   # queue group -> its read_ahead
        self._writing = False
        self._scheduled = False

    def want(self, group: str, read_ahead: Callable[[], bool]) -> None:
        self._wanting[group] = read_ahead
        self._schedule()

    def on_writing(self) -> None:
        self._writing = True
        self._schedule()

    def on_written(self, _written: Any) -> None:
        self._writing = False   # its durable callbacks come first; the next batch resumes the reading

    def _schedule(self) -> None:
        if self._writing and self._wanting and not self._scheduled:
            self._scheduled = True
            self._call_soon(self._run)

    def _run(self) -> None:
        self._scheduled = False
        if not (self._writing and self._wanting):
            return
        group = next(iter(self._wanting))
        read_ahead = self._wanting.pop(group)
        try:
            if read_ahead():
                self._wanting[group] = read_ahead   # more to read: after the other queues
        except Exception:  # noqa: BLE001 -- one queue's bad entry stays its own (its delivery meets it again)
            log.exception("quorum.read_ahead_failed", group=group)
        self._schedule()
