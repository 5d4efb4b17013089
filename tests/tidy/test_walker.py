"""The import walker itself: the rules built on it can only fail if it sees every kind of import."""
from __future__ import annotations

from pathlib import Path

from tests.tidy.imports import (
    _strongly_connected,
    cycle_path,
    imports_in_source,
    imports_of,
    project_modules,
    reachable,
)

SAMPLE = '''
from typing import TYPE_CHECKING
import os.path
from . import sibling, NAME
from .. import codec
from ..constants import FRAME_END

if TYPE_CHECKING:
    import random
else:
    import json

def later():
    import time
    return __import__("socket"), importlib.import_module(name)
'''


def sample_imports():
    known = {"pkg.sub.sibling", "pkg.codec"}
    path = Path("pkg/sub/mod.py")
    return {(i.target, i.line, i.deferred, i.typing_only, i.dynamic)
            for i in imports_in_source("pkg.sub.mod", path, SAMPLE, known)}


def test_the_walker_sees_every_kind_of_import():
    assert sample_imports() == {
        ("typing", 2, False, False, False),
        ("os.path", 3, False, False, False),
        ("pkg.sub", 4, False, False, False),          # NAME is taken from the package itself
        ("pkg.sub.sibling", 4, False, False, False),  # a submodule named in a from-import
        ("pkg.codec", 5, False, False, False),
        ("pkg.constants", 6, False, False, False),
        ("random", 9, False, True, False),            # TYPE_CHECKING only
        ("json", 11, False, False, False),            # its else branch runs
        ("time", 14, True, False, False),             # inside a function
        ("socket", 15, True, False, True),            # __import__ with a literal
        ("?", 15, True, False, True),                 # importlib with a computed name
    }


def test_the_walker_reads_the_whole_project():
    assert len(project_modules()) >= 45
    assert {"broker.queues.fifo", "raft.core", "storage.wal", "protocol", "config.settings"} <= set(project_modules())
    assert any(edge.target == "raft.core" for edge in imports_of("raft.system"))
    deferred = [edge for edge in imports_of("broker.node.cluster")
                if edge.target == "broker.queues.quorum" and edge.deferred]
    assert deferred, "broker/node/cluster.py imports broker.queues.quorum inside a function"


def test_reaching_a_module_reaches_its_package_and_what_it_imports():
    reached = reachable("broker.admin.auth")
    assert {"config", "config.settings", "protocol.codec", "protocol"} <= set(reached)
    # broker/admin/auth.py imports config, whose __init__ imports config.settings
    assert [edge.target for edge in reached["config.settings"]] == ["config", "config.settings"]


def test_cycles_are_found_and_drawn():
    graph = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": [], "e": ["e"]}
    groups = _strongly_connected(graph)
    assert frozenset({"a", "b", "c"}) in groups and frozenset({"d"}) in groups
    ring = cycle_path(frozenset({"broker.node.cluster", "broker.queues.quorum"}))
    assert [edge.target for edge in ring] == ["broker.queues.quorum", "broker.node.cluster"]
