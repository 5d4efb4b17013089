"""Quorum queues on three real nodes: many publishers and consumers on different nodes,
unacked messages coming back when a channel closes or a consumer's node dies (or
restarts), and dead-letter / alternate-exchange routes delivering exactly once."""
from __future__ import annotations

import contextlib
import signal
import threading
import time
import uuid

import pika
import pytest

from tests.integration.quorum_cluster import (
    NAMES,
    Publisher,
    api,
    connect,
    declare_everywhere,
    leader_of,
    queue_view,
    start_cluster,
    stop_all,
    wait_for,
)

PER_PUBLISHER = 500
PUBLISH_NODES = ["a@local", "b@local", "c@local", "a@local"]
CONSUME_NODES = ["c@local", "b@local", "a@local", "b@local"]
UNACKED = 10


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def logs(servers, nodes=None) -> str:
    return "\n".join(f"--- {n} log (tail) ---\n{servers[n].log()}" for n in nodes or NAMES
                     if servers[n].process is not None)


class Collector:
    """What all consumers received, shared between their threads."""

    def __init__(self, want: set[bytes]):
        self.want = want
        self.lock = threading.Lock()
        self.seen: dict[bytes, str] = {}          # body -> consumer that got it first
        self.duplicates: list[tuple[bytes, str, str]] = []
        self.done = threading.Event()

    def record(self, body: bytes, who: str) -> None:
        with self.lock:
            if body in self.seen:
                self.duplicates.append((body, self.seen[body], who))
            else:
                self.seen[body] = who
            if self.want <= self.seen.keys():
                self.done.set()


class Consumer(threading.Thread):
    """Consumes with manual acks on a connection of its own until the collector is done."""

    def __init__(self, server, queue: str, collector: Collector, name: str, prefetch: int = 20,
                 seconds: float = 45.0):
        super().__init__(daemon=True, name=name)
        self.server, self.queue, self.collector = server, queue, collector
        self.prefetch, self.seconds = prefetch, seconds
        self.received: list[tuple[bytes, bool]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            deadline = time.monotonic() + self.seconds
            with connect(self.server) as connection:
                channel = connection.channel()
                channel.basic_qos(prefetch_count=self.prefetch)
                for method, _, body in channel.consume(self.queue, inactivity_timeout=0.2):
                    if method is not None:
                        self.received.append((body, method.redelivered))
                        self.collector.record(body, self.name)
                        channel.basic_ack(method.delivery_tag)
                    if self.collector.done.is_set() or time.monotonic() > deadline:
                        break
                channel.cancel()
        except BaseException as error:  # noqa: BLE001 -- reported by the test
            self.error = error


def take_unacked(channel, queue: str, count: int, seconds: float = 20.0) -> list[tuple[bytes, bool]]:
    """Consume `count` messages (prefetch `count`) and do not ack them."""
    channel.basic_qos(prefetch_count=count)
    taken: list[tuple[bytes, bool]] = []
    for method, _, body in channel.consume(queue, inactivity_timeout=seconds):
        assert method is not None, f"only {len(taken)} of {count} messages delivered in {seconds}s: {taken}"
        taken.append((body, method.redelivered))
        if len(taken) == count:
            break
    return taken


def receive(server, queue: str, count: int, seconds: float) -> list[tuple[bytes, bool]]:
    """Consume and ack until `count` messages arrived; fail if none arrives for `seconds`."""
    got: list[tuple[bytes, bool]] = []
    with connect(server) as connection:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=count)
        for method, _, body in channel.consume(queue, inactivity_timeout=seconds):
            assert method is not None, f"only {len(got)} of {count} messages arrived (none for {seconds}s): {got}"
            got.append((body, method.redelivered))
            channel.basic_ack(method.delivery_tag)
            if len(got) == count:
                break
        channel.cancel()
    return got


def publish_confirmed(server, exchange: str, routing_key: str, bodies: list[bytes], headers=None) -> None:
    with connect(server) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for body in bodies:
            channel.basic_publish(exchange, routing_key, body,
                                  pika.BasicProperties(delivery_mode=2, headers=headers), mandatory=True)


