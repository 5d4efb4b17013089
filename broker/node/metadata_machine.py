"""The metadata Raft group's machine: `apply(meta, command, state) -> (state, reply, effects)`.

Theory of operation. Every node applies the group's committed commands
(broker/node/metadata_commands.py) in log order to its own `MetaState`
(broker/node/metadata_state.py), so every node holds the same state; the machine
only decides. What the change means for the node (its `VirtualHost` read
model, Raft groups to host or drop, a first leader's campaign, connections
to close, the membership reconciler's follow-up) comes back as effect
records (broker/node/metadata_effects.py) that every node's shell performs. The
reply is what the asking channel or warrenctl gets, with RabbitMQ's codes and
texts: a queue, exchange or binding error is [reply_code, reply_text,
class_id, method_id]; a users/vhosts/permissions change answers {"ok": true}
or {"error": text, "status": http status}; a membership change the new
members or such an error; a queue deletion `MessageCountOfDeletedQueue`,
which the shell answers with the count (the queue's own group holds the
messages, not this machine).

`meta` carries what the entry itself does not: its log index (a new queue's
group id is `q:<vhost>:<name>:<index>`, unique when a name is reused, and the
`balanced` leader locator picks by it), the cluster's nodes (a membership
change must name one), and whether this is a node's own machine: exclusive
and transient objects go through the same commands and checks, applied
locally to the node's own state (broker/node/local_topology.py), where a
queue is one without a log (no group, no members, no first leader). The
machine reads no clock and does no I/O; it updates `state` in place and
returns it (the fold of a log is cheap that way).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from warren.broker.node import metadata_commands as mc
from warren.broker.node import metadata_effects as fx
from warren.broker.node.definition_checks import check_expression, valid_password_hash
from warren.broker.node.metadata_state import ExchangeRecord, MetaState, QueueRecord, UserRecord, VhostRecord
from warren.broker.routing.arguments import check_exchange_equivalent
from warren.broker.routing.exchanges import EXCHANGE_TYPES, Binding
from warren.protocol.constants import ACCESS_REFUSED, CONNECTION_FORCED, NOT_FOUND, PRECONDITION_FAILED
from warren.protocol.errors import ChannelError


@dataclass(frozen=True, slots=True)
class Meta:
    index: int
    nodes: tuple[str, ...] = ()
    local: bool = False   # applied by a node's own machine (broker/node/local_topology.py), not from the log


@dataclass(frozen=True, slots=True)
class MessageCountOfDeletedQueue:
    """A queue deletion's reply: the shell answers its message count."""
    group: str


