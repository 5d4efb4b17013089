"""Space held back on the WAL's disk for the moment the disk is full.

On a full disk the writes that would free space are log entries too: a consumer's
gets and acks, which let its queue's log go, and the next rollover's new WAL file,
which lets the old files and the segments below the release cursors go. Waiting
for room that only they would make, a node stopped for good (chaos seed 4602: its
own queue logs filled the disk; tests/integration/test_disk_reserve.py). So the
node keeps a file of allocated space beside its log (Pebble's "ballast"), not
counted as free by its disk alarm, and gives it up the first time a write finds
the disk full; it is made again once the disk has room for it well above the limit.
"""
from __future__ import annotations

from pathlib import Path

import structlog

from warren.storage.files import RealFiles

log = structlog.get_logger("warren.storage")

RESERVE_FILE = "reserve"


class SpaceReserve:
    def __init__(self, files: RealFiles, directory: Path) -> None:
        self.files = files
        self.path = directory / RESERVE_FILE
        self.held = files.size(self.path)   # a reserve left by an earlier run is kept

    def hold(self, size: int) -> bool:
        """Allocate the reserve (`size` bytes) unless one is held; True if it was made now."""
        if self.held or size <= 0:
            return False
        if not self.files.allocate(self.path, size):
            return False
        self.held = size
        return True

    def release(self, writer: str) -> int:
        """Give the reserve back to the disk for `writer`, which found it full; the bytes
        released (0 if none was held)."""
        released, self.held = self.held, 0
        if released:
            self.files.remove(self.path)
            log.warning("wal.reserve_released", bytes=released, writer=writer,
                        detail="the disk is full: the space held back for this is given up")
        return released
