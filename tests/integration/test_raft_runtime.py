"""Three RaftRuntimes over loopback in one event loop, each with its own data
directory, WAL and group commit: groups elect, replicate and apply the same
sequences; losing the node that leads most groups elects new leaders within
a bound and commits go on; the node restarted from its disk catches up.

The WAL is kept small (64 KiB) so that rollovers, segments and the
re-written control records are part of every run. Every wait is bounded:
`until` polls a condition with a deadline; nothing sleeps to synchronise.
The replay tests at the end drive the record format without a network.
"""
from __future__ import annotations

import asyncio
import errno
import random
import time
from collections import defaultdict
from pathlib import Path

import msgpack
import pytest

from tests.serverproc import free_port
from warren.config.settings import ClusterNode, Settings
from warren.raft.group import PersistItem
from warren.raft.messages import Entry, EntryKind, HardState, Snapshot
from warren.raft.raft_storage import (
    RAFT_LOG_ID_BASE,
    GroupStorage,
    RaftLogCorrupt,
    RecoveryScan,
    group_record,
    removed_record,
)
from warren.raft.runtime import RaftRuntime
from warren.raft.stall import stall_limit_seconds
from warren.raft.transport import TransportLimits
from warren.storage import records
from warren.storage.group_commit import GroupCommitter
from warren.storage.wal import LogStore, NoSpace

SECRET = "raft-runtime-cookie"
GROUPS = [f"queue-{n}" for n in range(10)]
ENTRIES_PER_GROUP = 200
ENTRIES_AFTER_FAILOVER = 50
# Small, so that every node rolls its WAL over several times during the test.
WAL_MAX_SIZE_BYTES = 64 * 1024
SEGMENT_MAX_ENTRIES = 64
FAST = TransportLimits(heartbeat_seconds=0.2, handshake_timeout_seconds=1.0, reconnect_initial_seconds=0.02,
                       reconnect_max_seconds=0.2, connect_timeout_seconds=1.0)
ELECTION_BOUND_SECONDS = 5.0
# Failover: connection closed -> peer_down -> a woken follower's lease runs
# out (election_ticks) and its randomized timeout fires (< 2 * election_ticks).
NEW_LEADERS_BOUND_SECONDS = 2.5
APPLY_BOUND_SECONDS = 15.0


async def until(predicate, what, timeout: float) -> float:
    """Poll `predicate` until it holds; the seconds it took. `what` may be a
    callable, to describe the state when the deadline passes."""
    started = time.monotonic()

    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.01)
    try:
        await asyncio.wait_for(poll(), timeout)
    except TimeoutError:
        pytest.fail(f"timed out after {timeout} s waiting for: {what() if callable(what) else what}")
    return time.monotonic() - started


def node_settings(name: str, members: list[ClusterNode], data_dir: Path, secret: str) -> Settings:
    """A loopback cluster node's settings, its port taken from `members`."""
    port = next(member.port for member in members if member.name == name)
    return Settings(node_name=name, cluster_nodes=members, cluster_host="127.0.0.1", cluster_port=port,
                    cluster_secret=secret, data_dir=data_dir)


