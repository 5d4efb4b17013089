"""Installed, Warren adds one top-level import name, `warren`, and the code imports itself only through it.

The folders stay at the top of the repository (protocol/, broker/, raft/, ...); pyproject.toml maps each under
`warren.` (package-dir). A bare `import broker` would work from a checkout (the repository root is on sys.path)
but not installed, and would shadow or be shadowed by a user's own `config` or `storage` package.
"""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from tests.tidy.imports import INSTALLED_NAME, PROJECT_PACKAGES, REPO


def python_files() -> list[Path]:
    return sorted(path for folder in (*PROJECT_PACKAGES, "tests") for path in (REPO / folder).rglob("*.py"))


def bare_imports(path: Path) -> list[str]:
    """`import broker.x` / `from raft import y` (absolute, without the `warren.` prefix) in one file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        found += [f"{path.relative_to(REPO)}:{node.lineno} imports {name}"
                  for name in names if name.split(".")[0] in PROJECT_PACKAGES]
    return found


def test_the_code_imports_itself_only_under_the_warren_name():
    found = [line for path in python_files() for line in bare_imports(path)]
    assert not found, "import these as warren.<package>... (the installed name):\n" + "\n".join(found)


def package_folders() -> set[str]:
    return {f"{INSTALLED_NAME}." + ".".join(init.parent.relative_to(REPO).parts)
            for package in PROJECT_PACKAGES for init in (REPO / package).rglob("__init__.py")}


def test_pyproject_lists_every_package_folder():
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert set(setuptools["packages"]) == package_folders(), \
        "pyproject.toml [tool.setuptools] packages must name every folder with an __init__.py, and no other"
    assert setuptools["package-dir"] == {f"{INSTALLED_NAME}.{package}": package for package in PROJECT_PACKAGES}


def test_the_wheel_has_one_top_level_name(tmp_path):
    source = tmp_path / "source"      # a copy: building in place would leave build/ and egg-info in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for package in PROJECT_PACKAGES:
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(source)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, f"pip wheel failed:\n{built.stdout}{built.stderr}"
    [wheel] = tmp_path.glob("warren-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist() if not name.split("/")[0].endswith(".dist-info")}
        modules = {name for name in archive.namelist() if name.endswith(".py")}
    assert tops == {INSTALLED_NAME}, f"the wheel installs these top-level names: {sorted(tops)}"
    assert f"{INSTALLED_NAME}/broker/node/server.py" in modules
