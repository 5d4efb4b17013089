"""The warren-server process as an operator sees it.

Configuration errors (fail fast, one line naming the field), --help, file vs
environment precedence, graceful SIGTERM (320 CONNECTION_FORCED), heartbeats,
JSON logs that never contain a password, configured users, the metrics
endpoint.
"""
from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pika
import pytest
from pamqp import commands as spec
from pamqp.heartbeat import Heartbeat

from tests.integration.quorum_cluster import api
from tests.integration.raw_async_amqp import Closed, RawClient
from tests.serverproc import free_port, make_server

pytestmark = pytest.mark.timeout(60)

BAD_CONFIG_EXIT_SECONDS = 10.0
SIGTERM_EXIT_SECONDS = 8.0
ALICE_PASSWORD = "S3cretPW"
WRONG_PASSWORD = "Wr0ngPW77"
USERS = json.dumps([{"name": "alice", "password": ALICE_PASSWORD},
                    {"name": "guest", "password": "guest"}])


def run_broker(env: dict, *args: str, timeout: float = BAD_CONFIG_EXIT_SECONDS) -> subprocess.CompletedProcess:
    """Run ``python -m warren.broker`` expecting it to exit by itself; fail if it does not."""
    started = time.monotonic()
    try:
        result = subprocess.run([sys.executable, "-m", "warren.broker", *args], env=env, capture_output=True,
                                text=True, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"python -m warren.broker {' '.join(args)} was still running after {timeout}s "
                    f"(stderr so far: {error.stderr!r})")
    result.elapsed = time.monotonic() - started
    return result


def connect(server, user: str = "guest", password: str = "guest", **kwargs) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", server.amqp_port, "/", pika.PlainCredentials(user, password),
        connection_attempts=1, socket_timeout=5, blocked_connection_timeout=10, **kwargs))


def scrape(server) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5) as response:
        assert response.status == 200, f"metrics endpoint answered {response.status}"
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            values[key] = float(value)
    return values


# -- configuration ------------------------------------------------------------

@pytest.mark.parametrize("variable, value, field", [
    ("WARREN_AMQP_PORT", "notaport", "amqp_port"),
    ("WARREN_AMQP_PORT", "70000", "amqp_port"),
    ("WARREN_LOG_FORMAT", "xml", "log_format"),
    ("WARREN_LOG_LEVEL", "loud", "log_level"),
    ("WARREN_HEARTBEAT", "-1", "heartbeat"),
    ("WARREN_FRAME_MAX", "100", "frame_max"),
    ("WARREN_USERS", "not json", "users"),
])
def test_bad_environment_value_fails_fast_naming_the_field(tmp_path, variable, value, field):
    env = make_server(tmp_path, **{variable: value}).env
    result = run_broker(env)
    assert result.returncode != 0, f"{variable}={value!r}: the server exited 0; stderr={result.stderr!r}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"{variable}={value!r}: expected a one-line message on stderr, got:\n{result.stderr}"
    assert field in lines[0], f"{variable}={value!r}: stderr does not name {field!r}: {lines[0]!r}"
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("toml, field", [
    ('heartbeat = "often"\n', "heartbeat"),
    ("channel_max = 0\n", "channel_max"),
    ('log_format = "xml"\n', "log_format"),
    ("no_such_setting = 1\n", "no_such_setting"),
    ("[[users]]\nname = \"bob\"\n", "password"),
])
def test_bad_config_file_value_fails_fast_naming_the_field(tmp_path, toml, field):
    config = tmp_path / "warren.toml"
    config.write_text(toml)
    result = run_broker(make_server(tmp_path).env, "--config", str(config))
    assert result.returncode != 0, f"config {toml!r}: the server exited 0"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"config {toml!r}: expected a one-line message on stderr, got:\n{result.stderr}"
    assert field in lines[0], f"config {toml!r}: stderr does not name {field!r}: {lines[0]!r}"


