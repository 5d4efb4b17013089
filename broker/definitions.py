"""Users, vhosts and permissions as metadata-group commands (RabbitMQ's definitions).

Theory of operation. warrenctl's add_user, delete_user, change_password,
set_user_tags, add_vhost, delete_vhost, set_permissions and
clear_permissions (broker/management.py) check the change against this
node's state, so that a mistake gets rabbitmqctl's words at once, then submit
it to the metadata Raft group (broker/metadata.py); every node checks it
again and applies it in log order, so every node of the cluster ends with the
same users, vhosts and permissions. Each node journals what it applied in its
metadata log (broker/durability.py) before the group's index, so a restart
replays it and re-applies only later entries.

Commands (a password travels only as its salted hash, made by the asking node):
["user_add", name, password_hash, tags], ["user_del", name],
["user_pw", name, password_hash], ["user_tags", name, tags],
["vhost_add", name], ["vhost_del", name],
["perm_set", user, vhost, configure, write, read], ["perm_clear", user, vhost].
An apply answers {"ok": true} or {"error": text, "status": http status}.

delete_vhost closes the vhost's connections on every node (320
CONNECTION_FORCED "vhost '<v>' is deleted", as RabbitMQ), deletes its queues
(a replicated one as queue.delete does: every node drops its replica) and
its exchanges; delete_user closes the user's connections ("user '<u>' is
deleted"). Changed permissions apply to channels opened afterwards (a channel
caches what it checked, as RabbitMQ's does).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from broker.auth import Permission, UserRecord, check_expression, valid_password_hash
from broker.metadata import ChangeRefused
from broker.quorum import QuorumQueue

if TYPE_CHECKING:
    from broker.broker import Broker
    from broker.metadata import Metadata

log = structlog.get_logger("warren.definitions")


class DefinitionError(ChangeRefused):
    """A user, vhost or permission change that cannot be made (rabbitmqctl's words)."""


def no_such_user(name: str) -> DefinitionError:
    return DefinitionError(404, f'User "{name}" does not exist')


def no_such_vhost(name: str) -> DefinitionError:
    return DefinitionError(404, f'Virtual host "{name}" does not exist')


class Definitions:
    def __init__(self, broker: "Broker", metadata: "Metadata") -> None:
        self.broker = broker
        self.metadata = metadata
        handlers: dict[str, Callable[[list], None]] = {
            "user_add": self._user_add, "user_del": self._user_del, "user_pw": self._user_pw,
            "user_tags": self._user_tags, "vhost_add": self._vhost_add, "vhost_del": self._vhost_del,
            "perm_set": self._perm_set, "perm_clear": self._perm_clear,
        }
        metadata.cluster.meta_handlers.update(
            {kind: metadata.answering_index(self._applying(handler)) for kind, handler in handlers.items()})

    # -- checks: where asked, and again on every node where applied -----------------
    def check(self, command: list) -> None:
        """Raise DefinitionError if `command` cannot be applied to this node's state."""
        access = self.broker.access
        kind = command[0]
        if kind == "user_add":
            if command[1] in access.users:
                raise DefinitionError(400, f'User "{command[1]}" already exists')
            if not valid_password_hash(command[2]):
                raise DefinitionError(400, "the password hash is not a base64 salted SHA-256 hash")
            return
        if kind in ("user_del", "user_pw", "user_tags"):
            if command[1] not in access.users:
                raise no_such_user(command[1])
            if kind == "user_pw" and not valid_password_hash(command[2]):
                raise DefinitionError(400, "the password hash is not a base64 salted SHA-256 hash")
            return
        if kind == "vhost_add":
            if command[1] in self.broker.vhosts:
                raise DefinitionError(400, f'Virtual host "{command[1]}" already exists')
            return
        if kind == "vhost_del":
            if command[1] not in self.broker.vhosts:
                raise no_such_vhost(command[1])
            return
        if kind in ("perm_set", "perm_clear"):
            user, vhost = command[1], command[2]
            if user not in access.users:
                raise no_such_user(user)
            if vhost not in self.broker.vhosts:
                raise no_such_vhost(vhost)
            for expression in command[3:]:
                error = check_expression(expression)
                if error is not None:
                    raise DefinitionError(400, f"invalid regular expression '{expression}': {error}")
            return
        raise AssertionError(f"unknown definitions command {kind!r}")

    def _applying(self, handler: Callable[[list], None]) -> Callable[[list, int], Any]:
        def apply(command: list, index: int) -> Any:
            try:
                self.check(command)
            except DefinitionError as error:
                return error.reply()
            handler(command)
            return {"ok": True}
        return apply

    # -- applied on every node --------------------------------------------------------
    def _journal(self, entry: list) -> None:
        self.broker.durability.definitions_changed(entry)

    def _user_add(self, command: list) -> None:
        _, name, password_hash, tags = command
        self.broker.access.put_user(UserRecord(name, password_hash, tuple(tags)))
        self._journal(["user", name, password_hash, list(tags)])
        log.info("definitions.user_added", user=name)

    def _user_pw(self, command: list) -> None:
        _, name, password_hash = command
        user = self.broker.access.users[name]
        self.broker.access.put_user(UserRecord(name, password_hash, user.tags))
        self._journal(["user", name, password_hash, list(user.tags)])
        log.info("definitions.password_changed", user=name)

    def _user_tags(self, command: list) -> None:
        _, name, tags = command
        user = self.broker.access.users[name]
        self.broker.access.put_user(UserRecord(name, user.password_hash, tuple(tags)))
        self._journal(["user", name, user.password_hash, list(tags)])
        log.info("definitions.user_tags_set", user=name, tags=list(tags))

    def _user_del(self, command: list) -> None:
        name = command[1]
        self.broker.access.delete_user(name)
        self._journal(["user_deleted", name])
        closed = self.broker.close_connections(lambda c: c.user_name == name,
                                               f"CONNECTION_FORCED - user '{name}' is deleted")
        log.info("definitions.user_deleted", user=name, connections_closed=closed)

    def _vhost_add(self, command: list) -> None:
        name = command[1]
        self.broker.add_vhost(name)
        self._journal(["vhost", name])
        log.info("definitions.vhost_added", vhost=name)

    def _vhost_del(self, command: list) -> None:
        name = command[1]
        broker = self.broker
        vhost = broker.vhosts[name]
        closed = broker.close_connections(lambda c: c.vhost is vhost, f"CONNECTION_FORCED - vhost '{name}' is deleted")
        queues = 0
        for queue in list(vhost.queues.values()):
            if isinstance(queue, QuorumQueue):
                self.metadata.drop_queue(vhost, queue)
            else:
                vhost.delete_queue_now(queue)
            queues += 1
        broker.remove_vhost(name)
        self._journal(["vhost_deleted", name])
        log.info("definitions.vhost_deleted", vhost=name, connections_closed=closed, queues_deleted=queues)

    def _perm_set(self, command: list) -> None:
        _, user, vhost, configure, write, read = command
        self.broker.access.set_permission(user, vhost, Permission(configure, write, read))
        self._journal(["permission", user, vhost, configure, write, read])
        log.info("definitions.permissions_set", user=user, vhost=vhost,
                 configure=configure, write=write, read=read)

    def _perm_clear(self, command: list) -> None:
        _, user, vhost = command
        self.broker.access.clear_permission(user, vhost)
        self._journal(["permission_cleared", user, vhost])
        log.info("definitions.permissions_cleared", user=user, vhost=vhost)
