"""The pure cores do no I/O and read no clock or global RNG (STYLE.md rule 1), nor does anything they import.

Imports under `if TYPE_CHECKING:` never run and are allowed (`random.Random` as a type, say); imports
inside functions count.
"""
from __future__ import annotations

import ast

import pytest

from tests.tidy.imports import ancestors, chain_text, imports_of, module_path, project_edges, project_modules, reachable
from tests.tidy.rules import EXTRA_IMPURE, IMPURE_STDLIB, NO_DIRECT_IO, pure_cores


def impure_imports(name: str, forbidden: frozenset[str]) -> list[str]:
    return [edge.describe() for edge in imports_of(name) if not edge.typing_only and edge.top in forbidden]


def test_the_pure_modules_exist():
    missing = [name for name in [*pure_cores(), *NO_DIRECT_IO] if name not in project_modules()]
    assert not missing, f"tests/tidy/rules.py names modules that do not exist: {missing}"
    assert len(pure_cores()) >= 17, pure_cores()


@pytest.mark.parametrize("name", pure_cores())
def test_a_pure_core_and_all_it_imports_do_no_io(name):
    forbidden = IMPURE_STDLIB | EXTRA_IMPURE.get(name, frozenset())
    problems = []
    for reached, chain in reachable(name).items():
        for found in impure_imports(reached, forbidden):
            problems.append(f"{found}" + (f", reached by {chain_text(chain)}" if chain else ""))
    assert not problems, f"pure core {name} must not import {sorted(forbidden)}:\n" + "\n".join(problems)


@pytest.mark.parametrize("name", pure_cores())
def test_a_pure_core_imports_only_pure_cores(name):
    """Even one without I/O today: a pure core's imports are part of what tests and simulations rely on."""
    allowed = set(pure_cores()) | {package for core in pure_cores() for package in ancestors(core)}
    problems = [edge.describe() for edge in project_edges(name, typing_only=False) if edge.target not in allowed]
    assert not problems, f"pure core {name} imports modules that are not pure cores (tests/tidy/rules.py):\n" + \
        "\n".join(problems)


@pytest.mark.parametrize("name", NO_DIRECT_IO)
def test_a_module_without_io_of_its_own_imports_none(name):
    problems = impure_imports(name, IMPURE_STDLIB)
    assert not problems, f"{name} must not import {sorted(IMPURE_STDLIB)}:\n" + "\n".join(problems)


def global_rng_calls(name: str) -> list[str]:
    """Calls like random.random() or random.randint(): the module-level RNG (a random.Random is handed in)."""
    tree = ast.parse(project_modules()[name].read_text())
    return [f"{module_path(name)}:{node.lineno} calls random.{node.func.attr}()" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "random"
            and node.func.attr != "Random"]


@pytest.mark.parametrize("name", [*pure_cores(), *NO_DIRECT_IO])
def test_a_pure_core_uses_no_global_random(name):
    assert not global_rng_calls(name), "\n".join(global_rng_calls(name))