@pytest.mark.parametrize("content, expected", [
    (None, "does not exist"),
    ("heartbeat = = 3\n", "not valid TOML"),
])
def test_missing_or_unparsable_config_file(tmp_path, content, expected):
    config = tmp_path / "warren.toml"
    if content is not None:
        config.write_text(content)
    result = run_broker(make_server(tmp_path).env, "--config", str(config))
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], f"expected one line saying {expected!r}, got {result.stderr!r}"


def test_help_and_version(tmp_path):
    env = make_server(tmp_path).env
    result = run_broker(env, "--help")
    assert result.returncode == 0, f"--help exited {result.returncode}: {result.stderr}"
    assert "usage" in result.stdout.lower() and "--config" in result.stdout, result.stdout
    version = run_broker(env, "--version")
    assert version.returncode == 0 and version.stdout.strip(), f"--version: {version.stdout!r} {version.stderr!r}"


def test_the_server_process_runs_with_huge_pages_for_malloc_under_the_pid_it_started_with(server):
    """warren-server executes itself again with glibc's huge-page tunable
    (broker/node/malloc_tuning.py): same pid, so a supervisor keeps track of it."""
    pid = server.process.pid
    environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    tunables = [item for item in environ if item.startswith(b"GLIBC_TUNABLES=")]
    assert tunables == [b"GLIBC_TUNABLES=glibc.malloc.hugetlb=1"], (
        f"the server (pid {pid}, listening) should run with glibc.malloc.hugetlb=1, has {tunables}")


def test_the_server_executes_itself_again_before_it_imports_its_modules(tmp_path):
    """The exec for huge pages comes first (broker/node/launch.py): after the server's
    imports, every start paid them twice (about half a second, hundreds of starts in a
    test run). Python's -X importtime, which the exec keeps, lists each import made."""
    env = {k: v for k, v in make_server(tmp_path).env.items() if k != "GLIBC_TUNABLES"}
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "warren.broker", "--version"], env=env,
                            capture_output=True, text=True, timeout=BAD_CONFIG_EXIT_SECONDS)
    assert result.returncode == 0, result.stderr[-2000:]
    imports = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line]
    assert imports.count("warren.broker.node.malloc_tuning") == 2, "one process before the exec, one after"
    assert imports.count("warren.broker.node.server") == 1, "the server's modules were imported before the exec"


def test_port_already_in_use_fails_with_a_message(tmp_path, server):
    env = make_server(tmp_path, WARREN_AMQP_PORT=str(server.amqp_port)).env
    result = run_broker(env)
    assert result.returncode != 0, "a second server on a used port exited 0"
    assert "cannot start" in result.stderr or "address" in result.stderr.lower(), result.stderr


async def test_config_file_values_are_used_and_environment_overrides_them(tmp_path):
    file_port = free_port()
    config = tmp_path / "warren.toml"
    config.write_text(f'node_name = "from-file@host"\nheartbeat = 17\nframe_max = 16384\namqp_port = {file_port}\n')
    # make_server sets WARREN_AMQP_PORT: the environment must win over the file's amqp_port.
    server = make_server(tmp_path, WARREN_FRAME_MAX="8192").start(args=("--config", str(config)))
    try:
        client = await RawClient.connect(server.amqp_port)
        try:
            await client.send(b"AMQP\x00\x00\x09\x01")
            start = await client.expect(spec.Connection.Start)
            assert start.server_properties.get("cluster_name") == "from-file@host", \
                f"node_name from the file not used: {start.server_properties!r}"
            await client.send_frame(0, spec.Connection.StartOk(
                client_properties={}, mechanism="PLAIN", response="\0guest\0guest", locale="en_US"))
            tune = await client.expect(spec.Connection.Tune)
            assert tune.heartbeat == 17, f"heartbeat from the file not used: tune={tune!r}"
            assert tune.frame_max == 8192, f"WARREN_FRAME_MAX=8192 should beat the file's 16384, got {tune.frame_max}"
        finally:
            await client.close()
        try:
            (await RawClient.connect(file_port, timeout=1)).writer.close()
            pytest.fail(f"the server also listens on the file's amqp_port {file_port}; the environment must win")
        except OSError:
            pass
    finally:
        server.stop()


