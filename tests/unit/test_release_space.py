"""With the disk alarm on, the node rolls its WAL over as soon as a group's log has let
entries go (raft/persistence.py `RaftPersistence.release_space`): they leave the disk only
at a rollover, and the publishers the alarm blocks no longer fill the WAL. One rollover per
change (and again after one that failed), not one per alarm check."""
from __future__ import annotations

from types import SimpleNamespace

from warren.raft.persistence import RaftPersistence


def group(log_id: int, cursor: int) -> SimpleNamespace:
    return SimpleNamespace(log_id=log_id, cursor=lambda: cursor, prune_locations=lambda: range(0), locations={},
                           rollover_records=lambda: [])


def test_the_wal_rolls_over_once_a_cursor_moved_or_a_group_went_and_only_then():
    rollovers: list[None] = []
    groups = {"a": group(1, 5), "b": group(2, 1)}
    committer = SimpleNamespace(rollover_soon=lambda: rollovers.append(None), rollover_retry_due=False)
    persistence = RaftPersistence(committer, groups,
                                  locations=None, report_durable=lambda token, ok: None, request_turn=lambda: None)
    assert persistence.release_space() and len(rollovers) == 1, "no rollover yet: whatever was let go is on disk"
    persistence.prepare_rollover()   # the committer's rollover starts
    assert not persistence.release_space() and len(rollovers) == 1, "nothing let go since: no rollover"
    groups["a"] = group(1, 9)        # the queue's release cursor moved (its messages were consumed)
    assert persistence.release_space() and len(rollovers) == 2
    persistence.prepare_rollover()
    assert not persistence.release_space()
    del groups["b"]                  # a deleted queue's log: its segments go at a rollover too
    assert persistence.release_space() and len(rollovers) == 3
    persistence.prepare_rollover()
    committer.rollover_retry_due = True  # it found no room, and may be tried again now
    assert persistence.release_space() and len(rollovers) == 4, "a failed rollover is asked for again"
