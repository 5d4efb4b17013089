"""Properties of the in-memory Raft log (raft/log.py) against a plain list."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from warren.raft.log import RaftLog
from warren.raft.messages import ConfigChange, ConfigChangeOp, Entry, EntryKind, Snapshot

OPERATIONS = st.lists(st.tuples(st.sampled_from(["append", "commit", "apply", "compact", "persist"]),
                                st.integers(0, 30), st.integers(1, 4)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(OPERATIONS)
def test_the_log_behaves_like_a_list_with_a_compacted_prefix(operations):
    log = RaftLog(Snapshot(0, 0, ("a",), b""), [], 0)
    model: list[tuple[int, bytes]] = []          # (term, data) at index i + 1
    term = 1
    for op, number, count in operations:
        if op == "append":
            # a leader of a newer term overwrites the uncommitted suffix from some point
            term += 1
            first = max(log.commit_index + 1, log.snapshot_index + 1, min(number, log.last_index() + 1))
            entries = [Entry(term, first + i, EntryKind.NORMAL, b"%d" % (first + i)) for i in range(count)]
            log.append(entries)
            del model[first - 1:]
            model += [(term, e.data) for e in entries]
        else:
            step(log, op, number)
        check(log, model)


def step(log: RaftLog, op: str, number: int) -> None:
    """One of the operations other than an append."""
    if op == "commit":
        log.commit_to(min(number, log.last_index()))
    elif op == "apply":
        # entries are applied once persisted (persist, send, apply)
        log.applied_index = max(log.applied_index, min(number, log.commit_index, log.stable_index))
    elif op == "compact" and log.snapshot_index < log.applied_index:
        index = log.applied_index
        log.compact(Snapshot(index, log.term(index), log.config_at(index)[1], b""))
    elif op == "persist" and log.entries:
        log.stable_to(log.last_index(), log.last_term())


def check(log: RaftLog, model: list[tuple[int, bytes]]) -> None:
    assert log.snapshot_index <= log.applied_index <= log.commit_index <= log.last_index() == len(model)
    assert log.stable_index <= log.last_index()
    for index in range(log.snapshot_index + 1, log.last_index() + 1):
        assert (log.term(index), log.entry(index).data) == model[index - 1]
    assert log.term(log.snapshot_index) == (model[log.snapshot_index - 1][0] if log.snapshot_index else 0)
    assert log.term(log.snapshot_index - 1 if log.snapshot_index else 0) in (None, 0)
    assert [e.index for e in log.unstable_entries()] == list(range(log.stable_index + 1, log.last_index() + 1))
    committed = log.committed_unapplied(log.applied_index)
    assert [e.index for e in committed] == list(range(log.applied_index + 1, log.commit_index + 1))
    if log.last_index() > log.snapshot_index:
        sliced = log.slice(log.snapshot_index + 1, 0)
        assert len(sliced) == 1                       # at least one entry, even over the limit
    assert log.slice(log.snapshot_index, 1 << 20) is None if log.snapshot_index else True


CONFIG_OPERATIONS = st.lists(st.tuples(st.sampled_from(["append", "append-config", "commit", "apply", "compact",
                                                        "persist", "restore"]),
                                       st.integers(0, 30), st.integers(1, 4)), max_size=60)


def config_entry(term: int, index: int) -> Entry:
    change = ConfigChange(ConfigChangeOp.ADD, f"n{index}", ("a", f"n{index}"))
    return Entry(term, index, EntryKind.CONFIG, change.encode())


@settings(max_examples=300, deadline=None)
@given(CONFIG_OPERATIONS)
def test_the_configuration_in_force_is_the_latest_config_entry_at_or_before_an_index(operations):
    # config_at keeps the indexes of CONFIG entries instead of walking the log back: check it against a walk
    log = RaftLog(Snapshot(0, 0, ("a",), b""), [], 0)
    term = 1
    for op, number, count in operations:
        if op.startswith("append"):
            term += 1
            first = max(log.commit_index + 1, log.snapshot_index + 1, min(number, log.last_index() + 1))
            make = config_entry if op == "append-config" else (
                lambda t, i: Entry(t, i, EntryKind.NORMAL, b"%d" % i))
            log.append([make(term, first + i) for i in range(count)])
        elif op == "restore":
            if number > log.commit_index:
                log.restore(Snapshot(number, term, ("a", f"r{number}"), b""))
                log.applied_index = number
        else:
            step(log, op, number)
        for index in range(log.snapshot_index, log.last_index() + 3):
            assert log.config_at(index) == walked_config_at(log, index), f"config_at({index})"


def walked_config_at(log: RaftLog, index: int) -> tuple[int, tuple[str, ...]]:
    for at in range(min(index, log.last_index()), log.snapshot_index, -1):
        entry = log.entry(at)
        if entry.kind == EntryKind.CONFIG:
            return at, ConfigChange.decode(entry.data).voters
    return log.snapshot_index, log.snapshot.voters


def test_committed_entries_are_handed_over_a_bounded_size_at_a_time_and_read_back_only_that_far():
    data = [bytes([i]) * 1000 for i in range(10)]
    # as recovered: every entry committed, its data on disk only
    log = RaftLog(Snapshot(0, 0, ("a",), b""), [Entry(1, i + 1, EntryKind.NORMAL, None) for i in range(10)], 10)
    loaded = []
    log.loader = lambda index: loaded.append(index) or data[index - 1]
    first = log.committed_unapplied(0, max_bytes=2500)
    assert [(e.index, e.data) for e in first] == [(1, data[0]), (2, data[1])]
    assert loaded == [1, 2, 3]   # the third read back to find it over the bound, not the other seven
    assert [e.index for e in log.committed_unapplied(0, max_bytes=10)] == [1]   # one at least, over the bound
    log.applied_index = 2
    assert [e.index for e in log.committed_unapplied(2)] == list(range(3, 11))   # within the default bound
