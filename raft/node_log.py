"""The node's one WAL and its group committer, for the Raft runtime alone.

The node shell builds a `NodeLog` and hands its committer to the
`RaftRuntime` (raft/runtime.py), which is the storage's only client: every
record in the WAL is a Raft group's (the metadata group's and each queue's
alike, raft/raft_storage.py), so the runtime alone says what a rollover keeps
(`rollover_source`, its `prepare_rollover`) and replays the WAL at start
(`RaftRuntime.recover`). The shell drains and closes it after the runtime
stopped.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from warren.storage.group_commit import NO_SPACE_GIVE_UP_SECONDS, GroupCommitter
from warren.storage.wal import LogStore, no_space  # noqa: F401 -- re-exported: the broker asks raft, not storage

Rollover = Callable[[], tuple[dict[int, int], bytes]]


class NodeLog:
    def __init__(self, directory: Path, wal_max_size_bytes: int, segment_max_entries: int,
                 no_space_give_up_seconds: float = NO_SPACE_GIVE_UP_SECONDS) -> None:
        self.store = LogStore(directory, wal_max_size_bytes, segment_max_entries)
        self.committer = GroupCommitter(self.store, self._prepare_rollover,
                                        no_space_give_up_seconds=no_space_give_up_seconds)
        # the Raft runtime's cursors and records to start a new WAL file with (set when it takes the log)
        self.rollover_source: Rollover | None = None

    def _prepare_rollover(self) -> tuple[dict[int, int], bytes]:
        assert self.rollover_source is not None, "a WAL rollover before the Raft runtime took the log"
        return self.rollover_source()

    def free_bytes(self, path: Path) -> int:
        return self.store.files.free_bytes(path)

    def roll_over_within(self, size: int) -> None:
        """The WAL rolls over at `size` bytes if that comes before its configured size
        (the room its rollover has on the disk: broker/node/disk_watch.py)."""
        self.store.wal_room_bytes = size

    def hold_reserve(self, size: int) -> None:
        """Hold `size` bytes of the disk back for when it is full (storage/reserve.py)."""
        self.committer.hold_reserve(size)

    def on_bytes_written(self, listener: Callable[[int], None]) -> None:
        """`listener(size)` after each WAL batch written (the disk alarm counts them)."""
        self.committer.subscribe(lambda written: listener(written.size))

    async def close(self) -> None:
        await self.committer.drain()
        self.store.close()
