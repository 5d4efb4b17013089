"""``warren-server``: start one node (AMQP listener + Prometheus endpoint).

Reads the config (``--config`` TOML file, WARREN_* environment), runs on
uvloop, and shuts down gracefully on SIGTERM/SIGINT: every client connection
gets connection.close 320 CONNECTION_FORCED before the process exits. One that
comes while the node starts (a node of a cluster waits for its peers before it
listens) stops it then.

If the node's Raft fails as a whole (its WAL lost a batch, or a failure no
single group owns: raft/runtime.py, "Failure"), the node must not go on
accepting clients it can no longer answer: it logs ``server.fatal``, shuts
down the same way and exits with status 1, so that a supervisor restarts it
(the restart rebuilds Raft from the WAL).

The node shell builds the WAL and its group committer (`Broker.node_log`,
raft/node_log.py) and hands them to the Raft runtime, their only client;
it closes them after the runtime stopped.
"""
from __future__ import annotations

import argparse
import asyncio
import errno
import fcntl
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO

import structlog
import uvloop

from warren.broker.admin.gather import ShardGatherer
from warren.broker.admin.http import start_http_server
from warren.broker.amqp.connection import AMQPConnection
from warren.broker.node import gc_tuning, loop_cpu, shards
from warren.broker.node.broker import VERSION, Broker
from warren.broker.node.connection_handoff import ConnectionHandoff
from warren.broker.node.listen_sockets import LISTEN_BACKLOG, skippable
from warren.broker.node.logs import configure_logging
from warren.broker.node.shared_cluster_port import SharedClusterPort
from warren.broker.node.supervisor import NO_SPACE_EXIT_STATUS, Supervisor
from warren.broker.node.supervisor_pause import SupervisorPauses
from warren.config import ConfigError, Settings, load_settings
from warren.raft.node_log import no_space
from warren.raft.raft_storage import RaftLogCorrupt
from warren.storage.records import CorruptLog

log = structlog.get_logger("warren.server")
# How long shutdown waits for clients to answer connection.close.
SHUTDOWN_GRACE_SECONDS = 5.0
# Exit status after a fatal failure of the node's Raft (a supervisor restarts the node).
FATAL_EXIT_STATUS = 1
# In the data directory: held locked (flock) by the server using it, naming its pid and node.
DATA_DIR_LOCK_FILE = "warren.lock"


class DataDirInUse(Exception):
    """Another process holds the data directory's lock."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="warren-server",
        description="Warren: an AMQP 0-9-1 message broker. Configuration comes from an optional TOML "
                    "file and WARREN_* environment variables (which win), e.g. WARREN_AMQP_PORT=5672, "
                    "WARREN_DATA_DIR=./warren-data, WARREN_LOG_FORMAT=console, WARREN_NODE_PROCESSES=1 (default: "
                    "one process per core the node may use, its CPU affinity capped by its cgroup's CPU quota; "
                    "fixed when the data directory is created; every node of a cluster must run as many).")
    parser.add_argument("--config", metavar="PATH", help="TOML configuration file")
    parser.add_argument("--version", action="version", version=f"warren {VERSION}")
    parser.add_argument("--shard-plan", help=argparse.SUPPRESS)   # set by the supervisor for its shards
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not _assertions_enabled():
        print("warren-server: refusing to run with assertions disabled (python -O)", file=sys.stderr)
        return 2
    inherited = None
    try:
        settings = load_settings(args.config)
        _check_cluster_config(settings)
        # decided on the node's own settings (a shard's list the node's shards as a cluster)
        settings = settings.model_copy(update={
            "loop_cpu_binding": loop_cpu.binding(settings.loop_cpu_binding, len(settings.cluster_nodes))})
        if args.shard_plan is not None:   # one of a supervisor's shards (broker/node/supervisor.py)
            plan = shards.ShardPlan.from_json(args.shard_plan)
            shards.die_with_supervisor(plan.supervisor_pid)
            settings, inherited = plan.shard_settings(settings), InheritedSockets.of(plan, settings.node_name)
    except ConfigError as error:
        print(f"warren-server: {error}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    try:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        print(f"warren-server: data_dir {settings.data_dir}: {error.strerror}", file=sys.stderr)
        return 2
    try:
        lock = lock_data_dir(settings.data_dir, settings.node_name)  # held until the process exits
    except DataDirInUse as error:
        print(f"warren-server: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"warren-server: data_dir {settings.data_dir}: cannot lock: {error.strerror}", file=sys.stderr)
        return 2
    try:
        if inherited is None:
            processes = shards.node_processes(settings, shards.recorded_processes(settings.data_dir))
            if processes > 1:
                config_args = ["--config", args.config] if args.config else []
                return Supervisor(settings, processes, config_args).run()
        return uvloop.run(serve(settings, inherited))
    except ConfigError as error:
        print(f"warren-server: {error}", file=sys.stderr)
        return 2
    except (CorruptLog, RaftLogCorrupt) as error:
        log.error("server.start_failed", error=str(error))
        print(f"warren-server: cannot start: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        log.error("server.start_failed", error=str(error))
        print(f"warren-server: cannot start: {error}", file=sys.stderr)
        # a full disk may get room back: a supervisor starts such a shard again (supervisor.py)
        return NO_SPACE_EXIT_STATUS if no_space(error) else 1
    finally:
        lock.close()


@dataclass(frozen=True)
class InheritedSockets:
    """A shard's listening sockets, bound by its supervisor."""

    amqp: list[socket.socket]
    http: list[socket.socket]
    gatherer: ShardGatherer | None   # shard 0's, answering for the node
    handoff: ConnectionHandoff
    cluster: SharedClusterPort
    pauses: SupervisorPauses

    @classmethod
    def of(cls, plan: shards.ShardPlan, node_name: str) -> "InheritedSockets":
        others = {k: port for k, port in enumerate(plan.http_ports) if k > 0 and port is not None}
        return cls([socket.socket(fileno=fd) for fd in plan.amqp_fds],
                   [socket.socket(fileno=fd) for fd in plan.http_fds],
                   ShardGatherer(node_name, others) if plan.shard == 0 else None,
                   ConnectionHandoff.of(plan.shard, plan.handoff_inbox_fds, plan.handoff_outbox_fds),
                   SharedClusterPort([socket.socket(fileno=fd) for fd in plan.cluster_fds],
                                     {shards.shard_name(node_name, k): k for k in range(plan.count)},
                                     ConnectionHandoff.of(plan.shard, plan.link_inbox_fds, plan.link_outbox_fds)),
                   SupervisorPauses(plan.supervisor_pid))


