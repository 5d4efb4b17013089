"""broker/queues/queue_factory.py: the one place a queue's kind is decided."""
import pytest

from warren.broker.queues.queue import Queue
from warren.broker.queues.queue_factory import (
    Placement,
    is_replicated,
    make_queue,
    place_members,
)
from warren.broker.queues.quorum import QuorumQueue
from warren.broker.routing.vhost import VirtualHost


class _Cluster:
    """What a replicated queue asks of its cluster when it is made on a non-member."""
    node = "n1"

    def owner_key(self, owner: object) -> str:
        return str(owner)


@pytest.mark.parametrize("durable, exclusive, arguments, replicated", [
    (True, False, {}, True),                              # durable classic: a group of one
    (False, False, {}, False),                            # transient
    (True, True, {}, False),                              # exclusive
    (False, False, {"x-queue-type": "quorum"}, True),     # quorum (its properties are checked before)
    (True, False, {"x-queue-type": "classic"}, True),
])
def test_which_queues_are_replicated(durable, exclusive, arguments, replicated):
    assert is_replicated(durable, exclusive, arguments) is replicated


def test_a_queue_without_placement_is_local():
    vhost = VirtualHost("/")
    queue = make_queue(vhost, "q", {"x-max-length": 3}, durable=False, exclusive_owner="conn",
                       auto_delete=True)
    assert type(queue) is Queue and not queue.replicated
    assert (queue.durable, queue.exclusive_owner, queue.auto_delete) == (False, "conn", True)
    assert queue.limits.max_length == 3


def test_a_placed_queue_is_replicated_on_its_group():
    vhost = VirtualHost("/")
    placement = Placement(_Cluster(), "g1", ("n2", "n3"))
    queue = make_queue(vhost, "q", {"x-queue-type": "quorum"}, durable=True, exclusive_owner=None,
                       auto_delete=True, placement=placement)
    assert isinstance(queue, QuorumQueue) and queue.replicated
    assert (queue.group, queue.members, queue.auto_delete, queue.durable) == ("g1", ["n2", "n3"], True, True)
    assert queue.replica is None   # n1 is not a member: it routes to the group, holds no replica


def test_an_exclusive_queue_cannot_be_placed_on_a_group():
    with pytest.raises(ValueError):
        make_queue(VirtualHost("/"), "q", {}, durable=True, exclusive_owner="conn", auto_delete=False,
                   placement=Placement(_Cluster(), "g1", ("n1",)))


@pytest.mark.parametrize("arguments, node, members", [
    ({"x-queue-type": "quorum"}, "n1", ["n1", "n2", "n3"]),                  # quorum_cluster_size (3)
    ({"x-queue-type": "quorum"}, "n4", ["n4", "n5", "n1"]),                  # the declaring node first, wrapping
    ({"x-queue-type": "quorum", "x-quorum-initial-group-size": 9}, "n2", ["n2", "n3", "n4", "n5", "n1"]),
    ({"x-queue-type": "quorum", "x-quorum-initial-group-size": 1}, "n3", ["n3"]),
    ({}, "n3", ["n3"]),                                                      # a durable classic: a group of one
    ({"x-queue-type": "classic", "x-quorum-initial-group-size": 3}, "n5", ["n5"]),
])
def test_place_members_starts_at_the_declaring_node(arguments, node, members):
    assert place_members(arguments, node, ["n1", "n2", "n3", "n4", "n5"], 3) == members


SHARDS = ["n#0", "n#1", "n#2"]


@pytest.mark.parametrize("hosted, declaring, placed", [
    ({}, "n#1", "n#1"),                              # none anywhere: where it was declared
    ({"n#1": 1}, "n#1", "n#0"),                      # the declaring shard has more: the first with fewest
    ({"n#0": 2, "n#1": 2, "n#2": 1}, "n#0", "n#2"),
    ({"n#0": 1, "n#1": 1, "n#2": 1}, "n#2", "n#2"),  # among equals the declaring one
    ({"n#0": 3, "n#9": 7}, "n#1", "n#1"),            # shards not listed count none; unknown names count nothing
    (None, "n#2", "n#2"),                            # connections do not move: the declaring shard
])
def test_a_sharded_node_puts_a_new_queue_on_the_shard_with_fewest(hosted, declaring, placed):
    assert place_members({}, declaring, SHARDS, 3, hosted) == [placed]
    # one node: a quorum queue has one member whatever its size, replicas on one disk buy nothing
    assert place_members({"x-queue-type": "quorum", "x-quorum-initial-group-size": 3}, declaring, SHARDS, 3,
                         hosted) == [placed]


CLUSTER_SHARDS = [f"{node}#{k}" for node in ("a", "b", "c", "d") for k in range(2)]


@pytest.mark.parametrize("arguments, declaring, hosted, members", [
    ({"x-queue-type": "quorum"}, "b#0", {}, ["b#0", "c#0", "d#0"]),       # distinct nodes, one shard index
    ({"x-queue-type": "quorum"}, "d#1", None, ["d#1", "a#1", "b#1"]),     # the declaring node first, wrapping
    ({"x-queue-type": "quorum"}, "a#0", {"a#0": 1, "b#0": 1, "c#0": 1}, ["a#1", "b#1", "c#1"]),
    # the load is the cluster's per shard index: index 1 hosts more over the cluster
    ({"x-queue-type": "quorum"}, "a#0", {"a#0": 1, "b#1": 1, "c#1": 1}, ["a#0", "b#0", "c#0"]),
    ({"x-queue-type": "quorum", "x-quorum-initial-group-size": 9}, "c#1", {}, ["c#1", "d#1", "a#1", "b#1"]),
    ({}, "c#1", {"c#1": 1}, ["c#0"]),                                     # a durable classic: one shard
])
def test_the_members_on_a_cluster_of_sharded_nodes_are_one_shard_of_distinct_nodes(arguments, declaring, hosted,
                                                                                  members):
    assert place_members(arguments, declaring, CLUSTER_SHARDS, 3, hosted) == members
