"""Users, vhosts and permissions changed at runtime with warrenctl, against real nodes."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import pika
import pytest

from tests.integration.quorum_cluster import NAMES, api, start_cluster, stop_all, wait_for
from tests.serverproc import make_server

CTL_TIMEOUT_SECONDS = 60
BOB_PASSWORD = "b0b-s3cret-pw"


def ctl(server, *args: str, user: str = "guest", password: str = "guest") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "warren.broker.admin.ctl", "--port", str(server.metrics_port), "--user", user,
         "--password", password, *args], capture_output=True, text=True, timeout=CTL_TIMEOUT_SECONDS)


def ok(server, *args: str) -> str:
    result = ctl(server, *args)
    assert result.returncode == 0, f"warrenctl {' '.join(args)}: {result.returncode} {result.stderr}"
    return result.stdout


def refused(server, *args: str, **kwargs) -> str:
    result = ctl(server, *args, **kwargs)
    assert result.returncode == 1, f"warrenctl {' '.join(args)} should fail with 1: {result}"
    return result.stderr.strip()


def connect(server, user: str, password: str, vhost: str = "/", host: str = "127.0.0.1") -> pika.BlockingConnection:
    credentials = pika.PlainCredentials(user, password)
    return pika.BlockingConnection(pika.ConnectionParameters(
        host, server.amqp_port, vhost, credentials, heartbeat=0, connection_attempts=1))


def channel_error(action) -> tuple[int, str]:
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        action()
    return info.value.reply_code, info.value.reply_text


def rows(output: str) -> list[list[str]]:
    return [line.split("\t") for line in output.splitlines()[1:]]


@pytest.fixture
def node(tmp_path):
    process = make_server(tmp_path).start()
    yield process
    process.stop()


def test_runtime_user_logs_in_and_is_refused_outside_its_permissions(node):
    ok(node, "add_user", "bob", BOB_PASSWORD)
    ok(node, "add_vhost", "dev")
    ok(node, "set_permissions", "-p", "dev", "bob", "^bob-", "^(bob-|amq\\.topic$)", "^bob-")
    assert ["bob", "[]"] in rows(ok(node, "list_users"))
    assert ["dev"] in rows(ok(node, "list_vhosts"))
    assert rows(ok(node, "list_permissions", "-p", "dev")) == [["bob", "^bob-", "^(bob-|amq\\.topic$)", "^bob-"]]
    assert rows(ok(node, "list_permissions")) == [["guest", ".*", ".*", ".*"]]
    assert refused(node, "add_user", "bob", "x") == 'warrenctl: User "bob" already exists'
    assert refused(node, "add_vhost", "dev") == 'warrenctl: Virtual host "dev" already exists'
    assert refused(node, "delete_user", "nobody") == 'warrenctl: User "nobody" does not exist'
    assert refused(node, "set_permissions", "-p", "nowhere", "bob", ".*", ".*", ".*") == \
        'warrenctl: Virtual host "nowhere" does not exist'
    assert "invalid regular expression" in refused(node, "set_permissions", "-p", "dev", "bob", "(", ".*", ".*")

    connection = connect(node, "bob", BOB_PASSWORD, "dev")
    channel = connection.channel()
    channel.queue_declare("bob-q")
    channel.exchange_declare("bob-x", "fanout")
    channel.queue_bind("bob-q", "bob-x")
    channel.basic_publish("bob-x", "", b"hello")
    wait_for(lambda: channel.basic_get("bob-q", auto_ack=True)[2] == b"hello", "bob's message")
    assert channel_error(lambda: connection.channel().queue_declare("q")) == \
        (403, "ACCESS_REFUSED - configure access to queue 'q' in vhost 'dev' refused for user 'bob'")
    assert channel_error(lambda: connection.channel().exchange_declare("x", "direct")) == \
        (403, "ACCESS_REFUSED - configure access to exchange 'x' in vhost 'dev' refused for user 'bob'")
    # publish needs write on the exchange: the default exchange is checked as amq.default
    publisher = connection.channel()
    publisher.basic_publish("amq.topic", "k", b"allowed")
    publisher.basic_publish("", "bob-q", b"refused")
    assert channel_error(lambda: publisher.queue_declare("bob-q", passive=True)) == \
        (403, "ACCESS_REFUSED - write access to exchange 'amq.default' in vhost 'dev' refused for user 'bob'")
    # bind: write on the destination queue, read on the source exchange
    assert channel_error(lambda: connection.channel().queue_bind("bob-q", "amq.topic", "k")) == \
        (403, "ACCESS_REFUSED - read access to exchange 'amq.topic' in vhost 'dev' refused for user 'bob'")
    ok(node, "set_permissions", "-p", "dev", "bob", "^bob-", "^bob-", "^(bob-|other)")
    # guest (everything on /) made a queue bob may not read, in dev too
    ok(node, "set_permissions", "-p", "dev", "guest", ".*", ".*", ".*")
    with connect(node, "guest", "guest", "dev") as guest:
        guest.channel().queue_declare("secret")
    reader = connection.channel()   # opened after the change: sees bob's new permissions
    for action in (lambda: reader.basic_get("secret"),  # noqa: B023 (each action runs in its own turn)
                   lambda: reader.basic_consume("secret", lambda *a: None),  # noqa: B023
                   lambda: reader.queue_purge("secret")):  # noqa: B023
        assert channel_error(action) == \
            (403, "ACCESS_REFUSED - read access to queue 'secret' in vhost 'dev' refused for user 'bob'")
        reader = connection.channel()
    assert channel_error(lambda: reader.queue_delete("secret")) == \
        (403, "ACCESS_REFUSED - configure access to queue 'secret' in vhost 'dev' refused for user 'bob'")
    connection.close()

    # no permissions at all on / : connection.open is refused with 530
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        connect(node, "bob", BOB_PASSWORD, "/")
    assert '(530) "NOT_ALLOWED - access to vhost \'/\' refused for user \'bob\'"' in str(info.value), info.value
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(node, "bob", "wrong-password", "dev")
    # bob is no administrator: he may not change users
    assert "not tagged 'administrator'" in refused(node, "add_user", "eve", "x", user="bob", password=BOB_PASSWORD)
    ok(node, "set_user_tags", "bob", "administrator", "monitoring")
    assert ["bob", "[administrator,monitoring]"] in rows(ok(node, "list_users"))
    assert ctl(node, "add_vhost", "bobs", user="bob", password=BOB_PASSWORD).returncode == 0

    ok(node, "change_password", "bob", "n3w-pw")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(node, "bob", BOB_PASSWORD, "dev")
    connect(node, "bob", "n3w-pw", "dev").close()
    ok(node, "clear_permissions", "-p", "dev", "bob")
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        connect(node, "bob", "n3w-pw", "dev")
    assert "(530)" in str(info.value), info.value

    assert node.stop() == 0
    log = node.log_path.read_text(errors="replace")
    for password in (BOB_PASSWORD, "n3w-pw", "wrong-password"):
        assert password not in log, f"the server log contains the password {password!r}"


def _until_closed(connection: pika.BlockingConnection) -> pika.exceptions.ConnectionClosedByBroker | None:
    try:
        connection.process_data_events(time_limit=0.05)
    except pika.exceptions.ConnectionClosedByBroker as error:
        return error
    return None


def test_delete_vhost_closes_its_connections_with_320_and_delete_user_closes_the_users(node):
    ok(node, "add_vhost", "doomed")
    ok(node, "add_user", "carol", "c-pw")
    ok(node, "set_permissions", "-p", "doomed", "guest", ".*", ".*", ".*")
    ok(node, "set_permissions", "-p", "/", "carol", ".*", ".*", ".*")
    inside = connect(node, "guest", "guest", "doomed")
    channel = inside.channel()
    channel.queue_declare("durable-q", durable=True)
    channel.queue_declare("quorum-q", durable=True, arguments={"x-queue-type": "quorum"})
    channel.exchange_declare("durable-x", "topic", durable=True)
    channel.queue_bind("durable-q", "durable-x", "#")
    outside = connect(node, "guest", "guest", "/")
    carol = connect(node, "carol", "c-pw", "/")

    ok(node, "delete_vhost", "doomed")
    closed = wait_for(lambda: _until_closed(inside), "the doomed vhost's connection to be closed")
    assert (closed.reply_code, closed.reply_text) == (320, "CONNECTION_FORCED - vhost 'doomed' is deleted")
    outside.channel().queue_declare("still-here")   # other vhosts' connections stay
    assert "doomed" not in [q["vhost"] for q in api(node, "/api/queues")]
    assert ["doomed"] not in rows(ok(node, "list_vhosts"))
    assert refused(node, "delete_vhost", "doomed") == 'warrenctl: Virtual host "doomed" does not exist'
    # a vhost of the same name is new and empty, with the default exchanges
    ok(node, "add_vhost", "doomed")
    exchanges = {(e["vhost"], e["name"]) for e in api(node, "/api/exchanges")}
    assert {("doomed", "amq.direct"), ("doomed", "amq.topic"), ("doomed", "")} <= exchanges
    assert ("doomed", "durable-x") not in exchanges

    ok(node, "delete_user", "carol")
    closed = wait_for(lambda: _until_closed(carol), "carol's connection to be closed")
    assert (closed.reply_code, closed.reply_text) == (320, "CONNECTION_FORCED - user 'carol' is deleted")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(node, "carol", "c-pw")
    outside.close()


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_runtime_definitions_survive_a_restart_and_win_over_the_config(tmp_path, how):
    users = json.dumps([{"name": "guest", "password": "guest", "tags": ["administrator"]},
                        {"name": "cfg", "password": "cfg-pw", "vhosts": ["/", "cfgvhost"]}])
    server = make_server(tmp_path, WARREN_USERS=users, WARREN_VHOSTS='["/", "cfgvhost"]').start()
    try:
        ok(server, "add_user", "dave", "d-pw")
        ok(server, "add_vhost", "rt")
        ok(server, "set_permissions", "-p", "rt", "dave", "^d", "^d", "^d")
        ok(server, "change_password", "cfg", "cfg-new")
        ok(server, "delete_vhost", "cfgvhost")
        with connect(server, "dave", "d-pw", "rt") as connection:
            connection.channel().queue_declare("d-durable", durable=True)
        server.stop(signal.SIGKILL if how == "sigkill" else signal.SIGTERM)
        # the config now names another user: a node that has definitions does not read it again
        server.env["WARREN_USERS"] = json.dumps([{"name": "guest", "password": "guest", "tags": ["administrator"]},
                                                 {"name": "late", "password": "late-pw"}])
        server.start()
        connect(server, "dave", "d-pw", "rt").close()
        connect(server, "cfg", "cfg-new").close()
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            connect(server, "cfg", "cfg-pw")
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            connect(server, "late", "late-pw")
        assert sorted(v for v, in rows(ok(server, "list_vhosts"))) == ["/", "rt"]
        assert rows(ok(server, "list_permissions", "-p", "rt")) == [["dave", "^d", "^d", "^d"]]
        assert ("rt", "d-durable") in {(q["vhost"], q["name"]) for q in api(server, "/api/queues")}
    finally:
        server.stop()


def test_definitions_survive_a_wal_rollover_snapshot(tmp_path):
    server = make_server(tmp_path, WARREN_WAL_MAX_SIZE_BYTES=str(64 * 1024)).start()
    try:
        ok(server, "add_user", "erin", "e-pw")
        ok(server, "add_vhost", "ev")
        ok(server, "set_permissions", "-p", "ev", "erin", ".*", ".*", ".*")
        with connect(server, "guest", "guest") as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.queue_declare("filler", durable=True)
            for _ in range(40):   # 40 x 8 KiB persistent: the WAL rolls over at 64 KiB
                channel.basic_publish("", "filler", b"x" * 8192, pika.BasicProperties(delivery_mode=2))
        wait_for(lambda: api(server, "/api/overview")["wal"]["rollovers"] >= 1, "a WAL rollover")
        server.stop(signal.SIGKILL)
        server.start()
        connect(server, "erin", "e-pw", "ev").close()
        assert ["ev"] in rows(ok(server, "list_vhosts"))
    finally:
        server.stop()


def _non_loopback_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))   # no packet is sent: this only picks the route's source address
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


NETNS = "warren-users-test"
_LOGIN = """
import sys, pika
host, port, user, password = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
try:
    pika.BlockingConnection(pika.ConnectionParameters(
        host, port, "/", pika.PlainCredentials(user, password), connection_attempts=1, socket_timeout=10)).close()
    print("accepted")
