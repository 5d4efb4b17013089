"""A node over two processes (node_processes = 2, docs/multi-process.md stage 1): the
supervisor, its two shards on one AMQP port, queues on one shard used from the
other, shutdown, kill -9 and a shard's restart, with real processes."""
from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pika
import pytest
from pamqp import commands

from tests.integration.pika_raw_client import RawClient
from tests.integration.pika_support import publish_confirmed
from tests.integration.quorum_cluster import wait_for
from tests.serverproc import ServerProcess, make_server
from warren.broker.queues.queue_factory import split_shard

pytestmark = pytest.mark.timeout(120)

SHARDS = 2
QUORUM = {"x-queue-type": "quorum"}
EXIT_SECONDS = 15.0
# Which shard accepts a connection is the kernel's choice: see connections_on_each_shard.
LANDING_SECONDS = 15.0


class ShardedServer(ServerProcess):
    """warren-server as the supervisor of its shards, in a process group of its own."""

    def launch(self, args: tuple[str, ...] = ()) -> "ShardedServer":
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen([sys.executable, *self.command, *args], env=self.env, stdout=self._log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def wait_listening(self) -> "ShardedServer":
        """The supervisor's socket accepts at once: wait for every shard's HTTP port."""
        try:
            wait_for(lambda: self.process.poll() is not None or self._all_shards_serve(),
                     "both shards to serve", seconds=30)
            assert self.process.poll() is None, f"warren-server exited with {self.process.returncode}"
        except AssertionError as failure:
            self.stop()   # no node left behind by a failed start
            raise AssertionError(f"{failure}:\n{self.log()}") from None
        return self

    def _all_shards_serve(self) -> bool:
        rows = self.shard_rows()
        if len(rows) != SHARDS:
            return False
        try:   # shard 0 answers for the node once it hears from every other shard
            return all(shard["running"] for shard in shard_api(self.metrics_port, "/api/overview")["shards"])
        except OSError:
            return False

    def shard_rows(self) -> list[dict]:
        try:
            return json.loads((self.data_dir / "shard-ports.json").read_text())["shards"]
        except (OSError, ValueError):
            return []


def shard_api(port: int, path: str):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def node_metrics(server: ShardedServer) -> dict[str, float]:
    """The label-less series of the node's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5) as response:
        lines = response.read().decode().splitlines()
    return {name: float(value) for name, _, value in (line.partition(" ") for line in lines)
            if not name.startswith("#") and "{" not in name}


def sharded_server(tmp_path, move_connections: bool = False) -> ShardedServer:
    """Connections stay where they were accepted unless `move_connections` (the default of
    warren-server, tested in test_connection_moves.py): these tests cross between shards."""
    plain = make_server(tmp_path, WARREN_NODE_PROCESSES=str(SHARDS),
                        WARREN_MOVE_CONNECTIONS="true" if move_connections else "false")
    return ShardedServer(plain.amqp_port, plain.metrics_port, plain.data_dir, plain.env, log_path=plain.log_path)


@pytest.fixture
def node(tmp_path):
    server = sharded_server(tmp_path).start()
    yield server
    server.stop()
    assert_no_shards_left(server)


def assert_no_shards_left(server: ShardedServer) -> None:
    pids = [row["pid"] for row in server.shard_rows()]
    wait_for(lambda: not any(alive(pid) for pid in pids), f"the shards (pids {pids}) to be gone", 10)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def shard_of(connection: pika.BlockingConnection) -> int:
    """The shard that accepted the connection: its node name, `<node>#k`, in connection.start."""
    _, shard = split_shard(connection._impl.server_properties["node"])
    assert shard is not None, f"connection.start names no shard: {connection._impl.server_properties['node']!r}"
    return shard


def connections_per_shard(server: ShardedServer) -> list[int]:
    return [row["connections"] for row in shard_api(server.metrics_port, "/api/overview")["shards"]]


def connections_on_each_shard(server: ShardedServer, count: int) -> dict[int, list[pika.BlockingConnection]]:
    """`count` connections (one more at most), at least one on each shard. Which idle shard's
    loop accepts is up to the kernel's wake-ups: one shard may win 40 tries in a row (CI once
    saw 32), so tries go on for LANDING_SECONDS, a spare one closed unless its shard has none;
    returns once the node counts just the kept ones."""
    by_shard: dict[int, list] = {k: [] for k in range(SHARDS)}
    deadline, tries = time.monotonic() + LANDING_SECONDS, 0
    while sum(map(len, by_shard.values())) < count or not all(by_shard.values()):
        assert time.monotonic() < deadline, f"{tries} connections in {LANDING_SECONDS} s: none on a shard " \
            f"({ {k: len(connections) for k, connections in by_shard.items()} })"
        connection = pika.BlockingConnection(pika.URLParameters(server.url))
        tries += 1
        shard = shard_of(connection)
        if sum(map(len, by_shard.values())) >= count and by_shard[shard]:
            connection.close()
        else:
            by_shard[shard].append(connection)
    expected = [len(by_shard[k]) for k in range(SHARDS)]
    wait_for(lambda: connections_per_shard(server) == expected,
             f"the node to count {expected} connections per shard (the spare tries closed)", 10)
    return by_shard


def close_all(by_shard: dict[int, list]) -> None:
    for connections in by_shard.values():
        for connection in connections:
            if connection.is_open:
                connection.close()


def drain(channel, queue: str, count: int) -> list[bytes]:
    got = []
    for method, _, body in channel.consume(queue, inactivity_timeout=10):
        assert method is not None, f"{queue}: only {len(got)} of {count} messages came"
        channel.basic_ack(method.delivery_tag)
        got.append(body)
        if len(got) == count:
            break
    channel.cancel()
    return got


def test_connections_land_on_both_shards_and_share_a_quorum_queue(node):
    by_shard = connections_on_each_shard(node, 8)
    try:
        total = sum(len(connections) for connections in by_shard.values())
        # as RabbitMQ's: one cluster_name for the node, whichever process accepted the connection
        names = {(connection._impl.server_properties["cluster_name"], shard_of(connection))
                 for connections in by_shard.values() for connection in connections}
        assert names == {("warren@localhost", 0), ("warren@localhost", 1)}, names
        # the node's port (shard 0's) answers for the node; shard 1's own loopback port for shard 1
        listed = [row["shard"] for row in shard_api(node.metrics_port, "/api/connections")]
        assert sorted(listed) == sorted(k for k, connections in by_shard.items() for _ in connections)
        assert len(shard_api(node.shard_rows()[1]["http_port"], "/api/connections")) == len(by_shard[1])
        overview = shard_api(node.metrics_port, "/api/overview")
        assert (overview["node"], overview["connections"]) == ("warren@localhost", total)
        assert [(row["shard"], row["connections"]) for row in overview["shards"]] == [
            (k, len(connections)) for k, connections in sorted(by_shard.items())]
        home, other = by_shard[0][0].channel(), by_shard[1][0].channel()
        home.queue_declare("shared", durable=True, arguments=QUORUM)
        bodies = [b"m%d" % i for i in range(200)]
        publish_confirmed(other, "shared", bodies)   # every publish crosses to shard 0 and its confirm back
        queue = next(q for q in shard_api(node.shard_rows()[1]["http_port"], "/api/queues") if q["name"] == "shared")
        assert queue["members"] == ["warren@localhost#0"]   # placed on the declaring connection's shard
        assert drain(home, "shared", len(bodies)) == bodies
        metrics = node_metrics(node)
        assert metrics["warren_connections"] == total
        assert metrics["warren_messages_published_total"] == len(bodies)
        assert metrics["warren_queues"] == 1
        assert shard_api(node.metrics_port, "/api/overview")["queues"] == 1
    finally:
        close_all(by_shard)


def test_sigterm_stops_every_process_and_clients_get_320(node):
    by_shard = connections_on_each_shard(node, 4)
    pids = [row["pid"] for row in node.shard_rows()]
    node.process.send_signal(signal.SIGTERM)
    assert node.process.wait(EXIT_SECONDS) == 0, node.log()
    for connections in by_shard.values():
        for connection in connections:
            with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
                connection.process_data_events(time_limit=1)
            assert closed.value.reply_code == 320
    assert not [pid for pid in pids if alive(pid)]


def test_confirmed_messages_survive_kill_9_of_the_process_group(tmp_path):
    server = sharded_server(tmp_path).start()
    try:
        by_shard = connections_on_each_shard(server, 8)
        for home in range(SHARDS):   # a queue on each shard, published to from the other
            by_shard[home][0].channel().queue_declare(f"q{home}", durable=True, arguments=QUORUM)
            publish_confirmed(by_shard[1 - home][0].channel(), f"q{home}", [b"%d-%d" % (home, i) for i in range(300)])
        pids = [row["pid"] for row in server.shard_rows()]
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait(EXIT_SECONDS)
        wait_for(lambda: not any(alive(pid) for pid in pids), "the shards to die with their group", 10)
        server._log.close()
        server.start()
        with pika.BlockingConnection(pika.URLParameters(server.url)) as connection:
            channel = connection.channel()
            for home in range(SHARDS):
                assert drain(channel, f"q{home}", 300) == [b"%d-%d" % (home, i) for i in range(300)]
    finally:
        server.stop()
        assert_no_shards_left(server)


def test_a_killed_shard_is_restarted_and_its_queue_comes_back(node):
    by_shard = connections_on_each_shard(node, 8)
    try:
        by_shard[1][0].channel().queue_declare("on-one", durable=True, arguments=QUORUM)
        publish_confirmed(by_shard[1][0].channel(), "on-one", [b"x%d" % i for i in range(100)])
    finally:
        close_all(by_shard)
    killed = node.shard_rows()[1]["pid"]
    os.kill(killed, signal.SIGKILL)
    wait_for(lambda: node.shard_rows()[1]["pid"] != killed, "the supervisor to start shard 1 again")
    node.wait_listening()
    assert node.process.poll() is None
    with pika.BlockingConnection(pika.URLParameters(node.url)) as connection:
        assert drain(connection.channel(), "on-one", 100) == [b"x%d" % i for i in range(100)]


def test_a_shard_that_keeps_dying_stops_the_node_with_status_1(node):
    for _ in range(6):   # more than 5 restarts within a minute
        killed = node.shard_rows()[1]["pid"]
        os.kill(killed, signal.SIGKILL)
        wait_for(lambda killed=killed: node.process.poll() is not None or node.shard_rows()[1]["pid"] != killed,
                 "shard 1 to be started again, or the node to stop")
    assert node.process.wait(EXIT_SECONDS) == 1, node.log()
    assert "supervisor.giving_up" in node.log()


def run_server(server: ServerProcess, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "warren.broker"], env={**server.env, **env}, capture_output=True,
                          text=True, timeout=EXIT_SECONDS)


def test_another_process_count_on_the_data_dir_is_refused(node):
    node.stop()
    result = run_server(node, WARREN_NODE_PROCESSES="3")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"warren-server: data_dir {node.data_dir} was created for node_processes = 2, not 3: start with "
        "node_processes = 2 (queues do not move between processes)"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to tell one from all")
def test_a_node_bound_to_one_cpu_runs_one_process_by_default(tmp_path):
    """The default count is the cores the node may use (broker/node/usable_cores.py), not the host's."""
    bound = make_server(tmp_path)
    del bound.env["WARREN_NODE_PROCESSES"]
    cpu = min(os.sched_getaffinity(0))
    bound.command = ("-c", f"import os, sys; os.sched_setaffinity(0, {{{cpu}}}); "
                           "from warren.broker.node.launch import main; sys.exit(main())")
    bound.start()
    bound.stop()
    result = run_server(bound, WARREN_NODE_PROCESSES="2")
    assert "was created for node_processes = 1, not 2" in result.stderr, result.stderr


