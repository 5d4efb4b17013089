"""A quorum queue on three real nodes: publish through one node, consume through
another, kill -9 the leader's node mid-stream, restart it."""
from __future__ import annotations

import signal

import pika

from tests.integration.quorum_cluster import (
    NAMES,
    Publisher,
    connect,
    declare_everywhere,
    leader_of,
    queue_view,
    start_cluster,
    stop_all,
    wait_for,
)
from tests.serverproc import start_together

MESSAGES = 1500


def consume_until(server, queue: str, want: set[bytes], seconds: float = 60.0) -> list[tuple[bytes, bool]]:
    """Consume (prefetch 50, ack each) until every body in `want` has arrived."""
    received: list[tuple[bytes, bool]] = []
    seen: set[bytes] = set()
    with connect(server) as connection:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=50)
        for method, _, body in channel.consume(queue, inactivity_timeout=seconds):
            assert method is not None, (f"no delivery for {seconds}s; still missing "
                                        f"{len(want - seen)} of {len(want)}, e.g. {sorted(want - seen)[:5]}")
            received.append((body, method.redelivered))
            seen.add(body)
            channel.basic_ack(method.delivery_tag)
            if want <= seen:
                break
        channel.cancel()
    return received


def assert_per_publisher_order(received: list[tuple[bytes, bool]]) -> None:
    last: dict[str, int] = {}
    for body, redelivered in received:
        tag, number = body.decode().split(":")
        if not redelivered and int(number) < last.get(tag, -1):
            raise AssertionError(f"{body!r} arrived after {tag}:{last[tag]} without being a redelivery")
        last[tag] = max(last.get(tag, -1), int(number))


def test_kill_the_leaders_node_mid_stream_then_restart_it(tmp_path):
    servers = start_cluster(tmp_path)
    try:
        queue = "failover"
        declare_everywhere(servers, "a@local", queue)
        leader = leader_of(servers, queue)
        others = [n for n in NAMES if n != leader]
        publish_via, consume_via = others
        publisher = Publisher(servers[publish_via], queue, MESSAGES, "p")
        publisher.start()
        wait_for(lambda: len(publisher.confirmed) >= MESSAGES // 3, "a third of the messages to be confirmed")
        servers[leader].stop(signal.SIGKILL)
        publisher.join(120)
        assert not publisher.is_alive(), "the publisher never finished after the leader was killed"
        assert publisher.error is None, f"publisher failed: {publisher.error!r}"
        new_leader = wait_for(lambda: leader_of(servers, queue, others) != leader and leader_of(servers, queue, others),
                              "a new leader")
        assert new_leader in others
        want = {f"p:{n}".encode() for n in publisher.confirmed}
        received = consume_until(servers[consume_via], queue, want)
        assert want <= {body for body, _ in received}
        assert_per_publisher_order(received)

        servers[leader].start()
        # The restarted replica catches up with the others (log or snapshot).
        def caught_up():
            views = [queue_view(servers[n], queue) for n in NAMES]
            return all(v is not None for v in views) and len({(v["messages_ready"], v["leader"]) for v in views}) == 1
        wait_for(caught_up, f"{leader} to catch up after its restart")
    finally:
        stop_all(servers)


def test_the_whole_cluster_restarts_with_its_queues_and_messages(tmp_path):
    servers = start_cluster(tmp_path)
    try:
        queue = "restart-all"
        declare_everywhere(servers, "b@local", queue)
        with connect(servers["c@local"]) as connection:
            channel = connection.channel()
            channel.exchange_declare("restart-x", "direct", durable=True)
            channel.queue_bind(queue, "restart-x", "k")
        publisher = Publisher(servers["a@local"], queue, 300, "r")
        publisher.run()
        assert publisher.error is None and len(publisher.confirmed) == 300, publisher.error
        for node, server in servers.items():
            server.stop(signal.SIGKILL if node == "a@local" else signal.SIGTERM)
        start_together(servers.values())
        for node, server in servers.items():
            wait_for(lambda s=server: (queue_view(s, queue) or {}).get("leader"), f"{node} to know {queue}'s leader")
        with connect(servers["b@local"]) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.basic_publish("restart-x", "k", b"r:300", pika.BasicProperties(delivery_mode=2), mandatory=True)
        received = consume_until(servers["c@local"], queue, {f"r:{n}".encode() for n in range(301)})
        assert sorted({body for body, _ in received}) == sorted(f"r:{n}".encode() for n in range(301))
    finally:
        stop_all(servers)
