"""Users, vhosts and permissions through the metadata group (RabbitMQ's definitions): the shell's part.

Theory of operation. warrenctl's add_user, delete_user, change_password,
set_user_tags, add_vhost, delete_vhost, set_permissions and
clear_permissions (broker/admin/management.py) build a typed command
(broker/node/metadata_commands.py; a password travels only as its salted hash,
made by the asking node), which `check` tries against the metadata machine's
state here, so that a mistake gets rabbitmqctl's words at once; then it goes
to the metadata Raft group. Every node's machine (broker/node/metadata_machine.py)
checks it again and applies it in log order, so every node of the cluster
ends with the same users, vhosts and permissions; an apply answers {"ok":
true} or {"error": text, "status": http status}. This module performs the
machine's effects on the node: `AccessControl` (logins and permission
checks read it), the broker's vhosts, connections to close, and the node's
metadata log (broker/node/durability.py), journaled before the group's index so a
restart replays it and re-applies only later entries.

delete_vhost closes the vhost's connections on every node (320
CONNECTION_FORCED "vhost '<v>' is deleted", as RabbitMQ), deletes its queues
(a replicated one as queue.delete does: every node drops its replica; the
node's local ones here) and its exchanges; delete_user closes the user's
connections ("user '<u>' is deleted"). Changed permissions apply to channels
opened afterwards (a channel caches what it checked, as RabbitMQ's does).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from warren.broker.admin.auth import Permission, UserRecord
from warren.broker.node import metadata_commands as mc
from warren.broker.node import metadata_effects as fx
from warren.broker.node import metadata_machine as machine
from warren.broker.node.metadata import ChangeRefused

if TYPE_CHECKING:
    from warren.broker.node.broker import Broker
    from warren.broker.node.metadata import Metadata

log = structlog.get_logger("warren.definitions")


class DefinitionError(ChangeRefused):
    """A user, vhost or permission change that cannot be made (rabbitmqctl's words)."""


class Definitions:
    def __init__(self, broker: "Broker", metadata: "Metadata") -> None:
        self.broker = broker
        self.metadata = metadata

    def check(self, command: mc.Command) -> None:
        """Raise DefinitionError if `command` cannot be applied to the machine's state here."""
        try:
            machine.check_definitions_change(self.metadata.state, command)
        except machine.Refused as refused:
            raise DefinitionError(refused.status, refused.text) from None

    # -- the machine's effects, on every node ------------------------------------------
    def perform(self, effect: fx.Effect) -> None:
        match effect:
            case fx.UserSet():
                self._user_set(effect)
            case fx.UserDeleted(name=name):
                self.broker.access.delete_user(name)
                self._journal(["user_deleted", name])
                log.info("definitions.user_deleted", user=name)
            case fx.CloseConnections():
                self._close_connections(effect)
            case fx.VhostAdded(name=name):
                if name not in self.broker.vhosts:
                    self.broker.add_vhost(name)
                self._journal(["vhost", name])
                log.info("definitions.vhost_added", vhost=name)
            case fx.VhostDeleted():
                self._vhost_deleted(effect)
            case fx.PermissionSet(user=user, vhost=vhost, configure=configure, write=write, read=read):
                self.broker.access.set_permission(user, vhost, Permission(configure, write, read))
                self._journal(["permission", user, vhost, configure, write, read])
                log.info("definitions.permissions_set", user=user, vhost=vhost,
                         configure=configure, write=write, read=read)
            case fx.PermissionCleared(user=user, vhost=vhost):
                self.broker.access.clear_permission(user, vhost)
                self._journal(["permission_cleared", user, vhost])
                log.info("definitions.permissions_cleared", user=user, vhost=vhost)
            case _:
                raise AssertionError(f"not a definitions effect: {effect!r}")

    def _journal(self, entry: list) -> None:
        self.broker.durability.definitions_changed(entry)

    def _user_set(self, effect: fx.UserSet) -> None:
        self.broker.access.put_user(UserRecord(effect.name, effect.password_hash, tuple(effect.tags)))
        self._journal(["user", effect.name, effect.password_hash, list(effect.tags)])
        log.info(f"definitions.user_{effect.change}", user=effect.name, tags=list(effect.tags))

    def _close_connections(self, effect: fx.CloseConnections) -> None:
        if effect.user is not None:
            closed = self.broker.close_connections(lambda c: c.user_name == effect.user, effect.reply_text,
                                                   effect.reply_code)
        else:
            vhost = self.broker.vhosts.get(effect.vhost)
            closed = self.broker.close_connections(lambda c: vhost is not None and c.vhost is vhost,
                                                   effect.reply_text, effect.reply_code)
        log.info("definitions.connections_closed", user=effect.user, vhost=effect.vhost, closed=closed)

    def _vhost_deleted(self, effect: fx.VhostDeleted) -> None:
        """Its replicated queues went with their QueueDeleted effects; its local ones go here."""
        broker = self.broker
        vhost = broker.vhosts.get(effect.name)
        if vhost is not None:
            for queue in list(vhost.queues.values()):
                if queue.replicated:
                    self.metadata.drop_queue(vhost, queue)   # not expected: the machine deleted it first
                else:
                    vhost.delete_queue_now(queue)
        broker.remove_vhost(effect.name)
        self._journal(["vhost_deleted", effect.name])
        log.info("definitions.vhost_deleted", vhost=effect.name)
