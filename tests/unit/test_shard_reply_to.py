"""A direct reply-to address names its shard (broker/node/shard_link.py)."""
from __future__ import annotations

from types import SimpleNamespace

from warren.broker.node.shard_link import ShardLink
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