class Node:
    """One node: its LogStore, GroupCommitter and RaftRuntime, and what it applied."""

    def __init__(self, name: str, members: list[ClusterNode], data_dir: Path, seed: int) -> None:
        self.name = name
        self.data_dir = data_dir
        self.seed = seed
        self.settings = node_settings(name, members, data_dir, SECRET)
        self.runtime: RaftRuntime | None = None
        self.applied: dict[str, list[bytes]] = defaultdict(list)
        self.last_index: dict[str, int] = defaultdict(int)
        self.rollovers = 0
        self.recovered_records = 0
        # (seconds since the test began, group, role, leader, term): printed when a wait fails
        self.role_changes: list[tuple] = []
        self.epoch = time.monotonic()

    async def start(self) -> None:
        """Recover from the data directory (empty the first time) and start."""
        self.applied = defaultdict(list)
        self.last_index = defaultdict(int)
        self.store = LogStore(self.data_dir / "log", WAL_MAX_SIZE_BYTES, SEGMENT_MAX_ENTRIES)
        self.committer = GroupCommitter(self.store, self.prepare_rollover)
        self.runtime = RaftRuntime(self.settings, self.committer, self.on_apply, random.Random(self.seed),
                                   transport_limits=FAST, on_role_change=self.on_role_change)
        self.seed += 1
        recovered = self.store.recover(self.visit)
        assert not recovered.torn, f"{self.name}: a clean stop left a torn tail: {recovered.torn}"
        await self.runtime.start()

    def visit(self, record: records.Record, location) -> None:
        assert record.log_id >= RAFT_LOG_ID_BASE, f"only Raft logs in this WAL, got {record.log_id}"
        self.recovered_records += 1
        self.runtime.recover_visit(record, location)

    def prepare_rollover(self) -> tuple[dict[int, int], bytes]:
        self.rollovers += 1
        return self.runtime.prepare_rollover()

    def on_apply(self, group_id: str, entry: Entry) -> None:
        # Raft's State Machine Safety, locally: every index once, in order.
        assert entry.index == self.last_index[group_id] + 1, \
            f"{self.name}/{group_id}: applied {entry.index} after {self.last_index[group_id]}"
        self.last_index[group_id] = entry.index
        if entry.kind == EntryKind.NORMAL:
            self.applied[group_id].append(entry.data)

    def on_role_change(self, group_id: str, role, leader_id: str | None, term: int) -> None:
        self.role_changes.append((round(time.monotonic() - self.epoch, 3), group_id, role.value, leader_id, term))

    async def stop(self) -> None:
        await self.runtime.stop()
        await asyncio.wait_for(self.committer.drain(), 5.0)
        self.store.close()

    def role(self, group_id: str) -> str:
        return self.runtime.group_metrics(group_id).role

    def reported_role(self, group_id: str) -> str | None:
        """The role of the last role-change callback for the group (None before the first)."""
        return next((c[2] for c in reversed(self.role_changes) if c[1] == group_id), None)


def leaders(nodes: list, groups: list[str] = GROUPS) -> dict[str, str] | None:
    """Each group's leader if every group has one that all `nodes` agree on."""
    found = {}
    for group_id in groups:
        metrics = [node.runtime.group_metrics(group_id) for node in nodes]
        term = max(m.term for m in metrics)
        leading = [node.name for node, m in zip(nodes, metrics) if m.role == "leader" and m.term == term]
        if len(leading) != 1 or any(m.leader_id != leading[0] for m in metrics):
            return None
        found[group_id] = leading[0]
    return found


def describe_leaders(nodes: list[Node]) -> str:
    history = "\n".join(f"{n.name}: {n.role_changes[-30:]} {n.runtime.metrics()}" for n in nodes)
    return history + "\n" + "; ".join(f"{n.name}: " + ", ".join(
        f"{g}={m.role}/{m.leader_id}/t{m.term}" for g in GROUPS for m in [n.runtime.group_metrics(g)])
        for n in nodes)


def caught_up(nodes: list[Node], expected: dict[str, list[bytes]]) -> bool:
    return all(node.applied[g] == expected[g] for node in nodes for g in GROUPS)


def describe_progress(nodes: list[Node], expected: dict[str, list[bytes]]) -> str:
    return "; ".join(f"{n.name}: applied " + ",".join(str(len(n.applied[g])) for g in GROUPS)
                     + f" of {len(expected[GROUPS[0]])} (failed={n.runtime.failed!r})" for n in nodes)


async def propose_through_leaders(nodes: list[Node], tag: str, count: int,
                                  expected: dict[str, list[bytes]]) -> None:
    """`count` entries per group, each through the group's leader: one entry
    per group per loop turn, so that the proposals never starve the loop (the
    transport's failure detector runs on it too)."""
    by_name = {node.name: node for node in nodes}
    current = leaders(nodes)
    assert current is not None, f"a group has no leader: {describe_leaders(nodes)}"
    for number in range(count):
        for group_id in GROUPS:
            data = f"{group_id}/{tag}/{number}".encode()
            index = by_name[current[group_id]].runtime.propose(group_id, data)
            assert index is not None, \
                f"{current[group_id]} no longer leads {group_id}: {describe_leaders(nodes)}"
            expected[group_id].append(data)
        await asyncio.sleep(0)   # one loop turn: persist, send, apply