except pika.exceptions.ProbableAuthenticationError:
    print("refused")
"""


@contextlib.contextmanager
def _remote_client():
    """(the server's address as the client sees it, the command prefix that runs
    the client there): as root, a network namespace of this test's own joined to
    this one by a veth pair, so the broker sees a non-loopback peer on any
    machine; else this machine's own non-loopback address."""
    ip = shutil.which("ip")
    if os.geteuid() == 0 and ip is not None:
        def run(*args: str) -> None:
            subprocess.run([ip, *args], check=True, capture_output=True, timeout=10)
        subprocess.run([ip, "netns", "del", NETNS], capture_output=True, timeout=10)   # a leftover
        subprocess.run([ip, "link", "del", "wusr0"], capture_output=True, timeout=10)
        run("netns", "add", NETNS)
        try:
            run("link", "add", "wusr0", "type", "veth", "peer", "name", "wusr1")
            run("link", "set", "wusr1", "netns", NETNS)
            run("addr", "add", "10.231.7.1/30", "dev", "wusr0")
            run("link", "set", "wusr0", "up")
            run("netns", "exec", NETNS, "ip", "addr", "add", "10.231.7.2/30", "dev", "wusr1")
            run("netns", "exec", NETNS, "ip", "link", "set", "wusr1", "up")
            run("netns", "exec", NETNS, "ip", "link", "set", "lo", "up")   # pika's loop wakes itself over it
            yield "10.231.7.1", [ip, "netns", "exec", NETNS]
        finally:
            subprocess.run([ip, "link", "del", "wusr0"], capture_output=True, timeout=10)
            subprocess.run([ip, "netns", "del", NETNS], capture_output=True, timeout=10)
        return
    address = _non_loopback_address()
    if address is None:
        pytest.skip("neither root (for a network namespace) nor a non-loopback IPv4 address here")
    yield address, []


