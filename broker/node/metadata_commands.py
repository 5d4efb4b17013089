"""The metadata group's commands: typed records and the one codec of its log.

Each command is a frozen slotted dataclass with a string TAG. On the log a
command is the msgpack list ``[TAG, *fields]``: the very shape Warren wrote
before these classes existed (``["qdecl", vhost, name, arguments, members,
origin]``, ``["user_add", name, password_hash, tags]``, ...), so the log of
an old data directory decodes unchanged and a node of this version can apply
what an older node proposed. A field that msgpack returns as a list (members,
tags, leadership moves) is kept as a tuple, so that a decoded command equals
the one encoded.

Pure: no I/O, no clock.
"""
from __future__ import annotations

from dataclasses import MISSING, astuple, dataclass, fields
from typing import Any, ClassVar

import msgpack


def _tuples(value: Any) -> Any:
    return tuple(_tuples(item) for item in value) if isinstance(value, (list, tuple)) else value


class _Command:
    """Fields named in TUPLE_FIELDS are stored as (nested) tuples."""

    __slots__ = ()
    TAG: ClassVar[str]
    TUPLE_FIELDS: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        for name in self.TUPLE_FIELDS:
            object.__setattr__(self, name, _tuples(getattr(self, name)))


# -- queues, exchanges, bindings ------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DeclareQueue(_Command):
    """A replicated queue (quorum, or a durable classic queue on a group of one); applied
    by a node's own machine, a queue without a log (no members; transient or exclusive)."""
    TAG: ClassVar[str] = "qdecl"
    TUPLE_FIELDS: ClassVar[tuple[str, ...]] = ("members",)
    vhost: str
    name: str
    arguments: dict
    members: tuple[str, ...]
    origin: str   # the declaring node: the first leader under x-queue-leader-locator client-local
    auto_delete: bool = False   # a durable auto-delete classic queue (deleted through the group when unused)
    durable: bool = True   # the two fields a node's own queue adds; never on the log
    exclusive_owner: Any = None


@dataclass(frozen=True, slots=True)
class DeleteQueue(_Command):
    TAG: ClassVar[str] = "qdel"
    vhost: str
    name: str


@dataclass(frozen=True, slots=True)
class DeclareExchange(_Command):
    """A durable exchange (every durable exchange is the group's); a transient one
    (durable False) is applied by a node's own machine only."""
    TAG: ClassVar[str] = "xdecl"
    vhost: str
    name: str
    type: str
    auto_delete: bool
    internal: bool
    arguments: dict
    durable: bool = True


@dataclass(frozen=True, slots=True)
class DeleteExchange(_Command):
    TAG: ClassVar[str] = "xdel"
    vhost: str
    name: str
    if_unused: bool


@dataclass(frozen=True, slots=True)
class Bind(_Command):
    """class_id and method_id name the AMQP method, for the error an apply may meet."""
    TAG: ClassVar[str] = "bind"
    vhost: str
    source: str
    destination_kind: str   # "queue" | "exchange"
    destination: str
    routing_key: str
    arguments: dict
    class_id: int
    method_id: int


@dataclass(frozen=True, slots=True)
class Unbind(_Command):
    TAG: ClassVar[str] = "unbind"
    vhost: str
    source: str
    destination_kind: str
    destination: str
    routing_key: str
    arguments: dict
    class_id: int
    method_id: int


@dataclass(frozen=True, slots=True)
class ForgetEnd(_Command):
    """A node's own machine only: an object of the shared state went (applied from the
    metadata group); the node's bindings with it as an end go, and an auto-delete
    source of its own left without any."""
    TAG: ClassVar[str] = "forget_end"
    vhost: str
    kind: str   # "queue" | "exchange"
    name: str


# -- quorum queue membership ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SetMembers(_Command):
    """`members` is what the asking node computed; `op` and `node` are checked again."""
    TAG: ClassVar[str] = "qmembers"
    TUPLE_FIELDS: ClassVar[tuple[str, ...]] = ("members",)
    vhost: str
    name: str
    members: tuple[str, ...]
    op: str   # "add" | "remove"
    node: str


@dataclass(frozen=True, slots=True)
class ReleaseReplica(_Command):
    """The group's configuration no longer has `node`: it may drop its replica."""
    TAG: ClassVar[str] = "qrelease"
    vhost: str
    name: str
    group: str
    node: str


@dataclass(frozen=True, slots=True)
class NoteLeaving(_Command):
    """`node` still holds a replica of a group it is no longer a member of."""
    TAG: ClassVar[str] = "qleaving"
    vhost: str
    name: str
    group: str
    node: str


