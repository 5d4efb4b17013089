"""glibc malloc tunables for the node: huge pages for its heap, and a heap whose top
is not given back and faulted in again with every batch.

A node's working set is large and touched at random: the queue machine's
message table, the Raft logs' location maps, the bodies of a backlog. On the
machine we first measured on (a VM), touching an object allocated a second earlier
cost microseconds once the node had done heavy work; TLB misses, each a walk
of the guest's and the host's page tables, were the likely reason. glibc
(2.35 and later) backs its malloc heap with transparent huge pages when
``glibc.malloc.hugetlb=1`` is set; Python's own small-object allocator is left
as it is, so memory per message does not change.

Every publish's bodies (over 512 B, so on glibc's heap, not Python's arenas) are
freed once written. With glibc's own thresholds (a trim threshold of 128 KiB that
grows only with freed mmap'd blocks) the top of the heap is given back after each
batch and faulted in again by the next: a 2 MB huge page zeroed each time (about
5 % of a backlog's publish on the machine measured since), a fault per 4 KiB page
without huge pages. ``trim_threshold`` and ``mmap_threshold`` at 32 MiB, the
ceiling glibc's own dynamic thresholds reach, keep that top (at most 32 MiB of
free heap is kept, as glibc itself may keep once its thresholds have grown).

The tunables are read when the process starts, so `warren-server` sets them and
executes itself again (the same pid) before doing anything else
(broker/node/launch.py); its shard processes inherit them. Measured in
docs/performance.md. Setting any of them yourself (``GLIBC_TUNABLES=glibc.malloc.hugetlb=0``
for 4 KiB pages, say) leaves all of them to you.
"""
from __future__ import annotations

from collections.abc import Mapping

THRESHOLD_BYTES = 32 * 1024 * 1024
TUNABLES = (("glibc.malloc.hugetlb", "1"),
            ("glibc.malloc.trim_threshold", str(THRESHOLD_BYTES)),
            ("glibc.malloc.mmap_threshold", str(THRESHOLD_BYTES)))


def environment_with_tunables(environ: Mapping[str, str], platform: str) -> dict[str, str] | None:
    """The environment to execute the server again with, or None when there is
    nothing to do: not Linux, or one of the tunables already set (by us, or by the user)."""
    if not platform.startswith("linux"):
        return None
    tunables = environ.get("GLIBC_TUNABLES", "")
    ours = {name for name, _ in TUNABLES}
    if any(item.split("=", 1)[0] in ours for item in tunables.split(":")):
        return None
    env = dict(environ)
    settings = ":".join(f"{name}={value}" for name, value in TUNABLES)
    env["GLIBC_TUNABLES"] = f"{tunables}:{settings}" if tunables else settings
    return env
