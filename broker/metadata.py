"""Topology changes that go through the metadata Raft group (see broker/cluster.py).

The channel checks a change against its node's vhost first (so that mistakes
get RabbitMQ's reply at once), then submits it; every node applies the
committed change to its own vhost, the asking channel replies when its node
has. What goes through the group: quorum queue declarations and deletions
(always: the queue is a Raft group whose members every node must know) and,
in a cluster of several nodes, durable exchanges and the bindings between
durable exchanges and quorum queues. Everything else (classic queues, their
bindings, transient exchanges) stays on the node where it was made.

Commands: ["qdecl", vhost, name, arguments, members, origin], ["qdel", vhost,
name], ["xdecl", vhost, name, type, auto_delete, internal, arguments],
["xdel", vhost, name, if_unused], ["bind" | "unbind", vhost, source,
destination kind, destination, routing_key, arguments, class_id, method_id].
An apply that fails answers [reply_code, reply_text, class_id, method_id].
Users, vhosts and permissions are commands of this group too; their
handlers are in broker/definitions.py.

Quorum queue membership (warrenctl add_member, delete_member, grow, shrink,
rebalance; broker/management.py). The metadata group holds each queue's
wanted members (`QuorumQueue.members`); the queue's own Raft group follows
it one single-server change at a time (thesis §4.1):

* ["qmembers", vhost, name, members_new, op, node] (op "add" | "remove"):
  every node sets the members and journals the queue's row again (recovery
  applies rows in order, so the last one wins). The node added hosts the
  group with an empty log (`RaftRuntime.join_group`: no vote until the
  leader's CONFIG entry makes it a voter) and a fresh machine; the leader
  sends it entries or a snapshot. A node removed keeps its replica until
  its removal is committed (it may be needed for that commit: a leader
  elected after the change was proposed commits nothing without the old
  quorum), so every node notes it as leaving. The reply is the new members,
  or {"error": text, "status": http status}.
* The leader of each group reconciles (`reconcile`, on apply and every
  `RECONCILE_SECONDS` for groups in flux): once its configuration is
  committed it proposes the next change, additions first; a leader that is
  itself removed first hands leadership to the most caught-up remaining voter
  (`TRANSFER_GRACE_SECONDS`, then it proposes its own removal and steps down
  once that commits, thesis §4.2.2). When the committed configuration no
  longer has a leaving node, the leader submits ["qrelease", vhost, name,
  group, node]: that node drops its replica (`remove_group`) and its machine.
  A leaving node not released (say the leader restarted and forgot) submits
  ["qleaving", vhost, name, group, node] now and then, which notes it again.
* ["qlead", [[vhost, name, group, to], ...]]: the node leading a group
  transfers its leadership to `to` (rebalance; best effort, not journaled).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import msgpack
import structlog
from pamqp import commands as spec

from broker import fifo
from broker import quorum_machine as qm
from broker.cluster import META, METADATA_APPLIED
from broker.quorum import QuorumQueue
from protocol.errors import ChannelError

if TYPE_CHECKING:
    from broker.broker import Broker
    from broker.cluster import Cluster
    from broker.vhost import VirtualHost

log = structlog.get_logger("warren.metadata")

RECONCILE_SECONDS = 0.2
# a new quorum queue's first leader campaigns again after these delays while it has no leader
CAMPAIGN_AGAIN_SECONDS = (0.05, 0.15, 0.3)
# a leader being removed from its group tries this long to hand leadership over, then removes itself
TRANSFER_GRACE_SECONDS = 2.0
RELEASE_RESEND_SECONDS = 3.0
LEAVING_ANNOUNCE_SECONDS = 5.0
LEAVING_ANNOUNCE_MAX_SECONDS = 60.0
# An apply's reply is [APPLIED_AT, index, result]: the asking node answers once it applied `index` too.
APPLIED_AT = "@"
# A change is answered once every running node applied it, or after this long (a node
# that is up but cannot apply, say cut off from the group's leader alone, holds no one back).
SPREAD_WAIT_SECONDS = 10.0


@dataclass(slots=True, eq=False)
class AwaitingApply:
    index: int
    on_done: Callable[[Any], None]
    result: Any
    everywhere: bool
    deadline: float


def _apply_sync(command: list, index: int) -> None:
    """The no-op of `Metadata.catch_up`."""
    return None


class ChangeRefused(Exception):
    """A metadata change that cannot be made: an HTTP status and one line of text."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text

    def reply(self) -> dict:
        return {"error": self.text, "status": self.status}


