"""`warren-server` when `node_processes` > 1: the supervisor of the node's shards
(docs/multi-process.md, sections 5 and 8).

It runs no event loop and serves no client. Holding the data directory's lock,
it records the shard count, binds the AMQP port, the metrics port and the
cluster port once (a single node's: a free loopback port; every shard accepts
on it and passes each other the links meant for them, shared_cluster_port.py)
and starts S processes
`python -m warren.broker --shard-plan ...` with the listening sockets
inherited (`pass_fds`): every shard accepts on the one AMQP socket, so a new
connection goes to whichever shard's loop takes it first, and connections
wait in the supervisor's socket while a shard restarts.

SIGTERM and SIGINT are forwarded to every shard (each stops as a single node
does: clients get connection.close 320); the supervisor exits with the
shards' status. A SIGSTOP of the supervisor stops the shards too (each watches
it, broker/node/supervisor_pause.py) and its SIGCONT is forwarded to them. A
shard that exits on its own is started again;
more than `RESTARTS_MAX` restarts within `RESTART_WINDOW_SECONDS` stop the
node with status 1 for the outer supervisor, but not a shard that could not start
for want of disk space (`NO_SPACE_EXIT_STATUS`): that one is started again for as
long as the disk stays full. Shards die with the supervisor
(PR_SET_PDEATHSIG, in broker/node/shards.py).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path

import structlog

from warren.broker.node import shards, supervisor_pause
from warren.broker.node.connection_handoff import handoff_pairs
from warren.broker.node.listen_sockets import bind_listeners
from warren.config import Settings

log = structlog.get_logger("warren.supervisor")

RESTARTS_MAX = 5
RESTART_WINDOW_SECONDS = 60.0
RESTART_DELAY_SECONDS = 0.5
FAILED_EXIT_STATUS = 1
# A shard that cannot start for want of disk space (a WAL file's header) exits with this
# (EX_TEMPFAIL): it is started again, sooner first, for as long as the disk stays full,
# and such exits are not among the restarts that stop the node. A shard whose WAL gave up
# on a batch (wal_no_space_give_up_seconds) restarts into a disk as full as it left it.
NO_SPACE_EXIT_STATUS = 75
NO_SPACE_RESTART_FIRST_SECONDS = 0.25
NO_SPACE_RESTART_MAX_SECONDS = 4.0
# A shard still running this long after the stop signal is killed (each bounds its own shutdown).
STOP_TIMEOUT_SECONDS = 30


class Supervisor:
    def __init__(self, settings: Settings, count: int, config_args: list[str]) -> None:
        self.settings = settings
        self.count = count
        self.config_args = config_args
        self.processes: dict[int, subprocess.Popen] = {}   # shard -> its running process
        self.statuses: dict[int, int] = {}
        self.restarts: deque[float] = deque()
        self.stopping = False
        self.failed = False
        self.no_space_exits = 0   # shards' exits in a row for want of disk space at start
        self.stop_signal = 0      # the signal the shards were told to stop with

    def run(self) -> int:
        settings = self.settings
        amqp = bind_listeners(settings.amqp_host, settings.amqp_port, "amqp")
        metrics = bind_listeners(settings.metrics_host, settings.metrics_port, "metrics") \
            if settings.metrics_port else []
        # Recorded once the node can start: a start that cannot bind its ports fixes nothing.
        shards.record_processes(settings.data_dir, self.count)
        shards.ensure_secret(settings.data_dir)
        loopback_http = [bind_listeners(shards.LOOPBACK, 0, "shard http") for _ in range(1, self.count)]
        http_fds = [[sock.fileno() for sock in metrics], *[[sock.fileno() for sock in socks]
                                                            for socks in loopback_http]]
        http_ports: list[int | None] = [metrics[0].getsockname()[1] if metrics else None,
                                        *[socks[0].getsockname()[1] for socks in loopback_http]]
        clustered = len(settings.cluster_nodes) > 1   # stage 2: every shard at the node's cluster port
        cluster = bind_listeners(settings.cluster_host, settings.cluster_port, "cluster") if clustered \
            else bind_listeners(shards.LOOPBACK, 0, "shard cluster")
        cluster_port = cluster[0].getsockname()[1]
        handoff, links = handoff_pairs(self.count), handoff_pairs(self.count)
        self.plans = [shards.ShardPlan(k, self.count, os.getpid(), cluster_port, [s.fileno() for s in cluster],
                                       [s.fileno() for s in amqp], http_fds[k], http_ports,
                                       *_fds(handoff), *_fds(links)) for k in range(self.count)]
        self.listening = [*amqp, *metrics, *cluster, *(sock for socks in loopback_http for sock in socks),
                          *(sock for pair in handoff + links for sock in pair)]
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._forward)
        signal.signal(signal.SIGCONT, self._resume_shards)
        signal.signal(signal.SIGALRM, self._kill_stragglers)
        log.info("supervisor.started", node=settings.node_name, shards=self.count,
                 amqp=[_address(sock) for sock in amqp], metrics=[_address(sock) for sock in metrics],
                 data_dir=str(settings.data_dir))
        for shard in range(self.count):
            self._spawn(shard)
        self._watch()
        signal.alarm(0)
        for sock in self.listening:
            sock.close()
        status = FAILED_EXIT_STATUS if self.failed else _worst(self.statuses.values())
        log.info("supervisor.stopped", exit_status=status)
        return status

    def _spawn(self, shard: int) -> bool:
        """Start the shard's process; False if a stop signal came first."""
        if self.stopping:
            return False   # a stop signal came while the shards were being started
        plan = self.plans[shard]
        command = [sys.executable, "-m", "warren.broker", *self.config_args, "--shard-plan", plan.to_json()]
        self.processes[shard] = subprocess.Popen(command, pass_fds=[
            *plan.cluster_fds, *plan.amqp_fds, *plan.http_fds, *plan.handoff_inbox_fds, *plan.handoff_outbox_fds,
            *plan.link_inbox_fds, *plan.link_outbox_fds])
        if self.stopping:   # the signal came while it was being started: it did not reach this one
            self._signal_all(self.stop_signal)
        self._write_ports()
        return True

    def _write_ports(self) -> None:
        """Where each shard is, for operators and tests (shard 0's HTTP port is the node's)."""
        rows = [{"shard": k, "pid": process.pid, "http_port": self.plans[k].http_ports[k],
                 "cluster_port": self.plans[k].cluster_port} for k, process in sorted(self.processes.items())]
        path: Path = self.settings.data_dir / shards.SHARD_PORTS_FILE
        partial = path.with_name(path.name + ".new")
        try:
            partial.write_text(json.dumps({"supervisor_pid": os.getpid(), "shards": rows}) + "\n")
            os.replace(partial, path)
        except OSError as error:   # a full disk: the node goes on (it used to stop at a shard's restart)
            partial.unlink(missing_ok=True)
            log.warning("supervisor.ports_not_written", path=str(path), error=str(error))

    def _watch(self) -> None:
        """Reap shards until none runs: restart those that exited on their own."""
        while self.processes:
            try:
                pid, wait_status = os.waitpid(-1, 0)
            except ChildProcessError:
                return
            shard = next((k for k, process in self.processes.items() if process.pid == pid), None)
            if shard is None:
                continue
            status = os.waitstatus_to_exitcode(wait_status)
            self.processes.pop(shard).returncode = status
            if self.stopping:
                # killed by the signal forwarded to it, before its handlers were in: stopped as asked
                self.statuses[shard] = 0 if status == -self.stop_signal else status
                continue
            log.error("supervisor.shard_exited", shard=shard, pid=pid, exit_status=status)
            self.no_space_exits = self.no_space_exits + 1 if status == NO_SPACE_EXIT_STATUS else 0
            if not self.no_space_exits and self._too_many_restarts():
                log.critical("supervisor.giving_up", restarts=len(self.restarts),
                             window_seconds=RESTART_WINDOW_SECONDS)
                self.failed = True
                self._stop_all(signal.SIGTERM)
                continue
            # a shard that fails at once does not spin
            time.sleep(no_space_restart_delay(self.no_space_exits) if self.no_space_exits else RESTART_DELAY_SECONDS)
            if self._spawn(shard):
                log.info("supervisor.shard_restarted", shard=shard, pid=self.processes[shard].pid)

    def _too_many_restarts(self) -> bool:
        now = time.monotonic()
        self.restarts.append(now)
        while self.restarts and now - self.restarts[0] > RESTART_WINDOW_SECONDS:
            self.restarts.popleft()
        return len(self.restarts) > RESTARTS_MAX

    def _forward(self, signum: int, _frame: object) -> None:
        log.info("supervisor.stopping", signal=signal.Signals(signum).name)
        self._stop_all(signum)

    def _resume_shards(self, _signum: int, _frame: object) -> None:
        """Resumed: so are the shards that stopped with it, now and once more after their
        next look (one that read this process as stopped just before may stop itself after)."""
        self._signal_all(signal.SIGCONT)
        again = threading.Timer(2 * supervisor_pause.LOOK_SECONDS, self._signal_all, (signal.SIGCONT,))
        again.daemon = True
        again.start()

    def _kill_stragglers(self, _signum: int, _frame: object) -> None:
        log.error("supervisor.killing_shards", shards=sorted(self.processes), waited_seconds=STOP_TIMEOUT_SECONDS)
        self._signal_all(signal.SIGKILL)

    def _stop_all(self, signum: int) -> None:
        if not self.stopping:
            signal.alarm(STOP_TIMEOUT_SECONDS)
        self.stopping = True
        self.stop_signal = signum
        self._signal_all(signum)

    def _signal_all(self, signum: int) -> None:
        for process in list(self.processes.values()):   # a copy: a timer's thread calls this too
            try:
                os.kill(process.pid, signum)
            except ProcessLookupError:
                pass   # exited; reaped by _watch


def _worst(statuses: Iterable[int]) -> int:
    """0 if every shard stopped cleanly, else the first failure (a signal counts as 1)."""
    for status in statuses:
        if status != 0:
            return status if status > 0 else FAILED_EXIT_STATUS
    return 0


def no_space_restart_delay(in_a_row: int) -> float:
    """Seconds before a shard that could not start for want of disk space `in_a_row` times
    is started again: a quarter second, doubling up to 4 s (a start costs a process's imports)."""
    return min(NO_SPACE_RESTART_MAX_SECONDS, NO_SPACE_RESTART_FIRST_SECONDS * 2 ** min(in_a_row - 1, 8))


def _address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if sock.family == socket.AF_INET6 else f"{host}:{port}"


def _fds(pairs: list[tuple[socket.socket, socket.socket]]) -> tuple[list[int], list[int]]:
    """The shards' inbox ends and outbox ends of handoff pairs."""
    return [inbox.fileno() for inbox, _ in pairs], [outbox.fileno() for _, outbox in pairs]
