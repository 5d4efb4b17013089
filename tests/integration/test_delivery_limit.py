"""Quorum-queue redeliveries: x-delivery-count, and x-delivery-limit dead-letters."""
from __future__ import annotations

import pika


def test_redeliveries_count_up_and_the_limit_dead_letters(server, name):
    connection = pika.BlockingConnection(pika.URLParameters(server.url))
    channel = connection.channel()
    channel.queue_declare(name + "-dead")
    channel.queue_declare(name, durable=True, arguments={
        "x-queue-type": "quorum", "x-delivery-limit": 2,
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": name + "-dead"})
    channel.basic_publish("", name, b"poison")
    counts = []
    for _ in range(3):
        method, properties, body = channel.basic_get(name, auto_ack=False)
        assert body == b"poison", f"expected the message back, got {method}"
        counts.append((properties.headers or {}).get("x-delivery-count"))
        channel.basic_nack(method.delivery_tag, requeue=True)
    assert counts == [None, 1, 2], f"x-delivery-count on deliveries: {counts}"
    assert channel.basic_get(name, auto_ack=True)[0] is None, "the message came back past its limit"
    method, properties, body = channel.basic_get(name + "-dead", auto_ack=True)
    assert body == b"poison" and properties.headers["x-death"][0]["reason"] == "delivery_limit", properties
    connection.close()
