"""Reading a quorum queue's messages back from its log, and reading ahead while the
node waits for its disk (broker/queues/read_back.py)."""
from __future__ import annotations

from warren.broker.queues import queue_codec, read_back
from warren.broker.queues import queue_commands as qc
from warren.broker.queues.queue_replica import QueueReplica
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


def test_an_enqueue_applied_replaces_the_one_applied_before_it_not_those_read_back():
    log = Log({2: batch(2, 1), 3: batch(3, 1)})
    decoded = DecodedEntries(log.entry_data)
    for index in range(100, 105):                         # a publish phase: one entry held at a time
        decoded.remember(index, [], 10)
    assert list(decoded.entries) == [104] and decoded.held_bytes == 10
    decoded.read(2)
    decoded.read(3)
    decoded.remember(105, [], 10)
    assert list(decoded.entries) == [2, 3, 105], "a drain's entries stay"
    assert decoded.held_bytes == len(log.data[2]) + len(log.data[3]) + 10
    decoded.forget_read_back()
    assert list(decoded.entries) == [105] and decoded.held_bytes == 10, "until the backlog is delivered"


def test_the_entry_kept_longest_goes_first_not_the_lowest_index():
    log = Log({index: batch(index, 1) for index in range(1, 20)})
    decoded = DecodedEntries(log.entry_data)
    decoded.remember(100, [], 10)                          # the last enqueue applied, the highest index
    for index in range(10, 10 + DECODED_ENTRIES_MAX):     # a drain reads entries back
        decoded.read(index)
    assert 100 not in decoded.entries, "the entry kept longest went first"
    decoded.read(2)                                        # a lower index read later stays
    assert 2 in decoded.entries and 10 not in decoded.entries and len(decoded.entries) == DECODED_ENTRIES_MAX


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


