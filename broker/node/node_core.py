"""What one node decides beside Raft, as a pure object with one explicit turn.

Theory of operation (issue 11, item 4). The node's distributed logic takes
plain inputs and leaves plain outputs; the asyncio shell (broker/node/cluster.py)
feeds it and performs what it leaves, once per Raft turn:

* inputs: a channel's command (`submit`), a peer's application messages
  (`on_messages`), a peer's link up or down (`peer_up` / `peer_down`), the time
  (`tick(now)`), a committed entry and a group's new leader (`on_applied`,
  `on_role_change`);
* outputs: one application frame per peer (`take_frames`, at the end of the
  turn), the channels' answers (the callbacks given to `submit`, called in
  the turn that learns them), proposals to the groups this node leads
  (through `RaftPort`), and the queues' own hooks (`QueuePort`).

Commands reach a group's leader wherever they start: `submit` proposes
locally when this node leads, else sends a CMD message to the leader this
node knows of (a non-leader forwards it once more). The leader remembers
which index carries which (origin, token) and answers DONE with the apply's
reply when it applies that index. An origin resends what is still
unanswered when the group's leader changes and every `RESEND_SECONDS`; the
commands tolerate being applied twice (enqueues carry enqueuer sequences the
queue de-duplicates). A node's up, down and gone (liveness commands) are
stated by the current leader's own view only: a peer never forwards them.

Timers are ticks: the housekeeping (resends, nodes gone, bounded metadata
answers) runs when a tick finds it due, a new queue's first leader
campaigns again at the deadlines `campaign_again` set, and the membership
reconciler (`MembershipPort`, broker/node/metadata_reconcile.py) makes its
periodic pass every `RECONCILE_SECONDS` and reconciles a group whose
members changed at the end of the turn that changed them, and the broker's
own housekeeping (resource alarms, message TTL and x-expires, consumer
timeouts) is due every `broker_housekeeping_seconds` (`take_broker_housekeeping`);
so a seeded simulation drives every timer with its own clock.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack

from warren.broker.node.cluster_alarms import ClusterAlarms
from warren.broker.node.metadata_answers import MetadataAnswers
from warren.broker.queues import queue_codec
from warren.broker.queues import queue_commands as qc

META = "meta"
# application message kinds
CMD = 0        # [CMD, group, data, origin, token]
DONE = 1       # [DONE, group, token, result]
# (2 was one delivery a message, before DELIVERIES)
APPLIED = 3    # [APPLIED, group, enqueuer, first_seq, last_seq, [refused seqs]]
RESEND = 4     # [RESEND, group, owner, tag, after_seq]: a consumer's node lost deliveries
HELLO = 5      # [HELLO, incarnation]: sent to a peer when its link comes up, and again now and then
# [METADATA_APPLIED, index, {peer: its index}]: how far the sender applied the metadata group, and the
# peers it reaches with how far each said it did (MetadataAnswers.relayed)
METADATA_APPLIED = 6
RESENT = 7     # [RESENT, group, owner, tag, horizon, [seqs resent]]: a RESEND's answer, after its deliveries
# [DELIVERIES, group, owner, tag, [[seq, msg_id, [exchange, routing_key, properties, body], redelivered, count],
# ...]]: a run of one consumer's deliveries, in the order made
DELIVERIES = 8
# [ALARMS, [resource, ...]]: the sender's resource alarms ("memory", "disk"), whenever they change
# and again every housekeeping pass while any is on; [] once they cleared (cluster_alarms.py)
ALARMS = 9

RESEND_SECONDS = 1.0
HOUSEKEEPING_SECONDS = RESEND_SECONDS / 2
RECONCILE_SECONDS = 0.2   # the membership reconciler's periodic pass
# queue commands whose second field is the channel (owner) that sent them
OWNER_OPS = frozenset(record.TAG for record in (qc.Checkout, qc.Cancel, qc.Settle, qc.Return, qc.Discard, qc.Suspend,
                                                 qc.Dequeue, qc.Down))
# a new quorum queue's first leader campaigns again after these delays while it has no leader
CAMPAIGN_AGAIN_SECONDS = (0.05, 0.15, 0.3)


def forwardable_op(data: Any) -> int | None:
    """The opcode of a queue command a peer may forward: a msgpack list with a known
    opcode and arity, and not a liveness command (a node's up/down/gone is stated by
    the current leader's own view only, never forwarded: issue 9, item 5). None if not."""
    try:
        command = queue_codec.decode_positional(data)
    except Exception:  # noqa: BLE001 -- anything undecodable is simply not well formed
        return None
    op = command[0]
    if not isinstance(op, int) or queue_codec.ARITY.get(op) != len(command) or op in queue_codec.LIVENESS_TAGS:
        return None
    return op


def command_owner(data: bytes) -> str | None:
    """The owner (channel) a queue command names, None if it names none."""
    try:
        command = queue_codec.decode_positional(data)
    except Exception:  # noqa: BLE001 -- not a queue command
        return None
    return command[1] if command[0] in OWNER_OPS else None


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


class RaftPort(Protocol):
    """The node's Raft groups as the core uses them (raft/runtime.py, or a simulation's)."""

    def propose(self, group: str, data: bytes) -> int | None: ...

    def leader_of(self, group: str) -> str | None: ...

    def hosts(self, group: str) -> bool: ...

    def campaign(self, group: str) -> bool: ...


class QueuePort(Protocol):
    """A queue as the core reaches it: its members, the leader it was told of, and its hooks."""

    group: str
    members: list[str]
    leader_hint: str | None

    def on_node_down(self, peer: str) -> None: ...

    def on_node_up(self, peer: str, incarnation: str) -> None: ...

    def on_node_gone(self, peer: str) -> None: ...

    def on_link_up(self, peer: str) -> None: ...

    def ask_for_gaps(self) -> None: ...

    def resend_enqueues(self, now: float, leader_changed: bool = False) -> None: ...

    def on_applied(self, enqueuer: str, first_seq: int, last_seq: int, refused: list) -> None: ...

    def on_remote_deliveries(self, owner: str, tag: str, deliveries: list) -> None: ...

    def on_resent(self, owner: str, tag: str, horizon: int, checked_out: list[int]) -> None: ...

    def resend_deliveries(self, owner: str, tag: str, after_seq: int) -> None: ...

    def on_leader_change(self, leader: str | None, leading: bool) -> None: ...


class MembershipPort(Protocol):
    """The quorum queues' membership reconciler (broker/node/metadata_reconcile.py), run on the core's clock."""

    due: set[str]   # groups whose members changed this turn

    def tick(self, now: float) -> None: ...

    def run_due(self, now: float) -> None: ...


@dataclass(slots=True)
class Pending:
    group: str
    data: bytes
    callback: Callable[[Any], None] | None
    sent_at: float
    sent_to: str | None = None   # the leader it was last sent to (None: no leader was known)


class NodeCore:
    def __init__(self, node: str, incarnation: str, nodes: Iterable[str], raft: RaftPort,
                 node_gone_seconds: float, now: float = 0.0, broker_housekeeping_seconds: float = 0.5,
                 answer_grace_seconds: float = 0.0) -> None:
        self.node = node
        # a metadata answer still waits this long for a peer counted down (`answer_peers`)
        self.answer_grace_seconds = answer_grace_seconds
        # Owners and enqueuers carry it: a restarted node's old sessions are told apart.
        self.incarnation = incarnation
        self.nodes = sorted(set(nodes) | {node})
        self.raft = raft
        self.node_gone_seconds = node_gone_seconds
        self.queues: dict[str, QueuePort] = {}   # every replicated queue known here, by group id
        self.pending: dict[int, Pending] = {}
        self.next_token = 1
        # group -> index -> (origin node, token): what the leader answers when it applies
        self.awaiting_apply: dict[str, dict[int, tuple[str, int]]] = {}
        self.outbox: dict[str, list] = {}
        self.peer_incarnations: dict[str, str] = {}
        # every peer is down until its link comes up
        self.down_since: dict[str, float] = {peer: now for peer in self.nodes if peer != node}
        # peer -> the incarnation its HELLO named since its link last came up
        self.greeted: dict[str, str] = {}
        self.answers = MetadataAnswers()
        self.meta_applied_index = 0
        self._meta_applied_noted = False
        self.relay_due: set[str] = set()   # peers to tell, at the end of the turn, whom this node reaches
        self.next_housekeeping = now + HOUSEKEEPING_SECONDS
        self.campaigns: list[tuple[float, str]] = []   # (due, group): campaign if still leaderless
        self.membership: MembershipPort | None = None   # set by the metadata shell
        self.next_reconcile = now + RECONCILE_SECONDS
        self.broker_housekeeping_seconds = broker_housekeeping_seconds
        self.next_broker_housekeeping = now + broker_housekeeping_seconds
        self.broker_housekeeping_due = False
        self.alarms = ClusterAlarms()   # the shell re-blocks publishers when `alarms.changed`
        self.now = now

    # -- submitting commands -----------------------------------------------------
    def submit(self, group: str, data: bytes, callback: Callable[[Any], None] | None = None) -> None:
        """Have `data` applied by `group`; `callback(reply)` on this node once the
        leader has applied it (never, if it is lost for good)."""
        token = self.next_token
        self.next_token += 1
        pending = self.pending[token] = Pending(group, data, callback, self.now)
        pending.sent_to = self.send_command(group, data, token)

    def submit_down(self, group: str, owner_key: str, data: bytes) -> None:
        """A channel is gone (`data` is its DOWN): its unanswered commands to `group`
        are not resent after it (answered None here). A CHECKOUT resent after the
        DOWN was applied would register a consumer nobody closes, holding its
        messages for good (tests/sim, seeds 32 and 58 before this)."""
        for token, pending in list(self.pending.items()):
            if pending.group == group and command_owner(pending.data) == owner_key:
                del self.pending[token]
                if pending.callback is not None:
                    pending.callback(None)
        self.submit(group, data)

    def send_command(self, group: str, data: bytes, token: int = 0) -> str | None:
        """Send to the leader this node knows of; returns it (None: none known, not sent)."""
        leader = self.leader_hint(group)
        if leader == self.node:
            self.propose(group, data, self.node, token)
        elif leader is not None:
            self.send(leader, [CMD, group, data, self.node, token])
        return leader

    def propose(self, group: str, data: bytes, origin: str, token: int) -> None:
        index = self.raft.propose(group, data)
        if index is None:
            leader = self.raft.leader_of(group)
            if leader is not None and leader not in (self.node, origin):
                self.send(leader, [CMD, group, data, origin, token])
            return  # else dropped: the origin resends
        if token:
            self.awaiting_apply.setdefault(group, {})[index] = (origin, token)

    def leader_hint(self, group: str) -> str | None:
        if self.raft.hosts(group):
            return self.raft.leader_of(group)
        queue = self.queues.get(group)
        if queue is None:
            return None
        hint = queue.leader_hint
        if hint is None or hint in self.down_since or hint not in queue.members:
            # Not a member here: ask a live member (it forwards to the leader it knows). A hint
            # no longer a member may not host the group any more, and drops what it is sent
            # (tests/sim membership seed 2 before this).
            live = [member for member in queue.members if member not in self.down_since]
            queue.leader_hint = live[0] if live else queue.leader_hint
        return queue.leader_hint

    def is_leader(self, group: str) -> bool:
        return self.raft.leader_of(group) == self.node

    def resend(self, group: str | None = None) -> None:
        """Send unanswered commands again: all of them after `RESEND_SECONDS`
        without an answer, or those of `group` that went elsewhere than its leader now."""
        now = self.now
        leader = self.leader_hint(group) if group is not None else None
        for token, pending in list(self.pending.items()):
            if pending.group != META and pending.group not in self.queues:
                del self.pending[token]   # the queue was deleted: nobody will answer, so answer None here
                if pending.callback is not None:
                    pending.callback(None)
                continue
            if group is None and now - pending.sent_at < RESEND_SECONDS:
                continue
            if group is not None and (pending.group != group or pending.sent_to == leader):
                continue
            pending.sent_at = now
            pending.sent_to = self.send_command(pending.group, pending.data, token)
        for queue in list(self.queues.values()):
            if group is None or queue.group == group:
                queue.resend_enqueues(now, leader_changed=group is not None)

    def on_done(self, token: int, result: Any) -> None:
        pending = self.pending.pop(token, None)
        if pending is not None and pending.callback is not None:
            pending.callback(result)

    # -- what the node's groups did --------------------------------------------------
    def on_applied(self, group: str, index: int, result: Any) -> None:
        """`group` applied `index` here with `result`: answer its origin if this node proposed it for one."""
        waiting = self.awaiting_apply.get(group)
        if waiting:
            answer = waiting.pop(index, None)
            if answer is not None:
                origin, token = answer
                if origin == self.node:
                    self.on_done(token, result)
                else:
                    self.send(origin, [DONE, group, token, result])

    def on_meta_applied(self, index: int) -> None:
        """This node applied the metadata group through `index`; peers hear of it at the end of the turn."""
        self.meta_applied_index = max(self.meta_applied_index, index)
        self._meta_applied_noted = True

    def on_role_change(self, group: str, leading: bool, leader_id: str | None) -> None:
        if not leading:
            self.awaiting_apply.pop(group, None)
        queue = self.queues.get(group)
        if queue is not None:
            queue.on_leader_change(leader_id, leading)
        if leader_id is not None:
            self.resend(group)

    # -- metadata answers ------------------------------------------------------------
    def submit_meta(self, data: bytes, on_done: Callable[[Any], None], everywhere: bool = True) -> None:
        """Have the metadata group apply `data`; `on_done(reply)` once this node has
        applied it and (`everywhere`) so has every running node (MetadataAnswers)."""
        self.submit(META, data, lambda answer: self.answers.on_answer(
            answer, on_done, everywhere, self.now, self.meta_applied_index, self.answer_peers()))

    def release_answers(self) -> None:
        self.answers.release(self.now, self.meta_applied_index, self.answer_peers())

    def campaign_again(self, group: str) -> None:
        """A new group's first leader: campaign again while it has no leader (the
        other members may not host it yet and drop the votes asked)."""
        self.campaigns.extend((self.now + delay, group) for delay in CAMPAIGN_AGAIN_SECONDS)

    # -- application messages ------------------------------------------------------
    def send(self, peer: str, message: list) -> None:
        self.outbox.setdefault(peer, []).append(message)

    def take_messages_for(self, peer: str) -> list[list]:
        """The messages held for `peer` so far this turn, to go now (in order, before the rest)."""
        return self.outbox.pop(peer, [])

    @property
    def has_output(self) -> bool:
        return (bool(self.outbox) or self._meta_applied_noted or bool(self.relay_due)
                or bool(self.membership and self.membership.due))

    def end_turn(self) -> dict[str, list[list]]:
        """The end of the node's turn: reconcile the groups whose members changed,
        tell the peers how far this node applied the metadata group, answer what
        waited for it (which may send more), and hand over the turn's messages
        (peer -> messages)."""
        if self.membership is not None and self.membership.due:
            self.membership.run_due(self.now)
        while self._meta_applied_noted:
            self._meta_applied_noted = False   # once per turn, with the turn's last index
            self.relay_due.clear()   # every running peer hears now
            for peer in self.running_peers():
                self.send(peer, self.applied_message(peer))
            self.release_answers()
        if self.relay_due:
            for peer in sorted(self.relay_due):   # in a set order: the seeded simulation replays a seed
                if peer not in self.down_since:
                    self.send(peer, self.applied_message(peer))
            self.relay_due.clear()
        outbox, self.outbox = self.outbox, {}
        return outbox

    def on_messages(self, peer: str, messages: list) -> list[list]:
        """A peer's application messages; returns those that were not well formed."""
        bad = []
        for message in messages:
            try:
                if not self.on_message(peer, message):
                    bad.append(message)
            except (TypeError, ValueError, IndexError, KeyError):
                bad.append(message)
        return bad

    def on_message(self, peer: str, message: list) -> bool:
        kind = message[0]
        if kind == CMD:
            _, group, data, origin, token = message
            if group != META and forwardable_op(data) is None:
                return False
            self.propose(group, data, origin, token)
        elif kind == DONE:
            self.on_done(message[2], message[3])
        elif kind in (DELIVERIES, APPLIED, RESENT):
            queue = self.queues.get(message[1])
            if queue is not None:
                queue.leader_hint = peer
                if kind == DELIVERIES:
                    queue.on_remote_deliveries(message[2], message[3], message[4])
                elif kind == APPLIED:
                    queue.on_applied(message[2], message[3], message[4], message[5])
                else:
                    queue.on_resent(message[2], message[3], message[4], message[5])
        elif kind == RESEND:
            queue = self.queues.get(message[1])
            if queue is not None and self.is_leader(queue.group):
                queue.resend_deliveries(message[2], message[3], message[4])
        elif kind == METADATA_APPLIED:
            self.on_peer_applied(peer, message[1], message[2] if len(message) > 2 else None)
        elif kind == ALARMS:
            self.alarms.on_peer(peer, message[1], self.now)
        elif kind == HELLO:
            if self.greeted.get(peer) == message[1]:
                return True   # heard since its link came up: a repeat
            self.greeted[peer] = self.peer_incarnations[peer] = message[1]
            for queue in list(self.queues.values()):
                queue.on_node_up(peer, message[1])
        return True

    # -- how far the peers applied the metadata group ---------------------------------
    def applied_message(self, to: str) -> list:
        """How far this node applied the metadata group, and the peers it reaches (but `to`)
        with how far each said it did, for `to` to wait for one it cannot reach itself."""
        view = {peer: self.answers.peer_applied.get(peer, 0) for peer in self.running_peers() if peer != to}
        return [METADATA_APPLIED, self.meta_applied_index, view]

    def on_peer_applied(self, peer: str, index: int, view: dict | None) -> None:
        """`peer` applied the group through `index` and (`view`, if it said) reaches these nodes,
        which applied so far. A peer that does not reach a node this one reaches hears of that
        node's progress from here, whenever it moves (a bridge: NodeCore.answer_peers)."""
        if not isinstance(index, int) or not (view is None or isinstance(view, dict)):
            raise TypeError("METADATA_APPLIED: an index and a view")
        before = self.answers.peer_applied.get(peer, 0)
        self.answers.peer_applied[peer] = max(before, index)
        if view is not None and peer not in self.down_since:   # not one read after its link went down
            self.answers.relayed[peer] = {node: applied for node, applied in view.items()
                                          if node != self.node and node in self.nodes and isinstance(applied, int)}
            if self.misses_a_peer(peer):
                self.relay_due.add(peer)
        if index > before:
            self.relay_due.update(other for other in self.running_peers()
                                  if other in self.answers.relayed and peer not in self.answers.relayed[other]
                                  and other != peer)
        self.release_answers()

    def misses_a_peer(self, peer: str) -> bool:
        """Whether `peer` said it does not reach a node this one reaches."""
        reached = self.answers.relayed.get(peer)
        return reached is not None and any(other != peer and other not in reached for other in self.running_peers())

    # -- nodes coming and going ------------------------------------------------------
    def running_peers(self) -> list[str]:
        """The other nodes whose link is up."""
        return [peer for peer in self.nodes if peer != self.node and peer not in self.down_since]

    def answer_peers(self) -> list[str]:
        """The peers a metadata answer waits for: the running ones, and those counted down
        less than `answer_grace_seconds` ago. A peer cut off silently counts this node down
        by its own heartbeats, up to a few of them later than this node counted it down;
        until then its fence is not up (broker/node/metadata_fence.py) and its clients'
        publishes are routed by what it knew: an answer given before that lets a client
        publish through it to a name it does not know (tests/integration/test_metadata_propagation.py)."""
        now, grace = self.now, self.answer_grace_seconds
        relayed = self.answers.relayed_peers()
        return [peer for peer in self.nodes if peer != self.node
                and (peer not in self.down_since or now - self.down_since[peer] < grace or peer in relayed)]

    def greeting_peers(self) -> list[str]:
        """The running peers whose HELLO came since their link did: they count this node running."""
        return [peer for peer in self.running_peers() if peer in self.greeted]

    def peer_up(self, peer: str) -> None:
        self.down_since.pop(peer, None)
        self.send(peer, [HELLO, self.incarnation])
        self.send(peer, self.applied_message(peer))
        self.relay_due.update(self.running_peers())   # whom this node reaches changed: the others hear
        if self.alarms.local:
            self.send(peer, self.alarms_message())
        for queue in list(self.queues.values()):
            queue.on_link_up(peer)

    def peer_down(self, peer: str) -> None:
        """A node that went down no longer holds metadata answers back; when it is
        back it says how far it got."""
        self.down_since.setdefault(peer, self.now)
        self.greeted.pop(peer, None)
        self.answers.peer_applied.pop(peer, None)
        self.answers.relayed.pop(peer, None)
        self.relay_due.update(self.running_peers())
        self.release_answers()
        self.alarms.peer_down(peer)
        for queue in list(self.queues.values()):
            queue.on_node_down(peer)

    # -- resource alarms, cluster-wide (cluster_alarms.py) ----------------------------------
    def alarms_message(self) -> list:
        return [ALARMS, sorted(self.alarms.local)]

    def set_local_alarms(self, resources: Iterable[str]) -> None:
        """This node's own alarms, as the broker measured them: the peers hear of a change."""
        if self.alarms.set_local(resources):
            for peer in self.running_peers():
                self.send(peer, self.alarms_message())

    # -- time ----------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """The time is `now`: run the timers that are due."""
        self.now = now
        if self.campaigns:
            due = [group for at, group in self.campaigns if at <= now]
            self.campaigns = [(at, group) for at, group in self.campaigns if at > now]
            for group in due:
                if self.raft.hosts(group) and self.raft.leader_of(group) is None:
                    self.raft.campaign(group)
        if now >= self.next_housekeeping:
            self.next_housekeeping = now + HOUSEKEEPING_SECONDS
            self.resend()
            self.check_gone_nodes()
            self.release_answers()   # a wait for a lagging node is bounded
            self.announce()
            self.ask_for_lost_deliveries()
            self.alarms.expire(now)
        if self.membership is not None and now >= self.next_reconcile:
            self.next_reconcile = now + RECONCILE_SECONDS
            self.membership.tick(now)
        if now >= self.next_broker_housekeeping:
            self.next_broker_housekeeping = now + self.broker_housekeeping_seconds
            self.broker_housekeeping_due = True

    def take_broker_housekeeping(self) -> bool:
        """Whether the broker's housekeeping is due (once per period): the shell performs it."""
        due, self.broker_housekeeping_due = self.broker_housekeeping_due, False
        return due

    def announce(self) -> None:
        """Say again who this node is and how far it applied the metadata group: a
        message lost with a full outbound queue (or a simulated drop) would leave a
        restarted node's old consumers in place, or a declaration waiting for the
        bounded wait. A repeated HELLO is ignored; a repeated METADATA_APPLIED costs nothing."""
        for peer in self.running_peers():
            self.send(peer, [HELLO, self.incarnation])
            self.send(peer, self.applied_message(peer))
            if self.alarms.local:   # a peer that missed it would stop counting it (PEER_ALARM_STALE_SECONDS)
                self.send(peer, self.alarms_message())

    def ask_for_lost_deliveries(self) -> None:
        """This node's consumers ask each queue's leader, now and then, for what it
        checked out to them after the last delivery they saw: a lost delivery at the
        end of a consumer's window leaves no gap to notice, and the window stays full
        for good (tests/sim seed 33). The queue's link-up hook asks just that."""
        for queue in list(self.queues.values()):
            leader = queue.leader_hint
            if leader == self.node:
                queue.ask_for_gaps()
            elif leader is not None and leader not in self.down_since:
                queue.on_link_up(leader)

    def check_gone_nodes(self) -> None:
        for peer, since in list(self.down_since.items()):
            if self.now - since >= self.node_gone_seconds:
                for queue in list(self.queues.values()):
                    queue.on_node_gone(peer)

    def owner_key(self, owner: Any) -> str:
        """A channel's name in queue state: node/incarnation/connection/channel."""
        return f"{self.node}/{self.incarnation}/{owner[0]}/{owner[1]}"
