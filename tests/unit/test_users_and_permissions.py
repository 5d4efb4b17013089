"""Password hashing (RabbitMQ's rabbit_password_hashing_sha256) and permission matching."""
from __future__ import annotations

import base64
import hashlib

import pytest

from warren.broker.admin.auth import (
    AccessControl,
    AuthenticationError,
    Permission,
    UserRecord,
    authenticate,
    check_password,
    hash_password,
    refused_text,
)
from warren.config import load_settings


def test_hash_matches_rabbitmq_documented_example():
    # rabbitmq.com "Credentials and Passwords": salt 908DC60A, password "test12"
    assert hash_password("test12", bytes.fromhex("908DC60A")) == "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR"


def test_hash_is_salted_and_checks_in_both_directions():
    first, second = hash_password("s3cret"), hash_password("s3cret")
    assert first != second, "two hashes of one password should differ by their random salt"
    raw = base64.b64decode(first)
    assert len(raw) == 36 and raw[4:] == hashlib.sha256(raw[:4] + b"s3cret").digest()
    assert check_password(first, "s3cret") and check_password(second, "s3cret")
    assert not check_password(first, "s3cret ") and not check_password(first, "")
    assert check_password(hash_password("wönderland"), "wönderland")


@pytest.mark.parametrize("bad", ["", "not base64!", base64.b64encode(b"short").decode()])
def test_malformed_hash_never_matches(bad):
    assert not check_password(bad, "")


@pytest.mark.parametrize("expression, name, allowed", [
    (".*", "anything", True),
    (".*", "", True),
    ("", "", True),             # "" means "^$": only the empty name
    ("", "q", False),
    ("^bob-", "bob-q", True),
    ("^bob-", "alice-q", False),
    ("bob", "xbobx", True),     # unanchored, as Erlang's re:run
    ("^amq\\.default$", "amq.default", True),
    ("^(a|b)$", "ab", False),
])
def test_permission_matching(expression, name, allowed):
    permission = Permission(expression, expression, expression)
    for kind in ("configure", "write", "read"):
        assert permission.allows(kind, name) is allowed, f"{kind} {expression!r} on {name!r}"


def test_permissions_are_separate_per_kind():
    permission = Permission("^c$", "^w$", "^r$")
    assert permission.allows("configure", "c") and not permission.allows("configure", "w")
    assert permission.allows("write", "w") and not permission.allows("write", "r")
    assert permission.allows("read", "r") and not permission.allows("read", "c")


def test_refused_text_is_rabbitmqs():
    assert refused_text("configure", "queue", "q", "/", "u") == \
        "configure access to queue 'q' in vhost '/' refused for user 'u'"
    assert refused_text("write", "exchange", "", "v", "u") == \
        "write access to exchange 'amq.default' in vhost 'v' refused for user 'u'"


def test_config_users_are_hashed_and_get_all_permissions_on_their_declared_vhosts():
    settings = load_settings(vhosts=["/", "v"], users=[
        {"name": "alice", "password": "wönderland", "vhosts": ["/", "v", "undeclared"]},
        {"name": "bob", "password_hash": hash_password("builder"), "vhosts": []},
    ])
    access = AccessControl.from_settings(settings)
    assert "wönderland" not in repr(access.users), "a clear password kept"
    assert check_password(access.users["alice"].password_hash, "wönderland")
    assert set(access.permissions) == {("alice", "/"), ("alice", "v")}
    assert access.permission("alice", "v").row() == [".*", ".*", ".*"]
    assert authenticate(access, "PLAIN", "\0bob\0builder", "10.0.0.1").name == "bob"
    with pytest.raises(AuthenticationError):
        authenticate(access, "PLAIN", "\0bob\0builder2", "10.0.0.1")


def test_bad_password_hash_in_config_names_the_field():
    from warren.config import ConfigError
    with pytest.raises(ConfigError) as info:
        load_settings(users=[{"name": "bob", "password_hash": "nope"}])
    assert "users.0.password_hash" in str(info.value), info.value
    with pytest.raises(ConfigError) as info:
        load_settings(users=[{"name": "bob", "password": "x", "password_hash": hash_password("x")}])
    assert "users.0.password" in str(info.value), info.value


def test_deleting_a_vhost_or_a_user_drops_their_permissions():
    access = AccessControl(["guest"])
    access.put_user(UserRecord("u", hash_password("p"), ("administrator",)))
    access.set_permission("u", "/", Permission(".*", "", "^r"))
    access.set_permission("u", "v", Permission("a", "b", "c"))
    access.delete_vhost("v")
    assert list(access.permissions) == [("u", "/")]
    access.delete_user("u")
    assert access.users == {} and access.permissions == {}
