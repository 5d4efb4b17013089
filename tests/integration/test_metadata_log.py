"""The metadata Raft group's log is the node's only record of its topology
and definitions (broker/node/metadata_log.py): checked against a real
``warren-server`` and the WAL it leaves on disk.

* On a new data directory the config's users, vhosts and permissions are the
  group's first entry (`SeedDefinitions`), not a journal of their own.
* The group's log is compacted with the machine's snapshot like a queue's
  log: after many changes the WAL holds a snapshot and only the entries
  after it, and a restart (kill -9) rebuilds topology and definitions from
  that snapshot and those entries.
* A node that was away while the leader compacted the metadata log catches
  up from the leader's snapshot.
* A durable auto-delete classic queue is a Raft group of one: its persistent
  messages survive a restart, and when its last consumer goes it is deleted
  through the metadata group, so it stays deleted after the next restart.
"""
from __future__ import annotations

import signal
from pathlib import Path

import msgpack
import pika

from tests.integration.pika_support import connect, message_count
from tests.integration.quorum_cluster import NAMES, api, start_cluster, stop_all, wait_for
from tests.integration.quorum_cluster import connect as cluster_connect
from tests.integration.test_durability import (
    SMALL_WAL,
    barrier,
    confirm_channel,
    passive_exchange_exists,
    passive_queue_exists,
    running,
)
from warren.broker.node import metadata_commands as mc
from warren.raft.messages import EntryKind
from warren.raft.raft_storage import RAFT_LOG_ID_BASE, RecoveryScan
from warren.storage.wal import LogStore

PERSISTENT = pika.BasicProperties(delivery_mode=2)
# more than broker/node/metadata_log.py's SNAPSHOT_ENTRIES_MIN (256) changes, so the group compacts
CHANGES = 320


class WalOnDisk:
    """The Raft groups as a stopped server's WAL and segments hold them, read in this process."""

    def __init__(self, data_dir: Path) -> None:
        self.scan = RecoveryScan()
        self.records: dict[int, list[tuple[int, bytes]]] = {}   # log id -> [(index, payload)] as on disk
        store = LogStore(data_dir / "log", 1 << 30, 1 << 20)
        store.recover(self.visit)
        store.close()
        self.groups = {scan.group_id: scan for scan in self.scan.logs.values() if not scan.removed}

    def visit(self, record, location) -> None:
        assert record.log_id >= RAFT_LOG_ID_BASE, f"a record of log {record.log_id}: not a Raft group's"
        self.records.setdefault(record.log_id, []).append((record.index, bytes(record.payload)))
        self.scan.visit(record, location)

    def entries_on_disk(self, group: str) -> list[tuple[int, list]]:
        """The group's entry records (index >= 1) as written, decoded: (index, [kind, data])."""
        log_id = self.groups[group].log_id
        return [(index, msgpack.unpackb(payload, raw=False)) for index, payload in self.records[log_id] if index]


def stop(server, how=signal.SIGKILL) -> None:
    server.stop(how)


def test_the_configs_definitions_are_the_first_entry_of_an_empty_metadata_log(tmp_path):
    with running(tmp_path) as server:
        with connect(server):
            pass   # guest logs in: the seed was applied before the port opened
        stop(server, signal.SIGTERM)
        wal = WalOnDisk(server.data_dir)
        first = next(data for _, (kind, data) in wal.entries_on_disk("meta") if kind == EntryKind.NORMAL)
        seed = mc.decode(first)
        assert isinstance(seed, mc.SeedDefinitions), f"the metadata log starts with {seed!r}"
        assert seed.vhosts == ("/",) and [user[0] for user in seed.users] == ["guest"]
        assert seed.permissions == (("guest", "/", ".*", ".*", ".*"),)
        server.start()
        with connect(server):
            pass
        stop(server, signal.SIGTERM)
        seeds = [data for _, (kind, data) in WalOnDisk(server.data_dir).entries_on_disk("meta")
                 if kind == EntryKind.NORMAL and isinstance(mc.decode(data), mc.SeedDefinitions)]
        assert seeds == [first], "one seed, and a log that is not empty is not seeded again"


