"""A direct reply-to address names its shard (broker/node/shard_link.py)."""
from __future__ import annotations

from types import SimpleNamespace

from warren.broker.node.shard_link import ACK, EXCHANGE_DELETE, SYNC, ShardLink
from warren.config import ClusterNode


def link(shard: int, count: int = 3) -> ShardLink:
    nodes = [ClusterNode(name=f"w@h#{k}", host="127.0.0.1", port=25000 + k) for k in range(count)]
    return ShardLink(SimpleNamespace(settings=SimpleNamespace(node_name=f"w@h#{shard}", cluster_nodes=nodes)), shard)


def test_a_reply_address_leads_to_the_shard_that_made_it():
    token = link(2).reply_token()
    assert link(0).reply_peer(token) == "w@h#2"
    assert link(1).reply_peer(token) == "w@h#2"
    assert link(2).reply_peer(token) is None   # its own: delivered here


def test_an_address_of_no_shard_is_not_forwarded():
    for token in ("plain", "abc_9", "abc_", "abc_x1"):
        assert link(0).reply_peer(token) is None


def test_a_transient_exchange_deleted_is_answered_only_once_every_running_shard_dropped_it():
    # exchange.delete-ok before the other shards dropped it let a passive declare on another
    # shard's connection, made after the delete-ok, still find the exchange (seen in CI)
    home = link(0, count=2)
    home.broker.cluster = SimpleNamespace(running_peers=lambda: ["w@h#1"], frame_soon=lambda: None)
    home.exchange_homes[("/", "rpc-x")] = home.node
    answered = []
    home.exchange_deleted("/", "rpc-x", lambda: answered.append(True))
    [message] = home.take_outbox()["w@h#1"]
    assert message[:3] == [EXCHANGE_DELETE, "/", "rpc-x"] and not answered
    home.on_messages("w@h#1", [[ACK, message[3]]])
    assert answered == [True]


def test_deleting_an_exchange_no_other_shard_knows_is_answered_at_once():
    home = link(0, count=2)
    home.broker.cluster = SimpleNamespace(running_peers=lambda: ["w@h#1"], frame_soon=lambda: None)
    answered = []
    home.exchange_deleted("/", "never-shared", lambda: answered.append(True))
    assert answered == [True] and home.take_outbox() == {}


def test_synced_waits_for_every_running_shard_to_have_handled_what_was_sent_before():
    home = link(0, count=3)
    home.broker.cluster = SimpleNamespace(running_peers=lambda: ["w@h#1", "w@h#2"], frame_soon=lambda: None)
    synced = []
    home.synced(lambda: synced.append(True))
    sent = home.take_outbox()
    assert sorted(sent) == ["w@h#1", "w@h#2"] and not synced
    home.on_messages("w@h#1", [[ACK, sent["w@h#1"][-1][-1]]])
    assert not synced, "answered before shard 2 handled the deletion"
    home.on_messages("w@h#2", [[ACK, sent["w@h#2"][-1][-1]]])
    assert synced == [True]


def test_a_shard_acks_a_sync_after_handling_what_came_before_it():
    peer = link(1, count=2)
    peer.broker.cluster = SimpleNamespace(running_peers=lambda: ["w@h#0"], frame_soon=lambda: None)
    peer.on_messages("w@h#0", [[SYNC, 7]])
    assert peer.take_outbox() == {"w@h#0": [[ACK, 7]]}
