"""Reading a quorum queue's messages back from its log, and reading ahead while the
node waits for its disk (broker/queues/read_back.py)."""
from __future__ import annotations

from warren.broker.queues import queue_codec, read_back
from warren.broker.queues import queue_commands as qc
from warren.broker.queues.quorum_machine import QuorumMachine
from warren.broker.queues.read_back import DECODED_ENTRIES_MAX, DecodedEntries, ReadAhead, upcoming_entries

PERSISTENT = b"\x10\x00\x02"   # properties with delivery_mode 2


def batch(index: int, count: int, size: int = 10, first_seq: int = 1) -> qc.EnqueueBatch:
    return qc.EnqueueBatch("n1/i1/ch", first_seq, 0,
                           [["", "q", PERSISTENT, b"%d.%d" % (index, n) + b"x" * size, None, 0] for n in range(count)])


class Log:
    def __init__(self, entries: dict[int, qc.EnqueueBatch]) -> None:
        self.data = {index: queue_codec.encode(command) for index, command in entries.items()}
        self.reads: list[int] = []

    def entry_data(self, index: int) -> bytes | None:
        self.reads.append(index)
        return self.data.get(index)


def test_an_entry_read_back_is_decoded_once_and_marked_as_read_back():
    log = Log({3: batch(3, 4)})
    decoded = DecodedEntries(log.entry_data)
    messages = decoded.read(3)
    assert [m[3] for m in messages] == [b"3.%dxxxxxxxxxx" % n for n in range(4)]
    assert decoded.entries[3][2] is True and log.reads == [3]
    decoded.remember(9, batch(9, 1).messages, 50)
    assert decoded.entries[9][2] is False, "an enqueue just applied is not read back"
    assert decoded.read(4) is None and 4 not in decoded.entries, "an entry the log no longer has"


def test_the_entry_kept_longest_goes_first_not_the_lowest_index():
    log = Log({2: batch(2, 1)})
    decoded = DecodedEntries(log.entry_data)
    for index in range(100, 100 + DECODED_ENTRIES_MAX):   # a publish phase's entries, high indexes
        decoded.remember(index, [], 10)
    decoded.read(2)                                        # the drain reads the oldest back
    assert 2 in decoded.entries and 100 not in decoded.entries
    assert len(decoded.entries) == DECODED_ENTRIES_MAX and decoded.held_bytes == 10 * (DECODED_ENTRIES_MAX - 1) + \
        len(log.data[2])


def test_past_the_byte_bound_only_the_newest_entry_stays():
    decoded = DecodedEntries(lambda index: None)
    decoded.remember(1, [], read_back.DECODED_BYTES_MAX // 2)
    decoded.remember(2, [], read_back.DECODED_BYTES_MAX)
    assert list(decoded.entries) == [2] and decoded.held_bytes == read_back.DECODED_BYTES_MAX


def machine_with(entries: dict[int, int]) -> QuorumMachine:
    """A queue machine holding, ready, `count` messages of the batch at each index."""
    machine, seq = QuorumMachine(), 1
    for index, count in entries.items():
        machine.apply(batch(index, count, first_seq=seq), index)
        seq += count
    return machine


def test_upcoming_entries_are_the_log_indexes_of_the_next_ready_messages_in_order():
    machine = machine_with({5: 40, 6: 40, 7: 40, 8: 500})
    assert list(upcoming_entries(machine.state)) == [5, 6, 7, 8]
    assert list(upcoming_entries(machine.state, messages=100)) == [5, 6, 7], "as far as it looks"
    small = machine_with({5: 40, 6: 3, 7: 40})
    assert list(upcoming_entries(small.state)) == [5, 7], "a small entry between samples is read when delivered"
    assert list(upcoming_entries(small.state, stride=1)) == [5, 6, 7]


def test_a_read_ahead_reads_the_first_upcoming_entry_not_held_one_at_a_time():
    entries = {index: batch(index, 40) for index in range(10, 20)}
    log = Log(entries)
    decoded = DecodedEntries(log.entry_data)
    machine = machine_with({index: 40 for index in entries})
    decoded.read(10)                                      # being delivered from
    reads = []
    while decoded.read_ahead(upcoming_entries(machine.state)):
        reads.append(log.reads[-1])
    assert reads == [11, 12, 13], "the entries after the one being delivered from, up to READ_AHEAD_ENTRIES"
    assert set(decoded.entries) == {10, 11, 12, 13}


class Loop:
    def __init__(self) -> None:
        self.ready: list = []

    def call_soon(self, callback) -> None:
        self.ready.append(callback)

    def run_pass(self) -> None:
        ready, self.ready = self.ready, []
        for callback in ready:
            callback()


class Queue:
    def __init__(self, name: str, entries: int, runs: list) -> None:
        self.name, self.left, self.runs = name, entries, runs

    def read_ahead(self) -> bool:
        if self.name == "bad":
            raise ValueError("a corrupt entry")
        if not self.left:
            return False
        self.left -= 1
        self.runs.append(self.name)
        return True


def test_queues_read_ahead_one_entry_per_loop_pass_in_turn_while_the_writer_has_a_batch():
    loop, runs = Loop(), []
    read_ahead = ReadAhead(loop.call_soon)
    a, b = Queue("a", 3, runs), Queue("b", 1, runs)
    read_ahead.want("a", a.read_ahead)
    read_ahead.want("b", b.read_ahead)
    assert not loop.ready, "nothing while the writer is idle: the loop has other work"
    read_ahead.on_writing()
    read_ahead.on_writing()
    assert len(loop.ready) == 1, "scheduled once"
    loop.run_pass()
    loop.run_pass()
    loop.run_pass()
    assert runs == ["a", "b", "a"], "one entry per pass, the queues in turn"
    read_ahead.on_written(None)
    loop.run_pass()
    assert runs == ["a", "b", "a"] and not loop.ready, "the batch is durable: its callbacks come first"
    read_ahead.on_writing()
    for _ in range(5):
        loop.run_pass()
    assert runs == ["a", "b", "a", "a"] and not loop.ready, "a queue with nothing left to read drops out"


def test_a_queue_whose_read_ahead_fails_drops_out_and_the_others_go_on():
    loop, runs = Loop(), []
    read_ahead = ReadAhead(loop.call_soon)
    read_ahead.want("bad", Queue("bad", 1, runs).read_ahead)
    read_ahead.want("a", Queue("a", 1, runs).read_ahead)
    read_ahead.on_writing()
    for _ in range(4):
        loop.run_pass()
    assert runs == ["a"] and not loop.ready
