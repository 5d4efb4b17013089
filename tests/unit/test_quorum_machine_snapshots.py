"""The quorum machine's snapshots in both versions it reads (3: columns of
ints, broker/queues/snapshot_codec.py; 2: a list per message), and
`oldest_ref_index`, kept incrementally, against a scan of every message."""
from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_quorum_machine import C1, C2, P1, choices_strategy, draw_command, limits_strategy, wire
from warren.broker.queues import fifo, message_table
from warren.broker.queues import queue_codec as qcodec
from warren.broker.queues import queue_commands as qc
from warren.broker.queues import quorum_machine as qm
from warren.broker.queues.quorum_machine import QuorumMachine


def oldest_ref_index_by_scan(machine: QuorumMachine) -> int | None:
    """The definition: the lowest log index any message kept (or held) refers to."""
    refs = [message_table.unpacked(held)[0] for held in machine.state.messages.values()]
    refs += [message[1] for session in machine._sessions.values() for message in session.held.values()]
    return min((qm.ref_location(ref)[0] for ref in refs if type(ref) is int), default=None)


def as_version_2(snapshot: bytes) -> bytes:
    """A version 3 snapshot as version 2 wrote the same state (a list per message,
    a list per pair); checked against bytes the version 2 code wrote below."""
    version, next_msg_id, state, sessions, seqs, *rest = msgpack.unpackb(snapshot, raw=False)
    assert version == 3
    limits, (ids, refs, sizes, inline), counts, ready, returns, *middle, consumers, service = state
    ready_bytes, message_bytes, expiries, priorities, now_ms = middle
    payloads = list(refs)
    for position, payload in inline:
        payloads[position] = payload

    def pairs(columns):
        return [list(pair) for pair in zip(*columns)]

    consumers = [consumer[:9] for consumer in consumers]   # a consumer's `exclusive` came after version 2
    old_state = [limits, [list(m) for m in zip(ids, payloads, sizes)], pairs(counts), ready, returns, ready_bytes,
                 message_bytes, pairs(expiries), pairs(priorities), now_ms, consumers, service]
    old_seqs = [[consumer, last_seq, pairs(checked_out)] for consumer, last_seq, checked_out in seqs]
    return msgpack.packb([2, next_msg_id, old_state, sessions, old_seqs, *rest], use_bin_type=True)


def scenario() -> QuorumMachine:
    """A machine, with a log, holding some of everything per message: ready,
    returned, checked out, held out of order, TTLs, priorities, delivery counts."""
    machine = QuorumMachine(fifo.QueueLimits(max_priority=3, message_ttl_ms=60_000, delivery_limit=5))
    commands = [qc.Checkout(*C1, 10, 2, 1), qc.Checkout(*C2, 11, 1),
                qc.EnqueueBatch(P1, 1, 12, [["", "q", b"\x10\x00\x02", b"a", None, 2], ["", "q", b"", b"b", 50, 0]]),
                qc.Enqueue(P1, 5, 13, "", "q", b"", b"held", None, 0),
                qc.Return(*C1, 14, [1]),
                qc.EnqueueBatch(P1, 3, 15, [["", "q", b"", b"c", None, 1], ["", "q", b"", b"d", None, 0]])]
    for index, command in enumerate(commands, start=1):
        machine.apply(wire(command), index)
    return machine


# scenario().snapshot() as the version 2 code wrote it (commit bf26176)
SCENARIO_V2 = bytes.fromhex(
    "9902069c87aa6d61785f6c656e677468c0b06d61785f6c656e6774685f627974"
    "6573c0a86f766572666c6f77a964726f702d68656164ae6d6573736167655f74"
    "746c5f6d73cdea60b673696e676c655f6163746976655f636f6e73756d6572c2"
    "ac6d61785f7072696f7269747903ae64656c69766572795f6c696d6974059593"
    "01ce00030000019302d2fffcfffe019303d2fff9ffff019304d2fff9fffe0193"
    "05d2fffbffff04919201019092cf0003000000000004cf000300000000000505"
    "08959201cdea6c92023e9203cdea6f9204cdea6f9205cdea6f92920102920301"
    "0f929992a96e312f69312f636831a1610201c2920201c2c2c2029992a96e322f"
    "69312f636832a1620100c29103c2c2c201929201909200909193a86e312f6931"
    "2f70310690929392a96e312f69312f636831a16103929202029201039392a96e"
    "322f69312f636832a162019192030190909090"
)


