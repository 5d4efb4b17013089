"""Helpers for the pika integration tests: bounded waits, connections, cleanup.

Every wait here has a deadline and fails with a message naming what it was
waiting for; nothing sleeps to synchronise. A channel error from an
asynchronous method (basic.publish, basic.ack) surfaces at the next
synchronous call, so ``sync`` makes one that changes nothing.
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import pika
import pytest
from pika.exceptions import AMQPChannelError, AMQPConnectionError

WAIT_SECONDS = 5.0
POLL_SECONDS = 0.05
DRAIN_MESSAGES_MAX = 10_000


def parameters(server, **overrides) -> pika.ConnectionParameters:
    options = dict(
        host="127.0.0.1",
        port=server.amqp_port,
        virtual_host="/",
        credentials=pika.PlainCredentials("guest", "guest"),
        connection_attempts=1,
        socket_timeout=5,
        stack_timeout=10,
        blocked_connection_timeout=10,
    )
    options.update(overrides)
    return pika.ConnectionParameters(**options)


@contextlib.contextmanager
def connect(server, **overrides) -> Iterator[pika.BlockingConnection]:
    connection = pika.BlockingConnection(parameters(server, **overrides))
    try:
        yield connection
    finally:
        if connection.is_open:
            connection.close()


def pump_until(connection: pika.BlockingConnection, predicate: Callable[[], bool], what: str,
               timeout: float = WAIT_SECONDS) -> None:
    """Process I/O until ``predicate()`` holds; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        connection.process_data_events(time_limit=min(POLL_SECONDS, remaining))


def pump_for(connection: pika.BlockingConnection, seconds: float) -> None:
    """Process I/O for ``seconds`` (to observe that nothing more arrives)."""
    deadline = time.monotonic() + seconds
    while (remaining := deadline - time.monotonic()) > 0:
        connection.process_data_events(time_limit=remaining)


def sync(channel) -> None:
    """A synchronous no-op round trip: raises the channel error an async method caused."""
    channel.exchange_declare("amq.direct", passive=True)


def assert_closed_by(error: Exception, reply_code: int, text: str) -> None:
    assert error.reply_code == reply_code, (
        f"expected reply code {reply_code} with {text!r}, got {error.reply_code} {error.reply_text!r}")
    assert text in error.reply_text, (
        f"expected {text!r} in the reply text, got {error.reply_code} {error.reply_text!r}")


def get_one(channel, queue: str, auto_ack: bool = False, timeout: float = WAIT_SECONDS):
    """basic.get until a message comes (bounded); returns (method, properties, body)."""
    deadline = time.monotonic() + timeout
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=auto_ack)
        if method is not None:
            return method, properties, body
        if time.monotonic() > deadline:
            raise AssertionError(f"no message arrived in queue {queue!r} within {timeout}s")
        channel.connection.process_data_events(time_limit=POLL_SECONDS)


def drain(channel, queue: str) -> list[bytes]:
    """Take every ready message with auto-ack; returns the bodies in order."""
    bodies = []
    for _ in range(DRAIN_MESSAGES_MAX):
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return bodies
        bodies.append(body)
    raise AssertionError(f"queue {queue!r} held more than {DRAIN_MESSAGES_MAX} messages")


def publish_confirmed(channel, queue: str, bodies: list[bytes]) -> None:
    """Persistent, mandatory publishes on a confirming channel: each returns once confirmed."""
    channel.confirm_delivery()
    for body in bodies:
        channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2), mandatory=True)


def message_count(connection: pika.BlockingConnection, queue: str) -> int:
    channel = connection.channel()
    try:
        return channel.queue_declare(queue, passive=True).method.message_count
    finally:
        if channel.is_open:
            channel.close()


def wait_queue_gone(connection: pika.BlockingConnection, queue: str, timeout: float = WAIT_SECONDS) -> None:
    """Passive-declare on fresh channels until the broker says 404 (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        channel = connection.channel()
        try:
            channel.queue_declare(queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker as error:
            assert error.reply_code == 404, f"expected 404 for a deleted queue, got {error!r}"
            return
        channel.close()
        if time.monotonic() > deadline:
            raise AssertionError(f"queue {queue!r} still exists after {timeout}s")
        connection.process_data_events(time_limit=POLL_SECONDS)


class Names:
    """Queues and exchanges a test made, deleted after it."""

    def __init__(self) -> None:
        self.queues: list[str] = []
        self.exchanges: list[str] = []

    def queue(self, name: str) -> str:
        self.queues.append(name)
        return name

    def exchange(self, name: str) -> str:
        self.exchanges.append(name)
        return name


@pytest.fixture
def cleanup(server) -> Iterator[Names]:
    names = Names()
    yield names
    if not names.queues and not names.exchanges:
        return
    with connect(server) as connection:
        channel = connection.channel()
        for kind, items in (("queue", names.queues), ("exchange", names.exchanges)):
            for item in items:
                if not channel.is_open:
                    channel = connection.channel()
                try:
                    if kind == "queue":
                        channel.queue_delete(item)
                    else:
                        channel.exchange_delete(item)
                except (AMQPChannelError, AMQPConnectionError):
                    pass  # best effort: the test itself may have broken it


@pytest.fixture
def connection(server) -> Iterator[pika.BlockingConnection]:
    with connect(server) as opened:
        yield opened