def test_large_entries_are_not_read_ahead_past_half_the_byte_bound_nor_evicting():
    big = read_back.DECODED_BYTES_MAX // 3
    entries = {index: batch(index, 1, size=big) for index in range(10, 14)}
    log = Log(entries)
    decoded = DecodedEntries(log.entry_data)
    machine = machine_with({index: 1 for index in entries})
    decoded.read(10)                                      # being delivered from
    assert decoded.read_ahead(upcoming_entries(machine.state, stride=1)) is True     # 11: two thirds held
    assert decoded.read_ahead(upcoming_entries(machine.state, stride=1)) is False, "past half the bound"
    assert log.reads == [10, 11] and set(decoded.entries) == {10, 11}
    huge = Log({index: batch(index, 1, size=read_back.DECODED_BYTES_MAX // 2 + 10) for index in range(10, 14)})
    evicting = DecodedEntries(huge.entry_data)
    evicting.remember(9, [], read_back.DECODED_BYTES_MAX // 2 - 1)
    assert evicting.read_ahead(upcoming_entries(machine.state, stride=1)) is False, "a read that evicted: no more"
    assert evicting.evicted == 1 and list(evicting.entries) == [10] and huge.reads == [10]


def test_entries_the_delivery_has_passed_make_room_for_reading_ahead():
    """A drain's entries hold a few hundred messages each: those delivered already held
    half the byte bound, and the entries about to be delivered were read in the delivering
    turn instead of while the node waited for its disk."""
    sixth = read_back.DECODED_BYTES_MAX // 6
    entries = {index: batch(index, 1, size=sixth) for index in range(10, 16)}
    log = Log(entries)
    decoded = DecodedEntries(log.entry_data)
    for index in (10, 11, 12):                             # delivered: half the bound held
        decoded.read(index)
    decoded.remember(20, [], 10)                           # the last enqueue applied stays
    machine = machine_with({index: 1 for index in (13, 14, 15)})
    assert decoded.read_ahead(upcoming_entries(machine.state, stride=1)) is True
    assert set(decoded.entries) == {13, 20}, "the entries passed went, the next was read"
    returned = machine_with({index: 1 for index in (11, 13, 14)})   # a message of 11 returned: ready again
    assert decoded.read_ahead(upcoming_entries(returned.state, stride=1)) is True
    assert set(decoded.entries) == {11, 13, 20}, "a message returned is read again, nothing after it goes"
    held = set(decoded.entries)
    out_of_order = machine_with({index: 1 for index in (13, 11)})   # a message of 13 returned: first again
    for _ in range(3):
        decoded.read_ahead(upcoming_entries(out_of_order.state, stride=1))
    assert set(decoded.entries) == held and log.reads.count(11) == 2, "nothing it will deliver goes, nor is read twice"


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


class Client:
    """This node's sessions with the queue, as QueueReplica uses them: one local consumer."""

    def __init__(self, consumer: tuple) -> None:
        self.local_consumers = {consumer: object()}
        self.delivered: list[bytes] = []

    def on_deliveries(self, owner, tag, deliveries) -> None:
        self.delivered += [payload[3] for _, _, payload, _, _ in deliveries]

    def on_applied(self, enqueuer, first_seq, last_seq, refused) -> None:
        pass


class ReplicaLog(Log):
    def __init__(self, entries: dict[int, qc.EnqueueBatch]) -> None:
        super().__init__(entries)
        self.read_ahead_asked: list = []

    def compact(self, index: int, snapshot: bytes) -> None:
        pass

    def read_ahead_later(self, read_ahead) -> None:
        self.read_ahead_asked.append(read_ahead)


def test_a_leader_delivering_from_entries_read_back_asks_to_read_ahead_and_lets_go_once_delivered():
    owner, consumer = "n1/i1/ch", ("n1/i1/ch", "t")
    entries = {2: batch(2, 3, first_seq=1), 3: batch(3, 3, first_seq=4)}
    log, client = ReplicaLog(entries), Client(consumer)
    replica = QueueReplica(QuorumMachine(), "n1", "g", log, client, lambda node, message: None,
                           lambda reason, payloads: None)

    def apply(index: int, command) -> None:
        replica.apply_entry(index, queue_codec.encode(command), leading=True)

    apply(2, entries[2])
    apply(3, entries[3])                          # replaces 2: entry 2 is now read back when delivered
    assert list(replica.decoded.entries) == [3] and not log.read_ahead_asked
    apply(4, qc.Checkout(owner, "t", 0, 0))       # unlimited prefetch: all six delivered
    assert client.delivered == [b"2.%dxxxxxxxxxx" % n for n in range(3)] + [b"3.%dxxxxxxxxxx" % n for n in range(3)]
    assert log.reads == [2] and log.read_ahead_asked == [replica.read_ahead], "read back: the next are read ahead"
    assert set(replica.decoded.entries) == {3}, "nothing ready any more: the entry read back is let go"


class CompactingLog(ReplicaLog):
    """A log that lets go of its entries up to the index a replica compacts to."""

    def compact(self, index: int, snapshot: bytes) -> None:
        self.data = {i: data for i, data in self.data.items() if i > index}


def test_a_basic_get_without_ack_answers_with_its_message_though_the_same_apply_compacts_the_log():
    """A dequeue with no_ack settles its message as it is applied: the log may be compacted
    past the message's entry in that apply (300 KB bodies made a snapshot due every two
    entries), and the answer was read from the log after that: the message was taken from
    the queue and answered as gone, a confirmed message lost."""
    owner, body = "n1/i1/ch", b"b" * 300_000
    entries = {index: qc.EnqueueBatch(owner, index, 0, [["", "q", PERSISTENT, body + b"%d" % index, None, 0]])
               for index in range(1, 11)}
    log = CompactingLog(entries)
    replica = QueueReplica(QuorumMachine(), "n1", "g", log, Client((owner, "t")), lambda node, message: None,
                           lambda reason, payloads: None)
    for index, command in entries.items():
        replica.apply_entry(index, queue_codec.encode(command), leading=True)
    got = []
    for request in range(1, 11):
        _, reply = replica.apply_entry(10 + request, queue_codec.encode(qc.Dequeue(owner, request, 0, True)),
                                       leading=True)
        got.append(reply and reply[1][3][len(body):])
    assert got == [b"%d" % index for index in range(1, 11)], "every basic.get answered with its message"
