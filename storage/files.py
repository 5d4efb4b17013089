"""The file layer under the WAL and segments, so tests can inject disk faults.

``RealFiles`` is the operating system. Tests substitute a fake with the same
methods that tears writes, loses unsynced data, flips bits or runs out of
space. Paths are ``pathlib.Path``.
"""
from __future__ import annotations

import contextlib
import mmap
import os
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path

# The WAL file grows in steps allocated ahead of its writes (fallocate): an fdatasync
# that does not change the file's size has no inode to journal (ext4). A batch of a few
# hundred bytes, as at 5k msg/s: 0.20 ms appended, 0.14 ms into allocated space.
PREALLOCATE_STEP_BYTES = 4 * 1024 * 1024

# A large file is freed a step at a time (`shred`): unlinking 64 MiB at once held this
# machine's concurrent WAL fdatasyncs up to 17 ms, 700 MiB up to 62 ms (ext4 frees the
# extents in the journal the syncs wait for); 8 MiB steps 5 ms apart, at most 4 ms.
SHRED_STEP_BYTES = 8 * 1024 * 1024
SHRED_PAUSE_SECONDS = 0.005

# pwritev takes at most this many buffers a call (Linux's IOV_MAX).
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


class AppendHandle:
    """An open file that only grows; ``sync`` makes what was written durable.

    With ``preallocate_bytes``, space beyond ``size`` (the end of what was
    written) is allocated ahead, in steps, up to that size of the file (the WAL's
    rollover size: past it, plain appends), so the file on disk may end in
    zeros: ``close`` cuts them off, and a recovery after a crash reads them as
    the end of the file (records.scan). The first write (the file header) goes
    before anything is allocated, so a file is never zeros without one."""

    def __init__(self, path: Path, preallocate_bytes: int = 0):
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o640)
        self.size = os.fstat(self._fd).st_size   # where the next write goes
        self.allocated = self.size
        self._allocate_up_to = preallocate_bytes
        self.closed = False

    def write(self, data: bytes) -> None:
        self.write_pieces((data,))

    def write_pieces(self, pieces: Sequence[bytes]) -> None:
        """Append the pieces one after another, as one write of their concatenation,
        without making it (a WAL batch's records, each record's head and its entry's
        data: a published body is not copied again on its way to the disk)."""
        end = self.size + sum(map(len, pieces))
        if self.allocated < end < self._allocate_up_to and self.size:
            self._allocate(min(end + PREALLOCATE_STEP_BYTES, self._allocate_up_to))
        for start in range(0, len(pieces), IOV_MAX):
            self._pwritev(list(pieces[start:start + IOV_MAX]))

    def _pwritev(self, buffers: list) -> None:
        if not buffers:
            return
        written = os.pwritev(self._fd, buffers, self.size)
        self.size += written
        if written == sum(map(len, buffers)):
            return
        for position, buffer in enumerate(buffers):   # a short write goes on where it stopped
            if written < len(buffer):
                rest = buffers[position:]
                rest[0] = memoryview(buffer)[written:]
                self._pwritev(rest)
                return
            written -= len(buffer)

    def _allocate(self, end: int) -> None:
        try:
            os.posix_fallocate(self._fd, self.allocated, end - self.allocated)
        except OSError:   # no room to allocate ahead, or no fallocate: plain appends from here
            self._allocate_up_to = 0
            return
        self.allocated = end

    def sync(self) -> None:
        os.fdatasync(self._fd)

    def truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)
        self.size = self.allocated = size

    def close(self) -> None:
        self.closed = True
        try:
            if self.allocated > self.size:
                # not synced: a crash leaves the zeros, which recovery reads as the end; so does a failed cut
                # (records.scan, scan_heads), which must not fail the close of a rollover's old file
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self.size)
        finally:
            os.close(self._fd)


# Records are read back in the order they were written (a backlog drains front to
# back), so reads go through a small cache of file blocks: one pread per block.
READ_BLOCK_BYTES = 256 * 1024
READ_CACHE_BLOCKS_MAX = 32


