"""How long each function and module of the project is, in source lines."""
from __future__ import annotations

import ast
from collections.abc import Iterator

from tests.tidy.imports import REPO, project_modules


def module_lengths() -> dict[str, int]:
    """"broker/queues/fifo.py" -> number of lines."""
    return {str(path.relative_to(REPO)): len(path.read_text().splitlines()) for path in project_modules().values()}


def _functions(node: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{child.name}"
            yield name, (child.end_lineno or child.lineno) - child.lineno + 1
            yield from _functions(child, f"{name}.")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}{child.name}.")
        else:
            yield from _functions(child, prefix)


def function_lengths() -> dict[str, int]:
    """"protocol/connection.py:ServerConnection.receive_data" -> lines from `def` to its last line.

    Decorators are not counted; a nested function counts in its own right and in the one around it.
    Two functions of one qualified name (a property's getter and setter) are known by the longer.
    """
    lengths: dict[str, int] = {}
    for path in project_modules().values():
        relative = path.relative_to(REPO)
        for name, length in _functions(ast.parse(path.read_text(), filename=str(path)), ""):
            key = f"{relative}:{name}"
            lengths[key] = max(length, lengths.get(key, 0))
    return lengths
