"""How many processes a node runs on (broker/node/shards.py node_processes)."""
from __future__ import annotations

import os

import pytest

from warren.broker.node import shards
from warren.broker.node.usable_cores import usable_cores
from warren.config import ConfigError, Settings


def settings(tmp_path, **values) -> Settings:
    return Settings(data_dir=tmp_path, **values)


def test_a_new_data_directory_runs_one_process_per_core_unless_told(tmp_path):
    assert shards.node_processes(settings(tmp_path), recorded=None, cores=16) == 16
    assert shards.node_processes(settings(tmp_path), recorded=None) == usable_cores()
    assert shards.node_processes(settings(tmp_path, node_processes=3), recorded=None, cores=16) == 3
    assert shards.node_processes(settings(tmp_path, node_processes=1), recorded=None, cores=16) == 1


def test_an_existing_data_directory_keeps_its_count(tmp_path):
    assert shards.node_processes(settings(tmp_path), recorded=2, cores=16) == 2
    assert shards.node_processes(settings(tmp_path), recorded=1, cores=16) == 1
    with pytest.raises(ConfigError, match="was created for node_processes = 2"):
        shards.node_processes(settings(tmp_path, node_processes=1), recorded=2)


def test_a_node_of_a_cluster_runs_one_process_per_core_unless_told(tmp_path):
    """Nodes on one host at adjacent cluster ports (RabbitMQ's local layout) run shards too:
    a node's shards share its one cluster port (broker/node/shared_cluster_port.py)."""
    cluster = [{"name": "a@h", "host": "127.0.0.1", "port": 25001}, {"name": "b@h", "host": "127.0.0.1", "port": 25002}]
    assert shards.node_processes(settings(tmp_path, cluster_nodes=cluster), recorded=None, cores=16) == 16
    assert shards.node_processes(settings(tmp_path, node_processes=4, cluster_nodes=cluster), recorded=None) == 4
    assert shards.node_processes(settings(tmp_path, cluster_nodes=cluster), recorded=1, cores=16) == 1


def test_the_shards_of_a_cluster_make_one_cluster_of_every_nodes_shards(tmp_path):
    cluster = [{"name": "a@h", "host": "10.0.0.1", "port": 25672}, {"name": "b@h", "host": "10.0.0.2", "port": 25672}]
    node = settings(tmp_path, node_name="b@h", cluster_nodes=cluster, cluster_secret="s3cret", cluster_port=25672,
                    quorum_cluster_size=3)
    plan = shards.ShardPlan(1, 2, os.getpid(), 25672, [], [], [], [None, None], [], [], [], [])
    shard = plan.shard_settings(node)
    assert (shard.node_name, shard.cluster_port, shard.data_dir) == ("b@h#1", 25672, tmp_path / "shard-1")
    assert [(n.name, n.host, n.port) for n in shard.cluster_nodes] == [
        ("a@h#0", "10.0.0.1", 25672), ("a@h#1", "10.0.0.1", 25672),
        ("b@h#0", "10.0.0.2", 25672), ("b@h#1", "10.0.0.2", 25672)]
    assert shard.quorum_cluster_size == 3
    # a node's WAL size and memory watermark are its shards' sum
    assert (shard.wal_max_size_bytes, shard.memory_high_watermark_bytes) == (
        node.wal_max_size_bytes // 2, node.memory_high_watermark_bytes // 2)
    # bound to the shard count: a node with another count fails the handshake
    secret = shard.cluster_secret.get_secret_value()
    assert secret == shards.shard_secret("s3cret", 2) != shards.shard_secret("s3cret", 3)
    assert "s3cret" not in secret


def test_what_a_data_directory_holds_says_how_many_processes_made_it(tmp_path):
    assert shards.recorded_processes(tmp_path) is None                     # new
    (tmp_path / "lost+found").mkdir()    # the root of a filesystem of its own (a volume, a disk) is still new
    (tmp_path / "warren.lock").touch()
    assert shards.recorded_processes(tmp_path) is None
    (tmp_path / "log").mkdir()           # a single process's node log
    assert shards.recorded_processes(tmp_path) == 1
    (tmp_path / "shards").write_text("4\n")
    assert shards.recorded_processes(tmp_path) == 4