@dataclass(frozen=True, slots=True)
class TransferLeaders(_Command):
    """moves: ((vhost, name, group, to), ...): rebalance, best effort."""
    TAG: ClassVar[str] = "qlead"
    TUPLE_FIELDS: ClassVar[tuple[str, ...]] = ("moves",)
    moves: tuple[tuple[str, str, str, str], ...]


@dataclass(frozen=True, slots=True)
class Sync(_Command):
    """A no-op: a read barrier (`Metadata.catch_up`)."""
    TAG: ClassVar[str] = "sync"


# -- users, vhosts, permissions (a password only as its salted hash) --------------------------
@dataclass(frozen=True, slots=True)
class SeedDefinitions(_Command):
    """The config's users, vhosts and permissions: what a node proposes first on
    an empty metadata log. Only the first one applied counts (the log is the
    truth afterwards: README "Users and vhosts")."""
    TAG: ClassVar[str] = "seed"
    TUPLE_FIELDS: ClassVar[tuple[str, ...]] = ("vhosts", "users", "permissions")
    vhosts: tuple[str, ...]
    users: tuple[tuple[str, str, tuple[str, ...]], ...]        # (name, password_hash, tags)
    permissions: tuple[tuple[str, str, str, str, str], ...]    # (user, vhost, configure, write, read)


@dataclass(frozen=True, slots=True)
class AddUser(_Command):
    TAG: ClassVar[str] = "user_add"
    TUPLE_FIELDS: ClassVar[tuple[str, ...]] = ("tags",)
    name: str
    password_hash: str
    tags: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DeleteUser(_Command):
    TAG: ClassVar[str] = "user_del"
    name: str


@dataclass(frozen=True, slots=True)
class ChangePassword(_Command):
    TAG: ClassVar[str] = "user_pw"
    name: str
    password_hash: str


@dataclass(frozen=True, slots=True)
class SetUserTags(_Command):
    TAG: ClassVar[str] = "user_tags"
    TUPLE_FIELDS: ClassVar[tuple[str, ...]] = ("tags",)
    name: str
    tags: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AddVhost(_Command):
    TAG: ClassVar[str] = "vhost_add"
    name: str


@dataclass(frozen=True, slots=True)
class DeleteVhost(_Command):
    TAG: ClassVar[str] = "vhost_del"
    name: str


@dataclass(frozen=True, slots=True)
class SetPermissions(_Command):
    TAG: ClassVar[str] = "perm_set"
    user: str
    vhost: str
    configure: str
    write: str
    read: str


@dataclass(frozen=True, slots=True)
class ClearPermissions(_Command):
    TAG: ClassVar[str] = "perm_clear"
    user: str
    vhost: str


Command = (DeclareQueue | DeleteQueue | DeclareExchange | DeleteExchange | Bind | Unbind | ForgetEnd | SetMembers
           | ReleaseReplica | NoteLeaving | TransferLeaders | Sync | AddUser | DeleteUser | ChangePassword
           | SetUserTags | AddVhost | DeleteVhost | SetPermissions | ClearPermissions | SeedDefinitions)
# what the log may hold (ForgetEnd never is: a node's own machine only)
COMMANDS: dict[str, type] = {cls.TAG: cls for cls in Command.__args__ if cls is not ForgetEnd}


class BadCommand(ValueError):
    """Log data that is not a metadata command (unknown tag, wrong arity)."""


def to_wire(command: Command) -> list:
    """The command as its log list: [TAG, *fields], tuples as lists; trailing
    fields added later are left out while they hold their default, so a
    command keeps the shape older nodes read."""
    values = list(astuple(command))
    declared = fields(command)
    while values and declared[len(values) - 1].default is not MISSING \
            and values[-1] == declared[len(values) - 1].default:
        values.pop()
    return [command.TAG, *(_lists(value) for value in values)]


def _lists(value: Any) -> Any:
    return [_lists(item) for item in value] if isinstance(value, tuple) else value


def from_wire(raw: Any) -> Command:
    if not isinstance(raw, (list, tuple)) or not raw or not isinstance(raw[0], str):
        raise BadCommand(f"not a metadata command: {raw!r:.200}")
    cls = COMMANDS.get(raw[0])
    if cls is None:
        raise BadCommand(f"unknown metadata command {raw[0]!r}")
    declared = fields(cls)
    required = sum(1 for field in declared if field.default is MISSING)
    if not required <= len(raw) - 1 <= len(declared):   # a field added later has a default
        raise BadCommand(f"metadata command {raw[0]!r} with {len(raw) - 1} fields, not {len(declared)}")
    return cls(*raw[1:])


def encode(command: Command) -> bytes:
    return msgpack.packb(to_wire(command), use_bin_type=True, default=str)


def decode(data: bytes) -> Command:
    return from_wire(msgpack.unpackb(data, raw=False, strict_map_key=False))