@pytest.mark.parametrize("version", [2, 3])
def test_a_snapshot_of_either_version_restores_the_same_machine(version):
    original = scenario()
    snapshot = original.snapshot() if version == 3 else SCENARIO_V2
    restored = QuorumMachine.restore(snapshot)
    assert restored.snapshot() == original.snapshot()
    assert restored.state.messages == original.state.messages
    assert restored.oldest_ref_index() == original.oldest_ref_index() == oldest_ref_index_by_scan(original) == 3
    later = wire(qc.Enqueue(P1, 4, 16, "", "q", b"", b"e", None, 0))
    assert restored.apply(later, 7) == original.apply(later, 7)
    assert restored.snapshot() == original.snapshot()
    assert restored.oldest_ref_index() == original.oldest_ref_index() == oldest_ref_index_by_scan(original)


def test_the_version_2_form_of_a_snapshot_is_what_version_2_wrote():
    assert as_version_2(scenario().snapshot()) == SCENARIO_V2


def test_a_machine_without_a_log_keeps_its_inline_payloads_in_place():
    machine = QuorumMachine()
    for seq, body in enumerate([b"one", b"two"], start=1):
        machine.apply(wire(qc.Enqueue(P1, seq, 5, "", "q", b"", body)))
    restored = QuorumMachine.restore(machine.snapshot())
    assert list(restored.state.messages.items()) == list(machine.state.messages.items())
    assert restored.oldest_ref_index() is None


def run_indexed_log(choices, machine: QuorumMachine, index: int | None, length: int | None = None) -> list:
    """Applies commands at log indexes from `index` (messages are references;
    None: no log, payloads inline); after each, `oldest_ref_index` is the
    scan's. Returns (index, command, produced)."""
    log = []
    while (len(log) < length) if length is not None else not choices.exhausted():
        command = draw_command(choices, machine)
        log.append((index, command, machine.apply(qcodec.decode(command), index)))
        assert machine.oldest_ref_index() == oldest_ref_index_by_scan(machine)
        index = None if index is None else index + 1
    return log


@settings(max_examples=200, deadline=None)
@given(limits_strategy, st.integers(0, 80), st.sampled_from([2, 3]), st.booleans(), choices_strategy)
def test_restore_of_either_version_behaves_exactly_like_the_original(limits, before, version, indexed, choices):
    original = QuorumMachine(limits)
    run_indexed_log(choices, original, 1 if indexed else None, before)
    snapshot = original.snapshot()
    restored = QuorumMachine.restore(snapshot if version == 3 else as_version_2(snapshot))
    assert restored.snapshot() == snapshot
    for index, command, produced in run_indexed_log(choices, original, before + 1 if indexed else None):
        assert restored.apply(qcodec.decode(command), index) == produced
        assert restored.oldest_ref_index() == oldest_ref_index_by_scan(restored)
    assert restored.snapshot() == original.snapshot()
    assert restored.oldest_ref_index() == original.oldest_ref_index()
    assert restored.checked_out_deliveries() == original.checked_out_deliveries()


@settings(max_examples=200, deadline=None)
@given(limits_strategy, st.integers(0, 80), st.booleans(), choices_strategy)
def test_a_captured_snapshot_packs_the_state_of_its_capture_whatever_came_after(limits, before, indexed, choices):
    """A release cursor candidate is captured when offered and packed only if it is
    promoted, many commands later: the capture must share nothing that those
    commands change (the returns heap, a consumer's checked-out table, a session...)."""
    machine = QuorumMachine(limits)
    run_indexed_log(choices, machine, 1 if indexed else None, before)
    expected = machine.snapshot()
    capture = machine.capture()
    run_indexed_log(choices, machine, before + 1 if indexed else None)
    assert capture.pack() == expected
