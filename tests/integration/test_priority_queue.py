"""x-max-priority: higher-priority messages are delivered first, across a restart too."""
from __future__ import annotations

import signal

import pika

from tests.serverproc import make_server


def drain(channel, queue: str) -> list[bytes]:
    bodies = []
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return bodies
        bodies.append(body)


def test_priorities_order_deliveries_and_survive_kill_9(tmp_path):
    server = make_server(tmp_path).start()
    try:
        connection = pika.BlockingConnection(pika.URLParameters(server.url))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("prio", durable=True, arguments={"x-max-priority": 5})
        for body, priority in ((b"low", 0), (b"high", 5), (b"mid", 2), (b"none", None), (b"over", 9)):
            channel.basic_publish("", "prio", body, pika.BasicProperties(delivery_mode=2, priority=priority))
        connection.close()
        server.stop(signal.SIGKILL)
        server.start()
        connection = pika.BlockingConnection(pika.URLParameters(server.url))
        # 9 is capped at the queue's maximum (5): after "high", in publish order
        assert drain(connection.channel(), "prio") == [b"high", b"over", b"mid", b"low", b"none"]
        connection.close()
    finally:
        server.stop()
