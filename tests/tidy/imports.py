"""Warren's one import walker: what each module of the project imports, read with ast.

Every import statement counts, wherever it is: at module level, inside a
function (a deferred import still ties the two modules together) or under
`if TYPE_CHECKING:` (marked, because it never runs). Relative imports are
resolved against the importing module's package. `__import__(...)` and
`importlib.import_module(...)` calls are recorded as dynamic imports: the
walker cannot follow them, so the tidy tests forbid them.

Nothing of the project is imported or run: the answers come from the source.
"""
from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The installable packages' folders (pyproject's [tool.setuptools]); tests/ is not one of them...
PROJECT_PACKAGES = ("protocol", "broker", "raft", "storage", "config", "verification")
# ...installed under this one name (pyproject's package-dir): `import warren.raft.core` reads raft/core.py.
INSTALLED_NAME = "warren"


@dataclass(frozen=True, slots=True)
class Import:
    """One module named by one import statement (or dynamic import call)."""
    importer: str           # the importing module, dotted ("broker.node.durability")
    target: str             # the imported module, dotted and absolute ("storage.wal", "os.path")
    line: int
    deferred: bool = False      # inside a function: runs when the function does
    typing_only: bool = False   # under `if TYPE_CHECKING:`: never runs
    dynamic: bool = False       # `__import__`/`importlib` call: target is the literal argument or "?"

    @property
    def top(self) -> str:
        return self.target.split(".")[0]

    @property
    def where(self) -> str:
        """`broker/node/durability.py:40`, for messages."""
        return f"{module_path(self.importer)}:{self.line}"

    def describe(self) -> str:
        kind = " (dynamic)" if self.dynamic else " (TYPE_CHECKING)" if self.typing_only else \
            " (inside a function)" if self.deferred else ""
        return f"{self.where} imports {self.target}{kind}"


def source_name(imported: str) -> str:
    """`warren.broker.queues.fifo` (how the code imports it, installed) -> `broker.queues.fifo` (its folder)."""
    head, _, rest = imported.partition(".")
    return rest if head == INSTALLED_NAME and rest.split(".")[0] in PROJECT_PACKAGES else imported


def module_name(path: Path) -> str:
    """`broker/queues/fifo.py` -> `broker.queues.fifo`; `raft/__init__.py` -> `raft`."""
    parts = path.resolve().relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def project_modules() -> dict[str, Path]:
    """Every module of the project, by dotted name."""
    found: dict[str, Path] = {}
    for package in PROJECT_PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            found[module_name(path)] = path
    return found


def module_path(name: str) -> str:
    path = project_modules().get(name)
    return str(path.relative_to(REPO)) if path else name.replace(".", "/") + ".py"


def is_project(name: str) -> bool:
    return name.split(".")[0] in PROJECT_PACKAGES


