"""commands_soft_limit: a channel whose quorum-queue publishes are not being
applied stops being read, so a fast publisher cannot grow the node's memory."""
from __future__ import annotations

import threading
import time

import pika

from tests.integration.quorum_cluster import (
    FREEZABLE_QUEUE,
    api,
    connect,
    declare_everywhere,
    freeze_queue_follower,
    queue_view,
    start_cluster,
    stop_all,
    thaw,
    wait_for,
)

MESSAGES = 5000
OBSERVE_SECONDS = 3.0
BODY = b"x" * 4096


def test_a_publisher_is_held_back_while_its_queue_cannot_commit(tmp_path):
    servers = start_cluster(tmp_path)
    frozen: list[str] = []
    try:
        declare_everywhere(servers, "a@local", "flow", **FREEZABLE_QUEUE)
        published = []
        done = threading.Event()

        def publish() -> None:
            with connect(servers[leader]) as connection:
                channel = connection.channel()
                for number in range(MESSAGES):
                    channel.basic_publish("", "flow", BODY, pika.BasicProperties(delivery_mode=2))
                    published.append(number)
            done.set()

        # Without a quorum nothing commits, so nothing the publisher sends is applied.
        leader, stopped = freeze_queue_follower(servers, "flow")
        frozen += stopped
        thread = threading.Thread(target=publish, daemon=True)
        thread.start()
        wait_for(lambda: api(servers[leader], "/api/overview")["quorum_enqueues_pending"] > 32,
                 "the leader to hold more unapplied publishes than commands_soft_limit")
        # The channel stopped being read: over an observation window the publisher stays
        # stalled with most of its messages unsent (in socket buffers at most) and the node
        # holds about the limit. Without flow control the node reads all 20 MB in well under
        # a second and holds every publish.
        most = 0
        deadline = time.monotonic() + OBSERVE_SECONDS
        while time.monotonic() < deadline:
            most = max(most, api(servers[leader], "/api/overview")["quorum_enqueues_pending"])
            assert not done.is_set(), f"all {MESSAGES} publishes went through while the queue could not commit"
            assert most < 1000, f"the node holds {most} unapplied publishes: reading did not stop"
            time.sleep(0.05)  # sampling within the observation window
        assert len(published) < MESSAGES, "the publisher was never held back"
        thaw(servers, frozen)
        assert done.wait(60), f"the publisher never finished after the quorum came back ({len(published)} sent)"
        wait_for(lambda: (queue_view(servers[leader], "flow") or {}).get("messages_ready") == MESSAGES,
                 f"all {MESSAGES} messages in the queue")
    finally:
        thaw(servers, frozen)
        stop_all(servers)


HEARTBEAT_SECONDS = 1
# how long the publisher is held: more than the 2 heartbeat intervals after which a silent peer is dropped
HELD_SECONDS = 4 * HEARTBEAT_SECONDS


def test_a_held_publisher_is_not_dropped_as_a_heartbeat_timeout(tmp_path):
    """RabbitMQ does not count the time flow control keeps a reader from reading."""
    servers = start_cluster(tmp_path)
    frozen: list[str] = []
    try:
        declare_everywhere(servers, "a@local", "flow-hb", **FREEZABLE_QUEUE)
        errors: list[Exception] = []
        done = threading.Event()

        def publish() -> None:
            try:
                url = servers[leader].url + f"?heartbeat={HEARTBEAT_SECONDS}"
                with pika.BlockingConnection(pika.URLParameters(url)) as connection:
                    channel = connection.channel()
                    for _ in range(MESSAGES):
                        channel.basic_publish("", "flow-hb", BODY, pika.BasicProperties(delivery_mode=2))
            except Exception as error:  # reported by the test thread below
                errors.append(error)
            done.set()

        leader, stopped = freeze_queue_follower(servers, "flow-hb")
        frozen += stopped
        threading.Thread(target=publish, daemon=True).start()
        wait_for(lambda: api(servers[leader], "/api/overview")["quorum_enqueues_pending"] > 32,
                 "the publisher to be held back by commands_soft_limit")
        assert not done.wait(HELD_SECONDS), f"the publisher was not held back (errors: {errors})"
        assert api(servers[leader], "/api/overview")["connections"] == 1, "the held publisher's connection was closed"
        thaw(servers, frozen)
        assert done.wait(60), "the publisher never finished after the quorum came back"
        assert not errors, f"the held publisher failed: {errors}"
        assert "connection.heartbeat_timeout" not in servers[leader].log(), "the node took flow control for a dead peer"
    finally:
        thaw(servers, frozen)
        stop_all(servers)