class Refused(Exception):
    """A change the machine refuses: an HTTP status and rabbitmqctl's words."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text

    def reply(self) -> dict:
        return {"error": self.text, "status": self.status}


OK = {"ok": True}


def apply(meta: Meta, command: mc.Command, state: MetaState) -> tuple[MetaState, object, list]:
    match command:
        case mc.DeclareQueue():
            reply, effects = _declare_queue(meta, command, state)
        case mc.DeleteQueue():
            reply, effects = _delete_queue(command, state)
        case mc.DeclareExchange():
            reply, effects = _declare_exchange(command, state)
        case mc.DeleteExchange():
            reply, effects = _delete_exchange(command, state)
        case mc.Bind():
            reply, effects = _bind(command, state)
        case mc.Unbind():
            reply, effects = _unbind(command, state)
        case mc.ForgetEnd():
            reply, effects = None, _forget_end(command, state)
        case mc.SetMembers():
            reply, effects = _set_members(meta, command, state)
        case mc.ReleaseReplica():
            reply, effects = _release_replica(command, state)
        case mc.NoteLeaving():
            reply, effects = _note_leaving(command, state)
        case mc.TransferLeaders():
            reply, effects = None, [fx.TransferLeadership(command.moves)]
        case mc.Sync():
            reply, effects = None, []
        case mc.AddUser():
            reply, effects = _add_user(command, state)
        case mc.ChangePassword():
            reply, effects = _change_password(command, state)
        case mc.SetUserTags():
            reply, effects = _set_user_tags(command, state)
        case mc.DeleteUser():
            reply, effects = _delete_user(command, state)
        case mc.AddVhost():
            reply, effects = _add_vhost(command, state)
        case mc.DeleteVhost():
            reply, effects = _delete_vhost(command, state)
        case mc.SetPermissions():
            reply, effects = _set_permissions(command, state)
        case mc.ClearPermissions():
            reply, effects = _clear_permissions(command, state)
        case mc.SeedDefinitions():
            reply, effects = _seed(command, state)
        case _:
            raise AssertionError(f"not a metadata command: {command!r}")
    return state, reply, effects


def error_reply(error: ChannelError) -> list:
    return [error.reply_code, error.text, error.class_id, error.method_id]


# -- queues ----------------------------------------------------------------------------------
def first_leader(arguments: dict, members: tuple[str, ...], origin: str, index: int) -> str:
    """x-queue-leader-locator: client-local (the default) is the declaring node; balanced picks by index."""
    if arguments.get("x-queue-leader-locator", "client-local") == "client-local" and origin in members:
        return origin
    return members[index % len(members)]


def _declare_queue(meta: Meta, command: mc.DeclareQueue, state: MetaState) -> tuple[object, list]:
    vhost = state.vhosts.get(command.vhost)
    if vhost is None or command.name in vhost.queues or not (command.members or meta.local):
        return None, []   # declared already (a resend), or its vhost is gone
    if meta.local:
        vhost.queues[command.name] = QueueRecord(dict(command.arguments), "", [], command.auto_delete,
                                                 durable=command.durable, exclusive_owner=command.exclusive_owner)
        return None, [fx.QueueDeclared(command.vhost, command.name, command.arguments, "", (), command.auto_delete,
                                       durable=command.durable, exclusive_owner=command.exclusive_owner)]
    group = f"q:{command.vhost}:{command.name}:{meta.index}"
    vhost.queues[command.name] = QueueRecord(dict(command.arguments), group, list(command.members),
                                             command.auto_delete)
    leader = first_leader(command.arguments, command.members, command.origin, meta.index)
    return None, [fx.QueueDeclared(command.vhost, command.name, command.arguments, group, command.members,
                                   command.auto_delete),
                  fx.Campaign(group, leader)]


def _delete_queue(command: mc.DeleteQueue, state: MetaState) -> tuple[object, list]:
    queue = state.queue(command.vhost, command.name)
    if queue is None:
        return None, []   # as RabbitMQ 3.x: deleting a missing queue succeeds
    return MessageCountOfDeletedQueue(queue.group), _remove_queue(state, command.vhost, command.name)


def _remove_queue(state: MetaState, vhost_name: str, name: str) -> list:
    vhost = state.vhosts[vhost_name]
    queue = vhost.queues.pop(name)
    state.leaving.pop(queue.group, None)
    effects: list = [fx.QueueDeleted(vhost_name, name, queue.group)]
    return effects + _remove_bindings_to(vhost_name, vhost, ("queue", name))


def _remove_bindings_to(vhost_name: str, vhost: VhostRecord, destination: tuple[str, str]) -> list:
    """Drop the bindings to `destination`; an auto-delete source left without any goes too."""
    removed = vhost.bindings_to(destination)
    vhost.bindings.difference_update(removed)
    effects: list = []
    for source in sorted({binding.source for binding in removed}):
        effects += _auto_delete(vhost_name, vhost, source)
    return effects


def _auto_delete(vhost_name: str, vhost: VhostRecord, source: str) -> list:
    exchange = vhost.exchanges.get(source)
    if exchange is None or not exchange.auto_delete or vhost.has_bindings_from(source):
        return []
    return _remove_exchange(vhost_name, vhost, source)


# -- exchanges -------------------------------------------------------------------------------
def _declare_exchange(command: mc.DeclareExchange, state: MetaState) -> tuple[object, list]:
    vhost = state.vhosts.get(command.vhost)
    if vhost is None:
        return None, []
    try:
        _check_exchange_declare(command, vhost)
    except ChannelError as error:
        return error_reply(error), []
    if command.name in vhost.exchanges:
        return None, []
    vhost.exchanges[command.name] = ExchangeRecord(command.type, command.auto_delete, command.internal,
                                                   dict(command.arguments), command.durable)
    return None, [fx.ExchangeDeclared(command.vhost, command.name, command.type, command.auto_delete,
                                      command.internal, command.arguments, command.durable)]


def _check_exchange_declare(command: mc.DeclareExchange, vhost: VhostRecord) -> None:
    """VirtualHost.declare_exchange's checks, in its order, with RabbitMQ's texts."""
    name, where = command.name, f"in vhost '{command.vhost}'"
    if command.type not in EXCHANGE_TYPES:
        raise ChannelError(PRECONDITION_FAILED, f"unknown exchange type '{command.type}'", 40, 10)
    if name == "":
        raise ChannelError(ACCESS_REFUSED, "operation not permitted on the default exchange", 40, 10)
    existing = vhost.exchanges.get(name)
    if existing is None:
        if name.startswith("amq."):
            raise ChannelError(ACCESS_REFUSED, f"exchange name '{name}' contains reserved prefix 'amq.*'", 40, 10)
        return
    for field, received, current in (("type", command.type, existing.type),
                                     ("durable", command.durable, existing.durable),
                                     ("auto_delete", command.auto_delete, existing.auto_delete),
                                     ("internal", command.internal, existing.internal)):
        if received != current:
            raise ChannelError(
                PRECONDITION_FAILED, f"inequivalent arg '{field}' for exchange '{name}' {where}: "
                f"received '{_erl(received)}' but current is '{_erl(current)}'", 40, 10)
    check_exchange_equivalent(existing.arguments, command.arguments, name, command.vhost)


def _delete_exchange(command: mc.DeleteExchange, state: MetaState) -> tuple[object, list]:
    vhost = state.vhosts.get(command.vhost)
    if vhost is None:
        return None, []
    name = command.name
    if name == "" or name.startswith("amq."):
        text = ("operation not permitted on the default exchange" if name == ""
                else f"deletion of system exchange '{name}' in vhost '{command.vhost}' not allowed")
        return error_reply(ChannelError(ACCESS_REFUSED, text, 40, 20)), []
    if name not in vhost.exchanges:
        return None, []   # deleting what does not exist succeeds, as in RabbitMQ 3.x
    if command.if_unused and vhost.has_bindings_from(name):   # as RabbitMQ: bindings with it as source
        return error_reply(ChannelError(PRECONDITION_FAILED, f"exchange '{name}' in vhost '{command.vhost}' in use",
                                        40, 20)), []
    return None, _remove_exchange(command.vhost, vhost, name)


def _remove_exchange(vhost_name: str, vhost: VhostRecord, name: str) -> list:
    durable = vhost.exchanges[name].durable
    del vhost.exchanges[name]
    vhost.bindings.difference_update(vhost.bindings_from(name))
    return [fx.ExchangeDeleted(vhost_name, name, durable)] + _remove_bindings_to(vhost_name, vhost, ("exchange", name))


def _forget_end(command: mc.ForgetEnd, state: MetaState) -> list:
    vhost = state.vhosts.get(command.vhost)
    if vhost is None:
        return []
    if command.kind == "exchange":
        vhost.bindings.difference_update(vhost.bindings_from(command.name))
    return _remove_bindings_to(command.vhost, vhost, (command.kind, command.name))


# -- bindings --------------------------------------------------------------------------------
def _bind(command: mc.Bind, state: MetaState) -> tuple[object, list]:
    vhost = state.vhosts.get(command.vhost)
    if vhost is None:
        return None, []
    try:
        _check_binding_ends(command, vhost)
    except ChannelError as error:
        return error_reply(error), []
    binding = _binding(command)
    if binding in vhost.bindings:
        return None, []
    vhost.bindings.add(binding)
    return None, [_binding_changed(command, True)]


def _check_binding_ends(command: mc.Bind, vhost: VhostRecord) -> None:
    """VirtualHost.bind's checks: the source, then the destination."""
    class_id, method_id, where = command.class_id, command.method_id, f"in vhost '{command.vhost}'"
    for kind, name in (("exchange", command.source), (command.destination_kind, command.destination)):
        if kind == "queue":
            if name not in vhost.queues:
                raise ChannelError(NOT_FOUND, f"no queue '{name}' {where}", class_id, method_id)
            continue
        if name == "":
            raise ChannelError(ACCESS_REFUSED, "operation not permitted on the default exchange", class_id, method_id)
        if name not in vhost.exchanges:
            raise ChannelError(NOT_FOUND, f"no exchange '{name}' {where}", class_id, method_id)


