"""x-single-active-consumer: one consumer gets the messages; the next takes over."""
from __future__ import annotations

import time

import pika

WAIT_SECONDS = 10.0


def pump_until(connection, predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        connection.process_data_events(time_limit=0.05)


def test_only_the_first_consumer_receives_until_it_cancels(server, name):
    connection = pika.BlockingConnection(pika.URLParameters(server.url))
    first, second = connection.channel(), connection.channel()
    first.queue_declare(name, arguments={"x-single-active-consumer": True})
    got: dict[str, list[bytes]] = {"first": [], "second": []}
    tag = first.basic_consume(name, lambda ch, m, p, body: got["first"].append(body), auto_ack=True)
    second.basic_consume(name, lambda ch, m, p, body: got["second"].append(body), auto_ack=True)
    for number in range(5):
        first.basic_publish("", name, b"a%d" % number)
    pump_until(connection, lambda: len(got["first"]) == 5, "five deliveries to the active consumer")
    assert got["second"] == [], f"the waiting consumer received {got['second']}"
    first.basic_cancel(tag)
    for number in range(3):
        first.basic_publish("", name, b"b%d" % number)
    pump_until(connection, lambda: len(got["second"]) == 3, "the next consumer to take over")
    assert got["second"] == [b"b0", b"b1", b"b2"] and len(got["first"]) == 5
    connection.close()