# -- graceful shutdown -------------------------------------------------------

def test_sigterm_closes_clients_with_320_and_exits_zero(tmp_path):
    server = make_server(tmp_path).start()
    try:
        connection = connect(server)
        channel = connection.channel()
        channel.queue_declare("before-shutdown")
        server.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + SIGTERM_EXIT_SECONDS
        error = None
        while time.monotonic() < deadline:
            try:
                connection.process_data_events(time_limit=0.2)
            except pika.exceptions.ConnectionClosedByBroker as closed:
                error = closed
                break
        assert error is not None, f"the client saw no connection.close within {SIGTERM_EXIT_SECONDS}s of SIGTERM"
        assert error.reply_code == 320, f"expected 320 CONNECTION_FORCED, got {error.reply_code} {error.reply_text!r}"
        code = exit_status_after_sigterm(server, "the server")
        assert code == 0, f"the server exited {code} after SIGTERM:\n{server.log()}"
    finally:
        server.stop()


def exit_status_after_sigterm(server, what: str) -> int:
    """The status `server` exits with after the SIGTERM sent to it; fails if it does not exit in time."""
    try:
        return server.process.wait(SIGTERM_EXIT_SECONDS)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what} did not exit within {SIGTERM_EXIT_SECONDS}s of SIGTERM:\n{server.log()}")


def test_sigterm_with_no_clients_exits_zero_quickly(tmp_path):
    server = make_server(tmp_path).start()
    started = time.monotonic()
    code = server.stop(signal.SIGTERM)
    assert code == 0, f"exit code {code} after SIGTERM:\n{server.log()}"
    assert time.monotonic() - started < 3, "an idle server took more than 3 s to stop"


def test_sigterm_while_a_cluster_node_waits_for_its_peers_at_start_stops_it_then(tmp_path):
    """A node of a cluster opens its ports only once it caught up with its peers (up to
    cluster_startup_catch_up_seconds); a SIGTERM meanwhile stops it then, not after the wait
    (a shard restarted beside siblings that were stopping waited out the supervisor's 30 s
    and was killed)."""
    names = ["a@local", "b@local", "c@local"]
    ports = {name: free_port() for name in names}   # b and c never start
    members = json.dumps([{"name": name, "host": "127.0.0.1", "port": port} for name, port in ports.items()])
    server = make_server(tmp_path, WARREN_NODE_NAME="a@local", WARREN_CLUSTER_NODES=members,
                         WARREN_CLUSTER_HOST="127.0.0.1", WARREN_CLUSTER_PORT=str(ports["a@local"]),
                         WARREN_CLUSTER_SECRET="s3cret", WARREN_CLUSTER_STARTUP_CATCH_UP_SECONDS="120").launch()
    try:
        deadline = time.monotonic() + SIGTERM_EXIT_SECONDS
        while '"raft.started"' not in server.log():
            assert server.process.poll() is None and time.monotonic() < deadline, server.log()
            time.sleep(0.05)   # polling the log for the start, not synchronising with the node
        server.process.send_signal(signal.SIGTERM)
        code = exit_status_after_sigterm(server, "a node waiting for its peers at start")
        assert code == 0, f"the node exited {code} after SIGTERM at start:\n{server.log()}"
        assert '"server.stopped"' in server.log() and '"server.started"' not in server.log(), server.log()
    finally:
        server.stop()


# -- heartbeats ---------------------------------------------------------------

@pytest.fixture
def heartbeat_server(tmp_path):
    process = make_server(tmp_path, WARREN_HEARTBEAT="1").start()
    yield process
    process.stop()


async def test_silent_client_with_heartbeat_1_is_dropped(heartbeat_server):
    client = await RawClient.connect(heartbeat_server.amqp_port)
    loop = asyncio.get_running_loop()
    try:
        tune = await client.handshake(heartbeat=1)
        assert tune.heartbeat == 1
        opened = loop.time()
        frames = []
        while True:
            try:
                _, value = await client.read_frame(5.0, "a heartbeat or the socket closing")
            except Closed:
                break
            frames.append(value)
        elapsed = loop.time() - opened
    finally:
        await client.close()
    assert 1.0 <= elapsed <= 4.0, f"a silent client at heartbeat=1 was dropped after {elapsed:.2f}s, expected ~2-3 s"
    assert frames and all(isinstance(v, Heartbeat) for v in frames), \
        f"before dropping, the server should send heartbeats only, sent {frames!r}"