def get_one(channel, queue: str, what: str, seconds: float = 10.0):
    """basic_get until a message is there (a node may apply a committed entry a little later)."""
    def got():
        method, properties, body = channel.basic_get(queue, auto_ack=False)
        return (method, properties, body) if method is not None else None
    return wait_for(got, what, seconds)


def assert_no_more(channel, queue: str, seconds: float = 1.0) -> None:
    """Poll basic_get for `seconds`: a second copy must not appear."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        assert method is None, f"a second copy arrived in {queue}: {body!r} headers={properties.headers}"
        time.sleep(0.05)  # an observation window, not synchronisation


def queue_settled_empty(servers, queue: str, nodes=None) -> bool:
    views = [queue_view(servers[n], queue) for n in nodes or NAMES]
    return all(v is not None and v["messages_ready"] == 0 and v["messages_unacked"] == 0 for v in views)


def known_everywhere(servers, path: str, match, nodes=None) -> bool:
    return all(any(match(item) for item in api(servers[n], path)) for n in nodes or NAMES)


# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("restart_first", [False, True], ids=["declared-and-used-at-once", "after-a-restart"])
def test_four_publishers_four_consumers_on_three_nodes(tmp_path, restart_first):
    """Declared through a@local and used at once through every node (no wait until the
    others know it: declare-ok means they do), also right after c@local restarted."""
    servers = start_cluster(tmp_path)
    try:
        if restart_first:
            servers["c@local"].stop()
            servers["c@local"].start()
        queue = unique("many")
        with connect(servers["a@local"]) as connection:
            connection.channel().queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        tags = [f"p{i}" for i in range(len(PUBLISH_NODES))]
        want = {f"{tag}:{n}".encode() for tag in tags for n in range(PER_PUBLISHER)}
        collector = Collector(want)
        consumers = [Consumer(servers[node], queue, collector, f"consumer-{i}@{node}")
                     for i, node in enumerate(CONSUME_NODES)]
        publishers = [Publisher(servers[node], queue, PER_PUBLISHER, tag) for tag, node in zip(tags, PUBLISH_NODES)]
        for thread in consumers + publishers:
            thread.start()
        for publisher in publishers:
            publisher.join(50)
            assert not publisher.is_alive(), f"{publisher.name} still publishing after 50s " \
                                             f"({len(publisher.confirmed)} confirmed)\n{logs(servers)}"
            assert publisher.error is None, f"{publisher.name} failed: {publisher.error!r}\n{logs(servers)}"
            assert len(publisher.confirmed) == PER_PUBLISHER
        for consumer in consumers:
            consumer.join(50)
            assert not consumer.is_alive(), f"{consumer.name} never finished"
            assert consumer.error is None, f"{consumer.name} failed: {consumer.error!r}\n{logs(servers)}"

        missing = want - collector.seen.keys()
        assert not missing, f"{len(missing)} confirmed messages never arrived, e.g. {sorted(missing)[:10]}"
        assert collector.seen.keys() == want, f"unexpected bodies: {sorted(collector.seen.keys() - want)[:10]}"
        assert not collector.duplicates, f"{len(collector.duplicates)} bodies received twice " \
                                         f"(body, first, second): {collector.duplicates[:10]}"
        for consumer in consumers:
            redelivered = [body for body, again in consumer.received if again]
            assert not redelivered, f"{consumer.name} got redeliveries without any failure: {redelivered[:10]}"
            last: dict[str, int] = {}
            for body, _ in consumer.received:
                tag, number = body.decode().split(":")
                assert int(number) > last.get(tag, -1), \
                    f"{consumer.name} got {body!r} after {tag}:{last[tag]} (per-publisher order broken)"
                last[tag] = int(number)
        assert sum(len(c.received) for c in consumers) == len(want)
        wait_for(lambda: queue_settled_empty(servers, queue),
                 f"{queue} to be empty (nothing ready or unacked) everywhere")
        # Nothing left behind after the consumers cancelled: no late copy.
        with connect(servers["b@local"]) as connection:
            assert_no_more(connection.channel(), queue, 0.5)
    finally:
        stop_all(servers)


def test_unacked_messages_return_to_another_node_when_their_channel_closes(tmp_path):
    servers = start_cluster(tmp_path)
    try:
        queue = unique("closed")
        declare_everywhere(servers, "a@local", queue)
        bodies = [f"m:{i}".encode() for i in range(UNACKED)]
        publish_confirmed(servers["a@local"], "", queue, bodies)
        with connect(servers["b@local"]) as connection:
            channel = connection.channel()
            taken = take_unacked(channel, queue, UNACKED)
            assert [b for b, _ in taken] == bodies, f"node b took {taken}"
            assert not any(again for _, again in taken), f"first deliveries flagged redelivered: {taken}"
            wait_for(lambda: (queue_view(servers["c@local"], queue) or {}).get("messages_unacked") == UNACKED,
                     f"node c to see {UNACKED} unacked in {queue}")
            channel.close()
            got = receive(servers["c@local"], queue, UNACKED, seconds=10)
        assert sorted(b for b, _ in got) == sorted(bodies), f"node c got {got}"
        assert all(again for _, again in got), f"returned messages not flagged redelivered: {got}"
        wait_for(lambda: queue_settled_empty(servers, queue), f"{queue} to be empty everywhere")
    finally:
        stop_all(servers)


def _held_by_a_follower_node(servers, name: str, tag: str):
    """A queue whose UNACKED messages a consumer on a node that does not lead
    it holds: (queue, leader, that node, the third node, bodies, its connection)."""
    queue = unique(name)
    declare_everywhere(servers, "a@local", queue)
    leader = leader_of(servers, queue)
    victim, survivor = [n for n in NAMES if n != leader]
    bodies = [f"{tag}:{i}".encode() for i in range(UNACKED)]
    publish_confirmed(servers[leader], "", queue, bodies)
    connection = connect(servers[victim])
    taken = take_unacked(connection.channel(), queue, UNACKED)
    assert sorted(b for b, _ in taken) == sorted(bodies), f"{victim} took {taken}"
    wait_for(lambda: (queue_view(servers[survivor], queue) or {}).get("messages_unacked") == UNACKED,
             f"{survivor} to see {UNACKED} unacked in {queue}")
    return queue, leader, victim, survivor, bodies, connection


def test_unacked_messages_return_when_the_consumers_node_is_killed(tmp_path):
    gone = 2.0
    servers = start_cluster(tmp_path, gone_seconds=gone)
    try:
        queue, leader, victim, survivor, bodies, connection = _held_by_a_follower_node(servers, "killed", "k")
        killed_at = time.monotonic()
        servers[victim].stop(signal.SIGKILL)
        margin = 10.0
        got = receive(servers[survivor], queue, UNACKED, seconds=gone + margin)
        took = time.monotonic() - killed_at
        assert sorted(b for b, _ in got) == sorted(bodies), f"{survivor} got {got}\n{logs(servers, [leader, survivor])}"
        assert all(again for _, again in got), f"returned messages not flagged redelivered: {got}"
        assert took < gone + margin, f"messages came back {took:.1f}s after the kill (gone timeout {gone}s)"
        wait_for(lambda: queue_settled_empty(servers, queue, [leader, survivor]),
                 f"{queue} to be empty on the survivors")
        with contextlib.suppress(pika.exceptions.AMQPError, OSError):  # the node behind it is dead
            connection.close()
    finally:
        stop_all(servers)


def test_unacked_messages_return_when_the_consumers_node_restarts_before_it_is_gone(tmp_path):
    gone = 60.0  # only the restart (a new incarnation) can return the messages in this test's time
    servers = start_cluster(tmp_path, gone_seconds=gone)
    try:
        queue, leader, victim, survivor, bodies, connection = _held_by_a_follower_node(servers, "restarted", "r")
        killed_at = time.monotonic()
        servers[victim].stop(signal.SIGKILL)
        servers[victim].start()
        got = receive(servers[survivor], queue, UNACKED, seconds=25)
        took = time.monotonic() - killed_at
        assert sorted(b for b, _ in got) == sorted(bodies), f"{survivor} got {got}\n{logs(servers)}"
        assert all(again for _, again in got), f"returned messages not flagged redelivered: {got}"
        assert took < gone, f"messages came back only after {took:.1f}s (the gone timeout, not the restart)"
        wait_for(lambda: queue_settled_empty(servers, queue), f"{queue} to be empty everywhere after the rejoin")
        with contextlib.suppress(pika.exceptions.AMQPError, OSError):  # the process behind it was killed
            connection.close()
    finally:
        stop_all(servers)


def test_rejected_message_reaches_the_dead_letter_queue_exactly_once(tmp_path):
    servers = start_cluster(tmp_path)
    try:
        dlx, dead, source = unique("dlx"), unique("dead"), unique("source")
        with connect(servers["a@local"]) as connection:
            connection.channel().exchange_declare(dlx, "fanout", durable=True)
        declare_everywhere(servers, "a@local", dead)
        with connect(servers["a@local"]) as connection:
            connection.channel().queue_bind(dead, dlx)
        declare_everywhere(servers, "a@local", source, **{"x-dead-letter-exchange": dlx})
        wait_for(lambda: known_everywhere(servers, "/api/bindings",
                                          lambda b: b["source"] == dlx and b["destination"] == dead),
                 f"every node to know the binding {dlx} -> {dead}")

        publish_confirmed(servers["b@local"], "", source, [b"doomed"])
        with connect(servers["c@local"]) as connection:
            channel = connection.channel()
            method, _, body = get_one(channel, source, f"the message in {source} through node c")
            assert body == b"doomed"
            channel.basic_reject(method.delivery_tag, requeue=False)

        with connect(servers["a@local"]) as connection:
            channel = connection.channel()
            method, properties, body = get_one(channel, dead, f"the dead-lettered message in {dead} through node a")
            channel.basic_ack(method.delivery_tag)
            assert body == b"doomed"
            deaths = (properties.headers or {}).get("x-death")
            assert deaths and deaths[0]["reason"] == "rejected" and deaths[0]["queue"] == source, \
                f"x-death is {deaths!r}"
            assert deaths[0]["count"] == 1, f"x-death count is {deaths[0]['count']} (dead-lettered more than once?)"
            assert_no_more(channel, dead, 1.0)
        wait_for(lambda: queue_settled_empty(servers, source), f"{source} to be empty everywhere")
        wait_for(lambda: queue_settled_empty(servers, dead), f"{dead} to be empty everywhere")
    finally:
        stop_all(servers)


def test_unroutable_message_reaches_the_alternate_exchange_queue_exactly_once(tmp_path):
    servers = start_cluster(tmp_path)
    try:
        main, alternate, unrouted = unique("main"), unique("ae"), unique("unrouted")
        with connect(servers["a@local"]) as connection:
            channel = connection.channel()
            channel.exchange_declare(alternate, "fanout", durable=True)
            channel.exchange_declare(main, "direct", durable=True, arguments={"alternate-exchange": alternate})
        declare_everywhere(servers, "a@local", unrouted)
        with connect(servers["a@local"]) as connection:
            connection.channel().queue_bind(unrouted, alternate)
        wait_for(lambda: known_everywhere(servers, "/api/bindings",
                                          lambda b: b["source"] == alternate and b["destination"] == unrouted),
                 f"every node to know the binding {alternate} -> {unrouted}")
        wait_for(lambda: known_everywhere(servers, "/api/exchanges",
                                          lambda e: e["name"] == main and e["arguments"].get("alternate-exchange")
                                          == alternate),
                 f"every node to know {main} with its alternate exchange")

        # mandatory=True: a return (UnroutableError) would mean the alternate route was not taken.
        publish_confirmed(servers["b@local"], main, "no-such-key", [b"stray"])
        with connect(servers["c@local"]) as connection:
            channel = connection.channel()
            method, _, body = get_one(channel, unrouted, f"the unroutable message in {unrouted} through node c")
            channel.basic_ack(method.delivery_tag)
            assert body == b"stray"
            assert_no_more(channel, unrouted, 1.0)
        wait_for(lambda: queue_settled_empty(servers, unrouted), f"{unrouted} to be empty everywhere")
    finally:
        stop_all(servers)
