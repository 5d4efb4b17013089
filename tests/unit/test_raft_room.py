"""A node whose disk has no room for what its leaders replicate refuses it
(RaftSystem.admits_replicated, broker/node/disk_watch.py): to the leaders the entries
are lost on the way. The group commits without the node, the node neither campaigns
nor falls behind for good: it takes the leaders' snapshots once they compacted, and
the entries after them once it has room again (tests/unit/systemsim.py's checks hold
throughout)."""
from __future__ import annotations

import pytest

from tests.unit.systemsim import SystemCluster
from tests.unit.test_raft_system import SEEDS, assert_same_sequences, propose_all, settle, ticks
from warren.raft.system import COMMITTED_ENTRIES, SNAPSHOT, UNCOMMITTED_ENTRIES

GROUPS = list(range(1, 7))


@pytest.mark.parametrize("seed", SEEDS)
def test_a_follower_without_room_refuses_entries_and_catches_up_by_snapshot_once_it_has_room(seed):
    cluster = SystemCluster(seed)
    cluster.add_groups(GROUPS)
    cluster.run_until(lambda: cluster.all_led(GROUPS), ticks(cluster, 60), "leaders")
    full = next(name for name in cluster.names if all(cluster.leader(g).name != name for g in GROUPS[:1]))
    followed = [g for g in GROUPS if cluster.leader(g).name != full]
    room = {"entries": False, "snapshot": False}
    system = cluster.hosts[full].system
    system.admits_replicated = lambda group_id, size, kind: room["snapshot" if kind == SNAPSHOT else "entries"]
    terms = {g: system.groups[g].raft.term for g in GROUPS}
    applied_before = {g: len(cluster.applied_data(cluster.hosts[full], g)) for g in followed}

    propose_all(cluster, GROUPS, 5, "while-full")
    others = [h for h in cluster.live_hosts() if h.name != full]
    cluster.run_until(lambda: all(len(cluster.applied_data(h, g)) >= 5 for h in others for g in GROUPS),
                      ticks(cluster, 30), "the two other nodes to commit and apply without the full one")
    cluster.run(ticks(cluster, 3 * 10))   # three election timeouts: heartbeats still come through
    assert system.counters.messages_refused > 0
    assert {g: len(cluster.applied_data(cluster.hosts[full], g)) for g in followed} == applied_before, \
        "the full node applied entries it refused"
    assert {g: system.groups[g].raft.term for g in GROUPS} == terms, "refused entries made an election"

    for group_id in followed:   # the leaders' logs let go of the entries the full node lacks
        assert cluster.compact(cluster.leader(group_id).name, group_id)
    installs = cluster.installs
    room["snapshot"] = True
    cluster.run_until(lambda: cluster.installs >= installs + len(followed), ticks(cluster, 30),
                      "the full node to take the leaders' snapshots")
    room["entries"] = True
    propose_all(cluster, GROUPS, 2, "after")
    settle(cluster, GROUPS)
    assert_same_sequences(cluster, GROUPS)


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_a_follower_tells_a_catch_up_the_group_committed_without_it_from_entries_that_may_need_its_vote(seed):
    """Below half its disk limit a node refuses the first, not the second (broker/node/disk_watch.py)."""
    cluster = SystemCluster(seed)
    cluster.add_groups(GROUPS)
    cluster.run_until(lambda: cluster.all_led(GROUPS), ticks(cluster, 60), "leaders")
    behind = next(name for name in cluster.names if all(cluster.leader(g).name != name for g in GROUPS[:1]))
    kinds: list[str] = []
    room = {"entries": False}
    cluster.hosts[behind].system.admits_replicated = lambda group_id, size, kind: kinds.append(kind) or room["entries"]

    propose_all(cluster, GROUPS[:1], 5, "while-refused")
    others = [h for h in cluster.live_hosts() if h.name != behind]
    cluster.run_until(lambda: all(len(cluster.applied_data(h, GROUPS[0])) >= 5 for h in others),
                      ticks(cluster, 30), "the two other nodes to commit without the refusing one")
    assert UNCOMMITTED_ENTRIES in kinds, f"fresh entries were sent as {set(kinds)}"
    cluster.run_until(lambda: COMMITTED_ENTRIES in kinds, ticks(cluster, 30), "the leader's resend, a catch-up now")
    room["entries"] = True
    settle(cluster, GROUPS)
    assert_same_sequences(cluster, GROUPS)