class MembershipError(ChangeRefused):
    """A quorum queue membership change that cannot be made."""


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True, default=str)


def error_reply(error: ChannelError) -> list:
    return [error.reply_code, error.text, error.class_id, error.method_id]


def raise_if_error(result: Any) -> None:
    if isinstance(result, list) and len(result) == 4:
        code, text, class_id, method_id = result
        raise ChannelError(code, text, class_id, method_id)


class Metadata:
    def __init__(self, broker: "Broker", cluster: "Cluster") -> None:
        self.broker = broker
        self.cluster = cluster
        handlers = {
            "qdecl": self._apply_queue_declare, "qdel": self._apply_queue_delete,
            "xdecl": self._apply_exchange_declare, "xdel": self._apply_exchange_delete,
            "bind": self._apply_binding, "unbind": self._apply_binding,
            "qmembers": self._apply_members, "qrelease": self._apply_release,
            "qleaving": self._apply_leaving, "qlead": self._apply_lead, "sync": _apply_sync,
        }
        cluster.meta_handlers.update({kind: self.answering_index(handler) for kind, handler in handlers.items()})
        cluster.metadata = self
        # answers that came from the group's leader before this node (or every running one) applied them
        self._awaiting_apply: list[AwaitingApply] = []
        self.peer_applied: dict[str, int] = {}   # how far each running peer has applied the group
        # group -> nodes removed from its members that may still hold a replica
        self.leaving: dict[str, set[str]] = {}
        # groups hosted here whose Raft configuration may differ from their members
        self.converging: set[str] = set()
        self._scan_all = True
        self._transfer_started: dict[str, float] = {}
        self._release_sent: dict[tuple[str, str], float] = {}
        self._leaving_announce: dict[str, tuple[float, float]] = {}   # group -> (next at, interval)
        self._reconciler: asyncio.Task | None = None
        self._ensure_reconciler()

    # -- asked by channels ---------------------------------------------------------
    def submit(self, command: list, on_done: Callable[[Any], None], everywhere: bool = True) -> None:
        """Have the metadata group apply `command`; `on_done(reply)` once this
        node has applied it and (`everywhere`) so has every running node, as
        RabbitMQ answers a declaration only once every running node can use it:
        a client that declares through one node and publishes through another
        never meets a name the other does not know yet. The leader answers when
        it has applied it, which may be before this node: then the answer waits
        here (`release_answers`)."""
        self.cluster.submit(META, _pack(command), lambda answer: self._on_answer(answer, on_done, everywhere))

    def answering_index(self, handler: Callable[[list, int], Any]) -> Callable[[list, int], Any]:
        def apply(command: list, index: int) -> Any:
            return [APPLIED_AT, index, handler(command, index)]
        return apply

    def _on_answer(self, answer: Any, on_done: Callable[[Any], None], everywhere: bool) -> None:
        if not (isinstance(answer, list) and len(answer) == 3 and answer[0] == APPLIED_AT):
            on_done(answer)   # None: the leader had applied it before a restart
            return
        _, index, result = answer
        waiting = AwaitingApply(index, on_done, result, everywhere, time.monotonic() + SPREAD_WAIT_SECONDS)
        if not self._applied_where_needed(waiting):
            self._awaiting_apply.append(waiting)
            return
        on_done(result)

    def _applied_where_needed(self, waiting: "AwaitingApply") -> bool:
        if self.broker.durability.meta_applied_index < waiting.index:
            return False
        if not waiting.everywhere:
            return True
        lagging = [peer for peer in self.cluster.running_peers() if self.peer_applied.get(peer, 0) < waiting.index]
        if lagging and time.monotonic() >= waiting.deadline:
            log.warning("metadata.change_not_applied_everywhere", index=waiting.index, lagging=lagging,
                        waited_seconds=SPREAD_WAIT_SECONDS)
            return True
        return not lagging

    def release_answers(self) -> None:
        """Answer what every node it waits for has applied now: after a local
        apply, a peer's METADATA_APPLIED, a peer going down, and now and then
        (the wait is bounded)."""
        if not self._awaiting_apply:
            return
        ready = [waiting for waiting in self._awaiting_apply if self._applied_where_needed(waiting)]
        if ready:
            self._awaiting_apply = [waiting for waiting in self._awaiting_apply if waiting not in ready]
            for waiting in ready:
                waiting.on_done(waiting.result)

    def on_applied_here(self, index: int) -> None:
        """This node applied metadata entries up to `index` (once per turn):
        tell every peer, and answer what waited for it."""
        for peer in self.cluster.running_peers():
            self.cluster.app_send(peer, [METADATA_APPLIED, index])
        self.release_answers()

    def on_peer_applied(self, peer: str, index: int) -> None:
        self.peer_applied[peer] = max(self.peer_applied.get(peer, 0), index)
        self.release_answers()

    def on_peer_up(self, peer: str) -> None:
        self.cluster.app_send(peer, [METADATA_APPLIED, self.broker.durability.meta_applied_index])

    def on_peer_down(self, peer: str) -> None:
        """A node that went down no longer holds answers back; when it is back it
        says how far it got (and a restarted node catches up before it opens its
        AMQP port: `catch_up`)."""
        self.peer_applied.pop(peer, None)
        self.release_answers()

    async def catch_up(self, seconds: float) -> bool:
        """A barrier through the group (Raft's read index, by a no-op entry):
        True once this node applied everything committed before it started, so
        a restarted node does not answer 404 or route past a queue declared
        while it was away. False if no leader answered in `seconds` (no
        majority: nothing new can be declared then either)."""
        caught_up = asyncio.Event()
        self.submit(["sync"], lambda _: caught_up.set(), everywhere=False)
        try:
            await asyncio.wait_for(caught_up.wait(), seconds)
        except TimeoutError:
            return False
        return True

    def replicates_exchange(self, durable: bool) -> bool:
        return self.cluster.multi_node and durable

    def replicates_binding(self, vhost: "VirtualHost", source: str, kind: str, destination: str) -> bool:
        if kind == "queue":
            return isinstance(vhost.queues.get(destination), QuorumQueue)
        exchange = vhost.exchanges.get(source)
        target = vhost.exchanges.get(destination)
        return (self.cluster.multi_node and exchange is not None and exchange.durable
                and target is not None and target.durable)

    # -- applied on every node -------------------------------------------------------
    def _vhost(self, name: str) -> "VirtualHost | None":
        return self.broker.vhosts.get(name)

    def _apply_queue_declare(self, command: list, index: int) -> Any:
        _, vhost_name, name, arguments, members, origin = command
        vhost = self._vhost(vhost_name)
        if vhost is None or name in vhost.queues:
            return None
        cluster = self.cluster
        group = f"q:{vhost_name}:{name}:{index}"
        queue = QuorumQueue(vhost, name, arguments, cluster, group, members)
        cluster.queues[group] = queue
        vhost.add_queue(queue)
        vhost.journal.queue_declared(vhost, queue)
        if cluster.node in members and cluster.runtime.add_group(group, members):
            locator = arguments.get("x-queue-leader-locator", "client-local")
            leader = origin if locator == "client-local" and origin in members else \
                members[index % len(members)]
            if leader == cluster.node:
                cluster.runtime.campaign(group)
                # The other members may not host the group yet (they apply this entry a little
                # later) and drop the votes asked: ask again before their election timers fire.
                loop = asyncio.get_running_loop()
                for delay in CAMPAIGN_AGAIN_SECONDS:
                    loop.call_later(delay, self._campaign_if_leaderless, group)
        return None

    def _campaign_if_leaderless(self, group: str) -> None:
        runtime = self.cluster.runtime
        if (not runtime.stopped and runtime.failed is None and group in runtime.groups
                and self.cluster.local_leader(group) is None):
            runtime.campaign(group)

    def _apply_queue_delete(self, command: list, index: int) -> Any:
        _, vhost_name, name = command
        vhost = self._vhost(vhost_name)
        queue = vhost.queues.get(name) if vhost is not None else None
        if not isinstance(queue, QuorumQueue):
            return None
        return self.drop_queue(vhost, queue)

    def drop_queue(self, vhost: "VirtualHost", queue: QuorumQueue) -> int:
        """Delete a replicated queue here (its replica too); its message count."""
        count = queue.message_count
        vhost.delete_queue_now(queue)
        self.cluster.queues.pop(queue.group, None)
        self._forget_group(queue.group)
        if queue.group in self.cluster.runtime.groups:
            self.cluster.runtime.remove_group(queue.group)
        return count

    def _apply_exchange_declare(self, command: list, index: int) -> Any:
        _, vhost_name, name, type_, auto_delete, internal, arguments = command
        vhost = self._vhost(vhost_name)
        if vhost is None:
            return None
        try:
            vhost.declare_exchange(spec.Exchange.Declare(
                exchange=name, exchange_type=type_, durable=True, auto_delete=auto_delete, internal=internal,
                arguments=arguments))
        except ChannelError as error:
            return error_reply(error)
        return None

    def _apply_exchange_delete(self, command: list, index: int) -> Any:
        _, vhost_name, name, if_unused = command
        vhost = self._vhost(vhost_name)
        if vhost is None:
            return None
        try:
            vhost.delete_exchange(name, if_unused)
        except ChannelError as error:
            return error_reply(error)
        return None

    def _apply_binding(self, command: list, index: int) -> Any:
        kind, vhost_name, source, destination_kind, destination, routing_key, arguments, class_id, method_id = command
        vhost = self._vhost(vhost_name)
        if vhost is None:
            return None
        try:
            if kind == "bind":
                vhost.bind(source, (destination_kind, destination), routing_key, arguments, None, class_id, method_id)
            else:
                vhost.unbind(source, (destination_kind, destination), routing_key, arguments, None,
                             class_id, method_id)
        except ChannelError as error:
            return error_reply(error)
        return None

    # -- quorum queue membership (see the module docstring) ----------------------------
    def check_membership(self, vhost_name: str, name: str, op: str, node: str) -> tuple[QuorumQueue, list[str]]:
        """The queue and its members after `op` ("add" | "remove") of `node`,
        or MembershipError. Checked where asked and again where applied."""
        vhost = self._vhost(vhost_name)
        if vhost is None:
            raise MembershipError(404, f"vhost '{vhost_name}' not found")
        queue = vhost.queues.get(name)
        if queue is None:
            raise MembershipError(404, f"queue '{name}' in vhost '{vhost_name}' not found")
        if not isinstance(queue, QuorumQueue) or queue.queue_type != "quorum":
            raise MembershipError(400, f"queue '{name}' in vhost '{vhost_name}' is not a quorum queue")
        nodes = self.cluster.nodes
        if node not in nodes:
            raise MembershipError(400, f"node '{node}' is not a cluster node (cluster_nodes: {', '.join(nodes)})")
        members = list(queue.members)
        if op == "add":
            if node in members:
                raise MembershipError(
                    400, f"node '{node}' is already a member of queue '{name}' in vhost '{vhost_name}'")
            return queue, members + [node]
        if op == "remove":
            if node not in members:
                raise MembershipError(
                    400, f"node '{node}' is not a member of queue '{name}' in vhost '{vhost_name}'")
            if len(members) == 1:
                raise MembershipError(
                    400, f"node '{node}' is the last member of queue '{name}' in vhost '{vhost_name}'; "
                         "delete the queue instead")
            return queue, [m for m in members if m != node]
        raise MembershipError(400, f"unknown membership operation '{op}'")

    def _queue(self, vhost_name: str, name: str, group: str) -> QuorumQueue | None:
        vhost = self._vhost(vhost_name)
        queue = vhost.queues.get(name) if vhost is not None else None
        return queue if isinstance(queue, QuorumQueue) and queue.group == group else None

    def _apply_members(self, command: list, index: int) -> Any:
        _, vhost_name, name, members_new, op, node = command
        vhost = self._vhost(vhost_name)
        queue = vhost.queues.get(name) if vhost is not None else None
        if isinstance(queue, QuorumQueue) and sorted(queue.members) == sorted(members_new):
            # Applied already: the command was sent again, or a crash lost what followed the row.
            self._host_if_member(queue, [m for m in queue.members if m != self.cluster.node])
            return {"members": list(queue.members)}
        try:
            queue, members = self.check_membership(vhost_name, name, op, node)
        except MembershipError as error:
            return error.reply()
        group = queue.group
        before = list(queue.members)
        queue.members = members
        vhost.journal.queue_declared(vhost, queue)
        leaving = self.leaving.setdefault(group, set())
        if op == "add":
            leaving.discard(node)
        else:
            leaving.add(node)
        if not leaving:
            del self.leaving[group]
        self._host_if_member(queue, before)
        log.info("quorum.members_changed", queue=name, vhost=vhost_name, op=op, node=node, members=members)
        self.converging.add(group)
        self._ensure_reconciler()
        asyncio.get_running_loop().call_soon(self._reconcile_one, group)
        return {"members": list(members)}

    def _host_if_member(self, queue: QuorumQueue, voters_before: list[str]) -> None:
        """A member that does not host the group joins it: a fresh machine, an
        empty log starting from `voters_before` (the leader sends the rest)."""
        runtime = self.cluster.runtime
        if self.cluster.node not in queue.members or queue.group in runtime.groups:
            return
        queue.machine = qm.QuorumMachine(queue.state.limits)
        queue.state = queue.machine.state
        queue.applied_since_snapshot = 0
        runtime.join_group(queue.group, voters_before)

    def _apply_release(self, command: list, index: int) -> Any:
        _, vhost_name, name, group, node = command
        queue = self._queue(vhost_name, name, group)
        if queue is None:
            return None
        leaving = self.leaving.get(group)
        if leaving is not None:
            leaving.discard(node)
            if not leaving:
                del self.leaving[group]
        self._release_sent.pop((group, node), None)
        cluster = self.cluster
        if node != cluster.node or node in queue.members or group not in cluster.runtime.groups:
            return None
        leader = cluster.local_leader(group)
        cluster.runtime.remove_group(group)
        queue.machine = None
        queue.state = fifo.FifoState(limits=queue.state.limits)
        queue.leader_hint = leader if leader not in (None, cluster.node) else queue.members[0]
        self._leaving_announce.pop(group, None)
        self._transfer_started.pop(group, None)
        self.converging.discard(group)
        log.info("quorum.replica_released", queue=name, vhost=vhost_name)
        return None

    def _apply_leaving(self, command: list, index: int) -> Any:
        _, vhost_name, name, group, node = command
        queue = self._queue(vhost_name, name, group)
        if queue is not None and node not in queue.members:
            self.leaving.setdefault(group, set()).add(node)
            if group in self.cluster.runtime.groups:
                self.converging.add(group)
        return None

    def _apply_lead(self, command: list, index: int) -> Any:
        runtime = self.cluster.runtime
        moved = 0
        for _, _, group, to in command[1]:
            if to != self.cluster.node and self.cluster.is_leader(group):
                moved += runtime.transfer_leadership(group, to)
        return moved

    def _forget_group(self, group: str) -> None:
        self.leaving.pop(group, None)
        self.converging.discard(group)
        self._transfer_started.pop(group, None)
        self._leaving_announce.pop(group, None)
        for key in [key for key in self._release_sent if key[0] == group]:
            del self._release_sent[key]

    # -- reconciling a group's Raft configuration with its members -----------------------
    def _ensure_reconciler(self) -> None:
        if self._reconciler is not None and not self._reconciler.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return   # no event loop yet: the first apply starts it
        self._reconciler = loop.create_task(self._reconcile_forever())

    async def _reconcile_forever(self) -> None:
        runtime = self.cluster.runtime
        while not runtime.stopped:
            await asyncio.sleep(RECONCILE_SECONDS)
            if runtime.system is None or runtime.stopped or runtime.failed is not None:
                continue
            try:
                if self._scan_all:
                    # After a start: any hosted group may be mid-change (or a replica left behind).
                    self._scan_all = False
                    self.converging.update(group for group in self.cluster.queues if group in runtime.groups)
                for group in list(self.converging):
                    self.reconcile(group)
            except Exception:  # housekeeping must go on; the bug is logged
                log.exception("quorum.reconcile_failed")

    def _reconcile_one(self, group: str) -> None:
        runtime = self.cluster.runtime
        if runtime.system is None or runtime.stopped or runtime.failed is not None:
            return
        try:
            self.reconcile(group)
        except Exception:  # a bug: logged, and the periodic pass tries again
            log.exception("quorum.reconcile_failed", group=group)

    def reconcile(self, group: str) -> None:
        """One step towards the group's configuration being its members (see
        the module docstring); drops the group from `converging` when done here."""
        cluster = self.cluster
        runtime = cluster.runtime
        queue = cluster.queues.get(group)
        config = runtime.configuration(group)
        if queue is None or queue.deleted or config is None:
            self.converging.discard(group)
            return
        voters, committed = set(config[0]), config[1]
        members = set(queue.members)
        me = cluster.node
        leading = cluster.is_leader(group)
        leaving = self.leaving.get(group, set())
        if not leading:
            self._transfer_started.pop(group, None)
            if me not in members:
                self._announce_leaving(queue)
            elif voters == members and committed and not leaving:
                self.converging.discard(group)
            return
        if not committed:
            return   # one change at a time (the leader's first entry must commit too)
        adds = sorted(members - voters)
        removes = sorted(voters - members - {me})
        if adds or removes:
            op, node = ("add", adds[0]) if adds else ("remove", removes[0])
            if runtime.propose_conf_change(group, op, node) is not None:
                log.info("quorum.conf_change_proposed", queue=queue.name, vhost=queue.vhost.name, op=op, node=node)
            return
        if me not in members:
            self._hand_over(group, voters & members)
            return
        self._transfer_started.pop(group, None)
        now = time.monotonic()
        for node in sorted(leaving - voters):
            sent = self._release_sent.get((group, node))
            if sent is None or now - sent >= RELEASE_RESEND_SECONDS:
                self._release_sent[(group, node)] = now
                self.submit(["qrelease", queue.vhost.name, queue.name, group, node], lambda _: None)
        if not leaving:
            self.converging.discard(group)

    def _hand_over(self, group: str, remaining: set[str]) -> None:
        """This node leads `group` but is no longer a member: hand leadership
        to the most caught-up remaining voter, or after `TRANSFER_GRACE_SECONDS`
        propose its own removal (it steps down once that commits)."""
        runtime = self.cluster.runtime
        now = time.monotonic()
        started = self._transfer_started.setdefault(group, now)
        if now - started >= TRANSFER_GRACE_SECONDS or not remaining:
            if runtime.propose_conf_change(group, "remove", self.cluster.node) is not None:
                log.info("quorum.conf_change_proposed", group=group, op="remove", node=self.cluster.node)
            return
        status = runtime.status(group)
        down = self.cluster.down_since
        best = max(sorted(remaining), key=lambda voter: (voter not in down, status.match_index(voter) or 0))
        if status.lead_transferee != best and runtime.transfer_leadership(group, best):
            log.info("quorum.leadership_handed_over", group=group, to=best)

    def _announce_leaving(self, queue: QuorumQueue) -> None:
        group = queue.group
        now = time.monotonic()
        due = self._leaving_announce.get(group)
        if due is None:
            self._leaving_announce[group] = (now + LEAVING_ANNOUNCE_SECONDS, LEAVING_ANNOUNCE_SECONDS)
            return
        next_at, interval = due
        if now < next_at:
            return
        interval = min(interval * 2, LEAVING_ANNOUNCE_MAX_SECONDS)
        self._leaving_announce[group] = (now + interval, interval)
        self.submit(["qleaving", queue.vhost.name, queue.name, group, self.cluster.node], lambda _: None)