def lock_data_dir(data_dir: Path, node_name: str) -> IO[str]:
    """Lock the data directory for this process's life: two nodes appending to one
    WAL corrupt each other's log and lose confirmed messages. The kernel drops an
    flock when its holder dies, so a kill -9 leaves no stale lock."""
    lock = open(data_dir / DATA_DIR_LOCK_FILE, "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        raise DataDirInUse(f"data_dir {data_dir} is in use by {holder}; "
                           "a data directory serves one node at a time") from None
    try:   # unbuffered: a write the disk had no room for must not come back at close
        os.ftruncate(lock.fileno(), 0)
        os.write(lock.fileno(), f"pid {os.getpid()} (node {node_name})\n".encode())
    except OSError as error:   # the flock is the lock; on a full disk its holder's name is not written
        if not no_space(error):
            lock.close()
            raise
    return lock


def _check_cluster_config(settings: Settings) -> None:
    names = [node.name for node in settings.cluster_nodes]
    if not names:
        return
    if len(set(names)) != len(names):
        raise ConfigError(f"invalid configuration: cluster_nodes: a node name appears twice ({names})")
    if settings.node_name not in names:
        raise ConfigError(f"invalid configuration: cluster_nodes: must list this node ({settings.node_name})")
    if len(names) > 1 and (settings.cluster_secret is None or not settings.cluster_secret.get_secret_value()):
        raise ConfigError("invalid configuration: cluster_secret: required when cluster_nodes lists other nodes")


def _assertions_enabled() -> bool:
    try:
        assert False  # noqa: B011 (this is the check that asserts are on)
    except AssertionError:
        return True
    return False


async def serve(settings: Settings, inherited: InheritedSockets | None = None) -> int:
    loop = asyncio.get_running_loop()
    # Handlers first: a SIGTERM during start-up must still mean a graceful stop.
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    broker = Broker(settings)
    fatal: list[BaseException] = []
    broker.cluster.runtime.on_fatal = lambda error: _on_fatal(error, fatal, stop)
    if inherited is not None:   # the node's cluster port, every shard accepting on it
        broker.cluster.runtime.shared_port = inherited.cluster
        inherited.pauses.start(loop)   # a `kill -STOP` of the node's pid pauses the node
    # The Raft groups (metadata, queues) from the WAL, and the links to the other nodes.
    servers: list[asyncio.Server] = []
    metrics_servers: list[asyncio.Server] = []
    started = await _started_unless_stopped(broker, stop)
    binder = None
    if started:
        servers, metrics_servers = await _listen_all(broker, settings, inherited)
        if settings.loop_cpu_binding in ("busy", "always"):   # now: libuv's pool (name lookups) stays free
            binder = loop_cpu.start_binder(loop, settings.node_shard or 0, settings.loop_cpu_binding == "always")
            if binder is not None:
                log.info("server.loop_binding", cpu=binder.cpu, binding=settings.loop_cpu_binding)
        if inherited is not None:   # connections moved here from other shards are taken from now on
            inherited.handoff.start(loop, partial(_take_moved, broker))
            if settings.move_connections:
                broker.handoff = inherited.handoff
        broker.listeners = {"amqp": _addresses(servers), "metrics": _addresses(metrics_servers)}
        log.info("server.started", node=settings.node_name, **broker.listeners, data_dir=str(settings.data_dir),
                 version=VERSION)
        gc_tuning.tune_after_start()
        await stop.wait()
    log.info("server.stopping", connections=len(broker.connections))
    if binder is not None:
        binder.stop()
    for server in servers:
        server.close()
    if inherited is not None and started:
        inherited.handoff.stop(loop)
    broker.shutdown_connections()
    deadline = loop.time() + SHUTDOWN_GRACE_SECONDS
    while broker.connections and loop.time() < deadline:
        await asyncio.sleep(0.05)
    await broker.cluster.stop()
    await broker.node_log.close()
    for server in metrics_servers:
        server.close()
    log.info("server.stopped")
    return FATAL_EXIT_STATUS if fatal else 0


