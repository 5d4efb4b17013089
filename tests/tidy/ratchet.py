"""Comparing what the code breaks today with tests/tidy/known_violations.py, so the lists only shrink."""
from __future__ import annotations

from collections.abc import Callable, Collection, Hashable
from typing import TypeVar

Item = TypeVar("Item", bound=Hashable)
LISTS = "tests/tidy/known_violations.py"


def shrink_only(recorded: Collection[Item], found: Collection[Item], list_name: str,
                describe: Callable[[Item], str] = str) -> list[str]:
    """Problems: each violation found but not recorded, and each recorded one no longer found."""
    problems = [f"new: {describe(item)} (fix it; {list_name} in {LISTS} may only shrink)"
                for item in found if item not in recorded]
    problems += [f"gone: {_shown(item)} no longer happens: delete it from {list_name} in {LISTS}"
                 for item in recorded if item not in found]
    return problems


def size_ratchet(recorded: dict[str, int], sizes: dict[str, int], limit: int, list_name: str,
                 unit: str = "lines") -> list[str]:
    """Problems with the things over `limit` (in `unit`): new ones, grown ones, and recorded sizes to lower."""
    problems = []
    for name, size in sorted(sizes.items()):
        allowed = recorded.get(name, limit)
        if size > allowed:
            grew = f"grew from {allowed}" if name in recorded else f"is over the limit of {limit}"
            problems.append(f"{name} is {size} {unit}: it {grew}; mend it rather than raise the number")
        elif name in recorded and size < allowed:
            new = "delete its entry" if size <= limit else f"lower its size to {size}"
            problems.append(f"{name} shrank from {allowed} to {size} {unit}: {new} in {list_name} in {LISTS}")
    problems += [f"{name} is gone (renamed or moved?): delete it from {list_name} in {LISTS}"
                 for name in sorted(set(recorded) - set(sizes))]
    return problems


def _shown(item: object) -> str:
    return repr(sorted(item)) if isinstance(item, frozenset) else repr(item)
