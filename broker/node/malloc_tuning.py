"""Transparent huge pages for the node's larger allocations.

A node's working set is large and touched at random: the queue machine's
message table, the Raft logs' location maps, the bodies of a backlog. On the
machine we measure on (a VM), touching an object allocated a second earlier
costs microseconds once the node has done heavy work; TLB misses, each a walk
of the guest's and the host's page tables, are the likely reason. glibc
(2.35 and later) backs its malloc heap with transparent huge pages when the
tunable ``glibc.malloc.hugetlb=1`` is set; Python's own small-object
allocator is left as it is, so memory per message does not change. The
tunable is read when the process starts, so `warren-server` sets it and
executes itself again (the same pid) before doing anything else; its shard
processes inherit it. Measured in docs/performance.md.

Set ``GLIBC_TUNABLES=glibc.malloc.hugetlb=0`` to keep 4 KiB pages.
"""
from __future__ import annotations

from collections.abc import Mapping

HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb"


def environment_with_huge_pages(environ: Mapping[str, str], platform: str) -> dict[str, str] | None:
    """The environment to execute the server again with, or None when there is
    nothing to do: not Linux, or the tunable already set (by us, or to 0 by the user)."""
    if not platform.startswith("linux"):
        return None
    tunables = environ.get("GLIBC_TUNABLES", "")
    if any(item.split("=", 1)[0] == HUGE_PAGES_TUNABLE for item in tunables.split(":")):
        return None
    env = dict(environ)
    setting = f"{HUGE_PAGES_TUNABLE}=1"
    env["GLIBC_TUNABLES"] = f"{tunables}:{setting}" if tunables else setting
    return env
