"""Log compaction per group on the node's WAL, with three RaftRuntimes over
loopback in one event loop (as tests/integration/test_raft_runtime.py):

* every node compacts every group after each round of proposals: the bytes
  on disk (WAL files and segments) stay bounded across many rollovers while
  the bytes written keep growing, and the logs in memory stay short;
* a restarted node is rebuilt from its newest snapshot (`install_snapshot`
  first, with the data it compacted with) plus the entries after it;
* a node that was down while the others compacted catches up through
  InstallSnapshot, persists that snapshot and recovers from it next time.

Each group's state machine is small: the last index applied, the number of
NORMAL entries and a running SHA-256 over their data, plus some padding so
that snapshots are not trivially small. One group compacts from inside
`apply` (deferred by the runtime to the end of the turn).
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import msgpack

from tests.integration.test_raft_runtime import FAST, leaders, node_settings, until
from tests.serverproc import free_port
from warren.config.settings import ClusterNode
from warren.raft.messages import Entry, EntryKind, Snapshot
from warren.raft.runtime import RaftRuntime
from warren.storage.group_commit import GroupCommitter
from warren.storage.wal import LogStore

SECRET = "raft-compaction-cookie"
NAMES = ["node-a", "node-b", "node-c"]
GROUPS = [f"queue-{n}" for n in range(4)]
IN_APPLY_GROUP = GROUPS[0]     # compacts from inside apply, every IN_APPLY_EVERY entries
IN_APPLY_EVERY = 40
WAL_MAX_SIZE_BYTES = 32 * 1024
SEGMENT_MAX_ENTRIES = 32
PADDING = b"p" * 1024          # in every snapshot
ROUNDS = 12
ENTRIES_PER_ROUND = 60
ENTRY_BYTES = 120
BOUND_SECONDS = 15.0


@dataclass
class State:
    """A group's state machine."""
    index: int = 0
    count: int = 0
    digest: bytes = b""

    def apply(self, entry: Entry) -> None:
        assert entry.index == self.index + 1, f"applied {entry.index} after {self.index}"
        self.index = entry.index
        if entry.kind == EntryKind.NORMAL:
            self.count += 1
            self.digest = hashlib.sha256(self.digest + entry.data).digest()

    def encode(self) -> bytes:
        return msgpack.packb([self.index, self.count, self.digest, PADDING])

    @classmethod
    def decode(cls, data: bytes) -> State:
        index, count, digest, _ = msgpack.unpackb(data)
        return cls(index, count, digest)


def expected_state(datas: list[bytes]) -> tuple[int, bytes]:
    digest = b""
    for data in datas:
        digest = hashlib.sha256(digest + data).digest()
    return len(datas), digest


class Node:
    def __init__(self, name: str, members: list[ClusterNode], data_dir: Path, seed: int) -> None:
        self.name = name
        self.data_dir = data_dir
        self.seed = seed
        self.settings = node_settings(name, members, data_dir, SECRET)
        self.runtime: RaftRuntime | None = None
        # group -> {index: data} of every snapshot this node compacted with or installed
        self.snapshots: dict[str, dict[int, bytes]] = defaultdict(dict)
        self.rollovers = 0

    async def start(self) -> None:
        self.states: dict[str, State] = defaultdict(State)
        # since this start: ("install", group, index, data) and ("apply", group, index)
        self.events: list[tuple] = []
        self.store = LogStore(self.data_dir / "log", WAL_MAX_SIZE_BYTES, SEGMENT_MAX_ENTRIES)
        self.committer = GroupCommitter(self.store, self.prepare_rollover)
        self.runtime = RaftRuntime(self.settings, self.committer, self.on_apply, random.Random(self.seed),
                                   transport_limits=FAST, install_snapshot=self.on_install)
        self.seed += 1
        runtime = self.runtime
        self.store.recover(lambda record, location: runtime.recover_visit(record, location))
        await self.runtime.start()

    async def stop(self) -> None:
        await self.runtime.stop()
        await asyncio.wait_for(self.committer.drain(), 5.0)
        self.store.close()

    def prepare_rollover(self) -> tuple[dict[int, int], bytes]:
        self.rollovers += 1
        return self.runtime.prepare_rollover()

    def on_install(self, group_id: str, snapshot: Snapshot) -> None:
        state = State.decode(snapshot.data)
        assert state.index == snapshot.index, (
            f"{self.name}/{group_id}: snapshot data of {state.index} at {snapshot.index}")
        self.states[group_id] = state
        self.snapshots[group_id][snapshot.index] = snapshot.data
        self.events.append(("install", group_id, snapshot.index, snapshot.data))

    def on_apply(self, group_id: str, entry: Entry) -> None:
        state = self.states[group_id]
        state.apply(entry)
        self.events.append(("apply", group_id, entry.index))
        if group_id == IN_APPLY_GROUP and entry.index % IN_APPLY_EVERY == 0:
            self.compact(group_id, state)

    def compact(self, group_id: str, state: State) -> bool:
        data = state.encode()
        if self.runtime.compact(group_id, state.index, data):
            self.snapshots[group_id][state.index] = data
            return True
        return False

    def compact_all(self) -> None:
        for group_id in GROUPS:
            state = self.states[group_id]
            assert self.runtime.applied_index(group_id) == state.index
            self.compact(group_id, state)

    def disk_bytes(self) -> int:
        """The log's files now; the WAL's writer thread may remove a file or folder
        (a rollover's truncation) while this walks them: those count as gone."""
        total = 0
        for folder, _, names in os.walk(self.data_dir / "log"):
            for name in names:
                with contextlib.suppress(FileNotFoundError):
                    total += os.stat(os.path.join(folder, name)).st_size
        return total

    def snapshot_index(self, group_id: str) -> int:
        return self.runtime.system.status(group_id).snapshot_index


