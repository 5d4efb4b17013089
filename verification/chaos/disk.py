"""Size-limited data directories, so a node's disk can be filled up and freed again.

Each node's data dir becomes the mount point of a small ext4 image (a sparse
file under the run dir, loop-mounted), or, failing that, of a size-limited
tmpfs. Both need root; without it the disk fault is skipped with a message.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

IMAGE_BYTES = 256 * 1024 * 1024
FILLER_NAME = "chaos-disk-filler"
CHUNK_BYTES = 1024 * 1024


class SmallDisks:
    def __init__(self):
        self.mounts: list[Path] = []

    def mount(self, data_dir: Path) -> str | None:
        """Mount a small filesystem on data_dir; the reason when it cannot be done."""
        if os.geteuid() != 0:
            return "not root: cannot mount a size-limited data dir"
        data_dir.mkdir(parents=True, exist_ok=True)
        image = data_dir.parent / "disk.img"
        with open(image, "wb") as out:
            out.truncate(IMAGE_BYTES)
        attempts = [["mkfs.ext4", "-q", "-F", str(image)], ["mount", "-o", "loop", str(image), str(data_dir)]]
        if not all(_run(cmd) for cmd in attempts):
            image.unlink(missing_ok=True)
            if not _run(["mount", "-t", "tmpfs", "-o", f"size={IMAGE_BYTES}", "tmpfs", str(data_dir)]):
                return "neither a loop-mounted ext4 image nor a tmpfs could be mounted"
        self.mounts.append(data_dir)
        return None

    @staticmethod
    def fill(data_dir: Path) -> int:
        """Write a filler file until the filesystem is full; its size."""
        written = 0
        with open(data_dir / FILLER_NAME, "wb") as filler:
            try:
                while True:
                    filler.write(b"\0" * CHUNK_BYTES)
                    filler.flush()
                    written += CHUNK_BYTES
            except OSError:
                pass  # ENOSPC: full, as intended
        return written

    @staticmethod
    def free(data_dir: Path) -> None:
        (data_dir / FILLER_NAME).unlink(missing_ok=True)

    def unmount_all(self) -> None:
        for mount_point in reversed(self.mounts):
            self.free(mount_point)
            _run(["umount", "-l", str(mount_point)])  # lazy: a still-open file must not keep it mounted
        self.mounts.clear()


def _run(command: list[str]) -> bool:
    try:
        return subprocess.run(command, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