def package_of(name: str, path: Path) -> str:
    """The package a relative import in this module is resolved against."""
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _dynamic_call(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id in ("__import__", "import_module")
    if isinstance(func, ast.Attribute):
        return func.attr in ("__import__", "import_module")
    return False


class _Walker(ast.NodeVisitor):
    """Collects the imports of one module, knowing whether each sits in a function or TYPE_CHECKING block."""

    def __init__(self, name: str, path: Path, known: Iterable[str]) -> None:
        self.name, self.path, self.known = name, path, set(known)
        self.found: list[Import] = []
        self.depth_in_function = 0
        self.depth_in_typing = 0

    def add(self, target: str, line: int, dynamic: bool = False) -> None:
        target = source_name(target)
        self.found.append(Import(self.name, target, line, self.depth_in_function > 0,
                                 self.depth_in_typing > 0, dynamic))

    def visit_function(self, node: ast.AST) -> None:
        self.depth_in_function += 1
        self.generic_visit(node)
        self.depth_in_function -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = visit_function

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            self.generic_visit(node)
            return
        self.visit(node.test)
        self.depth_in_typing += 1
        for child in node.body:
            self.visit(child)
        self.depth_in_typing -= 1
        for child in node.orelse:      # the else branch of `if TYPE_CHECKING:` is what runs
            self.visit(child)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = source_name(self.absolute(node))
        # "from broker.queues import fifo" imports the module broker.queues.fifo; "from broker.queues.fifo
        # import X" only a name of broker.queues.fifo. The package itself counts only when a name is taken
        # from it (its __init__ runs either way: `reachable` adds the packages around every module it reaches).
        submodules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in self.known]
        if len(submodules) < len(node.names):
            self.add(base, node.lineno)
        for submodule in submodules:
            self.add(submodule, node.lineno)

    def absolute(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        package = package_of(self.name, self.path).split(".")
        base = ".".join(package[:len(package) - node.level + 1])
        return f"{base}.{node.module}" if node.module else base

    def visit_Call(self, node: ast.Call) -> None:
        if _dynamic_call(node):
            argument = node.args[0] if node.args else None
            target = argument.value if isinstance(argument, ast.Constant) and isinstance(argument.value, str) else "?"
            self.add(target, node.lineno, dynamic=True)
        self.generic_visit(node)


def imports_in_source(name: str, path: Path, source: str | None = None,
                      known: Iterable[str] = ()) -> list[Import]:
    """The imports of one file (source given for tests of the walker itself)."""
    text = path.read_text() if source is None else source
    walker = _Walker(name, path, known)
    walker.visit(ast.parse(text, filename=str(path)))
    return walker.found


@cache
def imports_of(name: str) -> tuple[Import, ...]:
    """What module `name` (a project module) names in its import statements, in source order."""
    return tuple(imports_in_source(name, project_modules()[name], known=project_modules()))


def project_edges(name: str, *, typing_only: bool = True) -> Iterator[Import]:
    """The imports of `name` that land on another project module (running ones only if typing_only=False)."""
    modules = project_modules()
    for found in imports_of(name):
        if found.target in modules and found.target != name and (typing_only or not found.typing_only):
            yield found


def ancestors(name: str) -> list[str]:
    """The packages whose __init__ runs before `name` does: raft.core -> [raft]."""
    parts = name.split(".")
    return [".".join(parts[:n]) for n in range(1, len(parts))]


def reachable(name: str, *, typing_only: bool = False) -> dict[str, list[Import]]:
    """Every project module `name` pulls in, transitively, each with the chain of imports that gets there.

    Importing a module runs its packages' __init__ too, so those count as reached (with the chain of the
    module inside them). typing_only=False (the default) follows only imports that run.
    """
    chains: dict[str, list[Import]] = {name: []}
    queue = [name]
    while queue:
        current = queue.pop(0)
        for found in project_edges(current, typing_only=typing_only):
            for reached in [*ancestors(found.target), found.target]:
                if reached in project_modules() and reached not in chains:
                    chains[reached] = [*chains[current], found]
                    queue.append(reached)
    return chains


def chain_text(chain: list[Import]) -> str:
    return " -> ".join(found.describe() for found in chain) or "(directly)"


def cycles(*, typing_only: bool = False) -> list[frozenset[str]]:
    """The groups of modules that import each other in a ring (strongly connected components of two or more).

    typing_only=False: an import under TYPE_CHECKING never runs, so it closes no cycle; one inside a
    function does run (later), and does.
    """
    graph = {name: sorted({e.target for e in project_edges(name, typing_only=typing_only)})
             for name in project_modules()}
    return [group for group in _strongly_connected(graph) if len(group) > 1]


def _strongly_connected(graph: dict[str, list[str]]) -> list[frozenset[str]]:
    """Tarjan's algorithm, iteratively (no recursion limit to worry about)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[frozenset[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(graph[successor])))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    groups.append(frozenset(group))
    return groups


def cycle_path(group: frozenset[str], *, typing_only: bool = False) -> list[Import]:
    """One concrete ring through a cycle group, as imports with their lines (for messages)."""
    start = min(group)
    chains: dict[str, list[Import]] = {start: []}
    queue = [start]
    while queue:
        current = queue.pop(0)
        for found in project_edges(current, typing_only=typing_only):
            if found.target == start:
                return [*chains[current], found]
            if found.target in group and found.target not in chains:
                chains[found.target] = [*chains[current], found]
                queue.append(found.target)
    return []