async def test_three_runtimes_replicate_fail_over_and_recover_from_disk(tmp_path):
    names = ["node-a", "node-b", "node-c"]
    members = [ClusterNode(name=name, host="127.0.0.1", port=free_port()) for name in names]
    nodes = [Node(name, members, tmp_path / name, seed) for seed, name in enumerate(names)]
    expected: dict[str, list[bytes]] = defaultdict(list)
    started = time.monotonic()
    live = list(nodes)
    try:
        for node in nodes:
            await node.start()
        for node in nodes:
            for group_id in GROUPS:
                assert node.runtime.add_group(group_id, names)
        elected_seconds = await until(lambda: leaders(nodes) is not None, lambda: describe_leaders(nodes),
                                      ELECTION_BOUND_SECONDS)

        # 1. Every node applies the same sequence per group, the proposed one.
        await propose_through_leaders(nodes, "first", ENTRIES_PER_GROUP, expected)
        await until(lambda: caught_up(nodes, expected), lambda: describe_progress(nodes, expected),
                    APPLY_BOUND_SECONDS)

        # 2. Stop the node leading most groups: new leaders within the bound, commits go on.
        led = defaultdict(int)
        for leader in leaders(nodes).values():
            led[leader] += 1
        victim = max(nodes, key=lambda node: led[node.name])
        live = [node for node in nodes if node is not victim]
        stopping = time.monotonic()
        await victim.stop()
        stop_seconds = time.monotonic() - stopping
        await until(lambda: leaders(live) is not None, lambda: describe_leaders(live), NEW_LEADERS_BOUND_SECONDS)
        failover_seconds = time.monotonic() - stopping
        assert failover_seconds < NEW_LEADERS_BOUND_SECONDS, f"new leaders took {failover_seconds:.2f} s"
        assert victim.name not in leaders(live).values()
        await propose_through_leaders(live, "after-failover", ENTRIES_AFTER_FAILOVER, expected)
        await until(lambda: caught_up(live, expected), lambda: describe_progress(live, expected),
                    APPLY_BOUND_SECONDS)

        # 3. Restart it from its data directory: it hosts its groups again and catches up.
        await victim.start()
        live = list(nodes)
        assert sorted(victim.runtime.groups) == sorted(GROUPS), "recovery lost groups"
        for group_id in GROUPS:   # its logs came back from its own disk, not from the leaders
            metrics = victim.runtime.group_metrics(group_id)
            assert metrics.log_entries >= ENTRIES_PER_GROUP, f"{group_id}: {metrics}"
            assert metrics.commit_index >= ENTRIES_PER_GROUP, f"{group_id}: {metrics}"
        catch_up_seconds = await until(lambda: caught_up(nodes, expected), lambda: describe_progress(nodes, expected),
                                       APPLY_BOUND_SECONDS)
        # ... and takes part again: the cluster commits with it.
        await until(lambda: leaders(nodes) is not None, lambda: describe_leaders(nodes), ELECTION_BOUND_SECONDS)
        await propose_through_leaders(nodes, "after-restart", 10, expected)
        await until(lambda: caught_up(nodes, expected), lambda: describe_progress(nodes, expected),
                    APPLY_BOUND_SECONDS)

        for node in nodes:
            assert node.runtime.failed is None, f"{node.name}: {node.runtime.failed!r}"
            assert node.rollovers >= 1, f"{node.name}: the WAL never rolled over; the test lost its point"
        assert victim.recovered_records > 0
        print(f"\nelected in {elected_seconds:.2f} s; failover of {victim.name} ({led[victim.name]} groups led) "
              f"in {failover_seconds:.2f} s (its stop took {stop_seconds:.2f} s); "
              f"restart caught up in {catch_up_seconds:.2f} s; "
              f"rollovers {[n.rollovers for n in nodes]}; recovered {victim.recovered_records} records; "
              f"total {time.monotonic() - started:.2f} s")
        for node in nodes:
            print(node.runtime.metrics())
    finally:
        for node in live:
            if node.runtime is not None and not node.runtime.stopped:
                await node.stop()


# --- replay of the record format, without a network --------------------------------------------------

LOG_ID = RAFT_LOG_ID_BASE + 1


def entry(term: int, index: int, data: bytes = b"x") -> Entry:
    return Entry(term, index, EntryKind.NORMAL, data)


def replay(encoded: list[records.Encoded]) -> RecoveryScan:
    scan = RecoveryScan()
    for record in records.scan(records.FILE_HEADER + b"".join(map(records.joined, encoded))).records:
        scan.visit(record)
    return scan


def item(hard_state=None, snapshot=None, entries=(), truncate_from=None) -> PersistItem:
    return PersistItem("g", hard_state, snapshot, truncate_from, tuple(entries))


