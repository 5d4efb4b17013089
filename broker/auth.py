"""SASL PLAIN and AMQPLAIN against the configured users (RabbitMQ's rules).

Users named in ``loopback_users`` (guest by default) may only connect from a
loopback address. Passwords are compared in constant time and never logged.
"""
from __future__ import annotations

import hmac
import ipaddress
import struct

from config import Settings, User
from protocol import codec


class AuthenticationError(Exception):
    """Login refused; the message is for the log, never for the client."""


def is_loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def authenticate(settings: Settings, mechanism: str, response: str | bytes, peer_host: str) -> User:
    raw = response.encode("utf-8", "surrogateescape") if isinstance(response, str) else bytes(response)
    if mechanism == "PLAIN":
        name, password = _parse_plain(raw)
    elif mechanism == "AMQPLAIN":
        name, password = _parse_amqplain(raw)
    else:
        raise AuthenticationError(f"unknown authentication mechanism '{mechanism}'")
    user = next((u for u in settings.users if u.name == name), None)
    if user is None:
        raise AuthenticationError(f"user '{name}' - invalid credentials")
    if not hmac.compare_digest(user.password.get_secret_value().encode(), password.encode()):
        raise AuthenticationError(f"user '{name}' - invalid credentials")
    if name in settings.loopback_users and not is_loopback(peer_host):
        raise AuthenticationError(f"user '{name}' can only connect via localhost")
    return user


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
