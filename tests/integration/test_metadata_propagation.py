"""A declaration answered on one node is usable at once on every other node
(issue 9, item 2), as RabbitMQ answers a declaration only once every running
node can use it: a client that declares on one node and publishes through
another must never lose a message to that, and a node that has just
restarted opens its AMQP port only once it knows what was declared while it
was away; nor may a node the others counted down (paused, or cut off) route
with what it knew before, once its clients reach it again."""
from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import pika
import pika.exceptions
import pytest

from tests.integration.partition import Network
from tests.integration.quorum_cluster import NAMES, api, connect, start_cluster, stop_all, wait_for
from tests.serverproc import free_port

ROUNDS = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    servers = start_cluster(tmp_path_factory.mktemp("metadata"))
    yield servers
    stop_all(servers)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def channels(servers):
    connections = {name: connect(servers[name]) for name in NAMES}
    opened = {name: connection.channel() for name, connection in connections.items()}
    for channel in opened.values():
        channel.confirm_delivery()
    return connections, opened


def close_all(connections) -> None:
    for connection in connections.values():
        if connection.is_open:
            connection.close()


def reopen(connections, channel, node: str) -> None:
    """A confirming channel on `node` again, after the broker closed the last one."""
    channel[node] = connections[node].channel()
    channel[node].confirm_delivery()


def get_body(connections, channel, node: str, queue: str):
    """basic.get's body, or what went wrong (the channel is opened again after a close)."""
    try:
        return channel[node].basic_get(queue, auto_ack=True)[2]
    except pika.exceptions.ChannelClosedByBroker as error:
        reopen(connections, channel, node)
        return f"{error.reply_code} {error.reply_text}"


def passive_declare_fails(channel, name: str) -> str | None:
    try:
        channel.queue_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as error:
        return f"{error.reply_code} {error.reply_text}"
    return None


def test_a_queue_declared_on_one_node_is_usable_at_once_on_the_others(cluster):
    connections, channel = channels(cluster)
    a, b, c = NAMES
    problems: list[str] = []
    try:
        for round_ in range(ROUNDS):
            for queue_type in ("quorum", "classic"):
                name = unique(f"declared-{queue_type}")
                channel[a].queue_declare(name, durable=True, arguments={"x-queue-type": queue_type})
                refused = passive_declare_fails(channel[b], name)
                if refused:
                    problems.append(f"round {round_}: passive declare of {name} on {b}: {refused}")
                    reopen(connections, channel, b)
                try:
                    channel[b].basic_publish("", name, b"m", pika.BasicProperties(delivery_mode=2), mandatory=True)
                except pika.exceptions.UnroutableError:
                    problems.append(f"round {round_}: a publish to {name} through {b} was unroutable")
                found = get_body(connections, channel, c, name)
                if found != b"m":
                    problems.append(f"round {round_}: basic.get of {name} on {c} found {found!r}")
                channel[a].queue_delete(name)
    finally:
        close_all(connections)
    assert not problems, f"{len(problems)} failures in {ROUNDS * 2} declarations:\n" + "\n".join(problems[:20])


def test_an_exchange_and_binding_made_on_one_node_route_at_once_on_the_others(cluster):
    connections, channel = channels(cluster)
    a, b, c = NAMES
    problems: list[str] = []
    try:
        for round_ in range(ROUNDS):
            exchange, queue = unique("x"), unique("bound")
            channel[a].exchange_declare(exchange, "direct", durable=True)
            channel[a].queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
            channel[a].queue_bind(queue, exchange, routing_key="key")
            try:
                channel[b].basic_publish(exchange, "key", b"m", pika.BasicProperties(delivery_mode=2),
                                         mandatory=True)
            except pika.exceptions.UnroutableError:
                problems.append(f"round {round_}: {exchange} -> {queue} unroutable through {b}")
            except pika.exceptions.ChannelClosedByBroker as error:
                problems.append(f"round {round_}: publish to {exchange} through {b}: {error}")
                reopen(connections, channel, b)
            found = get_body(connections, channel, c, queue)
            if found != b"m":
                problems.append(f"round {round_}: basic.get of {queue} on {c} found {found!r}")
            channel[a].queue_delete(queue)
            channel[a].exchange_delete(exchange)
    finally:
        close_all(connections)
    assert not problems, f"{len(problems)} failures in {ROUNDS} rounds:\n" + "\n".join(problems[:20])


