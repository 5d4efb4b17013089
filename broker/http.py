"""The node's HTTP endpoint, on the broker's event loop: Prometheus and management.

``/metrics`` (and ``/``) is the Prometheus text format, open like RabbitMQ's
prometheus plugin. ``/api/...`` are the read-only management views
(``broker.management``) as JSON, behind HTTP Basic authentication against the
configured users, with the same loopback rule as AMQP logins.
"""
from __future__ import annotations

import asyncio
import base64
import json
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from broker import management
from broker.auth import AuthenticationError, authenticate
from broker.metrics import BrokerCollector

if TYPE_CHECKING:
    from broker.broker import Broker

# A request is one line plus headers; anything longer is not a client of ours.
REQUEST_MAX_BYTES = 16384
REQUEST_TIMEOUT_SECONDS = 10


async def start_http_server(broker: "Broker", host: str, port: int) -> asyncio.Server:
    registry = CollectorRegistry()
    registry.register(BrokerCollector(broker))

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=REQUEST_TIMEOUT_SECONDS)
            peer = writer.get_extra_info("peername")
            status, content_type, body, extra = _respond(broker, registry, head, peer[0] if peer else "")
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + content_type + extra +
                         b"\r\nContent-Length: " + str(len(body)).encode() +
                         b"\r\nConnection: close\r\n\r\n" + body)
            await writer.drain()
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port, limit=REQUEST_MAX_BYTES)


def _respond(broker: "Broker", registry: CollectorRegistry, head: bytes,
             peer_host: str) -> tuple[bytes, bytes, bytes, bytes]:
    lines = head.split(b"\r\n")
    request_line = lines[0].split()
    if len(request_line) < 2 or request_line[0] != b"GET":
        return b"405 Method Not Allowed", b"text/plain", b"only GET\n", b""
    path = request_line[1].split(b"?")[0].decode("latin-1")
    if path in ("/metrics", "/"):
        return b"200 OK", CONTENT_TYPE_LATEST.encode(), generate_latest(registry), b""
    view = management.VIEWS.get(path)
    if view is None:
        return b"404 Not Found", b"text/plain", b"not found\n", b""
    if not _authorized(broker, lines[1:], peer_host):
        return (b"401 Unauthorized", b"text/plain", b"authentication required\n",
                b'\r\nWWW-Authenticate: Basic realm="warren"')
    body = json.dumps(view(broker), default=str).encode()
    return b"200 OK", b"application/json", body, b""


def _authorized(broker: "Broker", header_lines: list[bytes], peer_host: str) -> bool:
    for line in header_lines:
        name, _, value = line.partition(b":")
        if name.strip().lower() != b"authorization":
            continue
        scheme, _, encoded = value.strip().partition(b" ")
        if scheme.lower() != b"basic":
            return False
        try:
            user, _, password = base64.b64decode(encoded, validate=True).partition(b":")
        except ValueError:
            return False
        try:
            authenticate(broker.settings, "PLAIN", b"\0" + user + b"\0" + password, peer_host)
        except AuthenticationError:
            return False
        return True
    return False
