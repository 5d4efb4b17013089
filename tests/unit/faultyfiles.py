"""An in-memory fake of ``storage.files.RealFiles`` that models durability and faults.

Theory of operation. A file's content and a directory's entries each exist
twice: what the program sees now, and what is durable (would survive a power
loss). ``AppendHandle.sync`` makes a file's content durable (like fdatasync);
``FaultyFiles.truncate`` fsyncs, as ``RealFiles.truncate`` does;
``sync_directory`` makes the creations and deletions of that directory's
entries durable. ``crash(rng)`` is the power loss: for every file the unsynced
changes are lost entirely, or partly kept (a torn write: a random prefix of
the unsynced bytes survives); every directory entry created or deleted since
its directory was last synced independently keeps its new state or reverts,
and entries left without a parent directory disappear. All randomness comes
from the seeded ``random.Random`` passed in, so a failing run replays.

Directory creation is strict by default (POSIX: a new directory's entry in its
parent is durable only once the parent is synced). ``mkdir_durable=True``
relaxes that to what ext4's journal does in practice, for tests that are
about something else.

Fault knobs:
* ``enospc_after_bytes``: a handle write raises ``OSError(ENOSPC)`` once the
  total bytes written through handles would exceed it; the part that fits lands.
* ``eio_on_sync``: a handle sync raises ``OSError(EIO)``; a random prefix of the
  unsynced bytes may have reached the disk anyway (a partial writeback).
* ``crash_at_op``: the N-th mutating operation (counted in ``ops``) raises
  ``SimulatedCrash`` before it does anything; call ``crash(rng)`` afterwards.
* ``flip_bit(path, offset, bit)``: bit rot in durable data.
"""
from __future__ import annotations

import contextlib
import errno
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


class SimulatedCrash(BaseException):
    """Power loss in the middle of an operation. A BaseException so that the
    code under test's ``except OSError`` cannot swallow it."""


@dataclass(eq=False)
class FakeFile:
    data: bytearray = field(default_factory=bytearray)  # what the program sees
    durable: bytes = b""  # what survives a crash for certain

    def crash(self, rng: random.Random) -> None:
        if bytes(self.data) == self.durable:
            return
        common = _common_prefix_length(self.data, self.durable)
        if rng.random() < 0.4:
            kept = self.durable  # every unsynced change lost
        else:
            kept = bytes(self.data[:rng.randint(common, len(self.data))])  # torn write
        self.data = bytearray(kept)
        self.durable = kept


@dataclass(eq=False)
class FakeDir:
    pass


Node = FakeFile | FakeDir


def _common_prefix_length(a: bytes | bytearray, b: bytes | bytearray) -> int:
    limit = min(len(a), len(b))
    position = 0
    while position < limit and a[position] == b[position]:
        position += 1
    return position


class FakeAppendHandle:
    """Same surface as ``storage.files.AppendHandle``."""

    def __init__(self, files: "FaultyFiles", path: Path, node: FakeFile):
        self._files = files
        self.path = path
        self._node = node
        self._generation = files.generation
        self.closed = False

    @property
    def size(self) -> int:
        return len(self._node.data)

    def _check_usable(self) -> None:
        assert not self.closed, f"{self.path}: used after close"
        assert self._generation == self._files.generation, f"{self.path}: handle from before a crash"

    def write(self, data: bytes) -> None:
        self._check_usable()
        self._files.tick("write", self.path)
        limit = self._files.enospc_after_bytes
        room = self._files.free_bytes(self.path)   # the capacity: a full disk's, whatever was injected
        if limit is not None and self._files.bytes_written_total + len(data) > limit or len(data) > room:
            fits = min(room, len(data) if limit is None else max(0, limit - self._files.bytes_written_total))
            self._node.data += data[:fits]
            self._files.bytes_written_total += fits
            raise OSError(errno.ENOSPC, "No space left on device (injected)", str(self.path))
        self._node.data += data
        self._files.bytes_written_total += len(data)

    def write_pieces(self, pieces) -> None:
        self.write(b"".join(pieces))

    def sync(self) -> None:
        self._check_usable()
        self._files.tick("sync", self.path)
        if self._files.eio_on_sync:
            node = self._node
            if self._files.eio_partial_writeback and bytes(node.data).startswith(node.durable):
                reached = self._files.rng.randint(len(node.durable), len(node.data))
                node.durable = bytes(node.data[:reached])
            raise OSError(errno.EIO, "Input/output error (injected)", str(self.path))
        self._node.durable = bytes(self._node.data)
        self._files.syncs += 1

    def truncate(self, size: int) -> None:
        """ftruncate without fsync: the new size is not durable yet."""
        self._check_usable()
        self._files.tick("ftruncate", self.path)
        del self._node.data[size:]

    def close(self) -> None:
        self._check_usable()
        self.closed = True


