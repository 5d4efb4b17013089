"""The cluster runtime: the asyncio shell that runs one node's `RaftSystem`
over the node's WAL and the cluster transport.

Theory of operation (after rabbitmq/ra: one WAL and one loop for all groups,
failure detection per node). The pure `raft.system.RaftSystem` decides; this
shell performs, once per event-loop turn, what it decided, in etcd-raft's
order:

* **persist**: `persist(items)` turns every group's Ready into WAL records
  in the node's `GroupCommitter`, one batch and one fdatasync
  (raft/persistence.py); when that batch is durable the shell reports
  `on_persisted(token, ok)` and runs the turn (`batch_durable`);
* **send**: `send(peer, frame)` takes the system's one frame per peer; at
  the end of the turn it goes to the `ClusterTransport` in ONE frame with the
  host's messages for that peer (raft/frames.py; fire and forget: Raft
  resends what matters, §5.1);
* **apply**: committed entries go to the `apply(group_id, entry)` given.

Inputs reach the system from the transport (`step`), its per-node failure
detector (`peer_up` / `peer_down`), and ONE timer for all groups, every
`tick_seconds` (`tick`). When the turn that processes them runs, and the
host's callbacks around it: raft/turns.py. Where the groups' entries lie
(memory, WAL, segments) and when they leave memory: raft/entry_locations.py.

Timing. With the defaults (50 ms ticks, `election_ticks=10`,
`heartbeat_ticks=2`) a leader heartbeats every 100 ms and a follower's
election timeout is 0.5-1 s. A lost node is noticed by the transport at once
when its connection closes, else after `PEER_SILENT_HEARTBEATS_MAX`
(3) silent transport heartbeats (`cluster_heartbeat_seconds`, 0.25 s by
default, so a lost node is noticed within about 0.75 s). Then
`RaftSystem.peer_down` has one survivor per group campaign at once, so new
leaders follow about one round trip later; should that campaigner not win,
the election timers elect within about two election timeouts
(raft/group.py). Everything here shares one event loop with the transport's
failure detector: work that holds the loop for more than a few hundred ms
(a caller proposing thousands of entries without yielding) makes peers look
silent.

Start and restart. The runtime is the WAL's only client: `recover()` replays the node's WAL
(every record is a group's, raft/node_log.py) through `recover_visit`; `start()` then hosts
every group recovered (not removed), rebuilt from its snapshot, hard state and entries, and
re-applies its committed entries. Groups added later with `add_group` are written a GROUP
record first, so they come back too.

Snapshots and compaction: raft/persistence.py. A follower sent a snapshot
(Raft §7 InstallSnapshot) persists it the same way, as the SNAPSHOT record
of its Ready, and `install_snapshot(group_id, snapshot)` is called once that
is durable, before the entries after it are applied.

The install_snapshot contract on restart: for every recovered group whose
log starts with a snapshot, `start()` calls `install_snapshot(group_id,
snapshot)` with the newest durable snapshot, synchronously, after the group
is hosted and before any entry of it is applied (applies happen in later
loop turns); `apply` then gets the committed entries from `snapshot.index +
1` on. A group without a snapshot gets no call and is applied from index 1.
A runtime that recovers a snapshot must have been given `install_snapshot`.

Failure. What a client does must never stop the node's Raft, so failures
are sorted by whom they belong to:

* one group's: an exception out of its `apply`, `install_snapshot` or
  `on_role_change`, out of the core while its Ready completes, or while its
  records are encoded (`persist`), or its deferred compaction. The group is
  failed (`RaftSystem.fail_group`: no longer hosted, as a crashed replica;
  its records stay in the WAL and bring it back at the next start), logged
  as `raft.group_failed` with its id, and every other group goes on. A group
  in `vital_groups` (the broker's metadata group: the node is useless
  without it) is the exception: its failure is the node's;
* the node's: a lost WAL batch (`ok=False`: the storage all groups share),
  or any exception out of `process_ready` or `tick` that no group owns. The
  system's memory may now be ahead of or out of step with the disk: the
  runtime logs `raft.fatal`, stops ticking and processing (`failed` is set)
  and calls `on_fatal(error)`; the host must then stop the node (the server
  exits non-zero so that its supervisor restarts it, which rebuilds Raft
  from the WAL, as etcd-raft and ra crash and recover). It must never go on
  serving without Raft.

A group dropped (`remove_group`) while its Ready is being persisted or applied, e.g. a queue
deleted right after it was declared, is neither written after its REMOVED record nor
completed (`RaftSystem.still_hosted`).

The node shell builds the storage (`NodeLog`, raft/node_log.py: the
`LogStore` and its `GroupCommitter`), hands the committer to the runtime, and
drains and closes it after `stop()`. The committer's `prepare_rollover` is
this runtime's `prepare_rollover()` (the groups' cursors and the control
records to write again): no other layer has a log in the WAL.
"""
from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import structlog

