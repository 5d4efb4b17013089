"""The container packaging, proven rather than hoped.

The ``container`` tests build the repository's Dockerfile with podman (there is no
Docker engine here, see deploy/container-base.sh for the base images that stand in
for python:3.11-slim), run the image with host networking on free ports, and talk
AMQP and HTTP to it.  They need root (rootful podman; apt-get to install podman on
a fresh machine) and FAIL, not skip, when that is missing, so a broken image cannot
hide behind a skip.  ``WARREN_SKIP_CONTAINER=1`` skips them for fast local runs.

``test_compose_runs_a_three_node_cluster`` runs docker-compose.yml itself with
podman-compose (installed at run time into a venv of its own): three nodes form a
cluster on the compose network, a quorum queue gets three replicas, a message goes
in through one node and out through another, and the compose file's Prometheus
(Debian's prometheus package, deploy/prometheus/Dockerfile, built FROM the
debootstrap base) scrapes the three nodes: the test asks its HTTP API for the
targets' ``up`` and a Warren metric. A small override file names the images the
test built and free host ports; everything else is the compose file as shipped.

podman's configuration is the test's own (CONTAINERS_CONF, in its temporary
directory); the host's /etc/containers/containers.conf is left as it was.

The other tests check docker-compose.yml, deploy/prometheus.yml and
deploy/warren.toml without running anything.
"""
from __future__ import annotations

import base64
import json
import logging
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.serverproc import free_port

REPO = Path(__file__).resolve().parent.parent
BASE_SCRIPT = REPO / "deploy" / "container-base.sh"
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]
IMAGE = "localhost/warren:pytest"
BASE_IMAGE = "localhost/python-base"
BOOKWORM_IMAGE = "localhost/bookworm-min"  # the debootstrap image container-base.sh makes
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
TEST_USER = "warren-test"
TEST_PASSWORD = "pytest-" + uuid.uuid4().hex[:12]

# Applied to every test that builds or runs the image.  The first one pays for
# preparing the machine and building the image, cold several minutes: far more
# than the suite's default per-test timeout.
# WARREN_SKIP_CONTAINER=1 is for quick local runs only; CI never sets it.
_skip_on_request = pytest.mark.skipif(
    os.environ.get("WARREN_SKIP_CONTAINER") == "1",
    reason="WARREN_SKIP_CONTAINER=1: container tests skipped on request")


def container(test):
    return _skip_on_request(pytest.mark.container(test))


slow_timeout = pytest.mark.timeout(1800)


# ---------------------------------------------------------------------------
# helpers


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    if isinstance(data, bytes):
        return data.decode("utf-8", "replace")
    return data


def _tail(data: str | bytes | None, lines: int = 40) -> str:
    return "\n".join(_text(data).splitlines()[-lines:])


def _run(
    cmd: list[str], timeout: float, check: bool = True, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """subprocess.run with a timeout, failing the test with the output on error."""
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, **kwargs
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"timed out after {timeout:.0f} s: {shlex.join(cmd)}\n"
            f"--- stdout ---\n{_tail(exc.stdout)}\n--- stderr ---\n{_tail(exc.stderr)}"
        )
    if check and proc.returncode != 0:
        pytest.fail(
            f"exit {proc.returncode}: {shlex.join(cmd)}\n"
            f"--- stdout ---\n{_tail(proc.stdout)}\n--- stderr ---\n{_tail(proc.stderr)}"
        )
    return proc


def _container_state(name: str) -> str:
    proc = _run(
        PODMAN + ["inspect", "--format", "{{.State.Status}}", name],
        timeout=30,
        check=False,
    )
    return proc.stdout.strip() if proc.returncode == 0 else "missing"


def _container_logs(name: str) -> str:
    proc = _run(PODMAN + ["logs", "--tail", "60", name], timeout=30, check=False)
    return f"{proc.stdout}{proc.stderr}".strip() or "(no output)"


