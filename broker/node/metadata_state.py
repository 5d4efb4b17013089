"""The metadata machine's state: plain data, and its snapshot.

What the metadata Raft group decides, the same on every node: vhosts (with
their durable exchanges, replicated queues with their members and group
ids, the bindings between those, and room for policies), users with their
password hashes and tags, permissions, and for each group in a membership
change the nodes removed from its members that may still hold a replica
(`leaving`).

The same records hold a node's own objects (transient exchanges, exclusive
and transient queues, the bindings with such an end): the machine applies
their commands to a second state of each node's, never replicated nor
snapshotted (broker/node/local_topology.py); only there is a record's
`durable` False or its `exclusive_owner` set.

`snapshot(state)` is msgpack of a plain structure with a version number,
rows sorted so that equal states give equal bytes; `restore(bytes)` is its
inverse. It is the metadata Raft group's snapshot (broker/node/metadata.py
compacts the group's log with it). Pure: no I/O, no clock.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from warren.broker.routing.exchanges import DEFAULT_EXCHANGES, Binding
from warren.raft.member_ids import member_id

SNAPSHOT_VERSION = 2


@dataclass(slots=True)
class ExchangeRecord:
    type: str
    auto_delete: bool = False
    internal: bool = False
    arguments: dict = field(default_factory=dict)
    durable: bool = True   # False: a node's own transient exchange


@dataclass(slots=True)
class QueueRecord:
    arguments: dict
    group: str
    members: list[str]
    auto_delete: bool = False   # a durable auto-delete classic queue (on a group of one)
    # node -> the metadata index of the change that last added it; the first members are not here
    joined: dict[str, int] = field(default_factory=dict)
    durable: bool = True   # False, or an exclusive owner: a node's own queue (no group, no members)
    exclusive_owner: object = None

    @property
    def queue_type(self) -> str:
        return self.arguments.get("x-queue-type", "classic")

    def member_ids(self) -> list[str]:
        """The members' replica ids in the group: a node added after the queue
        was declared is a new voter each time it is added (raft/member_ids.py)."""
        return [member_id(node, self.joined.get(node, 0)) for node in self.members]


class BindingSet(set[Binding]):
    """A vhost's bindings, found by source and by destination without a scan: deleting
    one of thousands of queues bound to one exchange touches only its own bindings.
    The machine changes it only through add, discard and difference_update."""

    __slots__ = ("_from", "_to")

    def __init__(self, bindings: Iterable[Binding] = ()) -> None:
        super().__init__()
        self._from: dict[str, set[Binding]] = {}
        self._to: dict[tuple[str, str], set[Binding]] = {}
        for binding in bindings:
            self.add(binding)

    def add(self, binding: Binding) -> None:
        if binding in self:
            return
        super().add(binding)
        self._from.setdefault(binding.source, set()).add(binding)
        self._to.setdefault(binding.destination, set()).add(binding)

    def discard(self, binding: object) -> None:
        if not isinstance(binding, Binding) or binding not in self:
            return
        super().discard(binding)
        _unindex(self._from, binding.source, binding)
        _unindex(self._to, binding.destination, binding)

    def difference_update(self, *others: Iterable[object]) -> None:
        for other in others:
            for binding in list(other):
                self.discard(binding)

    def from_source(self, source: str) -> list[Binding]:
        return list(self._from.get(source, ()))

    def any_from(self, source: str) -> bool:
        return source in self._from

    def to_destination(self, destination: tuple[str, str]) -> list[Binding]:
        return list(self._to.get(destination, ()))

    def _unindexed(self, *_: object) -> Any:
        raise TypeError("a BindingSet changes only through add, discard and difference_update")

    remove = pop = clear = update = intersection_update = symmetric_difference_update = _unindexed
    __ior__ = __iand__ = __isub__ = __ixor__ = _unindexed


def _unindex(index: dict[Any, set[Binding]], key: Any, binding: Binding) -> None:
    found = index[key]
    found.discard(binding)
    if not found:
        del index[key]


@dataclass(slots=True)
class VhostRecord:
    exchanges: dict[str, ExchangeRecord] = field(default_factory=dict)   # durable ones, built-ins too
    queues: dict[str, QueueRecord] = field(default_factory=dict)
    bindings: BindingSet = field(default_factory=BindingSet)
    policies: dict[str, dict] = field(default_factory=dict)   # none yet: no command sets one

    @staticmethod
    def fresh() -> "VhostRecord":
        return VhostRecord({name: ExchangeRecord(type_) for name, type_ in DEFAULT_EXCHANGES})

    def bindings_from(self, source: str) -> list[Binding]:
        return self.bindings.from_source(source)

    def has_bindings_from(self, source: str) -> bool:
        return self.bindings.any_from(source)

    def bindings_to(self, destination: tuple[str, str]) -> list[Binding]:
        return self.bindings.to_destination(destination)


@dataclass(frozen=True, slots=True)
class UserRecord:
    password_hash: str
    tags: tuple[str, ...] = ()


@dataclass(slots=True)
class MetaState:
    vhosts: dict[str, VhostRecord] = field(default_factory=dict)
    users: dict[str, UserRecord] = field(default_factory=dict)
    permissions: dict[tuple[str, str], tuple[str, str, str]] = field(default_factory=dict)   # (user, vhost)
    leaving: dict[str, set[str]] = field(default_factory=dict)   # group -> nodes
    seeded: bool = False   # the config's definitions were applied (the log's first SeedDefinitions)

    def queue(self, vhost: str, name: str) -> QueueRecord | None:
        record = self.vhosts.get(vhost)
        return record.queues.get(name) if record is not None else None


def initial_state(vhosts: Iterable[str] = (), users: dict[str, UserRecord] | None = None,
                  permissions: dict[tuple[str, str], tuple[str, str, str]] | None = None) -> MetaState:
    """A state seeded with vhosts (with their built-in exchanges), users and permissions."""
    return MetaState({name: VhostRecord.fresh() for name in vhosts}, dict(users or {}), dict(permissions or {}),
                     seeded=True)


# -- snapshot --------------------------------------------------------------------------
def snapshot(state: MetaState) -> bytes:
    return msgpack.packb(_plain(state), use_bin_type=True, default=str)


def _plain(state: MetaState) -> dict:
    return {
        "version": SNAPSHOT_VERSION,
        "vhosts": {name: _plain_vhost(record) for name, record in sorted(state.vhosts.items())},
        "users": [[name, user.password_hash, list(user.tags)] for name, user in sorted(state.users.items())],
        "permissions": [[user, vhost, *expressions]
                        for (user, vhost), expressions in sorted(state.permissions.items())],
        "leaving": [[group, sorted(nodes)] for group, nodes in sorted(state.leaving.items())],
        "seeded": state.seeded,
    }


def _plain_vhost(record: VhostRecord) -> dict:
    return {
        "exchanges": [[name, x.type, x.auto_delete, x.internal, x.arguments]
                      for name, x in sorted(record.exchanges.items())],
        "queues": [[name, q.arguments, q.group, list(q.members), q.auto_delete, sorted(q.joined.items())]
                   for name, q in sorted(record.queues.items())],
        "bindings": sorted(([b.source, b.destination[0], b.destination[1], b.routing_key, b.table]
                            for b in record.bindings), key=repr),
        "policies": dict(sorted(record.policies.items())),
    }


def restore(data: bytes) -> MetaState:
    plain = msgpack.unpackb(data, raw=False, strict_map_key=False)
    if plain.get("version") != SNAPSHOT_VERSION:
        raise ValueError(f"metadata snapshot version {plain.get('version')!r}, this node reads {SNAPSHOT_VERSION}")
    return MetaState(
        {name: _restore_vhost(rows) for name, rows in plain["vhosts"].items()},
        {name: UserRecord(password_hash, tuple(tags)) for name, password_hash, tags in plain["users"]},
        {(user, vhost): (configure, write, read) for user, vhost, configure, write, read in plain["permissions"]},
        {group: set(nodes) for group, nodes in plain["leaving"]},
        plain["seeded"],
    )


def _restore_vhost(rows: dict) -> VhostRecord:
    return VhostRecord(
        {name: ExchangeRecord(type_, auto_delete, internal, arguments)
         for name, type_, auto_delete, internal, arguments in rows["exchanges"]},
        {name: QueueRecord(arguments, group, list(members), auto_delete, dict(joined[0]) if joined else {})
         for name, arguments, group, members, auto_delete, *joined in rows["queues"]},
        BindingSet(Binding.make(source, (kind, destination), routing_key, table)
                   for source, kind, destination, routing_key, table in rows["bindings"]),
        dict(rows["policies"]),
    )
