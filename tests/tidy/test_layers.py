"""Layer rules between Warren's packages, and no import cycles (tests/tidy/rules.py has the picture)."""
from __future__ import annotations

import pytest

from tests.tidy.imports import chain_text, cycle_path, cycles, imports_of, project_edges, project_modules, reachable
from tests.tidy.known_violations import BROKER_TO_STORAGE, IMPORT_CYCLES
from tests.tidy.ratchet import shrink_only
from tests.tidy.rules import LAYERS


def package(name: str) -> str:
    return name.split(".")[0]


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_a_layer_depends_on_nothing_above_it(layer):
    problems = []
    for name in project_modules():
        if package(name) != layer:
            continue
        for reached, chain in reachable(name, typing_only=True).items():
            if package(reached) in LAYERS[layer]:
                problems.append(f"{name} depends on {reached}: {chain_text(chain)}")
    assert not problems, f"{layer} must not depend on {sorted(LAYERS[layer])}:\n" + "\n".join(problems)


def broker_imports_of_storage() -> dict[tuple[str, str], str]:
    """(broker module, storage module) -> where, for every direct import (raft is the way to storage)."""
    found = {}
    for name in project_modules():
        if package(name) == "broker":
            for edge in project_edges(name):
                if package(edge.target) == "storage":
                    found.setdefault((name, edge.target), edge.describe())
    return found


def test_the_broker_reaches_storage_only_through_raft():
    found = broker_imports_of_storage()
    problems = shrink_only(BROKER_TO_STORAGE, found, "BROKER_TO_STORAGE", describe=lambda pair: found[pair])
    assert not problems, "the broker imports storage directly (go through raft):\n" + "\n".join(problems)


def test_no_new_import_cycles():
    found = cycles()
    recorded = [frozenset(group) for group in IMPORT_CYCLES]
    problems = shrink_only(recorded, found, "IMPORT_CYCLES",
                           describe=lambda group: f"cycle {sorted(group)}: {chain_text(cycle_path(group))}")
    assert not problems, "import cycles changed (a smaller group replacing a recorded one is progress: " \
                         "record it instead):\n" + "\n".join(problems)


def test_no_dynamic_imports():
    """__import__/importlib calls hide edges from every rule above."""
    dynamic = [edge.describe() for name in project_modules() for edge in imports_of(name) if edge.dynamic]
    assert not dynamic, "import modules by name, not by a call:\n" + "\n".join(dynamic)