def test_a_later_write_at_an_index_replaces_the_tail():
    storage = GroupStorage(LOG_ID, "g", ("a", "b", "c"))
    written = [group_record(LOG_ID, "g", storage.members)]
    written += storage.records_for(item(HardState(1, "a", 0), entries=[entry(1, i) for i in range(1, 6)]))
    written += storage.records_for(item(HardState(2, "b", 3), entries=[entry(2, 4, b"new")], truncate_from=4))
    (group,) = replay(written).groups()
    assert [(e.term, e.index, e.data) for e in group.state.entries] == \
        [(1, 1, b"x"), (1, 2, b"x"), (1, 3, b"x"), (2, 4, b"new")]
    assert group.state.hard_state == HardState(2, "b", 3)
    assert group.members == ("a", "b", "c")


def test_a_snapshot_keeps_the_entries_after_a_matching_last_entry_and_drops_a_conflicting_log():
    entries = [entry(1, i) for i in range(1, 8)]
    matching = [group_record(LOG_ID, "g", ("a",))] + GroupStorage(LOG_ID, "g", ("a",)).records_for(
        item(HardState(1, None, 7), Snapshot(5, 1, ("a",), b"state"), entries))
    (group,) = replay(matching).groups()
    assert [e.index for e in group.state.entries] == [6, 7]
    assert group.state.snapshot.data == b"state"
    storage = GroupStorage(LOG_ID, "g", ("a",))
    conflicting = [group_record(LOG_ID, "g", ("a",))] + storage.records_for(item(entries=entries))
    conflicting += storage.records_for(item(HardState(3, None, 5), Snapshot(5, 3, ("a",), b"")))
    (group,) = replay(conflicting).groups()
    assert group.state.entries == [] and group.state.snapshot.index == 5


def test_rollover_records_rebuild_the_same_state_and_the_commit_index_is_capped():
    storage = GroupStorage(LOG_ID, "g", ("a", "b", "c"))
    storage.records_for(item(HardState(4, "c", 9), Snapshot(3, 2, ("a", "b", "c"), b"s")))
    cursors_and_records = storage.rollover_records()
    assert storage.cursor() == 4
    # The entries after the snapshot sit in a segment (visited first); the hard
    # state came from a batch that never became durable: commit capped at 5.
    segment = [records.encode(LOG_ID, 2, i, records_payload(i)) for i in (4, 5)]
    (group,) = replay(segment + cursors_and_records).groups()
    assert [e.index for e in group.state.entries] == [4, 5]
    assert group.state.hard_state == HardState(4, "c", 5)
    assert group.state.snapshot.index == 3


def records_payload(index: int) -> bytes:
    return msgpack.packb([int(EntryKind.NORMAL), f"e{index}".encode()])


def test_removed_groups_stay_removed_and_a_hole_is_refused():
    removed = [group_record(LOG_ID, "gone", ("a",)), removed_record(LOG_ID)]
    scan = replay(removed)
    assert list(scan.groups()) == [] and scan.next_group_number() == 2
    holed = [group_record(LOG_ID, "g", ("a",))] + GroupStorage(LOG_ID, "g", ("a",)).records_for(
        item(entries=[entry(1, 1), entry(1, 3)]))
    with pytest.raises(RaftLogCorrupt, match="hole"):
        list(replay(holed).groups())