async def test_heartbeat_0_client_is_not_dropped_and_gets_no_heartbeats(heartbeat_server):
    client = await RawClient.connect(heartbeat_server.amqp_port)
    try:
        tune = await client.handshake(heartbeat=0)
        assert tune.heartbeat == 1, "the server should propose its configured heartbeat"
        try:
            _, value = await client.read_frame(3.5, "nothing")
            pytest.fail(f"heartbeat 0 was negotiated but the server sent {value!r}")
        except AssertionError as error:
            if "no nothing within" not in str(error):
                raise
        except Closed as error:
            pytest.fail(f"a heartbeat-0 client was dropped: {error}")
        await client.send_frame(1, spec.Channel.Open())
        await client.expect(spec.Channel.OpenOk)
    finally:
        await client.close()


async def test_client_sending_heartbeats_is_kept(heartbeat_server):
    client = await RawClient.connect(heartbeat_server.amqp_port)
    loop = asyncio.get_running_loop()
    try:
        await client.handshake(heartbeat=1)
        until = loop.time() + 3.5
        while loop.time() < until:
            try:
                _, value = await client.read_frame(0.5, "heartbeat")
            except AssertionError:
                pass  # no frame in this half second
            except Closed as error:
                pytest.fail(f"a client that heartbeats was dropped: {error}")
            await client.send(b"\x08\x00\x00\x00\x00\x00\x00\xce")
        await client.send_frame(1, spec.Channel.Open())
        await client.expect(spec.Channel.OpenOk)
    finally:
        await client.close()


# -- users and logs -----------------------------------------------------------

@pytest.fixture
def users_server(tmp_path):
    process = make_server(tmp_path, WARREN_USERS=USERS).start()
    yield process
    process.stop()


def test_configured_user_can_log_in_and_password_is_never_logged(users_server, name):
    connection = connect(users_server, "alice", ALICE_PASSWORD)
    channel = connection.channel()
    channel.queue_declare(name, auto_delete=True)
    channel.basic_publish("", name, b"hello from alice")
    method, _, body = channel.basic_get(name, auto_ack=True)
    assert body == b"hello from alice"
    connection.close()

    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as refused:
        connect(users_server, "alice", WRONG_PASSWORD)
    assert "ACCESS_REFUSED" in str(refused.value), f"wrong password: expected 403 ACCESS_REFUSED, got {refused.value!r}"
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(users_server, "mallory", ALICE_PASSWORD)

    assert users_server.stop() == 0
    log = users_server.log_path.read_text(errors="replace")
    assert ALICE_PASSWORD not in log, "the server log contains alice's password"
    assert WRONG_PASSWORD not in log, "the server log contains a password from a refused login"
    lines = [line for line in log.splitlines() if line.strip()]
    assert lines, "the server wrote no log lines"
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            pytest.fail(f"log line is not JSON: {line!r}")
        assert isinstance(record, dict) and "event" in record and "level" in record and "timestamp" in record, \
            f"log record lacks event/level/timestamp: {line!r}"
    events = [json.loads(line)["event"] for line in lines]
    assert "connection.auth_failed" in events or any("auth" in event for event in events), \
        f"a refused login should be logged; events: {events}"


def test_guest_is_refused_when_not_configured(tmp_path):
    server = make_server(tmp_path, WARREN_USERS=json.dumps([{"name": "alice", "password": ALICE_PASSWORD}])).start()
    try:
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            connect(server, "guest", "guest")
        connect(server, "alice", ALICE_PASSWORD).close()
    finally:
        server.stop()


