"""How a node's `QueueClient` reaches the queue's replica: the one difference
between a replicated queue and one without a log.

`ReplicatedRoute` encodes each command (broker/queues/queue_codec.py) and has the
group's leader apply it (`Cluster.submit`, or `send_command` for publishes,
which carry their own sequences); a turn's publishes go out at the start of
the Raft turn that persists them. `LocalRoute` hands the record itself to the
replica on this node, which applies it at once: nothing is encoded, nothing
waits for a turn.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from warren.broker.node import metadata_commands as mc
from warren.broker.node.node_core import RESEND
from warren.broker.queues import queue_codec
from warren.broker.queues import queue_commands as qc
from warren.broker.queues.queue_replica import LOCAL_NODE
from warren.broker.weak_callbacks import WeakAttribute

if TYPE_CHECKING:
    from warren.broker.node.cluster import Cluster
    from warren.broker.queues.queue import Queue


class QueueRoute(Protocol):
    node: str

    def owner_key(self, owner: Any) -> str: ...

    def replica_wanted(self) -> bool: ...

    def replica_log(self) -> Any: ...

    def leading(self) -> bool: ...

    def expire(self) -> None: ...

    def at_end_of_turn(self, callback: Callable[[], None]) -> None: ...

    def send(self, command: Any) -> str | None: ...

    def submit(self, command: Any, on_done: Callable[[Any], None] | None) -> None: ...

    def submit_down(self, down: Any) -> None: ...

    def leader(self) -> str | None: ...

    def ask_resend(self, owner: str, tag: str, after_seq: int) -> None: ...

    def send_to(self, peer: str, message: list) -> None: ...


PROPOSED_KEPT = 64   # publish commands a leader keeps until it applies them (the rest are decoded)


class ProposedCommands:
    """The publish commands this node, as their queue's leader, encoded into its log,
    by the identity of their bytes: the leader applies the very bytes object it
    proposed (its Raft log holds it), so it takes the command back instead of
    decoding it, which copied every published body once more (only to drop it
    again when nobody consumes). Bytes a leader did not propose, or read back from
    disk, or received from another, are decoded as before; a command whose entry
    never comes is let go when the node stops leading, or past PROPOSED_KEPT."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[bytes, Any]] = {}   # holding the bytes keeps their id theirs

    def note(self, data: bytes, command: Any) -> None:
        by_id = self._by_id
        if len(by_id) >= PROPOSED_KEPT:
            del by_id[next(iter(by_id))]
        by_id[id(data)] = (data, command)

    def take(self, data: bytes) -> Any | None:
        held = self._by_id.pop(id(data), None)
        return held[1] if held is not None and held[0] is data else None

    def clear(self) -> None:
        self._by_id.clear()


class ReplicatedRoute:
    queue = WeakAttribute()   # the queue holds its route (broker/weak_callbacks.py)

    def __init__(self, cluster: "Cluster", queue: "Queue") -> None:
        self.cluster = cluster
        self.queue = queue
        self.group = queue.group
        self.node = cluster.node
        self.proposed = ProposedCommands()

    def owner_key(self, owner: Any) -> str:
        return self.cluster.owner_key(owner)

    def replica_wanted(self) -> bool:
        return self.node in self.queue.members

    def replica_log(self) -> Any:
        return RaftLogView(self.cluster, self.group)

    def leading(self) -> bool:
        return self.queue.replica is not None and self.cluster.is_leader(self.group)

    def expire(self) -> None:
        """x-expires or auto-delete: one deletion through the metadata group."""
        self.queue.expiring = True
        self.cluster.broker.metadata.submit(mc.DeleteQueue(self.queue.vhost.name, self.queue.name), lambda _: None)

    def at_end_of_turn(self, callback: Callable[[], None]) -> None:
        # at the start of the Raft turn that persists it (not a call_soon before it)
        self.cluster.runtime.before_turn(callback)

    def send(self, command: Any) -> str | None:
        publishes = type(command) is qc.EnqueueBatch
        # large bodies are not copied into the command: its Raft entry holds them as they are
        data = queue_codec.encode_publishes(command) if publishes else queue_codec.encode(command)
        leader = self.cluster.send_command(self.group, data)
        if leader == self.node and publishes:
            self.proposed.note(data, command)
        return leader

    def submit(self, command: Any, on_done: Callable[[Any], None] | None) -> None:
        self.cluster.submit(self.group, queue_codec.encode(command), on_done)

    def submit_down(self, down: Any) -> None:
        """A channel's Down: its commands still unanswered are not resent after it."""
        self.cluster.submit_down(self.group, down.owner, queue_codec.encode(down))

    def leader(self) -> str | None:
        return self.cluster.leader_hint(self.group)

    def ask_resend(self, owner: str, tag: str, after_seq: int) -> None:
        leader = self.queue.leader_hint
        if leader is None:
            return
        if leader == self.node:
            if self.queue.replica is not None:
                self.queue.replica.resend_deliveries(owner, tag, after_seq)
        else:
            self.cluster.app_send(leader, [RESEND, self.group, owner, tag, after_seq])

    def send_to(self, peer: str, message: list) -> None:
        self.cluster.app_send(peer, message)


class LocalRoute:
    """Into the replica without a log on this node, at once."""

    queue = WeakAttribute()   # the queue holds its route (broker/weak_callbacks.py)

    def __init__(self, queue: "Queue", node: str = LOCAL_NODE) -> None:
        self.queue = queue
        self.node = node

    def owner_key(self, owner: Any) -> str:
        return "/".join(str(part) for part in owner)

    def replica_wanted(self) -> bool:
        return True

    def replica_log(self) -> Any:
        return None

    def leading(self) -> bool:
        return True

    def expire(self) -> None:
        self.queue.vhost.delete_queue_now(self.queue)

    def at_end_of_turn(self, callback: Callable[[], None]) -> None:
        callback()

    def send(self, command: Any) -> str | None:
        self.queue.replica.apply_now(command)
        return self.node

    def submit(self, command: Any, on_done: Callable[[Any], None] | None) -> None:
        reply = self.queue.replica.apply_now(command)
        if on_done is not None:
            on_done(reply)

    def submit_down(self, down: Any) -> None:
        self.queue.replica.apply_now(down)   # nothing is resent here

    def leader(self) -> str | None:
        return self.node

    def ask_resend(self, owner: str, tag: str, after_seq: int) -> None:
        self.queue.replica.resend_deliveries(owner, tag, after_seq)

    def send_to(self, peer: str, message: list) -> None:
        raise AssertionError(f"a queue without a log sends nothing to {peer}")


class RaftLogView:
    """A replica's view of its group's log in the node's Raft runtime."""

    def __init__(self, cluster: "Cluster", group: str) -> None:
        self.cluster = cluster
        self.runtime = cluster.runtime
        self.group = group

    def entry_data(self, index: int) -> bytes | None:
        return self.runtime.entry_data(self.group, index)

    def compact(self, index: int, snapshot: bytes) -> None:
        self.runtime.compact(self.group, index, snapshot)

    def read_ahead_later(self, read_ahead: Callable[[], bool]) -> None:
        self.cluster.read_ahead.want(self.group, read_ahead)
