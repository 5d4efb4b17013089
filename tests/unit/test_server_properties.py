"""connection.start's server properties: RabbitMQ's cluster_name, one name for a cluster."""
from __future__ import annotations

from warren.broker.amqp.server_properties import cluster_name, server_properties


def test_a_node_alone_is_its_own_cluster_name():
    assert cluster_name("warren@host", []) == "warren@host"


def test_every_process_of_a_node_reports_the_node():
    shards = ["warren@host#0", "warren@host#1"]
    assert {cluster_name(shard, shards) for shard in shards} == {"warren@host"}


def test_every_node_of_a_cluster_reports_its_first_node():
    nodes = ["n1@a#0", "n1@a#1", "n2@b#0", "n2@b#1", "n3@c#0", "n3@c#1"]
    assert {cluster_name(node, nodes) for node in nodes} == {"n1@a"}
    assert cluster_name("n3@c", ["n1@a", "n2@b", "n3@c"]) == "n1@a"


def test_the_accepting_process_is_named_apart():
    properties = server_properties("1.0", "warren@host#1", ["warren@host#0", "warren@host#1"])
    assert (properties["cluster_name"], properties["node"]) == ("warren@host", "warren@host#1")