def test_the_metadata_log_is_compacted_and_a_restart_rebuilds_from_its_snapshot(tmp_path):
    with running(tmp_path, **SMALL_WAL) as server:
        with connect(server) as connection:
            channel = connection.channel()
            channel.exchange_declare("kept", "topic", durable=True)
            channel.queue_declare("kept-q", durable=True)
            channel.queue_bind("kept-q", "kept", "a.#")
            for i in range(CHANGES // 2):
                channel.exchange_declare(f"churn-{i}", "direct", durable=True)
                channel.exchange_delete(f"churn-{i}")
            channel.exchange_declare("late", "fanout", durable=True)   # after the snapshot, most likely
            publisher = confirm_channel(connection)
            for _ in range(200):   # WAL rollovers drop what the snapshot covers from disk
                publisher.basic_publish("kept", "a.b", b"x" * 1024, PERSISTENT)
            barrier(connection)
        stop(server)
        wal = WalOnDisk(server.data_dir)
        meta = wal.groups["meta"]
        assert meta.snapshot is not None, "the metadata group never compacted its log"
        assert meta.snapshot.index > CHANGES // 2
        written = [index for index, _ in wal.entries_on_disk("meta")]
        assert min(written) > 1, "entries the snapshot covers are still on disk after rollovers"

        server.start()
        with connect(server) as connection:
            assert passive_exchange_exists(connection, "kept") and passive_exchange_exists(connection, "late")
            assert not passive_exchange_exists(connection, "churn-0")
            assert not passive_exchange_exists(connection, f"churn-{CHANGES // 2 - 1}")
            assert message_count(connection, "kept-q") == 200
            channel = confirm_channel(connection)
            channel.basic_publish("kept", "a.c", b"routed", PERSISTENT, mandatory=True)   # the binding is back
            assert message_count(connection, "kept-q") == 201


def test_a_durable_auto_delete_classic_queue_is_a_group_of_one_deleted_through_metadata(tmp_path):
    with running(tmp_path) as server:
        with connect(server) as connection:
            channel = confirm_channel(connection)
            channel.queue_declare("ad", durable=True, auto_delete=True)
            for i in range(5):
                channel.basic_publish("", "ad", f"m{i}".encode(), PERSISTENT)
        stop(server)
        groups = WalOnDisk(server.data_dir).groups
        assert any(group.startswith("q:/:ad:") for group in groups), f"no Raft group for the queue: {sorted(groups)}"

        server.start()
        with connect(server) as connection:
            assert message_count(connection, "ad") == 5
            channel = connection.channel()
            channel.queue_declare("ad", durable=True, auto_delete=True)   # equivalent: auto_delete is kept
            got = []
            tag = channel.basic_consume("ad", lambda ch, method, properties, body: got.append(body), auto_ack=True)
            wait_for(lambda: connection.process_data_events(0.05) or len(got) == 5, "the five messages")
            assert got == [f"m{i}".encode() for i in range(5)]
            channel.basic_cancel(tag)
            wait_for(lambda: not passive_queue_exists(connection, "ad"), "the unused queue to be deleted")
        stop(server)
        server.start()
        with connect(server) as connection:
            assert not passive_queue_exists(connection, "ad"), "the deletion went through the metadata log"


def test_a_node_that_was_away_catches_up_from_the_leaders_compacted_metadata_log(tmp_path):
    """Raft §7: the leader's metadata log starts after its snapshot, so the node
    that was away is sent the snapshot, which it installs over its live read
    model (broker/node/metadata_diff.py) before the entries after it."""
    servers = start_cluster(tmp_path)
    a, _, c = NAMES
    try:
        with cluster_connect(servers[a]) as connection:
            connection.channel().exchange_declare("gone-later", "direct", durable=True)
        wait_for(lambda: any(x["name"] == "gone-later" for x in api(servers[c], "/api/exchanges")), "c to know it")
        servers[c].stop()
        with cluster_connect(servers[a]) as connection:
            channel = connection.channel()
            channel.exchange_delete("gone-later")
            channel.exchange_declare("kept", "topic", durable=True)
            channel.queue_declare("kept-q", durable=True, arguments={"x-queue-type": "quorum"})
            channel.queue_bind("kept-q", "kept", "a.#")
            for i in range(CHANGES // 2):
                channel.exchange_declare(f"churn-{i}", "direct", durable=True)
                channel.exchange_delete(f"churn-{i}")
        servers[c].start()   # returns once it caught up with the metadata group
        # c applied too few entries to take a snapshot of its own: this one is the leader's
        assert "metadata.snapshot_installed" in servers[c].log(), "c caught up by entries, not the snapshot"
        with cluster_connect(servers[c]) as connection:
            assert passive_exchange_exists(connection, "kept") and passive_queue_exists(connection, "kept-q")
            assert not passive_exchange_exists(connection, "gone-later")
            assert not passive_exchange_exists(connection, "churn-0")
            channel = connection.channel()
            channel.confirm_delivery()
            channel.basic_publish("kept", "a.b", b"routed on c", PERSISTENT, mandatory=True)
        with cluster_connect(servers[a]) as connection:
            wait_for(lambda: message_count(connection, "kept-q") == 1, "the message routed through c")
    finally:
        stop_all(servers)