def test_console_log_format(tmp_path):
    server = make_server(tmp_path, WARREN_LOG_FORMAT="console").start()
    try:
        connect(server).close()
    finally:
        assert server.stop() == 0
    log = server.log_path.read_text(errors="replace")
    assert "server.started" in log, log
    assert not log.lstrip().startswith("{"), f"WARREN_LOG_FORMAT=console still writes JSON:\n{log[:500]}"


# -- metrics ------------------------------------------------------------------

def test_metrics_endpoint_counts_connections(fresh_server):
    before = scrape(fresh_server)
    assert "warren_connections" in before, f"no warren_connections metric: {sorted(before)[:20]}"
    assert before["warren_connections"] == 0, f"no client yet, warren_connections={before['warren_connections']}"
    connection = connect(fresh_server)
    try:
        assert scrape(fresh_server)["warren_connections"] == 1
    finally:
        connection.close()
    deadline = time.monotonic() + 5
    while scrape(fresh_server)["warren_connections"] != 0:
        assert time.monotonic() < deadline, "warren_connections did not return to 0 after the client closed"
        time.sleep(0.05)  # polling a condition with a deadline
    missing = urllib.request.Request(f"http://127.0.0.1:{fresh_server.metrics_port}/nope")
    with pytest.raises(urllib.error.HTTPError) as not_found:
        urllib.request.urlopen(missing, timeout=5)
    assert not_found.value.code == 404


def test_metrics_disabled_with_port_0(tmp_path):
    server = make_server(tmp_path, WARREN_METRICS_PORT="0").start()
    try:
        connect(server).close()
    finally:
        assert server.stop() == 0


def test_help_mentions_environment(tmp_path):
    result = run_broker(make_server(tmp_path).env, "--help")
    assert "WARREN_" in result.stdout, "--help should say that WARREN_* variables configure the server"


def test_assertions_cannot_be_disabled(tmp_path):
    result = subprocess.run([sys.executable, "-O", "-m", "warren.broker"], env=make_server(tmp_path).env,
                            capture_output=True, text=True, timeout=BAD_CONFIG_EXIT_SECONDS)
    assert result.returncode != 0, "the server ran under python -O"
    assert "assert" in result.stderr, result.stderr



# -- one server per data directory ---------------------------------------------

def test_second_server_on_a_data_directory_in_use_exits_naming_the_holder(tmp_path):
    """Two nodes writing one WAL lose confirmed messages: the second must refuse to start."""
    first = make_server(tmp_path, WARREN_NODE_NAME="first@host").start()
    try:
        second = make_server(tmp_path, WARREN_NODE_NAME="second@host")  # the same tmp_path/data
        assert second.data_dir == first.data_dir
        result = run_broker(second.env)
        assert result.returncode != 0, f"the second server exited 0: {result.stderr!r}"
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, f"expected a one-line message, got {result.stderr!r}"
        assert f"pid {first.process.pid}" in lines[0] and "first@host" in lines[0], lines[0]
        connect(first).close()  # the first one still serves
    finally:
        assert first.stop() == 0, first.log()
    make_server(tmp_path).start().stop()  # its stop released the directory


# -- listeners -------------------------------------------------------------------

def _accepts_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
            return True
    except OSError:
        return False


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


@pytest.mark.skipif(not socket.has_ipv6 or not _accepts_ipv6_loopback(), reason="no IPv6 loopback here")
def test_default_listeners_take_ipv6_and_ipv4(tmp_path):
    """As RabbitMQ's default listeners ([::] and 0.0.0.0): a client may resolve localhost to ::1 first."""
    server = make_server(tmp_path)
    for variable in ("WARREN_AMQP_HOST", "WARREN_METRICS_HOST"):
        del server.env[variable]
    server.start()
    try:
        for host in ("::1", "127.0.0.1"):
            assert _accepts(host, server.amqp_port), f"no AMQP listener on {host}"
            assert _accepts(host, server.metrics_port), f"no metrics listener on {host}"
        listeners = api(server, "/api/overview")["listeners"]
        assert listeners["amqp"] == [f"[::]:{server.amqp_port}", f"0.0.0.0:{server.amqp_port}"], listeners
    finally:
        server.stop()
