"""What the broker writes to the node's WAL, and how it is rebuilt at start.

Two kinds of log share the WAL (``storage.wal``):

* the metadata log (id 0): durable exchanges, queues and bindings, users,
  vhosts and permissions (`definitions`), one msgpack record per change, and
  at every WAL rollover one ``snapshot`` record of the whole durable topology
  and the definitions, which supersedes everything before it;
* one log per durable queue: ``[ENQUEUE, exchange, routing_key, properties,
  body]`` at the message's id (a persistent message only), and
  ``[REMOVE, [msg_id, ...]]`` when messages are settled, discarded, dropped or
  purged. A queue's release cursor is its oldest live message: every entry
  below it is dead (enqueued and removed), so it can go from WAL and segments.

Recovery applies the last snapshot and the metadata records after it, then
rebuilds each durable queue from its live messages in id order.

Definitions: the config's users, vhosts and permissions are only the seed of
a fresh node. A log without definitions (a new data directory, or one written
before definitions were journaled) gets a ``definitions`` record of the
config's at the end of recovery; from then on the log is the truth: its
definitions replace the config's at every start, and the config's users and
vhosts are not read again (README "Users and vhosts").
Non-durable queues and transient messages are never written, as in RabbitMQ.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgpack
import structlog
from prometheus_client import Histogram

from warren.broker.admin.auth import Permission, UserRecord
from warren.broker.queues.queue import Queue
from warren.broker.routing.exchanges import Binding, Exchange, make_exchange
from warren.broker.routing.vhost import NullJournal
from warren.config import Settings
from warren.protocol import codec
from warren.protocol.constants import PROP_EXPIRATION, PROP_PRIORITY
from warren.raft.raft_storage import is_raft_log_id
from warren.storage import records
from warren.storage.group_commit import BatchWritten, GroupCommitter
from warren.storage.wal import Location, LogStore, Relocation

if TYPE_CHECKING:
    from warren.broker.node.broker import Broker
    from warren.broker.routing.vhost import VirtualHost

log = structlog.get_logger("warren.durability")

METADATA_LOG_ID = 0
ENQUEUE = 1
REMOVE = 2


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True, default=str)


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


class Durability:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.store = LogStore(settings.data_dir / "log", settings.wal_max_size_bytes, settings.segment_max_entries)
        self.committer = GroupCommitter(self.store, self._prepare_rollover, self._on_batch_written,
                                        self._on_relocated)
        # durable queues by their log id, for relocating stored messages after a rollover
        self.queues_by_log: dict[int, Queue] = {}
        # batch -> (queue, msg_id, offset in batch, record length): messages whose bodies
        # can leave memory once that batch is on disk
        self._to_store: dict[int, list[tuple[Queue, int, int, int]]] = {}
        self.broker: "Broker | None" = None
        # set by the cluster: the Raft groups' part of a rollover, and their recovery visitor
        self.raft_rollover: Callable[[], tuple[dict[int, int], bytes]] | None = None
        self.raft_visit: Callable[[records.Record, Location], None] | None = None
        self.meta_index = 0
        # the highest index of the metadata Raft group whose change is in this log
        self.meta_applied_index = 0
        self.next_log_id = 1
        self.recovery_seconds = 0.0
        # the WAL batch holding the newest metadata record (topology replies wait for it)
        self.last_meta_batch = 0
        # recovery found users, vhosts and permissions in the log (else the config's seed them)
        self.definitions_recovered = False
        # per-log release cursors of the last rollover, read back from its snapshot
        self._recovered_cursors: dict[int, int] = {}
        self.entries_per_fsync = Histogram(
            "warren_wal_entries_per_fsync", "WAL records made durable by one fdatasync",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096), registry=None)
        self.fsync_seconds = Histogram(
            "warren_wal_fsync_seconds", "Time to write and fdatasync one WAL batch",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0), registry=None)

    # -- metadata journal (called by VirtualHost) --------------------------
    def _meta(self, entry: list) -> int:
        self.meta_index += 1
        self.last_meta_batch = self.committer.append(
            records.encode(METADATA_LOG_ID, 0, self.meta_index, _pack(entry)))
        return self.last_meta_batch

    def meta_applied(self, index: int) -> None:
        """The metadata group's entry `index` is applied here (its changes were
        journaled just before): a restart need not apply it again."""
        self.meta_applied_index = index
        self._meta(["meta_applied", index])

    def definitions_changed(self, entry: list) -> None:
        """A user, vhost or permission changed (broker/admin/definitions.py); one record."""
        assert entry[0] in _DEFINITION_RECORDS, f"not a definitions record: {entry[0]!r}"
        self._meta(entry)

    def exchange_declared(self, vhost: "VirtualHost", exchange: Exchange) -> None:
        if exchange.durable:
            self._meta(["exchange", vhost.name, *_exchange_row(exchange)])

    def exchange_deleted(self, vhost: "VirtualHost", exchange: Exchange) -> None:
        if exchange.durable:
            self._meta(["exchange_deleted", vhost.name, exchange.name])

    def queue_declared(self, vhost: "VirtualHost", queue: Queue) -> None:
        if not queue.durable:
            return
        if queue.replicated:  # its messages live in its Raft group's log
            self._meta(["queue", vhost.name, *_queue_row(queue)])
            return
        self._attach(queue, self.next_log_id)
        self._meta(["queue", vhost.name, *_queue_row(queue)])

    def _attach(self, queue: Queue, log_id: int) -> None:
        assert not is_raft_log_id(log_id), f"queue log id {log_id} is in the Raft range"
        queue.log_id = log_id
        queue.journal = self
        queue.state.track_removals = True
        self.queues_by_log[log_id] = queue
        self.next_log_id = max(self.next_log_id, log_id + 1)

    def queue_deleted(self, vhost: "VirtualHost", queue: Queue) -> None:
        if queue.log_id is not None or queue.replicated:
            self.queues_by_log.pop(queue.log_id, None)
            self._meta(["queue_deleted", vhost.name, queue.name])

    def binding_changed(self, vhost: "VirtualHost", binding: Binding, bound: bool) -> None:
        if self._binding_is_durable(vhost, binding):
            self._meta(["bind" if bound else "unbind", vhost.name, *_binding_row(binding)])

    @staticmethod
    def _binding_is_durable(vhost: "VirtualHost", binding: Binding) -> bool:
        source = vhost.exchanges.get(binding.source)
        kind, name = binding.destination
        target = vhost.queues.get(name) if kind == "queue" else vhost.exchanges.get(name)
        return source is not None and source.durable and target is not None and target.durable

    # -- queue logs (called by Queue) --------------------------------------
    def log_enqueue(self, queue: Queue, msg_id: int, payload: tuple) -> int:
        encoded = records.encode(queue.log_id, 0, msg_id, _pack([ENQUEUE, *payload]))
        batch = self.committer.append(encoded)
        waiting = self._to_store.get(batch)
        if waiting is None:
            waiting = self._to_store[batch] = []
            # a failed batch is never "written": forget its messages (they stay in memory)
            self.committer.when_durable(batch, lambda ok: ok or self._to_store.pop(batch, None))
        waiting.append((queue, msg_id, self.committer.last_offset_in_batch, len(encoded)))
        return batch

    def log_removals(self, log_id: int, index: int, removed: list) -> None:
        persistent = [msg_id for msg_id, payload, _ in removed
                      if type(payload) is Location or codec.is_persistent(payload[2])]
        if persistent:
            self.committer.append(records.encode(log_id, 0, index, _pack([REMOVE, persistent])))

    # -- rollover ------------------------------------------------------------
    def _prepare_rollover(self) -> tuple[dict[int, int], bytes]:
        """Cursors of every live log, and the metadata snapshot that starts the new WAL."""
        assert self.broker is not None, "rollover before the broker was attached"
        self.meta_index += 1
        cursors = {METADATA_LOG_ID: self.meta_index}
        snapshot: dict[str, Any] = {}
        for vhost in self.broker.vhosts.values():
            snapshot[vhost.name] = _vhost_rows(vhost)
            for queue in vhost.queues.values():
                if queue.log_id is not None:
                    cursors[queue.log_id] = queue.release_cursor()
        # The cursors go into the snapshot: a segment file may keep dead entries below
        # its log's cursor next to live ones, and recovery must skip those.
        first = records.encode(METADATA_LOG_ID, 0, self.meta_index,
                               _pack(["snapshot", snapshot, self.next_log_id, cursors, self.meta_applied_index,
                                      self._definitions()]))
        if self.raft_rollover is not None:
            raft_cursors, raft_records = self.raft_rollover()
            cursors.update(raft_cursors)
            first += raft_records
        return cursors, first

    def _definitions(self) -> dict:
        assert self.broker is not None, "definitions before the broker was attached"
        return self.broker.access.definitions(list(self.broker.vhosts))

    def _on_batch_written(self, written: BatchWritten) -> None:
        """A batch is durable: its messages' bodies may now be read back from disk
        instead of being held in memory (RabbitMQ's lazy queues)."""
        self.entries_per_fsync.observe(written.entries)
        self.fsync_seconds.observe(written.seconds)
        for queue, msg_id, offset, length in self._to_store.pop(written.batch, ()):
            queue.store_body(msg_id, Location(written.path, written.start_offset + offset, length))

    def _on_relocated(self, moved: list[Relocation]) -> None:
        """A rollover copied entries into segments: point stored bodies at the copies."""
        for relocation in moved:
            queue = self.queues_by_log.get(relocation.log_id)
            if queue is not None:
                for index, location in relocation.locations():
                    queue.relocate_body(index, location)

    def load(self, location: Location) -> tuple:
        """A stored message body back from disk, as the payload tuple."""
        decoded = _unpack(self.store.read_payload(location))
        assert decoded[0] == ENQUEUE, f"record at {location} is not an enqueue"
        return tuple(decoded[1:])

    # -- recovery ------------------------------------------------------------
    def recover(self, broker: "Broker") -> None:
        started = time.perf_counter()
        self.broker = broker
        scan = _RecoveryScan(self.raft_visit)
        recovered = self.store.recover(scan.visit)
        for torn in recovered.torn:
            log.warning("wal.torn_tail_cut", file=str(torn.path), offset=torn.offset,
                        bytes_lost=torn.bytes_lost, reason=torn.reason)
        for vhost in broker.vhosts.values():
            vhost.journal = NullJournal()  # replaying must not write the records again
        self._replay_metadata(broker, scan.metadata)
        for vhost in broker.vhosts.values():
            vhost.journal = self
        if not self.definitions_recovered:
            # a fresh node: the config's users, vhosts and permissions are its seed
            self._meta(["definitions", self._definitions()])
            self.definitions_recovered = True
        self.queues_by_log = {q.log_id: q for v in broker.vhosts.values() for q in v.queues.values()
                              if q.log_id is not None}
        messages = 0
        for log_id, queue in self.queues_by_log.items():
            messages += self._restore_queue(queue, scan.logs.get(log_id))
        self.recovery_seconds = time.perf_counter() - started
        log.info("recovery.done", seconds=round(self.recovery_seconds, 3), messages=messages,
                 queues=sum(len(v.queues) for v in broker.vhosts.values()))

    def _replay_metadata(self, broker: "Broker", metadata: dict[int, records.Record]) -> None:
        entries = [(index, _unpack(record.payload)) for index, record in sorted(metadata.items())]
        start = 0
        for position, (_, entry) in enumerate(entries):
            if entry[0] == "snapshot":
                start = position
        for index, entry in entries[start:]:
            self.meta_index = max(self.meta_index, index)
            self._apply_metadata(broker, entry)

    def _apply_metadata(self, broker: "Broker", entry: list) -> None:
        kind = entry[0]
        if kind == "meta_applied":
            self.meta_applied_index = max(self.meta_applied_index, entry[1])
            return
        if kind in _DEFINITION_RECORDS:
            self._apply_definitions_record(broker, entry)
            return
        if kind == "snapshot":
            _, snapshot, next_log_id, cursors, *rest = entry
            if rest:
                self.meta_applied_index = max(self.meta_applied_index, rest[0])
            if len(rest) > 1:
                self._apply_definitions_record(broker, ["definitions", rest[1]])
            self.next_log_id = max(self.next_log_id, next_log_id)
            self._recovered_cursors = {int(log_id): cursor for log_id, cursor in cursors.items()}
            for vhost_name, rows in snapshot.items():
                vhost = broker.vhosts.get(vhost_name)
                if vhost is None:
                    continue
                for row in rows["exchanges"]:
                    _restore_exchange(vhost, row)
                for row in rows["queues"]:
                    self._restore_queue_declaration(vhost, row)
                for row in rows["bindings"]:
                    _restore_binding(vhost, row, True)
            return
        vhost = broker.vhosts.get(entry[1])
        if vhost is None:
            return
        match kind:
            case "exchange":
                _restore_exchange(vhost, entry[2:])
            case "exchange_deleted":
                exchange = vhost.exchanges.get(entry[2])
                if exchange is not None:
                    vhost.remove_exchange(exchange)
            case "queue":
                self._restore_queue_declaration(vhost, entry[2:])
            case "queue_deleted":
                queue = vhost.queues.get(entry[2])
                if queue is not None:
                    vhost.delete_queue_now(queue)
            case "bind" | "unbind":
                _restore_binding(vhost, entry[2:], kind == "bind")
            case _:
                raise AssertionError(f"unknown metadata record {kind!r}")

    def _apply_definitions_record(self, broker: "Broker", entry: list) -> None:
        access = broker.access
        match entry:
            case ["definitions", definitions]:
                # the whole set: replaces what the config seeded (and any earlier records)
                self.definitions_recovered = True
                access.load(definitions)
                wanted = definitions["vhosts"]
                for name in [name for name in broker.vhosts if name not in wanted]:
                    broker.remove_vhost(name)
                for name in wanted:
                    if name not in broker.vhosts:
                        broker.add_vhost(name).journal = NullJournal()
            case ["user", name, password_hash, tags]:
                access.put_user(UserRecord(name, password_hash, tuple(tags)))
            case ["user_deleted", name]:
                access.delete_user(name)
            case ["vhost", name]:
                if name not in broker.vhosts:
                    broker.add_vhost(name).journal = NullJournal()
            case ["vhost_deleted", name]:
                broker.remove_vhost(name)
            case ["permission", user, vhost, configure, write, read]:
                access.set_permission(user, vhost, Permission(configure, write, read))
            case ["permission_cleared", user, vhost]:
                access.clear_permission(user, vhost)
            case _:
                raise AssertionError(f"malformed definitions record {entry!r}")

    def _restore_queue_declaration(self, vhost: "VirtualHost", row: list) -> None:
        name, log_id, auto_delete, arguments, *replicated = row
        if replicated:  # a quorum queue: [group, members]; its Raft group recovers its messages
            assert self.broker is not None
            self.broker.cluster.restore_queue(vhost, name, arguments, *replicated)
            return
        queue = Queue(vhost, name, True, None, auto_delete, arguments)
        self._attach(queue, log_id)
        vhost.add_queue(queue)

    def _restore_queue(self, queue: Queue, scanned: "_LogScan | None") -> int:
        """Re-enqueue the live messages, bodies left on disk, skipping the dead
        entries below the cursor of the last rollover."""
        if scanned is None:
            return 0
        cursor = self._recovered_cursors.get(queue.log_id, 0)
        removed = scanned.removed
        live = [(msg_id, location, size) for msg_id, (location, size) in sorted(scanned.enqueued.items())
                if msg_id >= cursor and msg_id not in removed]
        queue.restore(live, scanned.last_index, scanned.priorities, scanned.ttls)
        return len(queue.state.messages)

    async def close(self) -> None:
        await self.committer.drain()
        self.store.close()


_DEFINITION_RECORDS = ("definitions", "user", "user_deleted", "vhost", "vhost_deleted", "permission",
                       "permission_cleared")


def _exchange_row(exchange: Exchange) -> list:
    return [exchange.name, exchange.type, exchange.auto_delete, exchange.internal, exchange.arguments]


def _queue_row(queue: Queue) -> list:
    if queue.replicated:
        return [queue.name, None, False, queue.arguments, queue.group, queue.members]
    return [queue.name, queue.log_id, queue.auto_delete, queue.arguments]


def _binding_row(binding: Binding) -> list:
    return [binding.source, binding.destination[0], binding.destination[1], binding.routing_key,
            binding.table]


def _vhost_rows(vhost: "VirtualHost") -> dict:
    exchanges = [_exchange_row(e) for e in vhost.exchanges.values()
                 if e.durable and e.name and not e.name.startswith("amq.")]
    queues = [_queue_row(q) for q in vhost.queues.values() if q.log_id is not None or q.replicated]
    bindings = [_binding_row(b) for e in vhost.exchanges.values() if e.name for b in e.bindings
                if Durability._binding_is_durable(vhost, b)]
    return {"exchanges": exchanges, "queues": queues, "bindings": bindings}


def _restore_exchange(vhost: "VirtualHost", row: list) -> None:
    name, type_, auto_delete, internal, arguments = row
    if name not in vhost.exchanges:
        vhost.exchanges[name] = make_exchange(name, type_, True, auto_delete, internal, arguments)


def _restore_binding(vhost: "VirtualHost", row: list, bound: bool) -> None:
    source, kind, destination, routing_key, arguments = row
    exchange = vhost.exchanges.get(source)
    target_exists = (destination in vhost.queues) if kind == "queue" else (destination in vhost.exchanges)
    if exchange is None or not target_exists:
        return
    binding = Binding.make(source, (kind, destination), routing_key, arguments)
    if bound:
        exchange.bind(binding)
    else:
        exchange.unbind(binding)


class _LogScan:
    """What recovery learnt about one queue's log: where each enqueue lies."""

    __slots__ = ("enqueued", "removed", "last_index", "priorities", "ttls")

    def __init__(self) -> None:
        self.enqueued: dict[int, tuple[Location, int]] = {}  # msg_id -> (record, body size)
        self.removed: set[int] = set()
        self.last_index = 0
        self.priorities: dict[int, int] = {}  # msg_id -> priority property, where set
        self.ttls: dict[int, int] = {}  # msg_id -> expiration property (ms), where set


class _RecoveryScan:
    """Visits every recovered record; keeps metadata, and only locations of bodies."""

    def __init__(self, raft_visit: Callable[[records.Record, Location], None] | None) -> None:
        self.metadata: dict[int, records.Record] = {}
        self.logs: dict[int, _LogScan] = {}
        self.raft_visit = raft_visit

    def visit(self, record: records.Record, location: Location) -> None:
        if is_raft_log_id(record.log_id):
            assert self.raft_visit is not None, "Raft records in the WAL but no cluster to recover them"
            self.raft_visit(record, location)
            return
        if record.log_id == METADATA_LOG_ID:
            self.metadata[record.index] = record
            return
        scanned = self.logs.get(record.log_id)
        if scanned is None:
            scanned = self.logs[record.log_id] = _LogScan()
        scanned.last_index = max(scanned.last_index, record.index)
        decoded = _unpack(record.payload)
        if decoded[0] == ENQUEUE:
            scanned.enqueued[record.index] = (location, len(decoded[4]))
            properties = decoded[3]
            flags = codec.property_flags(properties)
            if flags & (PROP_PRIORITY | PROP_EXPIRATION):
                header = codec.decode_properties(properties)
                if header.priority:
                    scanned.priorities[record.index] = header.priority
                if header.expiration is not None and str(header.expiration).isdigit():
                    scanned.ttls[record.index] = int(header.expiration)
        else:
            scanned.removed.update(decoded[1])
