"""Checks on users' and permissions' data that the metadata machine makes too.

Pure (no I/O, no clock): the metadata machine (broker/node/metadata_machine.py)
checks a change with these on every node, so they cannot live in
broker/admin/auth.py, which reads the config.
"""
from __future__ import annotations

import base64
import hashlib
import re

SALT_BYTES = 4


def valid_password_hash(password_hash: str) -> bool:
    """RabbitMQ's rabbit_password_hashing_sha256 shape: base64(salt(4) | sha256)."""
    try:
        return len(base64.b64decode(password_hash, validate=True)) == SALT_BYTES + hashlib.sha256().digest_size
    except (ValueError, TypeError):
        return False


def check_expression(expression: str) -> str | None:
    """None if `expression` compiles, else the error's text."""
    try:
        re.compile(expression or "^$")
    except re.error as error:
        return str(error)
    return None