def _unbind(command: mc.Unbind, state: MetaState) -> tuple[object, list]:
    vhost = state.vhosts.get(command.vhost)
    if vhost is None:
        return None, []
    if command.source == "":
        return error_reply(ChannelError(ACCESS_REFUSED, "operation not permitted on the default exchange",
                                        command.class_id, command.method_id)), []
    binding = _binding(command)
    if binding not in vhost.bindings:
        return None, []   # as RabbitMQ: unbinding what is already gone succeeds
    vhost.bindings.discard(binding)
    return None, [_binding_changed(command, False)] + _auto_delete(command.vhost, vhost, command.source)


def _binding(command: mc.Bind | mc.Unbind) -> Binding:
    return Binding.make(command.source, (command.destination_kind, command.destination), command.routing_key,
                        command.arguments)


def _binding_changed(command: mc.Bind | mc.Unbind, bound: bool) -> fx.BindingChanged:
    return fx.BindingChanged(command.vhost, command.source, command.destination_kind, command.destination,
                             command.routing_key, command.arguments, bound)


# -- quorum queue membership -------------------------------------------------------------------
def members_after(state: MetaState, vhost: str, name: str, op: str, node: str,
                  nodes: tuple[str, ...]) -> tuple[QueueRecord, list[str]]:
    """The queue and its members after `op` ("add" | "remove") of `node`, or
    Refused. Checked where asked and again where applied."""
    if vhost not in state.vhosts:
        raise Refused(404, f"vhost '{vhost}' not found")
    queue = state.queue(vhost, name)
    where = f"queue '{name}' in vhost '{vhost}'"
    if queue is None:
        raise Refused(404, f"{where} not found")
    if queue.queue_type != "quorum":
        raise Refused(400, f"{where} is not a quorum queue")
    if node not in nodes:
        raise Refused(400, f"node '{node}' is not a cluster node (cluster_nodes: {', '.join(nodes)})")
    members = list(queue.members)
    if op == "add":
        if node in members:
            raise Refused(400, f"node '{node}' is already a member of {where}")
        return queue, members + [node]
    if op == "remove":
        if node not in members:
            raise Refused(400, f"node '{node}' is not a member of {where}")
        if len(members) == 1:
            raise Refused(400, f"node '{node}' is the last member of {where}; delete the queue instead")
        return queue, [member for member in members if member != node]
    raise Refused(400, f"unknown membership operation '{op}'")


