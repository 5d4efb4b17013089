"""Resource alarms are cluster-wide, as RabbitMQ's: while one node is low on disk, a
publisher connected to another node is blocked too (connection.blocked, "low on disk"),
and unblocked once that node's alarm no longer counts (here: the node is stopped, and
RabbitMQ clears a down node's alarms). Without it the other nodes' publishers went on
filling the low node's disk with their queues' entries until its WAL write failed and
the node stopped for good (a long fault run, docs/verification-tools.md)."""
from __future__ import annotations

import time

import pika

from tests.integration.quorum_cluster import NAMES, SECRET, api, start_nodes, stop_all, wait_for

QUEUE = "alarm-everywhere"


def _pump_until(connection: pika.BlockingConnection, predicate, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {seconds}s waiting for {what}"
        connection.process_data_events(time_limit=0.05)


def test_a_nodes_disk_alarm_blocks_publishers_on_the_other_nodes_until_it_is_gone(tmp_path):
    publishing_node, low_node = NAMES[0], NAMES[1]
    servers = start_nodes(tmp_path, NAMES, {name: SECRET for name in NAMES},
                          node_env={low_node: {"WARREN_DISK_FREE_LIMIT_BYTES": str(10**18)}},  # no disk is this big
                          WARREN_ALARM_CHECK_INTERVAL_SECONDS="0.05")
    try:
        for name, server in servers.items():
            wait_for(lambda s=server: api(s, "/api/overview")["running_nodes"] == NAMES, f"{name} to see all nodes")
        events: list[str] = []
        parameters = pika.URLParameters(servers[publishing_node].url)
        parameters.blocked_connection_timeout = 60   # pika's default would close a blocked connection
        publisher = pika.BlockingConnection(parameters)
        publisher.add_on_connection_blocked_callback(lambda _c, frame: events.append(frame.method.reason))
        publisher.add_on_connection_unblocked_callback(lambda _c, frame: events.append("unblocked"))
        channel = publisher.channel()
        channel.queue_declare(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        channel.basic_publish("", QUEUE, b"while-blocked")
        _pump_until(publisher, lambda: events, 15,
                    f"connection.blocked on {publishing_node} while {low_node} is low on disk")
        assert events == ["low on disk"], f"blocked with {events}, expected RabbitMQ's 'low on disk'"

        servers[low_node].stop()
        _pump_until(publisher, lambda: "unblocked" in events, 15,
                    f"connection.unblocked on {publishing_node} once {low_node} is down")
        confirmed = publisher.channel()
        confirmed.confirm_delivery()
        confirmed.basic_publish("", QUEUE, b"after", mandatory=True)   # raises if nacked or returned
        bodies = []
        for _ in range(2):
            _, _, body = confirmed.basic_get(QUEUE, auto_ack=True)
            bodies.append(body)
        assert bodies == [b"while-blocked", b"after"], f"the queue held {bodies}"
        publisher.close()
    finally:
        stop_all(servers)