def test_a_single_process_data_dir_is_refused_for_two(tmp_path):
    single = make_server(tmp_path).start()
    single.stop()
    result = run_server(single, WARREN_NODE_PROCESSES="2")
    assert result.returncode == 2
    assert "was created for node_processes = 1, not 2" in result.stderr


# -- every AMQP feature whatever shard a connection lands on (stage 2) ------------------------
CONNECTIONS_TO_REACH_EVERY_SHARD_MAX = 100


def one_connection_per_shard(server: ShardedServer) -> dict[int, pika.BlockingConnection]:
    """A connection on each shard: connections are opened (and the extra ones closed) until
    every shard took one, which idle loop accepts first being the kernel's choice."""
    found: dict[int, pika.BlockingConnection] = {}
    for _ in range(CONNECTIONS_TO_REACH_EVERY_SHARD_MAX):
        connection = pika.BlockingConnection(pika.URLParameters(server.url))
        if shard_of(connection) in found:
            connection.close()
        else:
            found[shard_of(connection)] = connection
        if len(found) == SHARDS:
            return found
    raise AssertionError(f"{CONNECTIONS_TO_REACH_EVERY_SHARD_MAX} connections all landed on one shard")


@pytest.fixture
def two_shards(node):
    """A connection on shard 0 and one on shard 1."""
    found = one_connection_per_shard(node)
    yield found[0], found[1]
    close_all({k: [connection] for k, connection in found.items()})