from warren.raft import frames
from warren.raft.core import RecoveredState, Status
from warren.raft.entry_locations import EntryLocations
from warren.raft.group import GroupId, GroupMetrics
from warren.raft.member_ids import on_node
from warren.raft.messages import ConfigChangeOp, Entry, HardState, Role, Snapshot
from warren.raft.persistence import RaftPersistence
from warren.raft.raft_storage import (
    GroupStorage,
    RecoveryScan,
    group_record,
    log_id_of,
    removed_record,
)
from warren.raft.stall import stall_limit_seconds, step_down_leaders, step_down_while_disk_full
from warren.raft.system import PersistFailed, RaftSystem
from warren.raft.transport import ClusterTransport, SharedPort, TransportLimits
from warren.raft.turns import TurnScheduler
from warren.storage import records
from warren.storage.group_commit import GroupCommitter
from warren.storage.wal import Location

log = structlog.get_logger("warren.cluster")

TICK_SECONDS = 0.05
ELECTION_TICKS = 10
HEARTBEAT_TICKS = 2

Apply = Callable[[GroupId, Entry], None]


class RaftRuntime:
    def __init__(self, settings: Any, committer: GroupCommitter, apply: Apply, rng: random.Random | None = None,
                 *, tick_seconds: float = TICK_SECONDS, transport_limits: TransportLimits | None = None,
                 install_snapshot: Callable[[GroupId, Snapshot], None] | None = None,
                 on_role_change: Callable[[GroupId, Role, str | None, int], None] | None = None,
                 on_fatal: Callable[[BaseException], None] | None = None,
                 vital_groups: frozenset[GroupId] = frozenset(), **raft_options: Any) -> None:
        assert tick_seconds > 0
        self.settings = settings
        self.node_name: str = settings.node_name
        self.committer = committer
        self.apply = apply
        self.rng = rng or random.Random()
        self.tick_seconds = tick_seconds
        self.transport_limits = transport_limits
        self.install_snapshot = install_snapshot
        self.on_role_change = on_role_change
        self.on_fatal = on_fatal   # called once when the node's Raft fails as a whole (module docstring)
        self.shared_port: SharedPort | None = None   # a shard's: the node's cluster port, shared
        self.vital_groups = vital_groups
        self.raft_options = {"election_ticks": ELECTION_TICKS, "heartbeat_ticks": HEARTBEAT_TICKS, **raft_options}
        self.scan: RecoveryScan | None = RecoveryScan()
        self.groups: dict[GroupId, GroupStorage] = {}
        self.next_group_number = 1
        self.system: RaftSystem | None = None
        self.transport: ClusterTransport | None = None
        self.failed: BaseException | None = None
        self.stopped = False
        self.last_tick_at: float | None = None   # the loop's time at the last tick
        self.frames_sent = 0          # frames handed to the transport (Raft and host messages together)
        self.host_frames = 0          # of those, frames with host messages (alone, or beside Raft's)
        self.frames_dropped = 0       # frames the transport refused (peer not linked, queue full)
        self.raft_outbox: dict[str, list[list]] = {}   # the turn's Raft frames per peer, sent at its end
        # the host's messages of the turn (part key -> peer -> messages) and its parts of frames received
        self.take_host_parts: Callable[[], dict[str, dict[str, list]]] | None = None
        self.on_host_frame: Callable[[str, dict], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tick_handle: asyncio.TimerHandle | None = None
        self.turns = TurnScheduler(self.node_name, self.process_turn, committer.flush, self.halted)
        self.turns.end_of_turn = self.end_turn
        self.groups_by_log: dict[int, GroupStorage] = {}
        self.locations = EntryLocations(committer.store, self.groups_by_log, apply)
        committer.subscribe(self.locations.on_batch_written, self.locations.on_relocated)
        self.persistence = RaftPersistence(committer, self.groups, self.locations, self.batch_durable,
                                           self.turns.request_turn)

    # --- recovery and lifecycle ---------------------------------------------------------------

    def recover(self) -> int:
        """Replay the node's WAL before `start()` (a torn tail is cut and
        logged); the number of records read."""
        recovered = self.committer.store.recover(self.recover_visit)
        for torn in recovered.torn:
            log.warning("wal.torn_tail_cut", file=str(torn.path), offset=torn.offset,
                        bytes_lost=torn.bytes_lost, reason=torn.reason)
        return self.scan.records if self.scan is not None else 0

    def recover_visit(self, record: records.Record, location: Location | None = None) -> None:
        """For `LogStore.recover`: every record, in file order, before `start()`."""
        assert self.scan is not None, "recover_visit after start()"
        self.scan.visit(record, location)

    async def start(self) -> None:
        """Host the recovered groups, link to the peers, start ticking."""
        transport = ClusterTransport(
            self.settings, self.on_frame, random.Random(self.rng.random()), limits=self.transport_limits,
            on_peer_up=self.on_peer_up, on_peer_down=self.on_peer_down, shared_port=self.shared_port)
        self.begin(asyncio.get_running_loop(), transport)
        await transport.start()

    def begin(self, loop: Any, transport: Any) -> None:
        """The synchronous part of `start` over the given loop (`call_soon`,
        `call_later`) and transport (`send`, `peers`, `connected_peers`): a
        seeded simulation (tests/sim) runs the runtime over its own."""
        assert self.system is None, "a runtime starts once; build a new one to restart"
        self._loop = self.turns.loop = loop
        self.system = RaftSystem(
            self.node_name, self.rng, self.persistence.persist, self.send, self.locations.apply_noting,
            install_snapshot=self.install_snapshot, on_role_change=self.on_role_change,
            request_turn=self.turns.request_turn, on_group_failed=self.on_group_failed,
            eager_commit_groups=self.vital_groups, **self.raft_options)
        self.persistence.system = self.system
        scan, self.scan = self.scan, None
        self.next_group_number = scan.next_group_number()
        recovered_groups = list(scan.groups())
        for recovered in recovered_groups:
            storage = self.groups[recovered.group_id] = recovered.storage()
            self.groups_by_log[storage.log_id] = storage
            self.system.add_group(recovered.group_id, recovered.members, recovered=recovered.state,
                                  me=recovered.me or None)
            self.attach_loader(storage)
        # Once every recovered group is hosted: installing one group's snapshot (the
        # broker's metadata) may ask for other groups, which must be found hosted.
        for recovered in recovered_groups:
            if recovered.state.snapshot is not None:
                # Before any entry after it is applied: applies run in later turns.
                assert self.install_snapshot is not None, \
                    f"group {recovered.group_id!r} recovered a snapshot but no install_snapshot callback was given"
                self.install_snapshot(recovered.group_id, recovered.state.snapshot)
        self.transport = transport
        # Until the transport links a peer, the failure detector's answer is "down".
        for peer in sorted(transport.peers):
            self.system.peer_down(peer)
        if self.turns.proposals_waiting:
            self.request_turn()   # proposals the host made before the start
        self._tick_handle = self._loop.call_later(self.tick_seconds, self.on_tick)
        log.info("raft.started", node=self.node_name, groups=len(self.groups), wal_records=scan.records)

    async def stop(self) -> None:
        """Stop ticking and processing, close the links. The caller then
        drains and closes the storage, which writes the commit indexes still
        carried (`CarriedCommits.carry`, raft/carried_commits.py) so that the next start re-applies
        every committed entry (`Cluster.host_groups`)."""
        if self.system is not None and self.failed is None and not self.stopped:
            self.system.persist_carried_commits()
        self.stopped = True
        if self._tick_handle is not None:
            self._tick_handle.cancel()
            self._tick_handle = None
        self.turns.cancel()
        if self.transport is not None:
            await self.transport.stop()
        log.info("raft.stopped", node=self.node_name, turns=self.turns.turns_run, frames_sent=self.frames_sent,
                 frames_with_host_messages=self.host_frames,
                 raft_frames=self.system.counters.frames_sent if self.system is not None else 0)

    # --- the API ------------------------------------------------------------------------------

    def add_group(self, group_id: GroupId, members: list[str], hosted_at: int = 0) -> bool:
        """Host a new group here (this node among `members`); False if it is
        hosted already (e.g. it was recovered). `hosted_at`: the host's mark
        of what made it host the group, kept with it (`hosted_at()`)."""
        self.check_running()
        if group_id in self.groups:
            return False
        assert self.node_name in members, f"{self.node_name} is not among the members {members}"
        storage = self._new_storage(group_id, tuple(sorted(members)), hosted_at)
        self.system.add_group(group_id, members)
        self.attach_loader(storage)
        return True

    def join_group(self, group_id: GroupId, voters: list[str], hosted_at: int = 0, me: str | None = None) -> bool:
        """Host a group this node is being added to (`propose_conf_change`
        on its leader) as the replica `me` (a member id not used in the group
        before, raft/member_ids.py; the node's name by default), with an empty
        log that starts from the configuration `voters` (member ids: the
        group's voters before the change, `me` not among them): it neither
        campaigns nor counts as a voter until the leader's entries (the CONFIG
        entry adding it) or snapshot say it is one, as etcd-raft's joining
        nodes. False if it is hosted already."""
        self.check_running()
        if group_id in self.groups:
            return False
        me = me or self.node_name
        members = tuple(sorted(voter for voter in voters if voter != me))
        storage = self._new_storage(group_id, members, hosted_at, me)
        # As if recovered empty: RaftNode takes a configuration without this node only from storage.
        self.system.add_group(group_id, members, recovered=RecoveredState(HardState(), None, []), me=me)
        self.attach_loader(storage)
        return True

    def _new_storage(self, group_id: GroupId, members: tuple[str, ...], hosted_at: int,
                     me: str | None = None) -> GroupStorage:
        mark = "" if me in (None, self.node_name) else me
        storage = GroupStorage(log_id_of(self.next_group_number), group_id, members, hosted_at=hosted_at, me=mark)
        self.next_group_number += 1
        self.groups[group_id] = storage
        self.groups_by_log[storage.log_id] = storage
        # Before any entry of the group: batches are durable in order.
        self.committer.append(group_record(storage.log_id, group_id, members, hosted_at, mark))
        return storage

    def voter_on(self, group_id: GroupId, node: str) -> str | None:
        """The voter of the group's latest configuration that runs on `node`, if any."""
        configuration = self.configuration(group_id)
        return on_node(configuration[0], node) if configuration else None

    def member_id(self, group_id: GroupId) -> str | None:
        """This node's replica's member id in the group, None if not hosted."""
        storage = self.groups.get(group_id)
        return None if storage is None else storage.me or self.node_name

    def hosted_at(self, group_id: GroupId) -> int | None:
        """The mark `add_group` or `join_group` was given for the replica hosted
        here (kept in its GROUP record, so a restart knows it), None if not hosted."""
        storage = self.groups.get(group_id)
        return storage.hosted_at if storage is not None else None

    def remove_group(self, group_id: GroupId) -> bool:
        """Stop hosting the group; its log is dead from here on."""
        self.check_running()
        storage = self.groups.pop(group_id, None)
        if storage is None:
            return False
        self.groups_by_log.pop(storage.log_id, None)
        self.system.remove_group(group_id)
        self.persistence.compactions.pop(group_id, None)
        store = self.committer.store
        removal = self.committer.append(removed_record(storage.log_id))
        # the WAL's notes of the log's records go once that is written (storage/wal_heads.py)
        self.committer.when_durable(removal, lambda _ok: store.forget_log_notes(storage.log_id))
        # its segments go at a rollover: one now if they are 64 MiB or more, not once the (512 MiB) WAL is full
        if store.log_segment_bytes(storage.log_id) >= min(store.wal_max_size_bytes, 64 * 1024 * 1024):
            self.committer.rollover_soon()
        return True

    def propose(self, group_id: GroupId, data: bytes) -> int | None:
        """The index `data` will have if it commits, or None: not the leader
        (ask `leader_of`), no such group, or the runtime is not running."""
        if self.system is None or self.stopped or self.failed is not None:
            return None
        return self.system.propose(group_id, data)

    def compact(self, group_id: GroupId, index: int, snapshot_data: bytes) -> bool:
        """The group's state machine has applied through `index` and
        `snapshot_data` is its state there: drop the log up to `index` (see
        raft/persistence.py). `snapshot_data` is kept as given (do not
        mutate it) until a later compaction replaces it. Called from inside
        `apply`, it is carried out at the end of the turn (a later call for
        the group replaces it). False when there is nothing to do: the group
        is not hosted here, the runtime is not running, or its log already
        starts at `index` or later (e.g. a snapshot from the leader)."""
        if self.system is None or self.stopped or self.failed is not None:
            return False
        return self.persistence.compact(group_id, index, snapshot_data)

    def campaign(self, group_id: GroupId) -> bool:
        """This node campaigns for the group now (`RaftSystem.campaign`); False
        if the group is not hosted here or the runtime is not running."""
        if self.system is None or self.stopped or self.failed is not None:
            return False
        return self.system.campaign(group_id)

    def propose_conf_change(self, group_id: GroupId, op: ConfigChangeOp | str, node_id: str) -> int | None:
        """Add or remove one voter, `node_id` a member id (raft/member_ids.py;
        `RaftSystem.propose_conf_change`, thesis
        §4.1): the index of the CONFIG entry, or None -- not the leader, an
        earlier change (or the leader's first entry) is not committed yet,
        nothing to change, no such group, or the runtime is not running."""
        if self.system is None or self.stopped or self.failed is not None:
            return None
        return self.system.propose_conf_change(group_id, op, node_id)

    def transfer_leadership(self, group_id: GroupId, to: str) -> bool:
        """This node, leading the group, hands leadership to the voter `to` (a member id)
        (thesis §3.10; aborted after an election timeout); False if it cannot."""
        if self.system is None or self.stopped or self.failed is not None:
            return False
        return self.system.transfer_leadership(group_id, to)

    def hosted(self, group_id: GroupId) -> bool:
        """Whether the group runs here: hosted, and not failed (a failed
        group keeps its storage, for rollovers, but the system no longer has it)."""
        return self.system is not None and group_id in self.system

    def configuration(self, group_id: GroupId) -> tuple[tuple[str, ...], bool] | None:
        """The group's voters (member ids, raft/member_ids.py) as this node's log
        has them (the latest configuration, committed or not, thesis §4.1) and whether this node
        knows it committed; None if the group is not hosted here."""
        if not self.hosted(group_id):
            return None
        raft = self.system.groups[group_id].raft
        return raft.voters, raft.config_index <= raft.commit_index

    def status(self, group_id: GroupId) -> Status | None:
        """The group's core status (`RaftNode.status()`), None if not hosted here."""
        if not self.hosted(group_id):
            return None
        return self.system.status(group_id)

    def applied_index(self, group_id: GroupId) -> int | None:
        """The index through which the group's entries were applied (its
        snapshot's index right after a restart); entries handed to `apply`
        count once their turn's Ready is done. None if not hosted here."""
        if not self.hosted(group_id):
            return None
        return self.system.status(group_id).last_applied

    def entry_data(self, group_id: GroupId, index: int) -> bytes | None:
        """The data of the group's entry at `index`: from memory, or read
        back from the WAL or a segment; None if it is not in the group's log
        here (compacted away, not yet received) or the group is not hosted."""
        storage = self.groups.get(group_id)
        if storage is None or not self.hosted(group_id):
            return None
        return self.locations.entry_data(storage, self.system.groups[group_id].raft.log, index)

    def leader_of(self, group_id: GroupId) -> str | None:
        """The node of the leader this node knows of, None if none or not hosted here."""
        if not self.hosted(group_id):
            return None
        return self.system.leader_id(group_id)

    def group_metrics(self, group_id: GroupId) -> GroupMetrics:
        assert self.system is not None
        return self.system.group_metrics(group_id)

    def metrics(self) -> dict[str, Any]:
        """Node-wide numbers: groups hosted and led, and the system's counters."""
        assert self.system is not None
        groups = list(self.system.all_group_metrics())
        return {
            "node": self.node_name,
            "groups": len(groups),
            "groups_led": sum(1 for group in groups if group.role == Role.LEADER.value),
            "groups_without_leader": sum(1 for group in groups if group.leader_id is None),
            "groups_quiescent": sum(1 for group in groups if group.quiescent),
            "peers_connected": len(self.transport.connected_peers()) if self.transport else 0,
            "turns": self.turns.turns_run,
            "frames_sent_to_peers": self.frames_sent,
            "frames_with_host_messages": self.host_frames,
            "frames_dropped": self.frames_dropped,
            "failed": self.failed is not None,
            "groups_failed": len(self.system.failed_groups),
            **self.system.counters.as_dict(),
        }

    def prepare_rollover(self) -> tuple[dict[int, int], bytes]:
        return self.persistence.prepare_rollover()

    # --- what the system calls ----------------------------------------------------------------------

    def attach_loader(self, storage: GroupStorage) -> None:
        self.locations.attach_loader(storage, self.system.groups[storage.group_id].raft.log)

    def batch_durable(self, token: int, ok: bool) -> None:
        """The batch is durable: the turn that completes its Readies runs now,
        in the callback that brought the news (a new turn would cost a loop
        hop between the fsync and the confirm, and buy no batching: the
        batch's Readies are all completed in that one turn anyway)."""
        if self.stopped or self.system is None:
            return
        if not ok:
            log.error("raft.persist_failed", node=self.node_name, batch=token)
        self.system.on_persisted(token, ok)
        self.turn_now()

    def send(self, peer: str, frame: list) -> None:
        """The system's frame for `peer`: it leaves at the end of the turn (`end_turn`)."""
        self.raft_outbox.setdefault(peer, []).append(frame)

    def end_turn(self) -> None:
        """The end of a turn (and of the host's input between turns): one frame per
        peer with the turn's Raft messages and the host's (raft/frames.py)."""
        parts = self.take_host_parts() if self.take_host_parts is not None else {}
        raft, self.raft_outbox = self.raft_outbox, {}
        for peer, frame in frames.assemble(raft, parts):
            self.send_frame(peer, frame)

    def send_frame(self, peer: str, frame: dict, now: bool = False) -> None:
        """One frame to `peer`; `now`: written at once, not at the end of the loop's callback."""
        self.frames_sent += 1
        self.host_frames += frames.has_host_parts(frame)
        if self.transport is None or not self.transport.send(peer, frame, now):
            self.frames_dropped += 1

    # --- turns (raft/turns.py) ---------------------------------------------------------------------

    def request_turn(self) -> None:
        self.turns.request_turn()

    def turn_now(self) -> None:
        self.turns.turn_now()

    def before_turn(self, callback: Callable[[], None]) -> None:
        self.turns.before_turn(callback)

    def after_turn(self, callback: Callable[[], None]) -> bool:
        return self.turns.after_turn(callback)

    def on_turn(self) -> None:
        self.turns.on_turn()

    def halted(self) -> bool:
        return self.stopped or self.failed is not None

    def process_turn(self) -> None:
        try:
            self.check_stall()
            self.system.process_ready()
            if self.persistence.compactions:
                self.persistence.run_deferred_compactions()
            if self.locations.applied_any:
                self.locations.evict_applied(self.system.groups)
            if self.persistence.released.pending:
                self.persistence.released.free_some()
        except PersistFailed as error:   # the shared WAL lost a batch
            self.fail(error)
        except Exception as error:  # noqa: BLE001 -- no group owns it (those are contained): the node's
            log.exception("raft.process_ready_failed", node=self.node_name)
            self.fail(error)

    # --- event handlers -------------------------------------------------------------------------------

    def on_tick(self) -> None:
        self._tick_handle = None
        if self.stopped or self.failed is not None:
            return
        try:
            self.check_stall()
            self.last_tick_at = self._loop.time()
            self.system.tick()
            step_down_while_disk_full(self.system, self.committer.waiting_for_space_since, self.last_tick_at,
                                      stall_limit_seconds(self.raft_options["election_ticks"], self.tick_seconds))
        except Exception as error:  # noqa: BLE001 -- a dead timer would leave Raft half alive: the node's
            log.exception("raft.tick_failed", node=self.node_name)
            self.fail(error)
            return
        self._tick_handle = self._loop.call_later(self.tick_seconds, self.on_tick)

    def check_stall(self) -> bool:
        """Whether the node stalled since its last tick; if so its leaders step down and
        its links are dropped unread, before anything else (raft/stall.py)."""
        if self.last_tick_at is None or self._loop is None:
            return False
        now = self._loop.time()
        if now - self.last_tick_at <= stall_limit_seconds(self.raft_options["election_ticks"], self.tick_seconds):
            return False
        stalled, self.last_tick_at = now - self.last_tick_at, now
        stepped_down = step_down_leaders(self.system)
        log.warning("raft.node_stalled", node=self.node_name, seconds=round(stalled, 3),
                    leaders_stepped_down=stepped_down)
        if self.transport is not None:
            self.transport.drop_links("this node stalled")
        return True

    def on_group_failed(self, group_id: GroupId, error: BaseException) -> None:
        """The system stopped one group for a failure of its own; the others go on."""
        log.error("raft.group_failed", node=self.node_name, group=group_id, error=repr(error),
                  exc_info=(type(error), error, error.__traceback__))
        if group_id in self.vital_groups:
            self.fail(error)

    def on_frame(self, peer: str, frame: Any) -> None:
        """A peer's frame: its Raft items stepped, then the frame handed to the host for the rest."""
        if self.stopped or self.failed is not None or self.system is None or self.check_stall():
            return
        items = frames.raft_items(frame)
        if items:
            self.system.step(peer, items)
        if self.on_host_frame is not None and frames.has_host_parts(frame):
            self.on_host_frame(peer, frame)

    def on_peer_up(self, peer: str) -> None:
        if not self.stopped and self.system is not None:
            self.system.peer_up(peer)

    def on_peer_down(self, peer: str) -> None:
        if not self.stopped and self.system is not None:
            self.system.peer_down(peer)

    # --- helpers ----------------------------------------------------------------------------------------

    def fail(self, error: BaseException) -> None:
        """The node's Raft failed as a whole: stop it and tell the host, once,
        loudly (see the module docstring); it must not go on half alive."""
        if self.failed is not None:
            return
        log.error("raft.fatal", node=self.node_name, error=repr(error))
        self.failed = error
        if self._tick_handle is not None:
            self._tick_handle.cancel()
            self._tick_handle = None
        self.turns.cancel()
        if self.on_fatal is not None:
            self.on_fatal(error)

    def check_running(self) -> None:
        assert self.system is not None, "start() the runtime first"
        assert not self.stopped, "the runtime is stopped"


__all__ = ["ELECTION_TICKS", "HEARTBEAT_TICKS", "TICK_SECONDS", "RaftRuntime"]
