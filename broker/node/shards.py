"""What a node over several processes (docs/multi-process.md, stage 1) agrees on:
how many shards a data directory holds, their shared cluster secret, and the plan
the supervisor hands each shard (`--shard-plan`, JSON) with the settings it derives.

Shard k is a whole Warren node named `<node>#k` with data directory
`data_dir/shard-k`, one member of a cluster of all the shards (the existing
cluster transport). A node's shards accept on one cluster port the supervisor
binds, passing each other the links meant for them (shared_cluster_port.py): a
single node's on a loopback port it picks at each start; the nodes of a cluster
(stage 2, docs/multi-process.md section 12) make one flat cluster of every
node's shards, every shard of a node at its cluster port, a quorum queue's
members the same shard of distinct nodes (queue_factory.place_members), and the
metadata group spans every shard.
"""
from __future__ import annotations

import ctypes
import hashlib
import hmac
import json
import os
import secrets
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

from pydantic import SecretStr

from warren.broker.node.usable_cores import usable_cores
from warren.config import WAL_MAX_SIZE_BYTES_MIN, ClusterNode, ConfigError, Settings

LOOPBACK = "127.0.0.1"
# In the data directory of a node over several processes.
SHARDS_FILE = "shards"                  # the shard count, written at the first start
SECRET_FILE = "cluster-secret"          # the shards' cluster secret (mode 0600)
SHARD_PORTS_FILE = "shard-ports.json"   # where each running shard listens, and its pid
# Entries of a data directory that say nothing about how many processes used it: the node's own,
# and what mkfs puts at the root of a filesystem (a data directory on a disk or volume of its own).
NODE_FILES = frozenset({"warren.lock", SHARDS_FILE, SECRET_FILE, SHARD_PORTS_FILE, "lost+found"})
PR_SET_PDEATHSIG = 1


def shard_name(node_name: str, shard: int) -> str:
    return f"{node_name}#{shard}"


def shard_dir(data_dir: Path, shard: int) -> Path:
    return data_dir / f"shard-{shard}"


def recorded_processes(data_dir: Path) -> int | None:
    """The count a data directory was created with: its `shards` file; 1 if a single
    process used it (it holds anything else); None if it is new."""
    try:
        return int((data_dir / SHARDS_FILE).read_text().strip())
    except FileNotFoundError:
        pass
    except ValueError:
        raise ConfigError(f"data_dir {data_dir}: {SHARDS_FILE} does not hold a number") from None
    used = any(entry.name not in NODE_FILES for entry in data_dir.iterdir())
    return 1 if used else None


def node_processes(settings: Settings, recorded: int | None, cores: int | None = None) -> int:
    """How many processes the node runs on: the setting, else the data directory's
    count, else the cores it may use (`cores`, default `usable_cores()`: its CPU
    affinity capped by its cgroup's CPU quota). Every node of a cluster must run as
    many (`shard_secret`): where the machines' cores differ, the setting says."""
    wanted = settings.node_processes
    if wanted is not None and recorded is not None and wanted != recorded:
        raise ConfigError(f"data_dir {settings.data_dir} was created for node_processes = {recorded}, "
                          f"not {wanted}: start with node_processes = {recorded} (queues do not move between "
                          "processes)")
    if wanted is not None:
        return wanted
    if recorded is not None:
        return recorded
    return max(1, cores if cores is not None else usable_cores())


def record_processes(data_dir: Path, count: int) -> None:
    path = data_dir / SHARDS_FILE
    if not path.exists():
        _write_durably(path, f"{count}\n")


def shard_secret(secret: str, count: int) -> str:
    """The cluster secret the shards of a cluster's nodes authenticate with: bound to the
    shard count, so a node started with another `node_processes` (whose idea of the
    cluster's members differs) fails the handshake instead of joining with another
    majority."""
    return hmac.new(secret.encode(), f"warren node_processes={count}".encode(), hashlib.sha256).hexdigest()


def cluster_shards(settings: Settings, count: int) -> list[ClusterNode]:
    """Every node's shards, each at its node's one cluster port (shared_cluster_port.py)."""
    return [ClusterNode(name=shard_name(node.name, k), host=node.host, port=node.port)
            for node in settings.cluster_nodes for k in range(count)]


def ensure_secret(data_dir: Path) -> None:
    """One secret per data directory, for the shards' cluster links on loopback."""
    path = data_dir / SECRET_FILE
    if not path.exists():
        _write_durably(path, secrets.token_hex(32) + "\n", mode=0o600)


def _write_durably(path: Path, text: str, mode: int = 0o644) -> None:
    partial = path.with_name(path.name + ".new")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(partial, path)


@dataclass(frozen=True)
class ShardPlan:
    """What the supervisor hands shard `shard`: inherited listening fds (the same
    numbers in the shard, `pass_fds`) and the ports of the whole set."""

    shard: int
    count: int
    supervisor_pid: int
    cluster_port: int            # the node's one cluster port, every shard accepting on it
    cluster_fds: list[int]
    amqp_fds: list[int]
    http_fds: list[int]          # shard 0: the node's metrics port; shard k: its own loopback one
    http_ports: list[int | None]  # each shard's HTTP port (shard 0's is the node's, None when off)
    # each shard's pair of the sockets connections move over (broker/node/connection_handoff.py)
    handoff_inbox_fds: list[int]
    handoff_outbox_fds: list[int]
    # and the pairs the cluster links accepted for another shard move over (shared_cluster_port.py)
    link_inbox_fds: list[int]
    link_outbox_fds: list[int]

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "ShardPlan":
        return cls(**json.loads(text))

    def shard_settings(self, settings: Settings) -> Settings:
        shard = {
            "node_name": shard_name(settings.node_name, self.shard),
            "data_dir": shard_dir(settings.data_dir, self.shard),
            "node_processes": 1,
            "node_shard": self.shard,
            "cluster_port": self.cluster_port,
            # No node-wide sum of queued bytes: each shard alarms at its share.
            "memory_high_watermark_bytes": max(settings.memory_high_watermark_bytes // self.count, 1024 * 1024),
            # Each shard writes a WAL of its own: the node's WAL size is their sum, as its disk use.
            "wal_max_size_bytes": max(settings.wal_max_size_bytes // self.count, WAL_MAX_SIZE_BYTES_MIN),
        }
        if len(settings.cluster_nodes) > 1:   # stage 2: one flat cluster of every node's shards
            secret = settings.cluster_secret.get_secret_value() if settings.cluster_secret else ""
            return settings.model_copy(update={**shard, "cluster_nodes": cluster_shards(settings, self.count),
                                               "cluster_secret": SecretStr(shard_secret(secret, self.count))})
        names = [shard_name(settings.node_name, k) for k in range(self.count)]
        secret = (settings.data_dir / SECRET_FILE).read_text().strip()
        return settings.model_copy(update={
            **shard,
            "cluster_nodes": [ClusterNode(name=name, host=LOOPBACK, port=self.cluster_port) for name in names],
            "cluster_host": LOOPBACK,
            "cluster_secret": SecretStr(secret),
        })


def die_with_supervisor(supervisor_pid: int) -> None:
    """A shard must not outlive its supervisor (a kill -9 of the supervisor would leave it
    holding its shard directory): the kernel kills it when the supervisor dies."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != supervisor_pid:   # it died before the prctl took effect
        os._exit(1)