def caught_up(nodes: list[Node], expected: dict[str, list[bytes]]) -> bool:
    for group_id in GROUPS:
        count, digest = expected_state(expected[group_id])
        if any((node.states[group_id].count, node.states[group_id].digest) != (count, digest) for node in nodes):
            return False
    return True


def progress(nodes: list[Node], expected: dict[str, list[bytes]]) -> str:
    return "; ".join(f"{n.name}: " + ",".join(f"{n.states[g].count}/{len(expected[g])}" for g in GROUPS)
                     + f" failed={n.runtime.failed!r}" for n in nodes)


async def propose(nodes: list[Node], tag: str, count: int, expected: dict[str, list[bytes]]) -> None:
    by_name = {node.name: node for node in nodes}
    current = leaders(nodes, GROUPS)
    assert current is not None
    for number in range(count):
        for group_id in GROUPS:
            data = f"{group_id}/{tag}/{number}/".encode().ljust(ENTRY_BYTES, b".")
            assert by_name[current[group_id]].runtime.propose(group_id, data) is not None
            expected[group_id].append(data)
        await asyncio.sleep(0)


async def settle(nodes: list[Node], expected: dict[str, list[bytes]]) -> None:
    await until(lambda: leaders(nodes, GROUPS) is not None, "leaders", BOUND_SECONDS)
    await until(lambda: caught_up(nodes, expected), lambda: progress(nodes, expected), BOUND_SECONDS)


async def start_cluster(tmp_path) -> list[Node]:
    members = [ClusterNode(name=name, host="127.0.0.1", port=free_port()) for name in NAMES]
    nodes = [Node(name, members, tmp_path / name, seed) for seed, name in enumerate(NAMES)]
    for node in nodes:
        await node.start()
    for node in nodes:
        for group_id in GROUPS:
            assert node.runtime.add_group(group_id, NAMES)
    assert nodes[0].runtime.campaign(GROUPS[1])   # one group need not wait for a timeout
    await until(lambda: leaders(nodes, GROUPS) is not None, "leaders", BOUND_SECONDS)
    return nodes


async def stop_all(nodes: list[Node]) -> None:
    for node in nodes:
        if node.runtime is not None and not node.runtime.stopped:
            await node.stop()