async def _started_unless_stopped(broker: Broker, stop: asyncio.Event) -> bool:
    """`broker.start()`, or False if a stop came first: a node of a cluster waits at start for
    its peers (up to cluster_startup_catch_up_seconds) before it listens, and a SIGTERM (or a
    fatal failure) meanwhile stops it then, not once the wait is over."""
    starting = asyncio.ensure_future(broker.start())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((starting, stopping), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not starting.done():
            starting.cancel()
    try:
        await starting
    except asyncio.CancelledError:
        if asyncio.current_task().cancelling():
            raise   # serve() itself is cancelled, not just the start
        log.info("server.start_abandoned", reason="stopped while starting")
        return False
    return True


def _take_moved(broker: Broker, sock: socket.socket, fields: list) -> None:
    """A connection another shard moved here (broker/amqp/connection_move.py)."""
    history, unparsed, channels = fields
    sock.setblocking(False)
    moved_in = (history, unparsed, channels)
    task = asyncio.ensure_future(asyncio.get_running_loop().connect_accepted_socket(
        lambda: AMQPConnection(broker, moved_in), sock))
    task.add_done_callback(partial(_moved_started, sock))


def _moved_started(sock: socket.socket, task: asyncio.Future) -> None:
    if task.cancelled() or task.exception() is not None:
        log.warning("connection.move_not_started", error=str(None if task.cancelled() else task.exception()))
        sock.close()


async def _listen_all(broker: Broker, settings: Settings, inherited: InheritedSockets | None,
                      ) -> tuple[list[asyncio.Server], list[asyncio.Server]]:
    """The AMQP and HTTP servers: on the configured addresses, or on a shard's inherited sockets."""
    loop = asyncio.get_running_loop()
    if inherited is not None:
        return ([await loop.create_server(lambda: AMQPConnection(broker), sock=sock, backlog=LISTEN_BACKLOG)
                 for sock in inherited.amqp],
                [await start_http_server(broker, sock=sock, gatherer=inherited.gatherer) for sock in inherited.http])
    servers = await listen(lambda host: loop.create_server(
        lambda: AMQPConnection(broker), host, settings.amqp_port, reuse_address=True, backlog=LISTEN_BACKLOG),
        settings.amqp_host, "amqp")
    metrics_servers: list[asyncio.Server] = []
    if settings.metrics_port:
        metrics_servers = await listen(lambda host: start_http_server(broker, host, settings.metrics_port),
                                       settings.metrics_host, "metrics")
    return servers, metrics_servers


async def listen(start: Callable[[str], Awaitable[asyncio.Server]], hosts: str,
                 listener: str) -> list[asyncio.Server]:
    """One server per address of `hosts` (comma-separated). An IPv6 address the host
    cannot bind (no IPv6) is skipped with a warning while another address listens."""
    addresses = [host.strip() for host in hosts.split(",") if host.strip()]
    servers = []
    for host in addresses:
        try:
            servers.append(await start(host))
        except OSError as error:
            if not skippable(host, error, addresses):
                raise
            log.warning("server.ipv6_unavailable", listener=listener, host=host, error=str(error))
    if not servers:
        raise OSError(errno.EADDRNOTAVAIL, f"no {listener} listener could bind any of {hosts}")
    return servers


def _addresses(servers: list[asyncio.Server]) -> list[str]:
    """Where the servers listen, as "[::]:5672" and "0.0.0.0:5672"."""
    return [f"[{name[0]}]:{name[1]}" if sock.family == socket.AF_INET6 else f"{name[0]}:{name[1]}"
            for server in servers for sock in server.sockets for name in [sock.getsockname()]]


def _on_fatal(error: BaseException, fatal: list[BaseException], stop: asyncio.Event) -> None:
    """The node's Raft stopped for good: stop the node rather than serve half alive."""
    log.critical("server.fatal", reason="raft failed", error=repr(error), exit_status=FATAL_EXIT_STATUS)
    fatal.append(error)
    stop.set()