def _set_members(meta: Meta, command: mc.SetMembers, state: MetaState) -> tuple[object, list]:
    queue = state.queue(command.vhost, command.name)
    if queue is not None and sorted(queue.members) == sorted(command.members):
        # Applied already: the command was sent again, or a crash lost what followed it.
        return {"members": list(queue.members)}, [
            fx.HostIfMember(command.vhost, command.name, queue.group, None, tuple(queue.member_ids()))]
    try:
        queue, members = members_after(state, command.vhost, command.name, command.op, command.node, meta.nodes)
    except Refused as refused:
        return refused.reply(), []
    before = tuple(queue.member_ids())
    queue.members = members
    leaving = state.leaving.setdefault(queue.group, set())
    # `joined` keeps a node's epoch after it leaves: added again before its
    # replica was released, it is the same voter with the same id.
    if command.op == "add":
        if command.node not in leaving:
            # Its replica (if it had one) was released: it is made anew, as a new voter
            # (raft/member_ids.py). Not released yet: the replica it still holds stays.
            queue.joined[command.node] = meta.index
        leaving.discard(command.node)
    else:
        leaving.add(command.node)   # it keeps its replica (and id) until its removal has committed
    if not leaving:
        del state.leaving[queue.group]
    return {"members": list(members)}, [
        fx.MembersChanged(command.vhost, command.name, queue.group, tuple(members), command.op, command.node),
        fx.HostIfMember(command.vhost, command.name, queue.group, before, tuple(queue.member_ids()))]


