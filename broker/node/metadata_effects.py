"""What the metadata machine asks every node's shell to do: plain records.

The machine decides the same on every node; an effect therefore never says
"this node": it names nodes, and each node's shell (broker/node/metadata.py,
broker/routing/metadata_read_model.py, broker/admin/definitions.py) compares them with
itself. Effects come in the order they must be performed.

Read model (each node's `VirtualHost` objects and its `AccessControl`):
ExchangeDeclared, ExchangeDeleted, BindingChanged, QueueDeclared,
QueueDeleted, VhostAdded, VhostDeleted, UserSet, UserDeleted, PermissionSet,
PermissionCleared. Raft groups and connections: QueueDeclared (host the
group where a member), Campaign, QueueDeleted (drop the replica, cancel
consumers), MembersChanged / HostIfMember / ReplicaReleased / LeavingNoted
(the membership reconciler's inputs), TransferLeadership, CloseConnections.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ExchangeDeclared:
    vhost: str
    name: str
    type: str
    auto_delete: bool
    internal: bool
    arguments: dict
    durable: bool = True


@dataclass(frozen=True, slots=True)
class ExchangeDeleted:
    """Also for an auto-delete exchange that lost its last binding. `durable`: which
    one (a node's own transient exchange may hide a durable one of the same name)."""
    vhost: str
    name: str
    durable: bool = True


@dataclass(frozen=True, slots=True)
class BindingChanged:
    vhost: str
    source: str
    destination_kind: str
    destination: str
    routing_key: str
    arguments: dict
    bound: bool


@dataclass(frozen=True, slots=True)
class QueueDeclared:
    """Every node knows the queue (it routes to it); its members host the group.
    `member_ids` (raft/member_ids.py): the members' replica ids, when some
    joined later (a node that learns the queue from a snapshot); () for the
    members themselves."""
    vhost: str
    name: str
    arguments: dict
    group: str
    members: tuple[str, ...]
    auto_delete: bool = False
    member_ids: tuple[str, ...] = ()
    durable: bool = True   # False, or an owner: a node's own queue (group "", no members)
    exclusive_owner: object = None


@dataclass(frozen=True, slots=True)
class Campaign:
    """`node` campaigns as the group's first leader (the queue's leader locator chose it)."""
    group: str
    node: str


@dataclass(frozen=True, slots=True)
class QueueDeleted:
    """Every node forgets the queue (its consumers are cancelled); its members drop the replica."""
    vhost: str
    name: str
    group: str


@dataclass(frozen=True, slots=True)
class MembersChanged:
    """The queue's wanted members; the group's leader reconciles its configuration with them."""
    vhost: str
    name: str
    group: str
    members: tuple[str, ...]
    op: str
    node: str


@dataclass(frozen=True, slots=True)
class HostIfMember:
    """A member that does not host the group joins it, as its id among
    `member_ids` (raft/member_ids.py), with an empty log whose voters are
    `voters_before` (member ids; None: the other members, for a change
    applied again). A replica hosted under another id is an older one."""
    vhost: str
    name: str
    group: str
    voters_before: tuple[str, ...] | None
    member_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ReplicaReleased:
    """`node` (no longer a member, no longer in the committed configuration) drops its replica."""
    vhost: str
    name: str
    group: str
    node: str


@dataclass(frozen=True, slots=True)
class LeavingNoted:
    group: str
    node: str


@dataclass(frozen=True, slots=True)
class TransferLeadership:
    """The node leading each group hands leadership to `to` (best effort)."""
    moves: tuple[tuple[str, str, str, str], ...]   # (vhost, name, group, to)


@dataclass(frozen=True, slots=True)
class CloseConnections:
    """Close the connections to `vhost` or of `user` (one of them is set)."""
    reply_code: int
    reply_text: str
    vhost: str | None = None
    user: str | None = None


@dataclass(frozen=True, slots=True)
class VhostAdded:
    name: str


@dataclass(frozen=True, slots=True)
class VhostDeleted:
    """After its queues' QueueDeleted: the node drops what is left (its local queues) and the vhost."""
    name: str


@dataclass(frozen=True, slots=True)
class UserSet:
    name: str
    password_hash: str
    tags: tuple[str, ...]
    change: str   # "added" | "password_changed" | "tags_set": for the log


@dataclass(frozen=True, slots=True)
class UserDeleted:
    name: str


@dataclass(frozen=True, slots=True)
class PermissionSet:
    user: str
    vhost: str
    configure: str
    write: str
    read: str


@dataclass(frozen=True, slots=True)
class PermissionCleared:
    user: str
    vhost: str


Effect = (ExchangeDeclared | ExchangeDeleted | BindingChanged | QueueDeclared | Campaign | QueueDeleted
          | MembersChanged | HostIfMember | ReplicaReleased | LeavingNoted | TransferLeadership
          | CloseConnections | VhostAdded | VhostDeleted | UserSet | UserDeleted | PermissionSet
          | PermissionCleared)
