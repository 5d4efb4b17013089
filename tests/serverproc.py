"""Start and stop real ``warren-server`` processes on free loopback ports."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from warren.verification.ports import listen_port

STARTUP_TIMEOUT_SECONDS = 20.0
STOP_TIMEOUT_SECONDS = 10.0


def free_port() -> int:
    """A port nothing listens on, on every address (a container binds them all)."""
    return listen_port("0.0.0.0")


@dataclass
class ServerProcess:
    amqp_port: int
    metrics_port: int
    data_dir: Path
    env: dict
    process: subprocess.Popen | None = None
    log_path: Path | None = None   # default: a new file beside the data directory, in the test's own folder
    # what follows the interpreter: the server module, or a wrapper that patches something first
    command: tuple[str, ...] = ("-m", "warren.broker")   # what the interpreter runs (a test may wrap the server)

    def __post_init__(self) -> None:
        if self.log_path is None:
            self.data_dir.parent.mkdir(parents=True, exist_ok=True)
            handle, path = tempfile.mkstemp(prefix=f"warren-{self.data_dir.name}-", suffix=".log",
                                            dir=self.data_dir.parent)
            os.close(handle)
            self.log_path = Path(path)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F"

    def start(self, args: tuple[str, ...] = ()) -> "ServerProcess":
        return self.launch(args).wait_listening()

    def launch(self, args: tuple[str, ...] = ()) -> "ServerProcess":
        """Start the process without waiting for its port: a restarting cluster node
        opens it only once it caught up with its peers, so they start together."""
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, *self.command, *args], env=self.env, stdout=self._log, stderr=subprocess.STDOUT)
        return self

    def wait_listening(self) -> "ServerProcess":
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"warren-server exited with {self.process.returncode} at start:\n{self.log()}")
            metrics_port = int(self.env.get("WARREN_METRICS_PORT", self.metrics_port))   # 0: off
            if self._accepts(self.amqp_port) and (not metrics_port or self._accepts(metrics_port)):
                return self
            time.sleep(0.02)  # polling for the listeners, not synchronising with them
        self.stop()
        raise RuntimeError(f"warren-server did not listen on {self.amqp_port} in time:\n{self.log()}")

    @staticmethod
    def _accepts(port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT_SECONDS)
        self._log.close()
        return self.process.returncode


def start_together(servers) -> None:
    """Launch every server, then wait for each: cluster nodes open their AMQP
    ports only once they caught up with the metadata group, which needs a majority."""
    for server in servers:
        server.launch()
    for server in servers:
        server.wait_listening()


def make_server(tmp_path: Path, **env_overrides: str) -> ServerProcess:
    amqp_port, metrics_port = free_port(), free_port()
    data_dir = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARREN_")}
    env.update({
        "WARREN_AMQP_HOST": "127.0.0.1",
        "WARREN_AMQP_PORT": str(amqp_port),
        "WARREN_METRICS_HOST": "127.0.0.1",
        "WARREN_METRICS_PORT": str(metrics_port),
        "WARREN_DATA_DIR": str(data_dir),
        "WARREN_LOG_LEVEL": "info",
        "WARREN_NODE_PROCESSES": "1",   # the default is the machine's cores; tests of shards set their own
        "WARREN_LOOP_CPU_BINDING": "never",   # a test's nodes share the machine's CPUs; tests of binding set it
    })
    env.update(env_overrides)
    return ServerProcess(amqp_port, metrics_port, data_dir, env)