def _retry(what: str, check: Callable[[], Any], timeout: float, logs: Callable[[], str],
           still_up: Callable[[], None] = lambda: None, missing: str = "not ready") -> Any:
    """Call check() until it returns a truthy value; fail with the logs after
    `timeout` (or when still_up() fails)."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = check()
            if result:
                return result
        except Exception as exc:  # noqa: BLE001 - keep the last one for the message
            last_error = exc
        still_up()
        if time.monotonic() > deadline:
            pytest.fail(f"{what} {missing} after {timeout:.0f} s (last error: {last_error!r}); logs:\n{logs()}")
        time.sleep(0.2)  # polling a condition with a deadline


def _poll(
    what: str, check: Callable[[], Any], timeout: float, container_name: str
) -> Any:
    """Call check() until it returns a truthy value; fail if the container dies."""
    def still_up() -> None:
        state = _container_state(container_name)
        if state != "running":
            pytest.fail(
                f"container {container_name} is {state} while waiting for {what}; "
                f"logs:\n{_container_logs(container_name)}"
            )
    return _retry(what, check, timeout, lambda: _container_logs(container_name), still_up)


def _port_accepts(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1):
        return True


def _fetch_metrics(port: int) -> tuple[int, str, str]:
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        return (
            response.status,
            response.headers.get("Content-Type", ""),
            response.read().decode("utf-8", "replace"),
        )


def _start_container(image: str, name: str, amqp_port: int, metrics_port: int,
                     processes: tuple[str, ...] = ("--env", "WARREN_NODE_PROCESSES=1")) -> None:
    """`processes`: the node's count, or the podman options it derives from (tests run one)."""
    users = [
        {"name": "guest", "password": "guest"},
        {"name": TEST_USER, "password": TEST_PASSWORD},
    ]
    _run(
        PODMAN
        + [
            "run", "--detach", "--name", name, "--network", "host",
            "--label", "warren-pytest=1",
            "--env", f"WARREN_AMQP_PORT={amqp_port}",
            "--env", f"WARREN_METRICS_PORT={metrics_port}",
            "--env", "WARREN_AMQP_HOST=0.0.0.0",
            "--env", f"WARREN_NODE_NAME=warren@{name}",
            "--env", "WARREN_LOG_LEVEL=info",
            *processes,
            "--env", f"WARREN_USERS={json.dumps(users)}",
            image,
        ],
        timeout=120,
    )


def _remove_container(name: str) -> None:
    # --volumes: the anonymous volume of the image's VOLUME goes with it
    _run(PODMAN + ["rm", "--force", "--volumes", "--time", "5", name], timeout=60, check=False)


# ---------------------------------------------------------------------------
# fixtures


HOST_CONTAINERS_CONF = Path("/etc/containers/containers.conf")