class RealFiles:
    def __init__(self) -> None:
        # read-only descriptors for reading records back; an unlinked file stays
        # readable through its descriptor until ``forget`` closes it
        self._readers: dict[Path, int] = {}
        self._blocks: OrderedDict[tuple[Path, int], bytes] = OrderedDict()
        # files open for appending into space allocated ahead (the WAL's): a block read from one stops
        # at what was written, not at the zeros after it, so a cached block is read again once the file
        # grew past it. Closed ones are dropped when the next is opened: at most a few are listed.
        self._appending: dict[Path, AppendHandle] = {}

    def read_at(self, path: Path, offset: int, length: int, cached: bool = True) -> bytes | memoryview:
        """``length`` bytes at ``offset`` (from a cached block, a view of it: a record
        read back for delivery is not copied out of the block). Callers verify what
        they read (checksums) and retry with ``cached=False`` if a cached block was stale."""
        fd = self._readers.get(path)
        if fd is None:
            fd = self._readers[path] = os.open(path, os.O_RDONLY)
        block, start = divmod(offset, READ_BLOCK_BYTES)
        if cached and start + length <= READ_BLOCK_BYTES:
            data = self._block(fd, path, block, start + length)
            if start + length <= len(data):
                return memoryview(data)[start:start + length]
        data = os.pread(fd, length, offset)
        if len(data) != length:
            raise OSError(f"{path}: short read at offset {offset}")
        return data

    def _block(self, fd: int, path: Path, block: int, needed_bytes: int) -> bytes:
        key = (path, block)
        data = self._blocks.get(key)
        if data is None or len(data) < needed_bytes:  # the file's last block may have grown
            data = os.pread(fd, self._readable_bytes(path, block), block * READ_BLOCK_BYTES)
            self._blocks[key] = data
            if len(self._blocks) > READ_CACHE_BLOCKS_MAX:
                self._blocks.popitem(last=False)
        else:
            self._blocks.move_to_end(key)
        return data

    def _readable_bytes(self, path: Path, block: int) -> int:
        writer = self._appending.get(path)
        if writer is None or writer.closed:
            return READ_BLOCK_BYTES
        return max(0, min(READ_BLOCK_BYTES, writer.size - block * READ_BLOCK_BYTES))

    def forget(self, path: Path) -> None:
        """Close the reader of a file that is gone or changed, and drop its cached blocks."""
        fd = self._readers.pop(path, None)
        if fd is not None:
            os.close(fd)
        for key in [k for k in self._blocks if k[0] == path]:
            self._blocks.pop(key, None)

    def open_append(self, path: Path, preallocate_bytes: int = 0) -> AppendHandle:
        handle = AppendHandle(path, preallocate_bytes)
        if preallocate_bytes:
            # opened on a worker thread (a rollover) while the loop reads: replaced whole, not changed
            self._appending = {**{p: h for p, h in self._appending.items() if not h.closed}, path: handle}
        return handle

    def read_bytes(self, path: Path) -> bytes:
        return path.read_bytes()

    @contextlib.contextmanager
    def mapped(self, path: Path) -> Iterator[mmap.mmap | bytes]:
        """A whole file, readable as bytes without being read into memory: a WAL file
        may be as large as RabbitMQ's (512 MiB), and a rollover or a recovery reads
        it through once. Its pages are the page cache's, not the heap's. Nothing may
        cut the file while it is mapped (an access past its end would fault): only
        files no longer appended to are mapped, and cut only once unmapped."""
        with open(path, "rb") as file:
            if os.fstat(file.fileno()).st_size == 0:   # mmap refuses an empty file
                yield b""
                return
            mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            yield mapping
        finally:
            try:
                mapping.close()
            except BufferError:   # a view of it outlives the block (an exception's frames): unmapped when freed
                pass

    def truncate(self, path: Path, size: int, keep_cache: bool = False) -> None:
        """Cut the file at `size`, durably. `keep_cache`: its readers and cached blocks stay (no
        thread but the loop's may touch them): what lies past `size` is written again, the same."""
        if not keep_cache:
            self.forget(path)
        with open(path, "r+b") as file:
            file.truncate(size)
            file.flush()
            os.fsync(file.fileno())

    def remove(self, path: Path) -> None:
        path.unlink(missing_ok=True)

    def allocate(self, path: Path, size: int) -> bool:
        """A file of `size` bytes of allocated space, durably (the WAL's reserve,
        storage/reserve.py); False, and no file, when the disk has no room for it."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
        try:
            os.posix_fallocate(fd, 0, size)
            os.fsync(fd)
        except OSError:
            os.close(fd)
            path.unlink(missing_ok=True)
            return False
        os.close(fd)
        self.sync_directory(path.parent)
        return True

    def rename(self, source: Path, target: Path) -> None:
        """Atomic; durable once both directories are synced."""
        os.rename(source, target)

    def shred(self, path: Path) -> None:
        """Remove a file no one reads any more, freeing its space in steps (blocks:
        on a worker thread). Its content is cut as it goes, so only a file whose
        name no recovery reads (the store's trash) is shredded."""
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(path, os.O_WRONLY)
            try:
                size = os.fstat(fd).st_size
                while size > SHRED_STEP_BYTES:
                    size -= SHRED_STEP_BYTES
                    os.ftruncate(fd, size)
                    time.sleep(SHRED_PAUSE_SECONDS)
            finally:
                os.close(fd)
            path.unlink()

    def listdir(self, path: Path) -> list[Path]:
        if not path.exists():
            return []
        return sorted(path.iterdir())

    def makedirs(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)

    def sync_directory(self, path: Path) -> None:
        """Make file creations and deletions in ``path`` durable."""
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def remove_tree(self, path: Path) -> None:
        for child in self.listdir(path):
            if child.is_dir():
                self.remove_tree(child)
            else:
                child.unlink(missing_ok=True)
        if path.exists():
            path.rmdir()

    def size(self, path: Path) -> int:
        try:
            return path.stat().st_size
        except FileNotFoundError:
            return 0

    def free_bytes(self, path: Path) -> int:
        stats = os.statvfs(path)
        return stats.f_bavail * stats.f_frsize