def _login_from(prefix: list[str], address: str, server, user: str, password: str) -> str:
    done = subprocess.run([*prefix, sys.executable, "-c", _LOGIN, address, str(server.amqp_port), user, password],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"the remote client failed: {done.stderr}"
    return done.stdout.strip()


def test_guest_is_refused_from_a_non_loopback_address_but_runtime_users_are_not(tmp_path):
    server = make_server(tmp_path, WARREN_AMQP_HOST="0.0.0.0").start()
    try:
        ok(server, "add_user", "frank", "f-pw")
        ok(server, "set_permissions", "frank", ".*", ".*", ".*")
        with _remote_client() as (address, prefix):
            assert _login_from(prefix, address, server, "guest", "guest") == "refused", \
                "guest logged in from a non-loopback address"
            assert _login_from(prefix, address, server, "frank", "f-pw") == "accepted"
        connect(server, "guest", "guest").close()
    finally:
        server.stop()


def test_a_user_added_on_one_node_logs_in_on_another_and_delete_vhost_reaches_every_node(tmp_path):
    servers = start_cluster(tmp_path)
    first, third = servers[NAMES[0]], servers[NAMES[2]]
    try:
        ok(first, "add_user", "gina", "g-pw")
        ok(first, "add_vhost", "shared")
        ok(first, "set_permissions", "-p", "shared", "gina", ".*", ".*", ".*")

        def logs_in() -> bool:
            try:
                connect(third, "gina", "g-pw", "shared").close()
            except pika.exceptions.AMQPConnectionError:
                return False
            return True
        wait_for(logs_in, "gina to log in on the third node")
        with connect(third, "gina", "g-pw", "shared") as connection:
            connection.channel().queue_declare("shared-qq", durable=True, arguments={"x-queue-type": "quorum"})
        for server in servers.values():
            wait_for(lambda s=server: any(q["vhost"] == "shared" for q in api(s, "/api/queues")),
                     "every node to know the quorum queue")
        inside = connect(third, "gina", "g-pw", "shared")
        ok(first, "delete_vhost", "shared")
        closed = wait_for(lambda: _until_closed(inside), "the third node to close its connection on the vhost")
        assert closed.reply_code == 320
        for server in servers.values():
            wait_for(lambda s=server: not any(q["vhost"] == "shared" for q in api(s, "/api/queues"))
                     and {"name": "shared"} not in api(s, "/api/vhosts"), "every node to drop the vhost")
        assert rows(ok(third, "list_permissions", "-p", "shared")) == []
    finally:
        stop_all(servers)