class FaultyFiles:
    def __init__(self, seed: int = 0, *, mkdir_durable: bool = False, capacity_bytes: int = 1 << 40):
        self.rng = random.Random(seed)  # for faults other than crash(): partial writebacks
        self.mkdir_durable = mkdir_durable
        self.capacity_bytes = capacity_bytes
        self.nodes: dict[Path, Node] = {}  # the namespace the program sees
        self.durable_nodes: dict[Path, Node] = {}  # the namespace that survives a crash
        self.enospc_after_bytes: int | None = None
        self.eio_on_sync = False
        self.eio_partial_writeback = True
        self.crash_at_op: int | None = None
        self.ops = 0
        self.op_log: list[tuple[str, Path]] = []
        self.bytes_written_total = 0
        self.syncs = 0
        self.generation = 0  # bumped by crash(): handles from before are dead

    # -- fault injection --------------------------------------------------
    def tick(self, operation: str, path: Path) -> None:
        self.ops += 1
        self.op_log.append((operation, path))
        if self.crash_at_op is not None and self.ops >= self.crash_at_op:
            self.crash_at_op = None
            raise SimulatedCrash(f"crash before op {self.ops}: {operation} {path}")

    def crash(self, rng: random.Random) -> None:
        """Power loss: unsynced data and unsynced directory changes may be lost."""
        seen: set[int] = set()
        for node in [*self.nodes.values(), *self.durable_nodes.values()]:
            if isinstance(node, FakeFile) and id(node) not in seen:
                seen.add(id(node))
                node.crash(rng)
        result: dict[Path, Node] = {}
        for path in sorted(set(self.nodes) | set(self.durable_nodes)):
            now, durable = self.nodes.get(path), self.durable_nodes.get(path)
            chosen = now if now is durable or rng.random() < 0.5 else durable
            if chosen is not None:
                result[path] = chosen
        # Entries whose directory did not survive are gone too (parents sort first).
        for path in sorted(result, key=lambda p: len(p.parts)):
            if not self._parent_exists(path, result):
                del result[path]
        self.nodes = result
        self.durable_nodes = dict(result)
        self.generation += 1
        self.crash_at_op = None
        self.eio_on_sync = False
        self.enospc_after_bytes = None

    def _parent_exists(self, path: Path, namespace: dict[Path, Node]) -> bool:
        parent = path.parent
        if parent == path:
            return True
        known = parent in self.nodes or parent in self.durable_nodes or parent in namespace
        if not known:
            return True  # above everything this fake tracks: the root
        return isinstance(namespace.get(parent), FakeDir)

    def flip_bit(self, path: Path, offset: int, bit: int) -> None:
        node = self.nodes[path]
        assert isinstance(node, FakeFile)
        assert 0 <= offset < len(node.durable), f"offset {offset} past durable data ({len(node.durable)})"
        assert 0 <= bit < 8
        durable = bytearray(node.durable)
        durable[offset] ^= 1 << bit
        node.durable = bytes(durable)
        if offset < len(node.data):
            node.data[offset] ^= 1 << bit

    # -- inspection for tests ---------------------------------------------
    def files(self) -> dict[Path, bytes]:
        return {p: bytes(n.data) for p, n in sorted(self.nodes.items()) if isinstance(n, FakeFile)}

    def total_bytes(self) -> int:
        return sum(len(n.data) for n in self.nodes.values() if isinstance(n, FakeFile))

    def makedirs_durable(self, path: Path) -> None:
        """Directories that exist before the program starts (the operator made them)."""
        for directory in [*reversed(path.parents), path]:
            node = self.nodes.setdefault(directory, FakeDir())
            assert isinstance(node, FakeDir)
            self.durable_nodes[directory] = node

    def sync_everything(self) -> None:
        for node in self.nodes.values():
            if isinstance(node, FakeFile):
                node.durable = bytes(node.data)
        self.durable_nodes = dict(self.nodes)

    # -- the RealFiles interface ------------------------------------------
    def open_append(self, path: Path, preallocate_bytes: int = 0) -> FakeAppendHandle:
        # preallocate_bytes: a fake file has no allocated space to grow into; RealFiles' is tested
        # against the disk (tests/unit/test_storage_files.py)
        self.tick("open_append", path)
        node = self.nodes.get(path)
        if node is None:
            self._require_directory(path.parent)
            node = FakeFile()
            self.nodes[path] = node
        if isinstance(node, FakeDir):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
        return FakeAppendHandle(self, path, node)

    def read_bytes(self, path: Path) -> bytes:
        node = self.nodes.get(path)
        if node is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
        if isinstance(node, FakeDir):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
        return bytes(node.data)

    @contextlib.contextmanager
    def mapped(self, path: Path) -> Iterator[bytes]:
        yield self.read_bytes(path)

    def read_at(self, path: Path, offset: int, length: int, cached: bool = True) -> bytes:
        data = self.read_bytes(path)[offset:offset + length]
        if len(data) != length:
            raise OSError(f"{path}: short read at offset {offset}")
        return data

    def forget(self, path: Path) -> None:
        pass

    def size(self, path: Path) -> int:
        node = self.nodes.get(path)
        return len(node.data) if node is not None and not isinstance(node, FakeDir) else 0

    def truncate(self, path: Path, size: int, keep_cache: bool = False) -> None:
        """Truncate and fsync, like ``RealFiles.truncate`` (which has a read cache to keep or not)."""
        self.tick("truncate", path)
        node = self.nodes.get(path)
        if not isinstance(node, FakeFile):
            raise FileNotFoundError(errno.ENOENT, "No such file", str(path))
        del node.data[size:]
        node.durable = bytes(node.data)

    def remove(self, path: Path) -> None:
        self.tick("remove", path)
        node = self.nodes.get(path)
        if isinstance(node, FakeDir):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
        self.nodes.pop(path, None)

    def allocate(self, path: Path, size: int) -> bool:
        """Like ``RealFiles.allocate``: a file of `size` zeros, durable, if the capacity holds it."""
        self.tick("allocate", path)
        if self.free_bytes(path) < size:
            return False
        self._require_directory(path.parent)
        node = FakeFile()
        node.data += bytes(size)
        node.durable = bytes(node.data)
        self.nodes[path] = self.durable_nodes[path] = node
        return True

    def rename(self, source: Path, target: Path) -> None:
        """The node moves now; each name's change is durable once its directory is synced."""
        self.tick("rename", source)
        node = self.nodes.get(source)
        if not isinstance(node, FakeFile):
            raise FileNotFoundError(errno.ENOENT, "No such file", str(source))
        if not self._parent_exists(target, self.nodes):
            raise FileNotFoundError(errno.ENOENT, "No such directory", str(target.parent))
        self.nodes[target] = self.nodes.pop(source)

    def shred(self, path: Path) -> None:
        self.remove(path)

    def listdir(self, path: Path) -> list[Path]:
        node = self.nodes.get(path)
        if node is None:
            return []
        if isinstance(node, FakeFile):
            raise NotADirectoryError(errno.ENOTDIR, "Not a directory", str(path))
        return sorted(p for p in self.nodes if p.parent == path and p != path)

    def makedirs(self, path: Path) -> None:
        self.tick("makedirs", path)
        for directory in [*reversed(path.parents), path]:
            node = self.nodes.get(directory)
            if node is None:
                if directory.parent != directory and not self._parent_exists(directory, self.nodes):
                    raise FileNotFoundError(errno.ENOENT, "No such directory", str(directory.parent))
                node = FakeDir()
                self.nodes[directory] = node
                if self.mkdir_durable:
                    self.durable_nodes[directory] = node
            elif isinstance(node, FakeFile):
                raise FileExistsError(errno.EEXIST, "File exists", str(directory))

    def sync_directory(self, path: Path) -> None:
        self.tick("sync_directory", path)
        self._require_directory(path)
        for child in set(self.nodes) | set(self.durable_nodes):
            if child.parent == path and child != path:
                if child in self.nodes:
                    self.durable_nodes[child] = self.nodes[child]
                else:
                    self.durable_nodes.pop(child, None)

    def remove_tree(self, path: Path) -> None:
        self.tick("remove_tree", path)
        for child in [p for p in self.nodes if p == path or path in p.parents]:
            del self.nodes[child]

    def free_bytes(self, path: Path) -> int:
        return max(0, self.capacity_bytes - self.total_bytes())

    def _require_directory(self, path: Path) -> None:
        node = self.nodes.get(path)
        known = path in self.nodes or path in self.durable_nodes
        if node is None and not known and path.parent == path:
            return
        if not isinstance(node, FakeDir):
            raise FileNotFoundError(errno.ENOENT, "No such directory", str(path))
