"""Failures in a node's Raft: one group's stay in that group; the shared
WAL's stop the node loudly (raft/runtime.py, "Failure"; issue 9, item 4).

One RaftRuntime of one node over a real WAL (groups of one, as a single
broker's queues). Every wait is bounded (`until` polls with a deadline).
"""
from __future__ import annotations

import asyncio
import errno
import random
import subprocess
import threading
from collections import defaultdict
from pathlib import Path

import pika
import pytest

from tests.integration.pika_support import parameters
from tests.integration.test_raft_runtime import node_settings, until
from tests.serverproc import free_port, make_server
from warren.config.settings import ClusterNode
from warren.raft.messages import Entry, EntryKind
from warren.raft.runtime import RaftRuntime
from warren.raft.system import PersistFailed
from warren.storage.group_commit import GroupCommitter
from warren.storage.wal import LogStore

pytestmark = pytest.mark.timeout(60)

BOUND_SECONDS = 10.0
BOOM = b"boom"


class OneNode:
    """A runtime of one node whose state machine raises on a BOOM entry."""

    def __init__(self, data_dir: Path, vital_groups=frozenset()) -> None:
        members = [ClusterNode(name="a", host="127.0.0.1", port=free_port())]
        self.settings = node_settings("a", members, data_dir, "failures-cookie")
        self.store = LogStore(data_dir / "log", 1 << 20, 64)
        self.committer = GroupCommitter(self.store, lambda: self.runtime.prepare_rollover())
        self.fatal: list[BaseException] = []
        self.applied: dict[str, list[bytes]] = defaultdict(list)
        self.runtime = RaftRuntime(self.settings, self.committer, self.apply, random.Random(1),
                                   on_fatal=self.fatal.append, vital_groups=vital_groups)
        self.store.recover(self.runtime.recover_visit)

    def apply(self, group_id: str, entry: Entry) -> None:
        if entry.kind != EntryKind.NORMAL:
            return
        if entry.data == BOOM:
            raise ValueError(f"the state machine of {group_id} cannot apply {entry.data!r}")
        self.applied[group_id].append(entry.data)

    async def start(self, groups: list[str]) -> None:
        await self.runtime.start()
        for group in groups:
            assert self.runtime.add_group(group, ["a"])
            self.runtime.campaign(group)
        await until(lambda: all(self.runtime.leader_of(group) == "a" for group in groups),
                    lambda: f"leaders: {[(group, self.runtime.leader_of(group)) for group in groups]}", BOUND_SECONDS)

    async def propose_applied(self, group: str, data: bytes) -> None:
        assert self.runtime.propose(group, data) is not None, \
            f"{group} took no proposal (failed: {self.runtime.failed!r})"
        await until(lambda: data in self.applied[group], lambda: f"{group} to apply {data!r}: {dict(self.applied)}",
                    BOUND_SECONDS)

    async def stop(self) -> None:
        await self.runtime.stop()
        await asyncio.wait_for(self.committer.drain(), 5.0)
        self.store.close()


@pytest.fixture
async def node(tmp_path):
    one = OneNode(tmp_path)
    yield one
    await one.stop()


async def test_a_group_whose_apply_raises_fails_alone(node):
    await node.start(["q1", "q2", "q3"])
    node.runtime.propose("q1", b"before")
    node.runtime.propose("q2", BOOM)
    node.runtime.propose("q3", b"before")
    await until(lambda: "q2" in node.runtime.system.failed_groups, "q2 to fail", BOUND_SECONDS)
    assert node.runtime.failed is None and node.fatal == [], f"one group's failure stopped the node: {node.fatal}"
    assert not node.runtime.hosted("q2") and node.runtime.propose("q2", b"more") is None
    assert node.runtime.status("q2") is None and node.runtime.metrics()["groups_failed"] == 1
    for group in ("q1", "q3"):   # the others go on, in this turn and later ones
        await node.propose_applied(group, b"after")
        assert node.applied[group] == [b"before", b"after"]
    assert node.runtime.remove_group("q2")   # a failed group can still be dropped (queue.delete)
    assert node.runtime.metrics()["groups_failed"] == 0


async def test_a_vital_group_that_fails_stops_the_node(tmp_path):
    node = OneNode(tmp_path, vital_groups=frozenset({"meta"}))
    try:
        await node.start(["meta", "q1"])
        node.runtime.propose("meta", BOOM)
        await until(lambda: node.fatal, "on_fatal", BOUND_SECONDS)
        assert node.runtime.failed is node.fatal[0] and len(node.fatal) == 1
        assert node.runtime.propose("q1", b"x") is None, "a failed node's Raft still takes proposals"
    finally:
        await node.stop()


async def test_a_lost_wal_batch_stops_the_node_loudly(node, monkeypatch):
    await node.start(["q1", "q2"])
    await node.propose_applied("q1", b"durable")

    def broken_disk(data: bytes):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(node.store, "write_batch", broken_disk)
    node.runtime.propose("q2", b"lost")
    await until(lambda: node.fatal, "on_fatal after the WAL lost a batch", BOUND_SECONDS)
    assert isinstance(node.runtime.failed, PersistFailed) and len(node.fatal) == 1
    assert node.runtime._tick_handle is None, "a failed runtime still ticks"
    assert node.runtime.propose("q1", b"x") is None and b"lost" not in node.applied["q2"]


# The real server, its WAL failing once a marker file exists: it must exit non-zero, not serve on.
FAILING_DISK_SERVER = """
import errno, os, sys
from warren.storage.wal import LogStore
write_batch = LogStore.write_batch
def failing(self, data):
    if os.path.exists(os.environ["WAL_FAILS_MARKER"]):
        raise OSError(errno.EIO, "Input/output error (injected)")
    return write_batch(self, data)
LogStore.write_batch = failing
from warren.broker.node.server import main
sys.exit(main())
"""
FATAL_EXIT_SECONDS = 20.0


def declare_ignoring_the_close(server, queue: str) -> None:
    try:
        with pika.BlockingConnection(parameters(server)) as connection:
            connection.channel().queue_declare(queue, durable=True)
    except pika.exceptions.AMQPError:
        pass   # the server closes the connection as it stops (or exits under it)


def test_the_server_exits_non_zero_when_its_wal_fails(tmp_path):
    marker = tmp_path / "wal-fails"
    server = make_server(tmp_path, WAL_FAILS_MARKER=str(marker))
    server.command = ("-c", FAILING_DISK_SERVER)
    server.start()
    try:
        with pika.BlockingConnection(parameters(server)) as connection:
            connection.channel().queue_declare("before", durable=True)
        marker.touch()
        # Its metadata entry cannot be written. In a thread: unanswered, it would wait forever.
        threading.Thread(target=declare_ignoring_the_close, args=(server, "after"), daemon=True).start()
        try:
            status = server.process.wait(FATAL_EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the server went on after its WAL failed; log tail:\n{server.log()}")
        log_tail = server.log()
        assert status == 1, f"exit status {status}; log tail:\n{log_tail}"
        assert '"server.fatal"' in log_tail and '"raft.fatal"' in log_tail, log_tail
    finally:
        server.stop()
