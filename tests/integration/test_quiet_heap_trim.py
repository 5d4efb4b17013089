"""A real node gives its heap's free memory back once quiet, and again after more work
(broker/node/heap_trim.py), while it goes on serving: pika against warren-server."""
from __future__ import annotations

import time

import pika
import pytest

from tests.integration.pika_support import connect
from tests.integration.test_pika_metrics import scrape, value
from tests.serverproc import make_server

pytestmark = pytest.mark.timeout(90)

WAIT_SECONDS = 20.0
POLL_SECONDS = 0.05
BODY = b"x" * 4096


def trims(server) -> float:
    return value(scrape(server), "warren_heap_trims_total")


def wait_for_trims(server, at_least: float) -> float:
    deadline = time.monotonic() + WAIT_SECONDS
    while (count := trims(server)) < at_least:
        assert time.monotonic() < deadline, f"no heap trim {WAIT_SECONDS}s after the node went quiet ({count} so far)"
        time.sleep(POLL_SECONDS)   # polling the metric: the trim runs on the node's own clock
    return count


def publish_confirmed(server, queue: str, count: int) -> None:
    with connect(server) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        for _ in range(count):
            channel.basic_publish("", queue, BODY, pika.BasicProperties(delivery_mode=2))


def test_a_quiet_node_trims_its_heap_once_a_spell_and_keeps_its_messages(tmp_path):
    server = make_server(tmp_path, WARREN_HEAP_TRIM_QUIET_SECONDS="0.3",
                         WARREN_ALARM_CHECK_INTERVAL_SECONDS="0.1").start()
    try:
        publish_confirmed(server, "trimmed", 2000)
        first = wait_for_trims(server, 1)
        publish_confirmed(server, "trimmed", 500)   # work again: the next quiet spell trims again
        wait_for_trims(server, first + 1)
        with connect(server) as connection:
            declared = connection.channel().queue_declare("trimmed", passive=True)
            assert declared.method.message_count == 2500
            method, _, body = connection.channel().basic_get("trimmed", auto_ack=True)
            assert method is not None and body == BODY
    finally:
        server.stop()

