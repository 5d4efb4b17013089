"""Scraped by a real Prometheus: Debian's ``prometheus`` binary scrapes a real
warren-server node, and the Raft and WAL metrics are read back through
Prometheus's own HTTP API (``/api/v1/query``), not from ``/metrics`` directly.

Prometheus runs with a config, a data directory and a loopback port of the
test's own (in its temporary directory); the host's Prometheus service, config
and data are not used. When the binary is missing the test installs Debian's
package if it runs as root (as the container tests install podman), with the
package's service kept from starting; it skips only when it is not root and the
binary is missing.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.serverproc import free_port, make_server

PROMETHEUS_PACKAGE = "prometheus"
SCRAPE_INTERVAL = "1s"
WAIT_SECONDS = 30.0
QUORUM = {"x-queue-type": "quorum"}


def _install_prometheus() -> None:
    """apt-get install Debian's prometheus without letting its service start.

    invoke-rc.d and deb-systemd-invoke ask /usr/sbin/policy-rc.d whether a
    package may start its service; when there is none, one that says no (101)
    is put there for the install and removed afterwards. The service the package
    enables for the next boot is disabled again: this test only needs the binary.
    """
    policy = Path("/usr/sbin/policy-rc.d")
    placed = not policy.exists()
    if placed:
        policy.write_text("#!/bin/sh\n# tests/integration/test_prometheus.py: no service starts\nexit 101\n")
        policy.chmod(0o755)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    apt = ["apt-get", "-q", "-o", "DPkg::Lock::Timeout=600"]
    try:
        for command in (apt + ["update"], apt + ["install", "-y", "--no-install-recommends", PROMETHEUS_PACKAGE]):
            proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                pytest.fail(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                            f"{proc.stderr[-3000:]}")
    finally:
        if placed:
            policy.unlink()
    # Not started at the next boot either (systemctl also disables the SysV links; it
    # works without a running systemd).
    if shutil.which("systemctl"):
        subprocess.run(["systemctl", "disable", "prometheus.service"], capture_output=True, timeout=60)
    elif shutil.which("update-rc.d"):
        subprocess.run(["update-rc.d", "prometheus", "disable"], capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found:
        return found
    if os.geteuid() != 0:
        pytest.skip("Debian's prometheus is not installed (no `prometheus` on PATH) and the test is not root, "
                    "so it cannot apt-get install it; as root it installs it itself")
    if shutil.which("apt-get") is None:
        pytest.fail("prometheus is not installed and apt-get is not available to install it")
    _install_prometheus()
    found = shutil.which("prometheus")
    assert found, "apt-get installed prometheus but there is no `prometheus` on PATH"
    return found


class Prometheus:
    """One prometheus process of the test's own: config, data and log in ``workdir``."""

    def __init__(self, binary: str, workdir: Path, metrics_port: int) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.config = workdir / "prometheus.yml"
        self.config.write_text(
            "global:\n"
            f"  scrape_interval: {SCRAPE_INTERVAL}\n"
            f"  scrape_timeout: {SCRAPE_INTERVAL}\n"
            "scrape_configs:\n"
            "  - job_name: warren\n"
            "    static_configs:\n"
            f"      - targets: ['127.0.0.1:{metrics_port}']\n")
        self.log_path = workdir / "prometheus.log"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [binary, f"--config.file={self.config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            cwd=workdir, stdout=self._log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as response:
            return json.loads(response.read())

    def query(self, promql: str) -> list[dict]:
        """The vector an instant query returns now."""
        answer = self.get("/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        assert answer["status"] == "success", answer
        assert answer["data"]["resultType"] == "vector", answer
        return answer["data"]["result"]

    def value(self, promql: str) -> float | None:
        """The single sample's value, or None while there is none."""
        result = self.query(promql)
        assert len(result) <= 1, f"{promql} returned several series: {result}"
        return float(result[0]["value"][1]) if result else None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(15)
        self._log.close()


def _until(what: str, check: Callable[[], Any], logs: Callable[[], str], timeout: float = WAIT_SECONDS) -> Any:
    """check() until it returns something truthy (not None/False); fail with the logs after timeout."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
            if last:
                return last
        except (OSError, ValueError) as exc:  # not listening yet, or a half-started API
            last = exc
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not seen after {timeout:.0f} s (last: {last!r}); logs:\n{logs()}")
        time.sleep(0.2)  # polling with a deadline


@pytest.fixture
def node_and_prometheus(prometheus_binary: str, tmp_path: Path):
    server = make_server(tmp_path / "warren").start()
    workdir = tmp_path / "prometheus"
    workdir.mkdir()
    prometheus = Prometheus(prometheus_binary, workdir, server.metrics_port)
    try:
        yield server, prometheus
    finally:
        prometheus.stop()
        server.stop()


def test_real_prometheus_scrapes_raft_and_wal_metrics(node_and_prometheus) -> None:
    server, prometheus = node_and_prometheus

    def logs() -> str:
        return f"--- prometheus ---\n{prometheus.log()}\n--- warren ---\n{server.log()}"

    def still_running() -> None:
        assert prometheus.process.poll() is None, f"prometheus exited with {prometheus.process.returncode}:\n{logs()}"

    # The target is up in Prometheus's own eyes.
    def target_up() -> bool:
        still_running()
        return prometheus.value('up{job="warren"}') == 1.0
    _until("up{job=\"warren\"} == 1 in Prometheus", target_up, logs)

    queue = "prometheus-quorum"
    selector = f'{{job="warren",vhost="/",queue="{queue}"}}'
    with pika.BlockingConnection(pika.URLParameters(server.url)) as connection:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True, arguments=QUORUM)
        channel.confirm_delivery()

        def raft_seen() -> tuple[float, float] | None:
            still_running()
            term = prometheus.value(f"warren_raft_term{selector}")
            commit = prometheus.value(f"warren_raft_commit_index{selector}")
            return (term, commit) if term is not None and commit is not None and commit > 0 else None
        term, commit_before = _until(f"warren_raft_term and warren_raft_commit_index > 0 for {queue}",
                                     raft_seen, logs)
        assert term >= 1, f"warren_raft_term{selector} = {term}"
        assert prometheus.value(f"warren_raft_is_leader{selector}") == 1.0  # the one member leads
        assert prometheus.value(f"warren_raft_members{selector}") == 1.0

        published = 5
        for number in range(published):
            channel.basic_publish("", queue, b"m%d" % number, pika.BasicProperties(delivery_mode=2),
                                  mandatory=True)  # confirmed: committed before it returns

    # Each confirmed publish is a committed Raft command, so the commit index
    # Prometheus sees grows by at least that many.
    def commit_grew() -> float | None:
        still_running()
        commit = prometheus.value(f"warren_raft_commit_index{selector}")
        return commit if commit is not None and commit >= commit_before + published else None
    commit_after = _until(f"warren_raft_commit_index to grow by {published} from {commit_before}", commit_grew, logs)

    def wal_size() -> float | None:
        still_running()
        size = prometheus.value('warren_wal_size_bytes{job="warren"}')
        return size if size is not None and size > 0 else None
    wal_bytes = _until("warren_wal_size_bytes > 0", wal_size, logs)
    term_after = prometheus.value(f"warren_raft_term{selector}")
    assert term_after is not None and term_after >= term, (term, term_after)

    print(f"\n[prometheus] via /api/v1/query: warren_raft_term={term:g}, warren_raft_commit_index "
          f"{commit_before:g} -> {commit_after:g} after {published} publishes, warren_wal_size_bytes={wal_bytes:g}")


def test_compose_prometheus_config_is_valid(prometheus_binary: str) -> None:
    """deploy/prometheus.yml, the config docker-compose.yml mounts, as Prometheus's own
    promtool reads it (the package ships promtool beside prometheus)."""
    promtool = Path(prometheus_binary).with_name("promtool")
    assert promtool.exists(), f"no promtool beside {prometheus_binary}"
    config = Path(__file__).resolve().parents[2] / "deploy" / "prometheus.yml"
    proc = subprocess.run([str(promtool), "check", "config", str(config)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, f"promtool check config {config}:\n{proc.stdout}\n{proc.stderr}"
