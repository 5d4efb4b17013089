"""The node's configuration: one pydantic-settings model read by every layer.

Sources, highest priority first: WARREN_* environment variables, the TOML file
given with ``--config``, then the defaults below. A bad value fails at start
with a message that names the field (``load_settings`` raises ConfigError).
"""
from __future__ import annotations

import base64
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings.exceptions import SettingsError

WAL_MAX_SIZE_BYTES_MIN = 64 * 1024


class ConfigError(Exception):
    """Invalid configuration; the message names the offending field."""


class User(BaseModel):
    """A user a fresh node starts with (see broker/admin/auth.py and README "Users")."""

    name: str = Field(min_length=1)
    # Instead of `password`: RabbitMQ's rabbit_password_hashing_sha256 hash (base64 of a
    # 4-byte salt and sha256(salt + password)), so that the config holds no clear password.
    password_hash: str | None = None
    password: SecretStr | None = Field(None, validate_default=True)
    # vhosts this user may use; RabbitMQ's ".*" configure/write/read per vhost.
    vhosts: list[str] = ["/"]
    # "administrator" may change users, vhosts and permissions with warrenctl.
    tags: list[str] = []

    @field_validator("password_hash")
    @classmethod
    def _hash_form(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            valid = len(base64.b64decode(value, validate=True)) == 36
        except ValueError:
            valid = False
        if not valid:
            raise ValueError("not a base64 salted SHA-256 hash (4-byte salt + 32-byte digest)")
        return value

    @field_validator("password")
    @classmethod
    def _one_password(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if (value is None) == (info.data.get("password_hash") is None):
            raise ValueError("a user needs exactly one of password and password_hash")
        return value


class ClusterNode(BaseModel):
    """A member of the cluster: its node name and where its cluster port listens."""

    name: str = Field(min_length=1, pattern=r"^[^!\s]+$")   # '!': raft/member_ids.py
    host: str = Field(min_length=1)
    port: int = Field(25672, ge=1, le=65535)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="WARREN_", extra="forbid", validate_default=True
    )

    # '!' and '#' are taken: a quorum queue replica's id is `node!epoch` (raft/member_ids.py),
    # a shard of a node over several processes is `node#k` (broker/node/shards.py)
    node_name: str = Field("warren@localhost", min_length=1, pattern=r"^[^!#\s]+$")
    # One address or several, comma-separated. The default, as RabbitMQ's listeners:
    # every interface over IPv6 and IPv4 (IPv6 is skipped on a host without it).
    amqp_host: str = Field("::,0.0.0.0", min_length=1)
    amqp_port: int = Field(5672, ge=0, le=65535)
    metrics_host: str = Field("::,0.0.0.0", min_length=1)
    # 0 disables the Prometheus endpoint.
    metrics_port: int = Field(15692, ge=0, le=65535)
    data_dir: Path = Path("./warren-data")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "console"] = "json"
    # Processes the node runs on (docs/multi-process.md): more than one makes warren-server a
    # supervisor of that many queue shards over one listening port. None: the cores the node
    # may use (broker/node/usable_cores.py) for a new data directory, else the count it was
    # created with. Every node of a cluster must run as many.
    node_processes: int | None = Field(None, ge=1, le=256)
    # Set by the supervisor for its shard k (broker/node/shards.py), never by hand.
    node_shard: int | None = Field(None, ge=0)
    # A node over several processes moves a connection to its queue's process at its first
    # publish or consume, when that is all it did so far (docs/multi-process.md, section 11);
    # off, every connection stays where it was accepted and crosses to its queues' processes.
    move_connections: bool = True
    # Each process's event loop thread bound to a CPU of its own, process k to the k-th CPU the
    # node may use, as RabbitMQ binds its schedulers (broker/node/loop_cpu.py): "busy" while it runs
    # flat out, "always", or "never"; its other threads run on any. None: "busy", but "never" on a
    # node of a cluster, whose nodes may share a machine (each would bind its first loop to one CPU).
    loop_cpu_binding: Literal["busy", "always", "never"] | None = None

    # The users, vhosts and permissions a fresh node starts with (RabbitMQ's default user
    # and load_definitions); after the first start they live in the metadata log and
    # change with warrenctl (README "Users and vhosts").
    users: list[User] = [User(name="guest", password=SecretStr("guest"), tags=["administrator"])]
    # Users that may only connect from loopback (RabbitMQ's loopback_users).
    loopback_users: list[str] = ["guest"]
    vhosts: list[str] = ["/"]

    # Tune parameters the server proposes (AMQP 0-9-1 §4.2.3); names as RabbitMQ's.
    frame_max: int = Field(131072, ge=4096, le=2**31 - 1)
    channel_max: int = Field(2047, ge=1, le=65535)
    heartbeat: int = Field(60, ge=0, le=65535)
    max_message_size_bytes: int = Field(128 * 1024 * 1024, ge=1, le=512 * 1024 * 1024)
    handshake_timeout_seconds: float = Field(10.0, gt=0)

    # A delivery not acknowledged within this long closes its channel with 406, as
    # RabbitMQ's consumer_timeout (default 30 min); 0 disables the check.
    consumer_timeout_ms: int = Field(1_800_000, ge=0)

    # Backpressure: a connection whose unsent output exceeds this stops reading.
    connection_write_buffer_max_bytes: int = Field(4 * 1024 * 1024, ge=65536)
    # Memory alarm: when the message bytes held by all queues exceed this, publishing
    # connections are blocked (connection.blocked, as RabbitMQ's memory alarm does).
    memory_high_watermark_bytes: int = Field(2 * 1024**3, ge=1024 * 1024)
    alarm_check_interval_seconds: float = Field(0.5, gt=0, le=60)
    # Disk alarm: below this much free space in data_dir, publishers are blocked. Free space
    # is looked at every alarm check near the limit, up to every 10 s far from it
    # (broker/node/broker.py, next_disk_check_in: RabbitMQ's disk monitor does the same).
    disk_free_limit_bytes: int = Field(50 * 1000 * 1000, ge=0)

    # The node-wide WAL rolls over at this size: its live entries move to segment
    # files. 512 MiB as RabbitMQ's (ra's wal_max_size_bytes): a backlog of a few
    # hundred MB is confirmed without a rollover's copy beside its batches (its
    # confirm p99 halved, docs/performance.md); a rollover maps the file rather
    # than read it (storage/files.py), notes 12 bytes a record (storage/wal_heads.py),
    # and a recovery hands records over as it reads them. Split among a node's
    # processes (broker/node/shards.py): a node's WAL disk use stays this size. It rolls
    # over sooner once it holds half the disk's free space (broker/node/disk_watch.py).
    wal_max_size_bytes: int = Field(512 * 1024 * 1024, ge=WAL_MAX_SIZE_BYTES_MIN)
    # Entries per segment file (rabbitmq/ra's default): the unit of truncation. A file also
    # ends at 64 MB (storage/wal.py SEGMENT_MAX_BYTES, ra's segment_max_size_bytes).
    segment_max_entries: int = Field(4096, ge=16)
    # A WAL batch that finds the disk full waits for room this long, then fails, and the node
    # (its process) restarts from its WAL: room that only the writes queued behind the batch
    # would make never comes (storage/group_commit.py).
    wal_no_space_give_up_seconds: float = Field(30.0, gt=0)

    # Cluster (the quorum-queue issue). Every node lists all members, itself included;
    # an empty list is a cluster of one. Nodes authenticate each other with the
    # shared secret, like RabbitMQ's Erlang cookie.
    cluster_nodes: list[ClusterNode] = []
    cluster_host: str = "0.0.0.0"
    cluster_port: int = Field(25672, ge=0, le=65535)
    cluster_secret: SecretStr | None = None
    # Replicas of a new quorum queue (capped at the cluster size), as RabbitMQ's.
    quorum_cluster_size: int = Field(3, ge=1, le=255)
    # Node-to-node transport limits.
    cluster_frame_max_bytes: int = Field(64 * 1024 * 1024, ge=65536)
    peer_outbound_max_bytes: int = Field(64 * 1024 * 1024, ge=65536)
    cluster_handshake_timeout_seconds: float = Field(5.0, gt=0)
    # Silent heartbeats (3) before a peer counts as down: failover takes about a second more.
    cluster_heartbeat_seconds: float = Field(0.25, gt=0)
    # How long a lost node's consumers keep their messages before they are returned.
    cluster_node_gone_seconds: float = Field(60.0, gt=0)
    # How long a starting cluster node waits to catch up with the metadata group (it needs
    # a majority of the nodes) before it opens its AMQP port anyway.
    cluster_startup_catch_up_seconds: float = Field(30.0, ge=0)
    # Enqueues a channel may have in flight before it counts as slow, and (RabbitMQ's credit flow
    # from reader to channel) how many more it reads before its socket pauses, and how many of
    # those must be done before it reads again (broker/amqp/publish_credit.py).
    commands_soft_limit: int = Field(32, ge=1)
    credit_flow_default_credit: tuple[int, int] = (400, 200)

    @field_validator("credit_flow_default_credit")
    @classmethod
    def _credit_not_negative(cls, value: tuple[int, int]) -> tuple[int, int]:
        if min(value) < 0:
            raise ValueError("credit_flow_default_credit: (initial credit, more credit after), neither negative")
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_level(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment beats the file (init_settings carries the file's values).
        return (env_settings, init_settings)


def load_settings(config_path: str | Path | None = None, **overrides: Any) -> Settings:
    """Read the TOML file (if any) and the environment; raise ConfigError."""
    file_values: dict[str, Any] = {}
    if config_path is not None:
        path = Path(config_path)
        try:
            file_values = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    file_values.update(overrides)
    try:
        return Settings(**file_values)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None
    except SettingsError as exc:  # e.g. WARREN_USERS that is not JSON
        raise ConfigError(f"invalid configuration: {exc}") from None


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        field = ".".join(str(p) for p in error["loc"]) or "config"
        parts.append(f"{field}: {error['msg']}")
    return "invalid configuration: " + "; ".join(parts)