def test_direct_reply_to_rpc_between_two_shards(two_shards):
    requester, replier = two_shards
    server = replier.channel()
    server.queue_declare("rpc-requests", durable=True, arguments=QUORUM)
    client = requester.channel()
    replies = []
    client.basic_consume("amq.rabbitmq.reply-to", lambda _ch, _m, props, body: replies.append((props, body)),
                         auto_ack=True)
    for i in range(3):
        client.basic_publish("", "rpc-requests", b"ask-%d" % i,
                             pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", correlation_id=str(i)))
        method, props, body = next(server.consume("rpc-requests", inactivity_timeout=10))
        assert method is not None, "the request did not reach the replier's shard"
        assert props.reply_to.startswith("amq.rabbitmq.reply-to.")
        server.basic_publish("", props.reply_to, b"answer-" + body,
                             pika.BasicProperties(correlation_id=props.correlation_id))
        server.basic_ack(method.delivery_tag)
        wait_for(lambda i=i: requester.process_data_events(time_limit=0.05) or len(replies) > i,
                 "the reply to reach the requester's shard", seconds=10)
    assert [(props.correlation_id, body) for props, body in replies] == [
        (str(i), b"answer-ask-%d" % i) for i in range(3)]


def test_an_exclusive_queue_is_locked_from_another_shard(two_shards):
    owner, other = two_shards
    owner.channel().queue_declare("mine", exclusive=True)
    for use in (lambda ch: ch.basic_consume("mine", lambda *_: None),
                lambda ch: ch.queue_declare("mine", passive=True),
                lambda ch: ch.queue_delete("mine"),
                lambda ch: ch.basic_get("mine")):
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            use(other.channel())
        assert closed.value.reply_code == 405
        assert closed.value.reply_text == (
            "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'mine' in vhost '/'. It could be "
            "originally declared on another connection or the exclusive property value does not match that of "
            "the original declaration.")
    channel = other.channel()   # but routed to from there
    channel.confirm_delivery()
    channel.basic_publish("", "mine", b"to the owner", mandatory=True)
    assert drain(owner.channel(), "mine", 1) == [b"to the owner"]


def raw_client_on_shard(server: ShardedServer, shard: int) -> RawClient:
    for _ in range(CONNECTIONS_TO_REACH_EVERY_SHARD_MAX):
        client = RawClient(server.amqp_port)
        client.handshake()
        if split_shard(client.server_properties["node"])[1] == shard:
            return client
        client.close_connection()
        client.close()
    raise AssertionError(f"{CONNECTIONS_TO_REACH_EVERY_SHARD_MAX} connections, none on shard {shard}")


def test_deleting_another_shards_queue_answers_delete_ok_before_the_own_consumers_cancel(node, two_shards):
    """As on one process (test_pika_consumers.py), and RabbitMQ: the delete-ok, then the cancel."""
    _, home = two_shards
    home.channel().queue_declare("far", durable=True, arguments=QUORUM)
    with raw_client_on_shard(node, 0) as client:
        client.open_channel(1)
        client.send(1, commands.Basic.Consume(queue="far", consumer_tag="own"))
        client.expect(commands.Basic.ConsumeOk)
        client.send(1, commands.Queue.Delete(queue="far"))
        first = client.expect(object)
        assert isinstance(first, commands.Queue.DeleteOk), f"before the delete-ok came {first!r}"
        assert client.expect(commands.Basic.Cancel).consumer_tag == "own"
        client.close_connection()


def test_an_exclusive_queue_goes_with_its_owner_on_every_shard(two_shards):
    owner, other = two_shards
    owner.channel().queue_declare("short-lived", exclusive=True)
    assert not _declare_passive_fails(other, "short-lived")   # there, though locked (405)
    owner.close()
    wait_for(lambda: _declare_passive_fails(other, "short-lived"), "the owner's queue to go on the other shard")


def _declare_passive_fails(connection, name: str) -> bool:
    try:
        connection.channel().queue_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as closed:
        assert closed.reply_code in (404, 405)
        return closed.reply_code == 404
    return False


def bytes_on_disk(server: ShardedServer) -> int:
    return sum(path.stat().st_size for path in server.data_dir.rglob("*") if path.is_file())


def test_a_transient_queue_of_one_shard_is_used_from_another(node, two_shards):
    home, other = two_shards
    on_disk = bytes_on_disk(node)
    home.channel().queue_declare("transient", durable=False)
    channel = other.channel()
    assert channel.queue_declare("transient", passive=True).method.queue == "transient"
    channel.confirm_delivery()
    bodies = [b"t%d-" % i + bytes(20_000) for i in range(50)]
    for body in bodies:
        channel.basic_publish("", "transient", body, mandatory=True)
    written = bytes_on_disk(node) - on_disk
    assert written < 10_000, f"{written} bytes written for a transient queue's 1 MB"   # nothing of it on disk
    assert channel.queue_declare("transient", passive=True).method.message_count == len(bodies)   # the home's count
    rows = [row for row in shard_api(node.metrics_port, "/api/queues") if row["name"] == "transient"]
    assert [(row["members"], row["member_shards"], row["messages_ready"]) for row in rows] == [
        (["warren@localhost"], ["warren@localhost#0"], len(bodies))]
    assert drain(other.channel(), "transient", len(bodies)) == bodies
    channel.basic_publish("", "transient", b"to get", mandatory=True)
    method, _, body = other.channel().basic_get("transient", auto_ack=True)
    assert (body, method.message_count) == (b"to get", 0)
    home.channel().basic_publish("", "transient", b"from home")
    assert drain(other.channel(), "transient", 1) == [b"from home"]
    burst = other.channel()   # no confirms: many publishes to one turn's frame
    for i in range(5000):
        burst.basic_publish("", "transient", b"b%d" % i)
    wait_for(lambda: burst.queue_declare("transient", passive=True).method.message_count == 5000,
             "a burst of publishes to reach the home shard")
    assert other.channel().queue_purge("transient").method.message_count == 5000
    other.channel().queue_delete("transient")
    wait_for(lambda: _declare_passive_fails(home, "transient"), "the deletion to reach the home shard")


IN_EXCLUSIVE_USE = "ACCESS_REFUSED - queue '{}' in vhost '/' in exclusive use"


@pytest.mark.parametrize("durable", [False, True], ids=["transient", "durable-classic"])
def test_an_exclusive_consumer_excludes_consumers_on_another_shard(two_shards, durable):
    """basic.consume's exclusive flag holds across shards, as on one RabbitMQ node: the
    queue's machine judges it, and the refused consumer's channel closes with 403."""
    first, second = two_shards
    for queue, (exclusive_on, other_on) in {"ex-first": (first, second), "ex-second": (second, first)}.items():
        first.channel().queue_declare(queue, durable=durable)
        exclusive = exclusive_on.channel()
        exclusive.basic_consume(queue, lambda *_: None, exclusive=True)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            other_on.channel().basic_consume(queue, lambda *_: None)
        assert (closed.value.reply_code, closed.value.reply_text) == (403, IN_EXCLUSIVE_USE.format(queue))
        exclusive.close()   # its consumer goes: the queue takes others again
        wait_for(lambda q=queue, o=other_on: _consumes(o, q, exclusive=True), f"{queue} to take a consumer again")
    plain = second.channel()   # and the other way round: an exclusive consume beside a consumer elsewhere
    plain.basic_consume("ex-first", lambda *_: None)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        first.channel().basic_consume("ex-first", lambda *_: None, exclusive=True)
    assert (closed.value.reply_code, closed.value.reply_text) == (403, IN_EXCLUSIVE_USE.format("ex-first"))


def _consumes(connection, queue: str, exclusive: bool) -> bool:
    channel = connection.channel()
    try:
        channel.basic_consume(queue, lambda *_: None, exclusive=exclusive)
    except pika.exceptions.ChannelClosedByBroker:
        return False
    channel.close()
    return True


def test_an_auto_delete_queue_goes_when_its_last_consumer_on_another_shard_leaves(two_shards):
    home, other = two_shards
    home.channel().queue_declare("auto", durable=False, auto_delete=True)
    consumer = other.channel()
    tag = consumer.basic_consume("auto", lambda *_: None)
    consumer.basic_cancel(tag)
    wait_for(lambda: _declare_passive_fails(home, "auto"), "the auto-delete queue to go")
    assert _declare_passive_fails(other, "auto")


def test_an_auto_delete_queue_goes_when_its_consumers_connection_drops(node, two_shards):
    """No cancel, no channel.close: the socket just goes, with a message unacked (aio-pika's
    test_queue_iterator_reconnect_after_disconnect got it again from the queue that stayed)."""
    publisher = two_shards[1].channel()
    for round_ in range(4):   # the raw client lands on either shard: the queue's home is its
        queue = f"auto-dropped-{round_}"
        consumer = RawClient(node.amqp_port)
        consumer.consume_new_queue(queue, auto_delete=True)
        publisher.basic_publish("", queue, b"held")
        consumer.expect(commands.Basic.Deliver)
        consumer.close()   # abruptly: the message stays unacked
        wait_for(lambda q=queue: all(_declare_passive_fails(c, q) for c in two_shards),
                 f"the auto-delete queue of a consumer on {consumer.server_properties['node']} to go")


def test_a_transient_exchange_and_its_bindings_route_on_every_shard(two_shards):
    home, other = two_shards
    declaring = home.channel()
    declaring.exchange_declare("rpc-x", "direct", durable=False)
    declaring.queue_declare("rpc-q", durable=False)
    other.channel().queue_bind("rpc-q", "rpc-x", "k")   # a binding made on the other shard
    for connection in (home, other):
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("rpc-x", "k", b"via " + str(shard_of(connection)).encode(), mandatory=True)
    assert sorted(drain(other.channel(), "rpc-q", 2)) == [b"via 0", b"via 1"]
    other.channel().queue_unbind("rpc-q", "rpc-x", "k")
    channel = home.channel()
    channel.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        channel.basic_publish("rpc-x", "k", b"unbound", mandatory=True)
    home.channel().exchange_delete("rpc-x")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        other.channel().exchange_declare("rpc-x", passive=True)
    assert closed.value.reply_code == 404


def test_a_transient_queue_deleted_on_its_home_shard_is_gone_on_the_other_at_delete_ok(two_shards):
    home, other = two_shards
    for round_ in range(20):   # the race is narrow (a proxy outliving the delete-ok); the link tests pin the order
        name = f"gone-{round_}"
        home.channel().queue_declare(name, durable=False)
        home.channel().queue_delete(name)
        assert _declare_passive_fails(other, name), f"{name}: still found on the other shard after delete-ok"


def test_a_restarted_shard_learns_the_transient_queues_and_its_consumers_give_back(node):
    found = one_connection_per_shard(node)
    home, doomed = found[0], found[1]
    try:
        home.channel().queue_declare("survivor", durable=False)
        home.channel().basic_publish("", "survivor", b"held by shard 1")
        holder = doomed.channel()
        held = []
        holder.basic_consume("survivor", lambda _ch, method, _props, body: held.append(body))   # never acked
        wait_for(lambda: doomed.process_data_events(time_limit=0.05) or held, "shard 1's consumer to get it")
        killed = node.shard_rows()[1]["pid"]
        os.kill(killed, signal.SIGKILL)
        returned = home.channel()
        method, _, body = next(returned.consume("survivor", inactivity_timeout=10))
        assert (body, method.redelivered) == (b"held by shard 1", True), "what shard 1 held did not come back"
        returned.cancel()
        wait_for(lambda: node.shard_rows()[1]["pid"] != killed, "the supervisor to start shard 1 again")
        node.wait_listening()
        back = one_connection_per_shard(node)
        try:
            channel = back[1].channel()
            assert channel.queue_declare("survivor", passive=True).method.queue == "survivor"
            channel.confirm_delivery()
            channel.basic_publish("", "survivor", b"from the new shard 1", mandatory=True)
            assert drain(home.channel(), "survivor", 1) == [b"from the new shard 1"]
        finally:
            close_all({k: [connection] for k, connection in back.items()})
    finally:
        if home.is_open:
            home.close()


def test_a_passive_declare_on_another_shard_counts_a_quorum_queue_where_it_is_hosted(two_shards):
    """A quorum queue's group lives on its declaring shard: a passive declare from the
    other shard answers that shard's counts, not the zero of a shard without a replica
    (the yardstick checks its queue's depth against what was confirmed that way)."""
    home, other = two_shards
    channel = home.channel()
    channel.queue_declare("counted", durable=True, arguments=QUORUM)
    publish_confirmed(channel, "counted", [b"m%d" % i for i in range(7)])
    declared = other.channel().queue_declare("counted", passive=True)
    assert (declared.method.message_count, declared.method.consumer_count) == (7, 0), \
        "a passive declare on the shard without the queue's group miscounted it"


def test_a_durable_classic_queue_is_judged_for_if_unused_and_if_empty_on_its_own_shard(two_shards):
    """queue.delete's flags from the shard without the queue's group are judged on the
    counts where the group lives: that shard's view has neither its messages nor the
    other shard's consumers (the delete went ahead, dropping confirmed messages)."""
    home, other = two_shards
    channel = home.channel()
    channel.queue_declare("judged", durable=True)
    publish_confirmed(channel, "judged", [b"kept"])
    channel.basic_consume("judged", lambda *delivery: None)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as in_use:
        other.channel().queue_delete("judged", if_unused=True)
    assert (in_use.value.reply_code, in_use.value.reply_text) == (
        406, "PRECONDITION_FAILED - queue 'judged' in vhost '/' in use")
    channel.close()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as not_empty:
        other.channel().queue_delete("judged", if_empty=True)
    assert (not_empty.value.reply_code, not_empty.value.reply_text) == (
        406, "PRECONDITION_FAILED - queue 'judged' in vhost '/' is not empty")
    declared = other.channel().queue_declare("judged", passive=True)
    assert (declared.method.message_count, declared.method.consumer_count) == (1, 0), \
        "a refused delete changed the queue"
    home.channel().queue_purge("judged")
    assert other.channel().queue_delete("judged", if_unused=True, if_empty=True).method.message_count == 0
