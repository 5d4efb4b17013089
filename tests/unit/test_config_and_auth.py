"""config/settings.py (load_settings) and broker/admin/auth.py (authenticate)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from pamqp import encode

from warren.broker.admin.auth import AuthenticationError, authenticate, is_loopback
from warren.config import ConfigError, Settings, load_settings

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """No WARREN_* variable of the developer's shell may leak into these tests."""
    for name in list(os.environ):
        if name.upper().startswith("WARREN_"):
            monkeypatch.delenv(name)


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "warren.toml"
    path.write_text(text)
    return path


# -- load_settings --------------------------------------------------------------

def test_defaults_without_a_file():
    settings = load_settings()
    assert (settings.amqp_port, settings.frame_max, settings.channel_max) == (5672, 131072, 2047), (
        f"defaults: port {settings.amqp_port}, frame_max {settings.frame_max}, channel_max {settings.channel_max}")
    assert [u.name for u in settings.users] == ["guest"], "default user should be guest"
    assert settings.loopback_users == ["guest"], "guest should be loopback-only by default"


def test_values_come_from_the_toml_file(tmp_path):
    path = write_toml(tmp_path, """
amqp_port = 5673
frame_max = 8192
log_level = "DEBUG"
vhosts = ["/", "staging"]

[[users]]
name = "alice"
password = "wonderland"
vhosts = ["staging"]
""")
    settings = load_settings(path)
    assert settings.amqp_port == 5673, f"amqp_port {settings.amqp_port}"
    assert settings.frame_max == 8192, f"frame_max {settings.frame_max}"
    assert settings.log_level == "debug", f"log_level should be lower-cased, is {settings.log_level!r}"
    assert settings.vhosts == ["/", "staging"], f"vhosts {settings.vhosts}"
    assert [(u.name, u.password.get_secret_value(), u.vhosts) for u in settings.users] == [
        ("alice", "wonderland", ["staging"])], "users from [[users]] tables"


def test_the_shipped_example_config_is_valid():
    settings = load_settings(REPO / "deploy" / "warren.toml")
    assert {u.name for u in settings.users} == {"admin", "guest"}, f"users {[u.name for u in settings.users]}"


def test_environment_overrides_the_file(tmp_path, monkeypatch):
    path = write_toml(tmp_path, "amqp_port = 5673\nheartbeat = 30\n")
    monkeypatch.setenv("WARREN_AMQP_PORT", "6000")
    settings = load_settings(path)
    assert settings.amqp_port == 6000, (
        f"env WARREN_AMQP_PORT=6000 should beat the file's 5673, got {settings.amqp_port}")
    assert settings.heartbeat == 30, f"file value not overridden by env should stay, heartbeat {settings.heartbeat}"


def test_environment_lists_are_json(monkeypatch):
    monkeypatch.setenv("WARREN_VHOSTS", '["/", "extra"]')
    assert load_settings().vhosts == ["/", "extra"], "WARREN_VHOSTS as JSON list"


def test_keyword_overrides_beat_the_file(tmp_path):
    path = write_toml(tmp_path, "amqp_port = 5673\n")
    assert load_settings(path, amqp_port=0).amqp_port == 0, "load_settings(**overrides) should beat the file"


@pytest.mark.parametrize("toml, field", [
    ("amqp_port = 70000", "amqp_port"),
    ("amqp_port = -1", "amqp_port"),
    ("amqp_port = \"five\"", "amqp_port"),
    ("frame_max = 100", "frame_max"),
    ("channel_max = 0", "channel_max"),
    ("heartbeat = 70000", "heartbeat"),
    ("log_level = \"verbose\"", "log_level"),
    ("log_format = \"xml\"", "log_format"),
    ("max_message_size_bytes = 0", "max_message_size_bytes"),
    ("handshake_timeout_seconds = 0", "handshake_timeout_seconds"),
    ("amqp_prot = 5672", "amqp_prot"),  # a typo: unknown keys are errors
    ("node_name = \"a!b\"", "node_name"),     # '!' names a replica added later (raft/member_ids.py)
    ("node_name = \"a#1\"", "node_name"),     # '#' names a shard (broker/node/shards.py)
    ("[[cluster_nodes]]\nname = \"b!2\"\nhost = \"h\"", "cluster_nodes.0.name"),
    ("[[users]]\nname = \"\"\npassword = \"x\"", "users.0.name"),
    ("[[users]]\nname = \"bob\"", "users.0.password"),
])
def test_bad_values_raise_config_error_naming_the_field(tmp_path, toml, field):
    path = write_toml(tmp_path, toml + "\n")
    with pytest.raises(ConfigError) as info:
        settings = load_settings(path)
        pytest.fail(f"{toml!r} accepted: {settings}")
    assert field in str(info.value), f"ConfigError for {toml!r} does not name {field!r}: {info.value}"


def test_bad_environment_value_names_the_field(monkeypatch):
    monkeypatch.setenv("WARREN_FRAME_MAX", "tiny")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "frame_max" in str(info.value), f"error does not name frame_max: {info.value}"