def _queue_of_group(state: MetaState, vhost: str, name: str, group: str) -> QueueRecord | None:
    queue = state.queue(vhost, name)
    return queue if queue is not None and queue.group == group else None


def _release_replica(command: mc.ReleaseReplica, state: MetaState) -> tuple[object, list]:
    if _queue_of_group(state, command.vhost, command.name, command.group) is None:
        return None, []
    leaving = state.leaving.get(command.group)
    if leaving is not None:
        leaving.discard(command.node)
        if not leaving:
            del state.leaving[command.group]
    return None, [fx.ReplicaReleased(command.vhost, command.name, command.group, command.node)]


def _note_leaving(command: mc.NoteLeaving, state: MetaState) -> tuple[object, list]:
    queue = _queue_of_group(state, command.vhost, command.name, command.group)
    if queue is None or command.node in queue.members:
        return None, []
    state.leaving.setdefault(command.group, set()).add(command.node)
    return None, [fx.LeavingNoted(command.group, command.node)]


# -- users, vhosts, permissions ----------------------------------------------------------------
def check_definitions_change(state: MetaState, command: mc.Command) -> None:
    """Refused (rabbitmqctl's words) if `command` cannot be applied to `state`:
    where asked, at once, and again on every node where applied."""
    match command:
        case mc.AddUser(name=name, password_hash=password_hash):
            if name in state.users:
                raise Refused(400, f'User "{name}" already exists')
            _check_password_hash(password_hash)
        case mc.ChangePassword(name=name, password_hash=password_hash):
            _check_user(state, name)
            _check_password_hash(password_hash)
        case mc.DeleteUser(name=name) | mc.SetUserTags(name=name):
            _check_user(state, name)
        case mc.AddVhost(name=name):
            if name in state.vhosts:
                raise Refused(400, f'Virtual host "{name}" already exists')
        case mc.DeleteVhost(name=name):
            _check_vhost(state, name)
        case mc.SetPermissions() | mc.ClearPermissions():
            _check_user(state, command.user)
            _check_vhost(state, command.vhost)
            expressions = ((command.configure, command.write, command.read)
                           if isinstance(command, mc.SetPermissions) else ())
            for expression in expressions:
                error = check_expression(expression)
                if error is not None:
                    raise Refused(400, f"invalid regular expression '{expression}': {error}")
        case _:
            raise AssertionError(f"not a definitions command: {command!r}")


def _check_user(state: MetaState, name: str) -> None:
    if name not in state.users:
        raise Refused(404, f'User "{name}" does not exist')


def _check_vhost(state: MetaState, name: str) -> None:
    if name not in state.vhosts:
        raise Refused(404, f'Virtual host "{name}" does not exist')


def _check_password_hash(password_hash: str) -> None:
    if not valid_password_hash(password_hash):
        raise Refused(400, "the password hash is not a base64 salted SHA-256 hash")