def test_a_restarted_node_knows_what_was_declared_while_it_was_away(cluster):
    a, _, c = NAMES
    names = [unique("while-away") for _ in range(5)]
    cluster[c].stop()
    with connect(cluster[a]) as connection:
        declaring = connection.channel()
        for name in names:
            declaring.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    cluster[c].start()   # returns once the AMQP port accepts connections
    with connect(cluster[c]) as connection:
        unknown = [name for name in names if passive_declare_fails(connection.channel(), name)]
    assert not unknown, f"{c} accepted clients before it knew {unknown}:\n{cluster[c].log()}"


class ConfirmedPublisher(threading.Thread):
    """Publishes `count` numbered persistent messages with confirms on `connection`, each
    after the last one's confirm (the first waits unanswered while its node is held)."""

    def __init__(self, connection: pika.BlockingConnection, queue: str, count: int, exchange: str = "",
                 routing_key: str | None = None) -> None:
        super().__init__(daemon=True)
        self.channel = connection.channel()
        self.channel.confirm_delivery()
        self.queue, self.count = queue, count
        self.exchange, self.routing_key = exchange, queue if routing_key is None else routing_key
        self.publishing = threading.Event()
        self.confirmed: list[int] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for number in range(self.count):
                self.publishing.set()
                self.channel.basic_publish(self.exchange, self.routing_key, str(number).encode(),
                                           pika.BasicProperties(delivery_mode=2))
                self.confirmed.append(number)
        except BaseException as error:  # noqa: BLE001 -- reported by the test
            self.error = error


def running_nodes(server) -> list[str]:
    try:
        return api(server, "/api/overview")["running_nodes"]
    except OSError:
        return []


def metadata_leader(server) -> str | None:
    try:
        return api(server, "/api/overview")["metadata_leader"]
    except OSError:
        return None


def held_out_declare_then_publish(servers, cut_off: str, via: str, hold, release, redeclare: bool) -> str | None:
    """`hold(cut_off)` until `via` counts it down; delete and declare a quorum queue through
    `via` (an earlier one of the name known to `cut_off` first if `redeclare`); publish 20
    confirmed messages through a connection to `cut_off` opened before; `release(cut_off)`.
    What went wrong, or None."""
    name = unique("held-out")
    with connect(servers[via]) as declaring_connection, connect(servers[cut_off]) as publishing_connection:
        declaring = declaring_connection.channel()
        if redeclare:
            declaring.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
        publisher = ConfirmedPublisher(publishing_connection, name, 20)
        hold(cut_off)
        try:
            wait_for(lambda: cut_off not in running_nodes(servers[via]), f"{via} to count {cut_off} down")
            declaring.queue_delete(name)
            declaring.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
            publisher.start()
            wait_for(publisher.publishing.is_set, "the publisher to start")
        finally:
            release(cut_off)
        publisher.join(60)
        if publisher.error is not None or len(publisher.confirmed) != 20:
            return f"{name}: {len(publisher.confirmed)} of 20 confirmed, {publisher.error!r}"
        found = []
        while True:
            method, _, body = declaring.basic_get(name, auto_ack=True)
            if method is None:
                break
            found.append(int(body))
        declaring.queue_delete(name)
    lost = sorted(set(publisher.confirmed) - set(found))
    return f"{name}: confirmed through {cut_off} and lost: {lost}" if lost else None


@pytest.mark.parametrize("redeclare", [False, True], ids=["new-name", "redeclared-name"])
def test_a_node_paused_past_the_failure_detector_catches_up_before_it_routes(cluster, redeclare):
    """SIGSTOP a node until another counts it down; declare there (answered without the
    paused node); the paused node's client publishes, then the node resumes. Before the
    fix it routed with what it knew before the pause: a new name unroutable, so confirmed
    and dropped (all 20), a redeclared name into the deleted queue (the first)."""
    a, _, c = NAMES

    def signal_node(sig):
        return lambda node: os.kill(cluster[node].process.pid, sig)
    problem = held_out_declare_then_publish(cluster, a, c, signal_node(signal.SIGSTOP), signal_node(signal.SIGCONT),
                                            redeclare)
    wait_for(lambda: all(running_nodes(cluster[node]) == NAMES for node in NAMES), "every node to see all again")
    assert problem is None, problem + "\n" + cluster[a].log()