def test_missing_file_is_a_config_error(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_settings(missing)
    assert str(missing) in str(info.value), f"error does not name the missing file: {info.value}"


def test_invalid_toml_is_a_config_error(tmp_path):
    path = write_toml(tmp_path, "amqp_port = = 5\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert "TOML" in str(info.value) and str(path) in str(info.value), f"unhelpful error: {info.value}"


# -- authenticate ---------------------------------------------------------------

@pytest.fixture
def settings() -> Settings:
    return load_settings(users=[
        {"name": "guest", "password": "guest"},
        {"name": "alice", "password": "wönderland"},
    ])


def amqplain(login: str, password: str) -> bytes:
    """AMQPLAIN's response: a field table without its 4-byte length prefix."""
    return encode.field_table({"LOGIN": login, "PASSWORD": password})[4:]


def refused(settings, mechanism, response, peer) -> AuthenticationError:
    with pytest.raises(AuthenticationError) as info:
        user = authenticate(settings, mechanism, response, peer)
        pytest.fail(f"{mechanism} login from {peer} accepted as {user.name!r}")
    return info.value


@pytest.mark.parametrize("response", ["\0guest\0guest", b"\0guest\0guest", "guest\0guest\0guest"])
def test_plain_login(settings, response):
    user = authenticate(settings, "PLAIN", response, "127.0.0.1")
    assert user.name == "guest", f"PLAIN {response!r} logged in as {user.name!r}"


def test_plain_login_with_non_ascii_password(settings):
    assert authenticate(settings, "PLAIN", "\0alice\0wönderland", "10.0.0.5").name == "alice"
    assert authenticate(settings, "PLAIN", "\0alice\0wönderland".encode(), "10.0.0.5").name == "alice"


def test_amqplain_login(settings):
    user = authenticate(settings, "AMQPLAIN", amqplain("alice", "wönderland"), "10.0.0.5")
    assert user.name == "alice", f"AMQPLAIN logged in as {user.name!r}"


@pytest.mark.parametrize("mechanism, response", [
    ("PLAIN", "\0guest\0wrong"),
    ("AMQPLAIN", amqplain("guest", "wrong")),
    ("PLAIN", "\0guest\0"),
    ("PLAIN", "\0guest\0guest2"),
])
def test_wrong_password_is_refused(settings, mechanism, response):
    error = refused(settings, mechanism, response, "127.0.0.1")
    assert "wrong" not in str(error) and "guest2" not in str(error), f"the password leaked into the error: {error}"


@pytest.mark.parametrize("mechanism, response", [
    ("PLAIN", "\0mallory\0guest"),
    ("AMQPLAIN", amqplain("mallory", "guest")),
])
def test_unknown_user_is_refused(settings, mechanism, response):
    refused(settings, mechanism, response, "127.0.0.1")


@pytest.mark.parametrize("mechanism", ["EXTERNAL", "plain", "SCRAM-SHA-256", ""])
def test_unknown_mechanism_is_refused(settings, mechanism):
    error = refused(settings, mechanism, "\0guest\0guest", "127.0.0.1")
    assert "mechanism" in str(error), f"error should say the mechanism is unknown: {error}"


@pytest.mark.parametrize("mechanism, response", [
    ("PLAIN", "guest"),
    ("PLAIN", "\0guest\0guest\0extra"),
    ("AMQPLAIN", b"\x05LOGIN"),
    ("AMQPLAIN", b"\xff\xff\xff"),
    ("AMQPLAIN", encode.field_table({"LOGIN": "guest"})[4:]),
    ("AMQPLAIN", encode.field_table({"LOGIN": 5, "PASSWORD": "guest"})[4:]),
])
def test_malformed_responses_are_refused(settings, mechanism, response):
    refused(settings, mechanism, response, "127.0.0.1")


@pytest.mark.parametrize("peer", ["10.1.2.3", "192.168.1.1", "8.8.8.8", "2001:db8::1", "fe80::1%eth0",
                                  "::ffff:10.1.2.3", "not-an-address"])
def test_guest_is_refused_from_non_loopback_addresses(settings, peer):
    error = refused(settings, "PLAIN", "\0guest\0guest", peer)
    assert "localhost" in str(error) or "loopback" in str(error), f"error should say why: {error}"


@pytest.mark.parametrize("peer", ["127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1"])
def test_guest_is_accepted_from_loopback_addresses(settings, peer):
    assert authenticate(settings, "PLAIN", "\0guest\0guest", peer).name == "guest", f"guest refused from {peer}"
    assert authenticate(settings, "AMQPLAIN", amqplain("guest", "guest"), peer).name == "guest", (
        f"guest refused from {peer} with AMQPLAIN")


def test_other_users_may_connect_from_anywhere(settings):
    assert authenticate(settings, "PLAIN", "\0alice\0wönderland", "10.1.2.3").name == "alice"


def test_loopback_users_list_is_configurable():
    settings = load_settings(users=[{"name": "guest", "password": "guest"}], loopback_users=[])
    assert authenticate(settings, "PLAIN", "\0guest\0guest", "10.1.2.3").name == "guest", (
        "with loopback_users = [] guest may connect remotely")


@pytest.mark.parametrize("host, expected", [
    ("127.0.0.1", True), ("127.255.255.254", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("10.1.2.3", False), ("0.0.0.0", False), ("::", False), ("localhost", False), ("", False),
])
def test_is_loopback(host, expected):
    assert is_loopback(host) is expected, f"is_loopback({host!r}) should be {expected}"