def _file_state(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


@pytest.fixture(scope="module")
def containers_conf(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """podman's configuration for these tests, in their temporary directory.

    The sandbox forbids raising rlimits, so podman must not set default ulimits.
    podman reads CONTAINERS_CONF instead of /etc/containers/containers.conf; it is
    set in this process's environment for the module, so that every podman run
    here (container-base.sh, podman-compose, _run) sees it. The host's own file is
    left as it was, and checked to be so at the end."""
    conf = tmp_path_factory.mktemp("containers") / "containers.conf"
    conf.write_text("[containers]\ndefault_ulimits = []\n")
    host_before = _file_state(HOST_CONTAINERS_CONF)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CONTAINERS_CONF", str(conf))
        # builds keep no intermediate images in the host's storage (podman, podman-compose)
        patch.setenv("BUILDAH_LAYERS", "false")
        yield conf
    assert _file_state(HOST_CONTAINERS_CONF) == host_before, \
        f"the container tests changed the host's {HOST_CONTAINERS_CONF}"


@pytest.fixture(scope="module")
def image(containers_conf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Prepare the machine (podman, base images) and build the Dockerfile; at the end,
    remove the image, so that the host's storage keeps only the base images."""
    if os.geteuid() != 0:
        pytest.fail(
            "the container tests need root (rootful podman, apt-get, debootstrap); "
            f"running as uid {os.geteuid()}. Run the suite as root, or set "
            "WARREN_SKIP_CONTAINER=1 to skip them locally."
        )
    if shutil.which("podman") is None and shutil.which("apt-get") is None:
        pytest.fail(
            "podman is not installed and apt-get is not available to install it: "
            "the container tests need a Debian-family machine (or podman + runc + "
            "debootstrap installed). Set WARREN_SKIP_CONTAINER=1 to skip them locally."
        )

    # The script writes the pip.conf for builds where it is told (here: the test's
    # temporary directory, as CONTAINERS_CONF is).
    pip_conf = tmp_path_factory.mktemp("podman-build") / "pip.conf"
    started = time.monotonic()
    _run(["bash", str(BASE_SCRIPT)], timeout=1500, env={**os.environ, "PIP_CONF": str(pip_conf)})
    prepared = time.monotonic()

    build = PODMAN + [
        "build", "--isolation", "chroot", "--network", "host",
        # docker format keeps the HEALTHCHECK (OCI image config has no such field)
        "--format", "docker",
        "--build-arg", f"BASE_IMAGE={BASE_IMAGE}",
        "--file", str(REPO / "Dockerfile"),
        "--tag", IMAGE,
    ]
    if HOST_CA.is_file():
        # pip inside the build must trust this machine's certificate bundle.
        pip_conf.write_text("[global]\ncert = /etc/host-ca.crt\n")
        build += [
            "--volume", f"{pip_conf}:/etc/pip.conf:ro",
            "--volume", f"{HOST_CA}:/etc/host-ca.crt:ro",
        ]
    images_before = _image_ids()
    try:
        _run(build + [str(REPO)], timeout=1200)
        done = time.monotonic()
        print(
            f"\n[container] machine prepared in {prepared - started:.1f} s, "
            f"image built in {done - prepared:.1f} s",
            file=sys.stderr,
        )
        yield IMAGE
    finally:
        _run(PODMAN + ["rmi", "--force", IMAGE], timeout=120, check=False)
    left = _image_ids() - images_before
    assert not left, f"the container tests left images in the host's storage: {sorted(left)}"


def _image_ids() -> set[str]:
    return set(_run(PODMAN + ["images", "--all", "--quiet", "--no-trunc"], timeout=60).stdout.split())


@pytest.fixture(scope="module")
def warren(image: str) -> Iterator[dict[str, Any]]:
    """One running container, host networking, on free ports."""
    name = f"warren-pytest-{uuid.uuid4().hex[:10]}"
    amqp_port = free_port()
    metrics_port = free_port()
    while metrics_port == amqp_port:
        metrics_port = free_port()
    try:
        started = time.monotonic()
        _start_container(image, name, amqp_port, metrics_port)
        _poll(
            f"AMQP port {amqp_port}",
            lambda: _port_accepts(amqp_port),
            timeout=90,
            container_name=name,
        )
        print(
            f"\n[container] {name} accepted AMQP after "
            f"{time.monotonic() - started:.1f} s",
            file=sys.stderr,
        )
        yield {"name": name, "amqp_port": amqp_port, "metrics_port": metrics_port}
    finally:
        _remove_container(name)


# ---------------------------------------------------------------------------
# the image, running


def _roundtrip(port: int, user: str, password: str) -> None:
    params = pika.ConnectionParameters(
        host="127.0.0.1",
        port=port,
        credentials=pika.PlainCredentials(user, password),
        connection_attempts=1,
        socket_timeout=10,
        blocked_connection_timeout=30,
    )
    connection = pika.BlockingConnection(params)
    try:
        channel = connection.channel()
        queue = f"container-test-{user}-{uuid.uuid4().hex[:8]}"
        declared = channel.queue_declare(queue=queue, auto_delete=False)
        assert declared.method.queue == queue
        body = f"hello from {user} {uuid.uuid4().hex}".encode()
        channel.basic_publish(
            exchange="",
            routing_key=queue,
            body=body,
            properties=pika.BasicProperties(content_type="text/plain"),
        )
        deadline = time.monotonic() + 15
        while True:
            method, properties, got = channel.basic_get(queue=queue, auto_ack=False)
            if method is not None:
                break
            assert time.monotonic() < deadline, f"message never arrived on {queue}"
            connection.sleep(0.05)
        assert got == body
        assert properties.content_type == "text/plain"
        channel.basic_ack(method.delivery_tag)
        method, _, _ = channel.basic_get(queue=queue, auto_ack=True)
        assert method is None, "the acknowledged message was delivered again"
        channel.queue_delete(queue=queue)
    finally:
        if connection.is_open:
            connection.close()


@container
@slow_timeout
def test_amqp_roundtrip_as_guest_from_loopback(warren: dict[str, Any]) -> None:
    _roundtrip(warren["amqp_port"], "guest", "guest")


@container
@slow_timeout
def test_amqp_roundtrip_as_user_from_warren_users(warren: dict[str, Any]) -> None:
    _roundtrip(warren["amqp_port"], TEST_USER, TEST_PASSWORD)


@container
@slow_timeout
def test_amqp_wrong_password_is_refused(
    warren: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.CRITICAL, logger="pika")  # the refusal is expected
    params = pika.ConnectionParameters(
        host="127.0.0.1",
        port=warren["amqp_port"],
        credentials=pika.PlainCredentials(TEST_USER, "not-the-password"),
        connection_attempts=1,
        socket_timeout=10,
    )
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika.BlockingConnection(params).close()


@container
@slow_timeout
def test_metrics_endpoint(warren: dict[str, Any]) -> None:
    status, content_type, body = _poll(
        f"metrics on port {warren['metrics_port']}",
        lambda: _fetch_metrics(warren["metrics_port"]),
        timeout=30,
        container_name=warren["name"],
    )
    assert status == 200
    assert content_type.startswith("text/plain"), content_type
    assert re.search(r"^# TYPE \S+ (counter|gauge|histogram|summary|untyped)$", body, re.M), body[:2000]
    samples = [line for line in body.splitlines() if line and not line.startswith("#")]
    assert samples, "no samples in /metrics"


@container
@slow_timeout
def test_runs_as_non_root_with_writable_data_dir(warren: dict[str, Any]) -> None:
    uid = _run(PODMAN + ["exec", warren["name"], "id", "-u"], timeout=60).stdout.strip()
    assert uid.isdigit() and int(uid) != 0, f"container runs as uid {uid!r}"
    env = _run(
        PODMAN + ["exec", warren["name"], "sh", "-c", 'echo "$WARREN_DATA_DIR"'],
        timeout=60,
    ).stdout.strip()
    assert env == "/var/lib/warren"
    _run(
        PODMAN + ["exec", warren["name"], "sh", "-c", "test -d /var/lib/warren -a -w /var/lib/warren"],
        timeout=60,
    )


@container
@slow_timeout
def test_a_container_limited_to_one_cpu_runs_one_process(image: str) -> None:
    """`--cpus 1` on a machine of more: the default count follows the container's CPU
    quota, not the host's cores (broker/node/usable_cores.py)."""
    name = f"warren-pytest-cpus-{uuid.uuid4().hex[:10]}"
    amqp_port = free_port()
    try:
        _start_container(image, name, amqp_port, free_port(), processes=("--cpus", "1"))
        _poll(f"AMQP port {amqp_port}", lambda: _port_accepts(amqp_port), timeout=90, container_name=name)
        listing = _run(PODMAN + ["exec", name, "ls", "/var/lib/warren"], timeout=60).stdout.split()
        assert "shard-ports.json" not in listing and "shard-0" not in listing, \
            f"a node in a one-CPU container started shards: {listing}; logs:\n{_container_logs(name)}"
    finally:
        _remove_container(name)


@container
@slow_timeout
def test_logs_are_json_lines(warren: dict[str, Any]) -> None:
    # The image sets WARREN_LOG_FORMAT=json: one JSON object per line, for collectors.
    proc = _run(PODMAN + ["logs", warren["name"]], timeout=60)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert lines, "the server logged nothing at start"
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            pytest.fail(f"log line is not JSON: {line!r}")
        assert isinstance(record, dict) and "event" in record, line


@container
@slow_timeout
def test_healthcheck_reports_healthy(warren: dict[str, Any]) -> None:
    # Runs the image's HEALTHCHECK command now (no systemd here for the timer).
    def healthy() -> bool:
        proc = _run(
            PODMAN + ["healthcheck", "run", warren["name"]], timeout=60, check=False
        )
        return proc.returncode == 0

    _poll("a passing HEALTHCHECK", healthy, timeout=60, container_name=warren["name"])


@container
@slow_timeout
def test_stops_promptly_on_sigterm(image: str) -> None:
    """`docker stop` sends SIGTERM to PID 1, the server: it must exit, not wait for SIGKILL."""
    name = f"warren-pytest-stop-{uuid.uuid4().hex[:10]}"
    amqp_port = free_port()
    metrics_port = free_port()
    try:
        _start_container(image, name, amqp_port, metrics_port)
        _poll(
            f"AMQP port {amqp_port}",
            lambda: _port_accepts(amqp_port),
            timeout=90,
            container_name=name,
        )
        started = time.monotonic()
        _run(PODMAN + ["stop", "--time", "20", name], timeout=90)
        elapsed = time.monotonic() - started
        code = _run(
            PODMAN + ["inspect", "--format", "{{.State.ExitCode}}", name], timeout=30
        ).stdout.strip()
        logs = _container_logs(name)
        assert elapsed < 15, f"took {elapsed:.1f} s to stop on SIGTERM; logs:\n{logs}"
        assert code == "0", f"exit code {code} after SIGTERM; logs:\n{logs}"
    finally:
        _remove_container(name)


# ---------------------------------------------------------------------------
# docker-compose.yml, running: podman-compose, three nodes and Prometheus

# podman-compose reads the compose file as `docker compose` does. It is installed at
# run time into a venv of the test's own (like podman itself, by container-base.sh),
# so the package's test extras stay free of a tool only this test uses.
PODMAN_COMPOSE = "podman-compose==1.6.0"
COMPOSE_NODES = ["warren1", "warren2", "warren3"]


@pytest.fixture(scope="module")
def podman_compose(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    venv = tmp_path_factory.mktemp("podman-compose") / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], timeout=120)
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
          "--disable-pip-version-check", PODMAN_COMPOSE], timeout=600)
    # podman's global flags for this machine (runc, cgroupfs), as PODMAN has them
    return [str(venv / "bin" / "podman-compose"), "--podman-args", " ".join(PODMAN[1:])]


