"""RaftSystem.campaign: the node campaigns now for one group (and wakes it)."""
from __future__ import annotations

import random

from warren.raft.messages import Role
from warren.raft.system import RaftSystem


def system(name: str, sent: list) -> RaftSystem:
    persisted: list[int] = []

    def persist(items) -> int:
        persisted.append(len(persisted) + 1)
        host.on_persisted(persisted[-1])
        return persisted[-1]
    host = RaftSystem(name, random.Random(1), persist, lambda peer, frame: sent.append((peer, frame)),
                      lambda group_id, entry: None)
    return host


def test_a_single_member_group_leads_at_once_and_a_quiet_group_wakes_to_campaign():
    sent: list = []
    alone = system("a", sent)
    alone.add_group("g", ["a"])
    assert alone.campaign("g") and not alone.campaign("missing")
    alone.process_ready()
    assert alone.role("g") == Role.LEADER
    three = system("a", sent)
    three.add_group("h", ["a", "b", "c"])
    three.process_ready()
    three.quiesce(three.groups["h"])
    assert three.campaign("h")
    assert not three.is_quiescent("h") and three.role("h") == Role.PRE_CANDIDATE
    three.process_ready()
    assert sorted(peer for peer, _ in sent) == ["b", "c"]   # the pre-vote requests
    assert three.status("h").last_applied == 0
