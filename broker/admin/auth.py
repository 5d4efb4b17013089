"""Users, passwords and permissions (RabbitMQ's internal auth backend).

Theory of operation. `AccessControl` holds the node's users (name, salted
password hash, tags) and per (user, vhost) permissions: three regular
expressions, configure / write / read, matched (unanchored, as Erlang's
``re:run``) against a resource name; an empty expression matches only the
empty name ("^$"), the default exchange is checked as ``amq.default``.
The config's users (`AccessControl.from_settings`) are only the first entry
of an empty metadata log (broker/node/metadata_log.py); the state is changed only
through the metadata Raft group (broker/node/metadata.py), so every node of a
cluster holds the same users, and the group's log is their record.

Passwords are never kept or logged in clear: a user holds RabbitMQ's
``rabbit_password_hashing_sha256`` hash, base64(salt(4) | sha256(salt |
password)), compared in constant time. SASL PLAIN and AMQPLAIN are parsed
here. Users named in ``loopback_users`` (guest by default) may only connect
from a loopback address.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import os
import re
import struct
from dataclasses import dataclass

from warren.broker.node.definition_checks import SALT_BYTES, check_expression, valid_password_hash  # noqa: F401 (re-exported)
from warren.config import Settings
from warren.protocol import codec

ADMINISTRATOR = "administrator"
PERMISSIONS = ("configure", "write", "read")


class AuthenticationError(Exception):
    """Login refused; the message is for the log, never for the client."""


def hash_password(password: str, salt: bytes | None = None) -> str:
    """RabbitMQ's rabbit_password_hashing_sha256: base64(salt | sha256(salt | password))."""
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    assert len(salt) == SALT_BYTES, f"salt of {len(salt)} bytes"
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode("utf-8")).digest()).decode("ascii")


def check_password(password_hash: str, password: str) -> bool:
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except ValueError:
        return False
    if len(raw) != SALT_BYTES + hashlib.sha256().digest_size:
        return False
    salt, digest = raw[:SALT_BYTES], raw[SALT_BYTES:]
    return hmac.compare_digest(digest, hashlib.sha256(salt + password.encode("utf-8")).digest())


_UNKNOWN_USER_HASH = hash_password("", bytes(SALT_BYTES))


@dataclass(frozen=True, slots=True)
class UserRecord:
    name: str
    password_hash: str
    tags: tuple[str, ...] = ()


class Permission:
    """One user's configure / write / read expressions on one vhost."""

    __slots__ = ("configure", "write", "read", "_compiled")

    def __init__(self, configure: str, write: str, read: str) -> None:
        self.configure, self.write, self.read = configure, write, read
        # re.error here: set_permissions checks the expressions before they are submitted
        self._compiled = {kind: re.compile(expression or "^$")
                          for kind, expression in zip(PERMISSIONS, (configure, write, read))}

    def allows(self, permission: str, name: str) -> bool:
        return self._compiled[permission].search(name) is not None

    def row(self) -> list[str]:
        return [self.configure, self.write, self.read]


def refused_text(permission: str, kind: str, name: str, vhost: str, user: str) -> str:
    """RabbitMQ's rabbit_access_control text for a refused resource access."""
    if kind == "exchange" and name == "":
        name = "amq.default"
    return f"{permission} access to {kind} '{name}' in vhost '{vhost}' refused for user '{user}'"


class AccessControl:
    """The node's users and permissions (vhosts themselves are `Broker.vhosts`)."""

    def __init__(self, loopback_users: list[str]) -> None:
        self.loopback_users = set(loopback_users)
        self.users: dict[str, UserRecord] = {}
        self.permissions: dict[tuple[str, str], Permission] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> "AccessControl":
        """The config's users, their passwords hashed; ".*" ".*" ".*" on each of
        their `vhosts` that the config declares."""
        access = cls(settings.loopback_users)
        for user in settings.users:
            if user.password_hash is not None:
                password_hash = user.password_hash
            else:
                assert user.password is not None, f"user {user.name} has neither password nor hash"
                password_hash = hash_password(user.password.get_secret_value())
            access.users[user.name] = UserRecord(user.name, password_hash, tuple(user.tags))
            for vhost in user.vhosts:
                if vhost in settings.vhosts:
                    access.permissions[(user.name, vhost)] = Permission(".*", ".*", ".*")
        return access

    # -- changes (applied from the metadata group, or replayed from the log) ---
    def put_user(self, user: UserRecord) -> None:
        self.users[user.name] = user

    def delete_user(self, name: str) -> None:
        self.users.pop(name, None)
        for key in [key for key in self.permissions if key[0] == name]:
            del self.permissions[key]

    def set_permission(self, user: str, vhost: str, permission: Permission) -> None:
        self.permissions[(user, vhost)] = permission

    def clear_permission(self, user: str, vhost: str) -> None:
        self.permissions.pop((user, vhost), None)

    def delete_vhost(self, vhost: str) -> None:
        for key in [key for key in self.permissions if key[1] == vhost]:
            del self.permissions[key]

    def permission(self, user: str, vhost: str) -> Permission | None:
        return self.permissions.get((user, vhost))

    # -- login -------------------------------------------------------------------
    def login(self, name: str, password: str, peer_host: str) -> UserRecord:
        user = self.users.get(name)
        if user is None:
            # hash anyway, so that an unknown name takes as long as a wrong password
            check_password(_UNKNOWN_USER_HASH, password)
            raise AuthenticationError(f"user '{name}' - invalid credentials")
        if not check_password(user.password_hash, password):
            raise AuthenticationError(f"user '{name}' - invalid credentials")
        if name in self.loopback_users and not is_loopback(peer_host):
            raise AuthenticationError(f"user '{name}' can only connect via localhost")
        return user


def is_loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def authenticate(access: AccessControl | Settings, mechanism: str, response: str | bytes,
                 peer_host: str) -> UserRecord:
    """The user a SASL response logs in as (AuthenticationError if none).
    `access` may be a Settings: then its config users are the users."""
    if isinstance(access, Settings):
        access = AccessControl.from_settings(access)
    raw = response.encode("utf-8", "surrogateescape") if isinstance(response, str) else bytes(response)
    if mechanism == "PLAIN":
        name, password = _parse_plain(raw)
    elif mechanism == "AMQPLAIN":
        name, password = _parse_amqplain(raw)
    else:
        raise AuthenticationError(f"unknown authentication mechanism '{mechanism}'")
    return access.login(name, password, peer_host)


def _parse_plain(raw: bytes) -> tuple[str, str]:
    parts = raw.split(b"\0")
    if len(parts) != 3:
        raise AuthenticationError("malformed PLAIN response")
    return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")


def _parse_amqplain(raw: bytes) -> tuple[str, str]:
    # AMQPLAIN: a field table without its 4-byte length prefix.
    try:
        table = codec.decode_table(struct.pack(">I", len(raw)) + raw)
    except Exception:
        raise AuthenticationError("malformed AMQPLAIN response") from None
    name, password = table.get("LOGIN"), table.get("PASSWORD")
    if isinstance(name, bytes):
        name = name.decode("utf-8", "replace")
    if isinstance(password, bytes):
        password = password.decode("utf-8", "replace")
    if not isinstance(name, str) or not isinstance(password, str):
        raise AuthenticationError("AMQPLAIN response lacks LOGIN or PASSWORD")
    return name, password