def _free_ports(count: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(free_port())
    return sorted(ports)


def _compose_override(warren_image: str, prometheus_image: str, ports: list[int]) -> str:
    """What differs from docker-compose.yml here: the images this test built from
    local base images (the compose file would build them FROM Docker Hub's), and
    free host ports instead of 5672-5674, 15692-15694, 9090."""
    lines = ["services:"]
    for offset, node in enumerate(COMPOSE_NODES):
        lines += [
            f"  {node}:",
            f"    image: {warren_image}",
            "    ports: !override",
            f'      - "{ports[offset]}:5672"',
            f'      - "{ports[3 + offset]}:15692"',
        ]
    lines += [
        "  prometheus:",
        f"    image: {prometheus_image}",
        "    ports: !override",
        f'      - "{ports[6]}:9090"',
    ]
    return "\n".join(lines) + "\n"


def _compose_logs(project: str) -> str:
    names = _run(PODMAN + ["ps", "-a", "--filter", f"label=io.podman.compose.project={project}",
                           "--format", "{{.Names}}"], timeout=60, check=False).stdout.split()
    return "\n".join(f"--- {name} ---\n{_container_logs(name)}" for name in names) or "(no containers)"


def _wait(what: str, check: Callable[[], Any], timeout: float, project: str) -> Any:
    return _retry(what, check, timeout, lambda: _compose_logs(project), missing="not seen")


def _api(port: int, path: str, password: str) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    credentials = base64.b64encode(f"admin:{password}".encode()).decode()
    request.add_header("Authorization", f"Basic {credentials}")
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def _admin_connection(port: int, password: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        host="127.0.0.1", port=port, credentials=pika.PlainCredentials("admin", password),
        connection_attempts=1, socket_timeout=10, blocked_connection_timeout=30))


