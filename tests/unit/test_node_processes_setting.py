"""How many processes a node runs on (broker/node/shards.py node_processes)."""
from __future__ import annotations

import os

import pytest

from warren.broker.node import shards
from warren.config import ConfigError, Settings


def settings(tmp_path, **values) -> Settings:
    return Settings(data_dir=tmp_path, **values)


def test_a_new_data_directory_runs_one_process_per_core_unless_told(tmp_path):
    assert shards.node_processes(settings(tmp_path), recorded=None, cores=16) == 16
    assert shards.node_processes(settings(tmp_path), recorded=None) == (os.cpu_count() or 1)
    assert shards.node_processes(settings(tmp_path, node_processes=3), recorded=None, cores=16) == 3
    assert shards.node_processes(settings(tmp_path, node_processes=1), recorded=None, cores=16) == 1


def test_an_existing_data_directory_keeps_its_count(tmp_path):
    assert shards.node_processes(settings(tmp_path), recorded=2, cores=16) == 2
    assert shards.node_processes(settings(tmp_path), recorded=1, cores=16) == 1
    with pytest.raises(ConfigError, match="was created for node_processes = 2"):
        shards.node_processes(settings(tmp_path, node_processes=1), recorded=2)


def test_more_than_one_process_in_a_cluster_is_refused(tmp_path):
    cluster = [{"name": "a@h", "host": "127.0.0.1", "port": 25001}, {"name": "b@h", "host": "127.0.0.1", "port": 25002}]
    with pytest.raises(ConfigError, match="not supported yet"):
        shards.node_processes(settings(tmp_path, node_processes=2, cluster_nodes=cluster), recorded=None)
    assert shards.node_processes(settings(tmp_path, cluster_nodes=cluster), recorded=None, cores=16) == 1