def test_a_node_cut_off_from_the_others_holds_its_clients_publishes_until_it_caught_up(tmp_path):
    """A node cut off from every other node while its clients still reach it: a name declared
    meanwhile is unknown to it, so it must neither drop nor confirm their publishes until it
    has caught up with the metadata group."""
    network = Network({name: free_port() for name in NAMES})
    servers = start_cluster(tmp_path, network=network)
    try:
        a, _, c = NAMES
        problem = held_out_declare_then_publish(servers, a, c, network.isolate, lambda _: network.heal(), False)
        assert problem is None, problem + "\n" + servers[a].log()
    finally:
        stop_all(servers)
        network.close()


SILENT_CUT_ROUNDS = 6


def test_a_node_that_counts_another_down_first_answers_only_once_the_other_holds_its_clients(tmp_path):
    """A silent partition (nothing closed, as with lost packets): each side counts the other
    down by its own heartbeats, one side up to a few heartbeats before the other. A
    declaration made through the faster side the moment it counted the cut-off node down
    must not be answered before that node holds its clients' publishes (its fence), or a
    client that publishes through it at once routes by what it knew before: unroutable,
    so confirmed and dropped. Before the fix, which side noticed first was chance, and
    some of these rounds lost every message published through the cut-off node."""
    network = Network({name: free_port() for name in NAMES})
    servers = start_cluster(tmp_path, network=network)
    try:
        a, _, c = NAMES
        for round_number in range(SILENT_CUT_ROUNDS):
            name = unique(f"silent-cut-{round_number}")
            with connect(servers[c]) as declaring_connection, connect(servers[a]) as publishing_connection:
                declaring = declaring_connection.channel()
                publisher = ConfirmedPublisher(publishing_connection, name, 20)
                network.isolate(a)
                try:
                    declaring.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
                    publisher.start()
                    wait_for(publisher.publishing.is_set, "the publisher to start")
                finally:
                    network.heal()
                publisher.join(60)
                assert publisher.error is None and len(publisher.confirmed) == 20, \
                    f"round {round_number}: {len(publisher.confirmed)} of 20 confirmed, {publisher.error!r}"
                found = []
                while (got := declaring.basic_get(name, auto_ack=True))[0] is not None:
                    found.append(int(got[2]))
                declaring.queue_delete(name)
            lost = sorted(set(publisher.confirmed) - set(found))
            assert not lost, f"round {round_number}: {name} confirmed through {a} and lost {lost}\n" + servers[a].log()
            wait_for(lambda: all(running_nodes(servers[node]) == NAMES for node in NAMES),
                     "every node to see all again")
    finally:
        stop_all(servers)
        network.close()


BRIDGED_ROUNDS_SECONDS = 4.0   # past the answer's grace for a peer counted down (1.5 s) with room to spare
LEADER_DELAY_SECONDS = 0.2     # below the failure detector's 3 heartbeats of 0.25 s


@pytest.mark.parametrize("one_way", [False, True], ids=["both-ways", "one-way"])
def test_a_declaration_waits_for_a_node_only_the_declaring_node_cannot_reach(tmp_path, one_way):
    """A bridge: two nodes cut off from each other, both still hearing the third, the metadata
    leader. The declaring node counts the other down, and past its grace (NodeCore.answer_peers)
    it answered without it, though the other was up, unfenced (it reaches the leader) and
    serving clients: it applied the change one replication later, so a client that published
    through it at once was routed by what it knew before: unroutable, so confirmed and dropped.
    What the leader sends the cut-off node is delayed a little, so that replication is late
    enough to lose the race on loopback. The queue lives on the leader, which both reach;
    rounds of bind-then-publish run from the cut on until well past that grace. One way:
    only what the publishing node sends the declaring node is lost, and only the declaring
    node counts the other down."""
    network = Network({name: free_port() for name in NAMES})
    servers = start_cluster(tmp_path, network=network)
    try:
        leader = metadata_leader(servers[NAMES[0]])
        assert leader in NAMES, f"no metadata leader known: {leader!r}"
        publishing_node, declaring_node = (name for name in NAMES if name != leader)
        exchange, queue = unique("bridged"), unique("bridged")
        with connect(servers[leader]) as connection:   # the queue's first leader: the declaring node
            setup = connection.channel()
            setup.exchange_declare(exchange, "direct", durable=True)
            setup.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        network.cut(publishing_node, declaring_node, one_way=one_way)
        network.delay(leader, publishing_node, LEADER_DELAY_SECONDS)
        wait_for(lambda: publishing_node not in running_nodes(servers[declaring_node])
                 and (one_way or declaring_node not in running_nodes(servers[publishing_node])),
                 "the cut to be noticed")
        confirmed = []
        with connect(servers[declaring_node]) as declaring_connection, \
                connect(servers[publishing_node]) as publishing_connection:
            binding = declaring_connection.channel()
            publishing = publishing_connection.channel()
            publishing.confirm_delivery()
            ends_at = time.monotonic() + BRIDGED_ROUNDS_SECONDS
            while time.monotonic() < ends_at:
                key = unique("key")
                binding.queue_bind(queue, exchange, routing_key=key)
                publishing.basic_publish(exchange, key, key.encode(), pika.BasicProperties(delivery_mode=2))
                confirmed.append(key)
        network.heal()
        wait_for(lambda: all(running_nodes(servers[node]) == NAMES for node in NAMES), "every node to see all again")
        with connect(servers[leader]) as connection:
            channel = connection.channel()
            found = set()
            while (got := channel.basic_get(queue, auto_ack=True))[0] is not None:
                found.add(got[2].decode())
        lost = [key for key in confirmed if key not in found]
        assert len(confirmed) >= 3, f"{len(confirmed)} rounds ran: too few to have run past the grace"
        assert not lost, (f"{len(lost)} of {len(confirmed)} messages confirmed through {publishing_node} were lost "
                          f"(bound through {declaring_node}, leader {leader}): {lost[:5]}\n"
                          + servers[publishing_node].log())
    finally:
        stop_all(servers)
        network.close()