async def test_compaction_keeps_the_wal_bounded_and_a_restart_starts_from_the_snapshot(tmp_path):
    started = time.monotonic()
    nodes = await start_cluster(tmp_path)
    expected: dict[str, list[bytes]] = defaultdict(list)
    disk_max = [0] * len(nodes)
    try:
        for round_number in range(ROUNDS):
            await propose(nodes, f"r{round_number}", ENTRIES_PER_ROUND, expected)
            await settle(nodes, expected)
            for node in nodes:
                # the compact() calls made inside apply were carried out at the end of their turns
                applied = node.states[IN_APPLY_GROUP].index
                assert node.snapshot_index(IN_APPLY_GROUP) == applied // IN_APPLY_EVERY * IN_APPLY_EVERY
                node.compact_all()
            # let the rollovers that follow the snapshot records run
            await asyncio.sleep(0.05)
            for position, node in enumerate(nodes):
                disk_max[position] = max(disk_max[position], node.disk_bytes())
                for group_id in GROUPS:
                    # the log in memory holds at most about one round
                    assert node.runtime.group_metrics(group_id).log_entries <= ENTRIES_PER_ROUND + IN_APPLY_EVERY
        written = [node.store.bytes_written for node in nodes]
        for node, most, total in zip(nodes, disk_max, written):
            assert node.runtime.failed is None
            assert node.rollovers >= 10, f"{node.name}: only {node.rollovers} rollovers"
            # WAL: the current file (< max + one batch) and an old one being moved; segments: entries above the cursor
            assert most < 4 * WAL_MAX_SIZE_BYTES, f"{node.name}: {most} bytes on disk"
            assert total > 5 * most, f"{node.name}: wrote {total} bytes, at most {most} on disk"
        # the snapshot is held once: the bytes given to compact are the ones storage writes again
        node = nodes[0]
        for group_id in GROUPS:
            kept = node.runtime.groups[group_id].snapshot
            assert kept.data is node.snapshots[group_id][kept.index]

        # Entries after the last snapshot, then restart a node from its disk.
        await propose(nodes, "tail", 25, expected)
        await settle(nodes, expected)
        victim = nodes[1]
        snapshot_at = {group_id: victim.snapshot_index(group_id) for group_id in GROUPS}
        applied_at = {group_id: victim.states[group_id].index for group_id in GROUPS}
        assert all(applied_at[g] - snapshot_at[g] >= 25 for g in GROUPS), (snapshot_at, applied_at)
        await victim.stop()
        restart_began = time.monotonic()
        await victim.start()
        # install_snapshot ran inside start(), once per group, before any apply
        # (start() awaits the transport: the re-applies may have begun since)
        installs = [event for event in victim.events if event[0] == "install"]
        assert [event[1] for event in installs] == GROUPS and victim.events[:len(GROUPS)] == installs
        for _, group_id, index, data in installs:
            assert index == snapshot_at[group_id]
            assert data == victim.snapshots[group_id][index]
            status = victim.runtime.system.status(group_id)
            assert status.snapshot_index == index and status.log_entries >= applied_at[group_id] - index
        await settle(nodes, expected)
        restart_seconds = time.monotonic() - restart_began
        for group_id in GROUPS:
            applies = [event[2] for event in victim.events if event[0] == "apply" and event[1] == group_id]
            assert applies[0] == snapshot_at[group_id] + 1, f"{group_id}: first applied {applies[:3]}"
        print(f"\nrollovers {[n.rollovers for n in nodes]}; disk max {disk_max} bytes; written {written} bytes; "
              f"restart caught up in {restart_seconds:.2f} s; total {time.monotonic() - started:.2f} s")
    finally:
        await stop_all(nodes)


async def test_a_follower_down_while_the_others_compact_catches_up_through_install_snapshot(tmp_path):
    started = time.monotonic()
    nodes = await start_cluster(tmp_path)
    expected: dict[str, list[bytes]] = defaultdict(list)
    try:
        await propose(nodes, "before", 20, expected)
        await settle(nodes, expected)
        late = nodes[2]
        live = nodes[:2]
        await late.stop()
        await propose_when_led(live, "while-down", 150, expected)
        await settle(live, expected)
        for node in live:
            node.compact_all()
        await propose(live, "after-compaction", 10, expected)
        await settle(live, expected)
        compacted = {group_id: max(node.snapshot_index(group_id) for node in live) for group_id in GROUPS}

        restart_began = time.monotonic()
        await late.start()
        assert not [event for event in late.events if event[0] == "install" and event[2] <= 20], \
            "it had compacted nothing before it went down"
        await settle(nodes, expected)
        catch_up_seconds = time.monotonic() - restart_began
        installs = {event[1]: event for event in late.events if event[0] == "install"}
        assert sorted(installs) == sorted(GROUPS), f"installs: {sorted(installs)}"
        for group_id, (_, _, index, data) in installs.items():
            assert index >= compacted[group_id] - IN_APPLY_EVERY
            leader_copies = [node.snapshots[group_id].get(index) for node in live]
            assert data in leader_copies, f"{group_id}: installed data at {index} is no leader's snapshot"
            assert late.snapshot_index(group_id) >= index
            position = late.events.index(installs[group_id])
            later = [e for e in late.events[position + 1:] if e[0] == "apply" and e[1] == group_id]
            assert later and later[0][2] == index + 1, f"{group_id}: applied {later[:1]} after the snapshot at {index}"

        # The installed snapshot is durable: the next start recovers from it.
        installed = {group_id: late.snapshot_index(group_id) for group_id in GROUPS}
        await late.stop()
        await late.start()
        assert [(event[0], event[1], event[2]) for event in late.events[:len(GROUPS)]] == \
            [("install", group_id, installed[group_id]) for group_id in GROUPS]
        await settle(nodes, expected)
        print(f"\nlate node caught up through InstallSnapshot in {catch_up_seconds:.2f} s; "
              f"total {time.monotonic() - started:.2f} s")
    finally:
        await stop_all(nodes)


async def propose_when_led(nodes: list[Node], tag: str, count: int, expected: dict[str, list[bytes]]) -> None:
    await until(lambda: leaders(nodes, GROUPS) is not None, "leaders without the stopped node", BOUND_SECONDS)
    await propose(nodes, tag, count, expected)
