"""The memory alarm blocks publishers with connection.blocked, as RabbitMQ's does."""
from __future__ import annotations

import time

import pika

from tests.serverproc import make_server

WATERMARK_BYTES = 1024 * 1024


def _wait_for(predicate, connection: pika.BlockingConnection, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        connection.process_data_events(time_limit=0.05)


def test_publishers_blocked_over_watermark_and_unblocked_after_drain(tmp_path):
    server = make_server(tmp_path, WARREN_MEMORY_HIGH_WATERMARK_BYTES=str(WATERMARK_BYTES),
                         WARREN_ALARM_CHECK_INTERVAL_SECONDS="0.05").start()
    try:
        events: list[str] = []
        publisher = pika.BlockingConnection(pika.URLParameters(server.url))
        publisher.add_on_connection_blocked_callback(lambda _c, frame: events.append("blocked"))
        publisher.add_on_connection_unblocked_callback(lambda _c, frame: events.append("unblocked"))
        channel = publisher.channel()
        channel.queue_declare("alarm-q")
        body = b"x" * 65536
        for _ in range(2 * WATERMARK_BYTES // len(body)):
            channel.basic_publish("", "alarm-q", body)
        _wait_for(lambda: "blocked" in events, publisher, 10, "connection.blocked over the watermark")

        # Another connection (one that does not publish) is not blocked and can drain.
        drainer = pika.BlockingConnection(pika.URLParameters(server.url))
        drained = drainer.channel().queue_purge("alarm-q").method.message_count
        assert drained >= WATERMARK_BYTES // len(body), f"only {drained} messages were queued"
        _wait_for(lambda: "unblocked" in events, publisher, 10, "connection.unblocked after the drain")
        assert events == ["blocked", "unblocked"], f"unexpected alarm events {events}"

        channel.basic_publish("", "alarm-q", b"after")  # reading resumed: this goes through
        assert drainer.channel().basic_get("alarm-q", auto_ack=True)[2] in (b"after", body)
        drainer.close()
        publisher.close()
    finally:
        server.stop()


def test_disk_alarm_blocks_publishers_when_free_space_is_below_the_limit(tmp_path):
    # A limit larger than any disk: the alarm is on from the first check.
    server = make_server(tmp_path, WARREN_DISK_FREE_LIMIT_BYTES=str(10**18),
                         WARREN_ALARM_CHECK_INTERVAL_SECONDS="0.05").start()
    try:
        reasons: list[str] = []
        publisher = pika.BlockingConnection(pika.URLParameters(server.url))
        publisher.add_on_connection_blocked_callback(
            lambda _c, frame: reasons.append(frame.method.reason))
        channel = publisher.channel()
        channel.queue_declare("disk-alarm-q")
        channel.basic_publish("", "disk-alarm-q", b"first")
        _wait_for(lambda: reasons, publisher, 10, "connection.blocked from the disk alarm")
        assert reasons == ["low on disk"], f"blocked with {reasons}, expected RabbitMQ's 'low on disk'"
        # No graceful close here: a blocked connection is not read from, so (as with
        # RabbitMQ) its connection.close would wait for the alarm to clear. Stopping
        # the server closes it with 320 instead.
    finally:
        server.stop()
