"""Queued persistent messages keep their bodies on disk, not in the broker's memory."""
from __future__ import annotations

import hashlib

import pika
import pytest

from tests.serverproc import make_server

BODY_BYTES = 256 * 1024
MESSAGES = 800  # 200 MiB of bodies


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc status")


def _body(number: int) -> bytes:
    seed = hashlib.sha256(number.to_bytes(4, "big")).digest()
    return (seed * (BODY_BYTES // len(seed) + 1))[:BODY_BYTES]


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_backlog_bodies_are_read_back_from_disk(tmp_path, queue_type):
    """A quorum queue's machine keeps references into its Raft log, and the
    log's applied entries leave memory: the bodies are on disk in both kinds."""
    # A fixed mmap threshold: glibc then returns freed large buffers to the OS at once,
    # so RSS shows what the broker holds rather than what the allocator keeps around.
    # A small WAL keeps the transient memory of a rollover (which reads one WAL file) small.
    # The memory alarm counts bodies in memory only: a backlog on disk far over the
    # watermark must not block the publisher (pika raises if blocked for 10 s).
    server = make_server(tmp_path, MALLOC_MMAP_THRESHOLD_="65536",
                         WARREN_WAL_MAX_SIZE_BYTES=str(8 * 1024 * 1024),
                         WARREN_MEMORY_HIGH_WATERMARK_BYTES=str(MESSAGES * BODY_BYTES // 4),
                         WARREN_ALARM_CHECK_INTERVAL_SECONDS="0.05").start()
    try:
        parameters = pika.URLParameters(server.url)
        parameters.blocked_connection_timeout = 10
        connection = pika.BlockingConnection(parameters)
        channel = connection.channel()
        channel.queue_declare("backlog", durable=True, arguments={"x-queue-type": queue_type})
        channel.confirm_delivery()
        rss_before = _rss_bytes(server.process.pid)
        for number in range(MESSAGES):
            channel.basic_publish("", "backlog", _body(number), pika.BasicProperties(delivery_mode=2))
        rss_full = _rss_bytes(server.process.pid)
        held = rss_full - rss_before
        assert held < MESSAGES * BODY_BYTES // 4, (
            f"the broker's RSS grew by {held} bytes for {MESSAGES * BODY_BYTES} bytes of queued bodies: "
            "bodies are being held in memory")

        for number in range(MESSAGES):  # every body comes back intact, in order
            method, _, body = channel.basic_get("backlog", auto_ack=False)
            assert method is not None, f"message {number} missing"
            assert body == _body(number), f"message {number} came back damaged"
            if number % 2:
                channel.basic_ack(method.delivery_tag)
            else:  # a requeued stored message is read from disk again
                channel.basic_nack(method.delivery_tag, requeue=True)
                again, _, body_again = channel.basic_get("backlog", auto_ack=True)
                assert again.redelivered and body_again == _body(number), f"redelivery of {number} differs"
        assert channel.queue_declare("backlog", passive=True).method.message_count == 0
        connection.close()
    finally:
        server.stop()


def test_basic_get_without_ack_of_large_messages_answers_every_one(tmp_path):
    """A basic.get with auto_ack settles its message as the queue applies it; with 300 KB
    bodies the same apply could compact the log past the message, and the answer, read
    after that, was "empty": the second of ten confirmed messages was lost."""
    server = make_server(tmp_path).start()
    try:
        with pika.BlockingConnection(pika.URLParameters(server.url)) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            channel.queue_declare("large", durable=True, arguments={"x-queue-type": "quorum"})
            for number in range(10):
                channel.basic_publish("", "large", _body(number) + b"x" * (300_000 - BODY_BYTES),
                                      pika.BasicProperties(delivery_mode=2))
            got = [channel.basic_get("large", auto_ack=True)[2] for _ in range(10)]
        missing = [number for number, body in enumerate(got) if body != _body(number) + b"x" * (300_000 - BODY_BYTES)]
        assert not missing, f"basic.get answered messages {missing} wrongly (empty: {[b is None for b in got]})"
    finally:
        server.stop()