FIVE_NAMES = [f"{letter}@local" for letter in "abcde"]


def test_a_node_that_lost_the_metadata_leader_holds_its_clients_publishes(tmp_path):
    """Five nodes split 2 | 3 in two steps: p loses the three others first (its fence goes
    up, and down again through the leader L, which it still hears); then L loses them too.
    L steps down (it hears no majority), the three elect a leader, and p counts nobody new
    down: no link of its went down, yet it can apply nothing more. A binding made on the
    three's side is answered without p (counted down long ago, and nobody says it reaches
    p), so p must hold its clients' publishes now, as when a link goes down: routed by what
    it knew, they were unroutable, so confirmed and dropped."""
    network = Network({name: free_port() for name in FIVE_NAMES})
    servers = start_cluster(tmp_path, gone_seconds=60.0, network=network, names=FIVE_NAMES)
    try:
        leader = wait_for(lambda: metadata_leader(servers[FIVE_NAMES[0]]), "a metadata leader")
        p = next(name for name in FIVE_NAMES if name != leader)
        majority = [name for name in FIVE_NAMES if name not in (p, leader)]
        exchange, queue = unique("lost-leader"), unique("lost-leader")
        with connect(servers[p]) as connection:   # a durable classic queue lives on p: no replica elsewhere
            channel = connection.channel()
            channel.exchange_declare(exchange, "direct", durable=True)
            channel.queue_declare(queue, durable=True)
            channel.confirm_delivery()
            for other in majority:
                network.cut(p, other)
            wait_for(lambda: running_nodes(servers[p]) == sorted([p, leader]), f"{p} to count the three down")
            channel.basic_publish("", queue, b"fence", pika.BasicProperties(delivery_mode=2))   # its fence is down
        for other in majority:
            network.cut(leader, other)
        wait_for(lambda: metadata_leader(servers[majority[0]]) in majority, "the three to elect a leader")
        wait_for(lambda: metadata_leader(servers[p]) is None, f"{p} to lose the old leader")
        with connect(servers[majority[0]]) as binding_connection, connect(servers[p]) as publishing_connection:
            binding_connection.channel().queue_bind(queue, exchange, routing_key="key")
            publisher = ConfirmedPublisher(publishing_connection, queue, 5, exchange=exchange, routing_key="key")
            publisher.start()
            try:
                deadline = time.monotonic() + 3.0   # time for the loss to show, if it comes
                wait_for(lambda: len(publisher.confirmed) == 5 or time.monotonic() >= deadline,
                         "the publisher to finish, or 3 s")
            finally:
                network.heal()
            publisher.join(60)
        assert publisher.error is None and len(publisher.confirmed) == 5, \
            f"{len(publisher.confirmed)} of 5 confirmed, {publisher.error!r}"
        with connect(servers[p]) as connection:
            channel = connection.channel()
            found = []
            while (got := channel.basic_get(queue, auto_ack=True))[0] is not None:
                found.append(got[2])
        lost = [number for number in publisher.confirmed if str(number).encode() not in found]
        assert not lost, (f"confirmed through {p} after it lost the leader {leader}, and lost: {lost}\n"
                          + servers[p].log())
    finally:
        stop_all(servers)
        network.close()