def _checked(handler: Callable[[Any, MetaState], list]) -> Callable[[Any, MetaState], tuple[object, list]]:
    """A users/vhosts/permissions handler: checked first (the same check as where asked), answered {"ok": true}."""
    def apply_checked(command: Any, state: MetaState) -> tuple[object, list]:
        try:
            check_definitions_change(state, command)
        except Refused as refused:
            return refused.reply(), []
        return OK, handler(command, state)
    return apply_checked


@_checked
def _add_user(command: mc.AddUser, state: MetaState) -> list:
    return _set_user(state, command.name, command.password_hash, command.tags, "added")


@_checked
def _change_password(command: mc.ChangePassword, state: MetaState) -> list:
    return _set_user(state, command.name, command.password_hash, state.users[command.name].tags, "password_changed")


@_checked
def _set_user_tags(command: mc.SetUserTags, state: MetaState) -> list:
    return _set_user(state, command.name, state.users[command.name].password_hash, command.tags, "tags_set")


def _set_user(state: MetaState, name: str, password_hash: str, tags: tuple[str, ...], change: str) -> list:
    state.users[name] = UserRecord(password_hash, tuple(tags))
    return [fx.UserSet(name, password_hash, tuple(tags), change)]


@_checked
def _delete_user(command: mc.DeleteUser, state: MetaState) -> list:
    name = command.name
    del state.users[name]
    for key in [key for key in state.permissions if key[0] == name]:
        del state.permissions[key]
    return [fx.UserDeleted(name),
            fx.CloseConnections(CONNECTION_FORCED, f"CONNECTION_FORCED - user '{name}' is deleted", user=name)]


@_checked
def _add_vhost(command: mc.AddVhost, state: MetaState) -> list:
    state.vhosts[command.name] = VhostRecord.fresh()
    return [fx.VhostAdded(command.name)]


@_checked
def _delete_vhost(command: mc.DeleteVhost, state: MetaState) -> list:
    """As RabbitMQ: its connections close with 320, its queues go (a replicated
    one as queue.delete: every node drops its replica), then the vhost."""
    name = command.name
    effects: list = [fx.CloseConnections(CONNECTION_FORCED, f"CONNECTION_FORCED - vhost '{name}' is deleted",
                                         vhost=name)]
    for queue_name in sorted(state.vhosts[name].queues):
        effects += _remove_queue(state, name, queue_name)
    del state.vhosts[name]
    for key in [key for key in state.permissions if key[1] == name]:
        del state.permissions[key]
    return effects + [fx.VhostDeleted(name)]


@_checked
def _set_permissions(command: mc.SetPermissions, state: MetaState) -> list:
    state.permissions[(command.user, command.vhost)] = (command.configure, command.write, command.read)
    return [fx.PermissionSet(command.user, command.vhost, command.configure, command.write, command.read)]


@_checked
def _clear_permissions(command: mc.ClearPermissions, state: MetaState) -> list:
    state.permissions.pop((command.user, command.vhost), None)
    return [fx.PermissionCleared(command.user, command.vhost)]


def _erl(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _seed(command: mc.SeedDefinitions, state: MetaState) -> tuple[object, list]:
    """The config's definitions, on a log that has none yet; later seeds (another
    node's first entry on its own empty log) change nothing."""
    if state.seeded:
        return None, []
    state.seeded = True
    effects: list = []
    for name in command.vhosts:
        if name not in state.vhosts:
            state.vhosts[name] = VhostRecord.fresh()
            effects.append(fx.VhostAdded(name))
    for name, password_hash, tags in command.users:
        effects += _set_user(state, name, password_hash, tags, "added")
    for user, vhost, configure, write, read in command.permissions:
        if user in state.users and vhost in state.vhosts:
            state.permissions[(user, vhost)] = (configure, write, read)
            effects.append(fx.PermissionSet(user, vhost, configure, write, read))
    return OK, effects
