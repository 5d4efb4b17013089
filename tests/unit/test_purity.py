"""The pure cores do no I/O and read no clock or global RNG (STYLE.md rule 1).

Checked on the source with ast, so an import hidden inside a function counts
too. A pure module may import another of Warren's modules only if that one is
pure as well.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = {"asyncio", "socket", "time", "os", "random", "selectors", "threading", "subprocess"}
PURE_MODULES = sorted(
    [p.relative_to(REPO) for p in (REPO / "protocol").glob("*.py")]
    + [Path("broker") / name for name in ("fifo.py", "quorum_machine.py", "exchanges.py", "confirms.py", "arguments.py",
                                          "metadata_machine.py", "metadata_state.py", "metadata_commands.py",
                                          "metadata_effects.py", "definition_checks.py")]
)
PURE_NAMES = {".".join(p.with_suffix("").parts) for p in PURE_MODULES} | {"protocol", "broker"}
OWN_PACKAGES = {"protocol", "broker", "raft", "storage", "config"}


def imported_modules(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: resolve against the module's package
                package = path.relative_to(REPO).parent.parts
                base = ".".join(package[:len(package) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.append((module, node.lineno))
            # "from package import module" imports the module too
            found += [(f"{module}.{alias.name}", node.lineno) for alias in node.names]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            found.append(("__import__", node.lineno))
    return found


def test_the_pure_module_list_is_not_empty():
    assert len(PURE_MODULES) >= 7, f"expected protocol/*.py and four broker modules, found {PURE_MODULES}"
    for path in PURE_MODULES:
        assert (REPO / path).exists(), f"pure module {path} does not exist"


@pytest.mark.parametrize("path", PURE_MODULES, ids=str)
def test_pure_module_imports_no_io_clock_or_global_random(path):
    for module, line in imported_modules(REPO / path):
        top = module.split(".")[0]
        assert top not in FORBIDDEN, f"{path}:{line} imports {module!r}; pure cores must not import {sorted(FORBIDDEN)}"
        assert module not in ("importlib", "__import__"), f"{path}:{line} imports dynamically ({module})"


@pytest.mark.parametrize("path", PURE_MODULES, ids=str)
def test_pure_module_imports_only_pure_warren_modules(path):
    for module, line in imported_modules(REPO / path):
        parts = module.split(".")
        if parts[0] not in OWN_PACKAGES:
            continue
        # "from protocol.constants import X" also yields "protocol.constants.X": judge the module part.
        candidates = {".".join(parts[:n]) for n in range(1, len(parts) + 1)}
        assert candidates & PURE_NAMES and (module in PURE_NAMES or ".".join(parts[:-1]) in PURE_NAMES), (
            f"{path}:{line} imports {module!r}, which is not one of the pure modules {sorted(PURE_NAMES)}")


def test_the_checker_sees_a_forbidden_import(tmp_path):
    """The test must be able to fail: imports inside functions and from-imports are found."""
    source = tmp_path / "sample.py"
    source.write_text("def f():\n    import time\n    from os import path\n    return __import__('socket')\n")
    found = {module for module, _ in imported_modules(source)}
    assert {"time", "os", "os.path", "__import__"} <= found, f"checker missed imports: {found}"