async def test_leaders_of_a_node_whose_loop_stalled_step_down_and_a_group_of_one_keeps_leading(tmp_path):
    """The loop held past two of the longest election timeouts (as a SIGSTOP would): on their
    next tick or turn the runtimes' leaders of groups with other voters step down before
    applying anything (another leader may have been elected meanwhile); the group whose only
    voter is here keeps its leader; the groups elect again."""
    names = ["node-a", "node-b", "node-c"]
    members = [ClusterNode(name=name, host="127.0.0.1", port=free_port()) for name in names]
    nodes = [Node(name, members, tmp_path / name, seed) for seed, name in enumerate(names)]
    shared = GROUPS[:3]
    try:
        for node in nodes:
            await node.start()
            for group_id in shared:
                assert node.runtime.add_group(group_id, names)
        assert nodes[0].runtime.add_group("alone", [names[0]])
        # The role-change callback comes after the vote is durable, later than role() shows it:
        # mark the changes only once every leader's own callback has been heard.
        await until(lambda: leaders(nodes, shared) is not None and nodes[0].role("alone") == "leader"
                    and nodes[0].reported_role("alone") == "leader"
                    and all(next(n for n in nodes if n.name == leader).reported_role(group_id) == "leader"
                            for group_id, leader in leaders(nodes, shared).items()),
                    lambda: describe_leaders(nodes), ELECTION_BOUND_SECONDS)
        before = leaders(nodes, shared)
        marks = [len(node.role_changes) for node in nodes]
        runtime = nodes[0].runtime
        stall = stall_limit_seconds(runtime.raft_options["election_ticks"], runtime.tick_seconds)
        time.sleep(stall + 0.5)   # the fault itself: every node's loop held (no other thread waits on it)
        await until(lambda: leaders(nodes, shared) is not None, lambda: describe_leaders(nodes),
                    NEW_LEADERS_BOUND_SECONDS)
        for group_id, leader in before.items():
            node = next(n for n in nodes if n.name == leader)
            changes = [c for c in node.role_changes[marks[nodes.index(node)]:] if c[1] == group_id]
            assert changes and changes[0][2] == "follower", \
                f"{leader} kept leading {group_id} through the stall: {node.role_changes[-10:]}"
        assert not [c for c in nodes[0].role_changes[marks[0]:] if c[1] == "alone"], \
            f"the group of one stepped down: {nodes[0].role_changes[-10:]}"
        assert nodes[0].role("alone") == "leader"
    finally:
        for node in nodes:
            await node.stop()


async def start_alone_leading(node: Node, group_ids: tuple[str, ...]) -> None:
    """Start `node`, a cluster of its own, and wait until it leads each of `group_ids`."""
    await node.start()
    for group_id in group_ids:
        assert node.runtime.add_group(group_id, [node.name])
    await until(lambda: all(node.role(group_id) == "leader" for group_id in group_ids),
                lambda: str(node.role_changes), ELECTION_BOUND_SECONDS)


async def test_a_removed_groups_segments_go_at_a_rollover_made_for_them_not_once_the_wal_is_full(tmp_path):
    """A deleted queue's segments are let go at a rollover; one over a WAL file's worth gets
    a rollover of its own when the group is removed (on a quiet node the WAL may take long to
    fill), and the node's other groups are unharmed."""
    node = Node("node-a", [ClusterNode(name="node-a", host="127.0.0.1", port=free_port())], tmp_path / "node-a", 1)
    try:
        await start_alone_leading(node, ("big", "kept"))
        log_id = node.runtime.groups["big"].log_id
        for number in range(400):   # kept whole (no snapshot): each rollover copies it into segments
            assert node.runtime.propose("big", b"%d:" % number + b"x" * 1024) is not None
            assert node.runtime.propose("kept", b"k%d" % number) is not None
            await asyncio.sleep(0)
        await until(lambda: node.store.log_segment_bytes(log_id) >= WAL_MAX_SIZE_BYTES
                    and node.applied["kept"] and len(node.applied["kept"]) == 400,
                    lambda: f"segments {node.store.log_segment_bytes(log_id)} B, rollovers {node.rollovers}", 10)
        for number in range(1000):   # small writes until a rollover leaves the WAL under its size
            if node.store.wal_size_bytes < WAL_MAX_SIZE_BYTES // 2:
                break
            assert node.runtime.propose("kept", b"s%d" % number) is not None
            await asyncio.sleep(0.001)
        await asyncio.wait_for(node.committer.drain(), 5)   # no rollover under way
        rollovers, wal_bytes = node.rollovers, node.store.wal_size_bytes
        assert node.runtime.remove_group("big")
        await until(lambda: not (node.store.segments_dir / str(log_id)).exists() and not node.store.trash_to_shred,
                    lambda: f"segments {node.store.log_segment_bytes(log_id)} B after the removal, "
                            f"rollovers {node.rollovers - rollovers}", 10)
        assert node.rollovers == rollovers + 1, "one rollover for the removed group's segments"
        assert wal_bytes < WAL_MAX_SIZE_BYTES, "the WAL was not full: the rollover was the removal's"
        assert node.runtime.propose("kept", b"after") is not None
        await until(lambda: node.applied["kept"][-1:] == [b"after"], lambda: str(node.applied["kept"][-3:]), 5)
    finally:
        await node.stop()