@container
@slow_timeout
def test_compose_runs_a_three_node_cluster(image: str, podman_compose: list[str], tmp_path: Path) -> None:
    """docker-compose.yml as it is, under podman-compose: the three nodes find each
    other on the compose network and form one cluster; a quorum queue declared
    through warren1 gets a replica on each node; a message published through
    warren2 is consumed through warren3; Prometheus, built from
    deploy/prometheus/Dockerfile and given the compose file's own config mount and
    flags, reports the three targets up and the queue's Raft metrics from each
    node through its /api/v1/query."""
    started = time.monotonic()
    project = f"warrenpytest{uuid.uuid4().hex[:10]}"
    # Tags of this test's own: a concurrent rebuild of IMAGE cannot change them under it.
    warren_image = f"localhost/warren:{project}"
    prometheus_image = f"localhost/warren-prometheus:{project}"
    _run(PODMAN + ["tag", image, warren_image], timeout=60)
    _run(PODMAN + ["build", "--isolation", "chroot", "--network", "host", "--format", "docker",
                   "--build-arg", f"BASE_IMAGE={BOOKWORM_IMAGE}", "--tag", prometheus_image,
                   str(REPO / "deploy" / "prometheus")], timeout=600)
    ports = _free_ports(7)
    override = tmp_path / "compose.override.yml"
    override.write_text(_compose_override(warren_image, prometheus_image, ports))
    password = "pw-" + uuid.uuid4().hex[:12]
    env = {**os.environ, "WARREN_ADMIN_PASSWORD": password, "WARREN_CLUSTER_SECRET": uuid.uuid4().hex}
    compose = podman_compose + ["-p", project, "-f", str(REPO / "docker-compose.yml"), "-f", str(override)]
    amqp = dict(zip(COMPOSE_NODES, ports[:3]))
    metrics = dict(zip(COMPOSE_NODES, ports[3:6]))
    everyone = [f"warren@{node}" for node in COMPOSE_NODES]
    try:
        _run(compose + ["up", "-d", "--no-build"], timeout=300, env=env)
        for node in COMPOSE_NODES:
            _wait(f"{node} to see all three nodes running",
                  lambda n=node: _api(metrics[n], "/api/overview", password)["running_nodes"] == everyone,
                  timeout=90, project=project)
        clustered = time.monotonic()

        queue = "compose-quorum"
        with _admin_connection(amqp["warren1"], password) as connection:
            connection.channel().queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})

        def placed(node: str) -> dict | None:
            view = next((q for q in _api(metrics[node], "/api/queues", password) if q["name"] == queue), None)
            return view if view and view["leader"] and sorted(view["members"]) == everyone else None

        for node in COMPOSE_NODES:
            view = _wait(f"{node} to list {queue} with a leader and three members", lambda n=node: placed(n),
                         timeout=60, project=project)
            assert view["type"] == "quorum", view

        bodies = [f"through warren2 #{number}".encode() for number in range(10)]
        with _admin_connection(amqp["warren2"], password) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            for body in bodies:
                channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2), mandatory=True)
        received = []
        with _admin_connection(amqp["warren3"], password) as connection:
            channel = connection.channel()
            for method, _, body in channel.consume(queue, inactivity_timeout=15):
                assert method is not None, f"consuming through warren3 stalled after {received}"
                received.append(body)
                channel.basic_ack(method.delivery_tag)
                if len(received) == len(bodies):
                    break
            channel.cancel()
        assert received == bodies

        targets = {f"{node}:15692" for node in COMPOSE_NODES}

        def query(promql: str) -> dict[str, float]:
            """{instance: value} of an instant query through Prometheus's API."""
            answer = _api_plain(ports[6], "/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
            assert answer["status"] == "success", answer
            return {r["metric"]["instance"]: float(r["value"][1]) for r in answer["data"]["result"]}

        def all_up() -> dict[str, float] | None:
            up = query('up{job="warren"}')
            return up if up == {target: 1.0 for target in targets} else None

        up = _wait('Prometheus: up{job="warren"} == 1 for warren1-3:15692', all_up, timeout=90, project=project)

        # Every node holds a replica of the queue: three series, each a group of three
        # members, with a commit index past the ten publishes.
        selector = f'{{job="warren",vhost="/",queue="{queue}"}}'

        def raft_seen() -> tuple[dict[str, float], dict[str, float]] | None:
            members = query(f"warren_raft_members{selector}")
            commit = query(f"warren_raft_commit_index{selector}")
            if set(members) == targets and set(commit) == targets and min(commit.values()) >= len(bodies):
                return members, commit
            return None

        members, commit = _wait(f"Prometheus: warren_raft_members and warren_raft_commit_index of {queue} "
                                "from all three nodes", raft_seen, timeout=90, project=project)
        assert set(members.values()) == {3.0}, members
        print(f"\n[container] compose: cluster of three in {clustered - started:.1f} s, "
              f"test done in {time.monotonic() - started:.1f} s; Prometheus /api/v1/query: up={up}, "
              f"warren_raft_members={members}, warren_raft_commit_index={commit}", file=sys.stderr)
    finally:
        down = _run(compose + ["down", "--volumes", "--timeout", "10"], timeout=180, check=False, env=env)
        left = _run(PODMAN + ["ps", "-aq", "--filter", f"label=io.podman.compose.project={project}"],
                    timeout=60, check=False).stdout.split()
        if left:  # down failed part way: remove what is left of this project
            _run(PODMAN + ["rm", "--force", "--time", "5", *left], timeout=120, check=False)
            _run(PODMAN + ["volume", "rm", "--force",
                           *[f"{project}_{name}" for name in (*[f"{n}-data" for n in COMPOSE_NODES],
                                                               "prometheus-data")]],
                 timeout=60, check=False)
            _run(PODMAN + ["network", "rm", "--force", f"{project}_default"], timeout=60, check=False)
        _run(PODMAN + ["untag", warren_image, warren_image], timeout=60, check=False)
        _run(PODMAN + ["rmi", prometheus_image], timeout=60, check=False)
        assert down.returncode == 0, f"podman-compose down failed:\n{_tail(down.stdout)}\n{_tail(down.stderr)}"
        assert not left, f"podman-compose down left containers {left}"


def _api_plain(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return json.loads(response.read())


# ---------------------------------------------------------------------------
# the deployment files, read (no YAML library here: indentation-based reading
# of the simple block style these files use)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _yaml_block(lines: list[str], key: str) -> list[str]:
    """The lines nested under ``key:`` at the outermost level of ``lines``."""
    top = min(
        (_indent(line) for line in lines if line.strip() and not line.lstrip().startswith("#")),
        default=0,
    )
    for index, line in enumerate(lines):
        match = re.match(rf"^ {{{top}}}{re.escape(key)}:\s*(&[\w-]+\s*)?(#.*)?$", line)
        if match:
            indent = top
            block = []
            for inner in lines[index + 1 :]:
                if inner.strip() and not inner.lstrip().startswith("#"):
                    if _indent(inner) <= indent:
                        break
                block.append(inner)
            return block
    raise AssertionError(f"no '{key}:' block found")


def _yaml_keys(block: list[str]) -> set[str]:
    indents = [
        _indent(line)
        for line in block
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not indents:
        return set()
    top = min(indents)
    return {
        match.group(1)
        for line in block
        if (match := re.match(rf"^ {{{top}}}([A-Za-z0-9_.-]+):", line))
    }


def _check_yaml_shape(path: Path) -> list[str]:
    text = path.read_text()
    assert "\t" not in text, f"{path.name}: tabs are not allowed in YAML indentation"
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        if line.strip() and not line.lstrip().startswith("#"):
            indent = _indent(line)
            assert indent % 2 == 0, f"{path.name}:{number}: odd indentation"
            stripped = line.strip()
            assert (
                stripped.startswith("- ") or ":" in stripped
            ), f"{path.name}:{number}: neither a key nor a list item: {line!r}"
    return lines


def test_compose_file_defines_three_nodes_and_prometheus() -> None:
    lines = _check_yaml_shape(REPO / "docker-compose.yml")
    assert {"services", "volumes", "x-warren-env"} <= _yaml_keys(lines)
    services = _yaml_block(lines, "services")
    nodes = ["warren1", "warren2", "warren3"]
    assert {*nodes, "prometheus"} <= _yaml_keys(services)
    build = "\n".join(_yaml_block(_yaml_block(services, "warren1"), "build"))
    assert re.search(r"^\s*dockerfile:\s*Dockerfile\s*$", build, re.M)
    for offset, node in enumerate(nodes):
        service = _yaml_block(services, node)
        assert {"environment", "ports", "volumes"} <= _yaml_keys(service), node
        ports = "\n".join(_yaml_block(service, "ports"))
        assert f'"{5672 + offset}:5672"' in ports and f'"{15692 + offset}:15692"' in ports, node
        volumes = "\n".join(_yaml_block(service, "volumes"))
        assert re.search(rf"^\s*- {node}-data:/var/lib/warren\s*$", volumes, re.M), node
        assert f"{node}-data" in _yaml_keys(_yaml_block(lines, "volumes"))
        environment = "\n".join(_yaml_block(service, "environment"))
        assert "<<: *warren-env" in environment and f"WARREN_NODE_NAME: warren@{node}" in environment, node

    environment = "\n".join(_yaml_block(lines, "x-warren-env"))
    assert re.search(r'^\s*WARREN_METRICS_PORT:\s*"15692"\s*$', environment, re.M)
    match = re.search(r"^\s*WARREN_USERS:\s*'(.*)'\s*$", environment, re.M)
    assert match, "WARREN_USERS missing from the shared environment"
    # compose interpolates ${VAR:-default}; the result must be the JSON list of users
    users = json.loads(re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", match.group(1)))
    names = {user["name"] for user in users}
    assert names - {"guest"}, "compose needs a non-guest user: guest is loopback-only"
    assert all(user.get("password") for user in users)
    match = re.search(r"^\s*WARREN_CLUSTER_NODES:\s*'(.*)'\s*$", environment, re.M)
    assert match, "WARREN_CLUSTER_NODES missing from the shared environment"
    cluster = json.loads(match.group(1))
    assert [n["name"] for n in cluster] == [f"warren@{node}" for node in nodes]
    assert [n["host"] for n in cluster] == nodes
    assert "WARREN_CLUSTER_SECRET" in environment

    prometheus = _yaml_block(services, "prometheus")
    # built from Debian's package (deploy/prometheus/Dockerfile), not pulled from Docker Hub
    build = "\n".join(_yaml_block(prometheus, "build"))
    assert re.search(r"^\s*context:\s*deploy/prometheus\s*$", build, re.M), build
    dockerfile = (REPO / "deploy" / "prometheus" / "Dockerfile").read_text()
    assert re.search(r"apt-get install .*\bprometheus\b", dockerfile), "deploy/prometheus/Dockerfile"
    mounts = "\n".join(_yaml_block(prometheus, "volumes"))
    assert "./deploy/prometheus.yml:/etc/prometheus/prometheus.yml" in mounts
    assert (REPO / "deploy" / "prometheus.yml").is_file()


def test_prometheus_scrapes_every_node() -> None:
    lines = _check_yaml_shape(REPO / "deploy" / "prometheus.yml")
    assert "scrape_configs" in _yaml_keys(lines)
    jobs = _yaml_block(lines, "scrape_configs")
    start = next(
        (i for i, line in enumerate(jobs) if re.match(r"^\s*- job_name:\s*['\"]?warren['\"]?\s*$", line)),
        None,
    )
    assert start is not None, "no scrape job named warren"
    indent = _indent(jobs[start])
    warren_job = [jobs[start]]
    for line in jobs[start + 1 :]:
        if line.strip() and _indent(line) <= indent:
            break
        warren_job.append(line)
    text = "\n".join(warren_job)
    assert re.search(r"^\s*metrics_path:\s*/metrics\s*$", text, re.M)
    for node in ("warren1", "warren2", "warren3"):
        assert re.search(rf"^\s*- ['\"]?{node}:15692['\"]?\s*$", text, re.M), text


def test_dockerfile_defaults() -> None:
    text = (REPO / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim$", text, re.M)
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.M)
    assert re.search(r"^EXPOSE 5672 15692$", text, re.M)
    assert re.search(r'^VOLUME \["/var/lib/warren"\]$', text, re.M)
    assert re.search(r'^CMD \["warren-server"\]$', text, re.M)
    assert "HEALTHCHECK" in text


def test_example_toml_is_valid_configuration() -> None:
    path = REPO / "deploy" / "warren.toml"
    raw = tomllib.loads(path.read_text())
    for key in (
        "node_name", "amqp_host", "amqp_port", "metrics_port", "data_dir",
        "log_level", "log_format", "frame_max", "channel_max", "heartbeat", "users",
    ):
        assert key in raw, f"deploy/warren.toml lacks {key}"
    # The server's own loader (unknown keys are an error there), run from the
    # repository, on the file's values only, whatever WARREN_* this shell has.
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARREN_")}
    script = (
        "import json, sys\n"
        "from config import load_settings\n"
        "s = load_settings(sys.argv[1])\n"
        "print(json.dumps({'amqp_port': s.amqp_port, 'metrics_port': s.metrics_port,"
        " 'users': sorted(u.name for u in s.users)}))\n"
    )
    proc = _run([sys.executable, "-c", script, str(path)], timeout=60, cwd=REPO, env=env)
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded["amqp_port"] == raw["amqp_port"]
    assert loaded["metrics_port"] == raw["metrics_port"]
    assert loaded["users"] == sorted(u["name"] for u in raw["users"])