async def test_a_removed_groups_notes_in_the_wal_go_once_its_removal_is_written(tmp_path):
    """The WAL notes where each log's records lie until a rollover (storage/wal_heads.py); a
    node whose clients declare and delete queues by the thousand between two rollovers (a
    512 MiB WAL) must not keep the notes of every log it removed."""
    node = Node("node-a", [ClusterNode(name="node-a", host="127.0.0.1", port=free_port())], tmp_path / "node-a", 1)
    try:
        await start_alone_leading(node, ("gone", "kept"))
        log_id = node.runtime.groups["gone"].log_id
        for number in range(20):
            assert node.runtime.propose("gone", b"g%d" % number) is not None
        await until(lambda: len(node.applied["gone"]) == 20, lambda: str(node.applied["gone"]), 5)
        notes = node.store._heads[node.store.wal_path].logs
        assert log_id in notes, "the removed group's records were never noted: the test lost its point"
        rollovers = node.rollovers
        assert node.runtime.remove_group("gone")
        assert node.runtime.propose("kept", b"after") is not None
        await until(lambda: node.applied["kept"][-1:] == [b"after"], lambda: str(node.applied["kept"][-3:]), 5)
        await asyncio.wait_for(node.committer.drain(), 5)
        assert node.rollovers == rollovers, "a rollover came between: it drops every note, the test lost its point"
        assert log_id not in node.store._heads[node.store.wal_path].logs, \
            "the removed group's notes stay until the next rollover"
    finally:
        await node.stop()


async def test_leaders_of_a_node_whose_disk_is_full_step_down_and_the_groups_go_on(tmp_path):
    """A node whose WAL finds the disk full persists nothing: the groups it leads would apply
    nothing (its followers commit without it, but it cannot take its next Ready). Past the stall
    limit its leaders step down, the other two elect leaders and go on; once there is room the
    node writes what waited and catches up."""
    names = ["node-a", "node-b", "node-c"]
    members = [ClusterNode(name=name, host="127.0.0.1", port=free_port()) for name in names]
    nodes = [Node(name, members, tmp_path / name, seed) for seed, name in enumerate(names)]
    expected: dict[str, list[bytes]] = defaultdict(list)
    try:
        for node in nodes:
            await node.start()
            for group_id in GROUPS:
                assert node.runtime.add_group(group_id, names)
        await until(lambda: leaders(nodes) is not None, lambda: describe_leaders(nodes), ELECTION_BOUND_SECONDS)
        await propose_through_leaders(nodes, "before", 5, expected)
        await until(lambda: caught_up(nodes, expected), lambda: describe_progress(nodes, expected),
                    APPLY_BOUND_SECONDS)
        full = next(n for n in nodes if n.name in leaders(nodes).values())
        others = [n for n in nodes if n is not full]

        def no_space(data: bytes):
            raise NoSpace(errno.ENOSPC, "injected: the disk is full")

        full.store.write_batch = no_space   # looked up per batch by the writer thread
        for group_id, leader in leaders(nodes).items():   # one proposal each: the full node's wait begins
            if leader == full.name:
                assert full.runtime.propose(group_id, b"stuck") is not None
        await until(lambda: full.committer.waiting_for_space, "the full node never tried to write", 5.0)
        runtime = full.runtime
        stall = stall_limit_seconds(runtime.raft_options["election_ticks"], runtime.tick_seconds)
        await until(lambda: (current := leaders(others)) is not None and full.name not in current.values(),
                    lambda: f"the full node still leads: {describe_leaders(nodes)}", stall + NEW_LEADERS_BOUND_SECONDS)
        written: dict[str, list[bytes]] = defaultdict(list)
        await propose_through_leaders(others, "while-full", 5, written)
        # What the full node took in as leader is applied before these if it was committed, or
        # never: once both others end with these and agree, their logs are what all must reach.
        await until(lambda: all(n.applied[g][-5:] == written[g] and n.applied[g] == others[0].applied[g]
                                for n in others for g in GROUPS),
                    lambda: describe_progress(nodes, written), APPLY_BOUND_SECONDS)
        expected = {group_id: list(others[0].applied[group_id]) for group_id in GROUPS}
        del full.store.write_batch   # room again
        await until(lambda: caught_up(nodes, expected), lambda: describe_progress(nodes, expected),
                    APPLY_BOUND_SECONDS)
        assert runtime.failed is None
    finally:
        for node in nodes:
            await node.stop()
