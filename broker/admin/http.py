"""The node's HTTP endpoint, on the broker's event loop: Prometheus and management.

``/metrics`` (and ``/``) is the Prometheus text format, open like RabbitMQ's
prometheus plugin. ``/api/...`` are the management views (GET) and changes
(POST with a JSON body: quorum queue membership; the reply waits until the
metadata Raft group has applied the change) of ``broker.admin.management``, as
JSON, behind HTTP Basic authentication against the node's users (as AMQP
logins: the same password hashes and loopback rule); users, vhosts and
permissions (`management.ADMIN_PATHS`) need the "administrator" tag, else
403. A change refused answers 400/404 (503 when the metadata group does not
commit it in time) with {"error": text}. Request bodies (which may hold a
new password) are never logged.
"""
from __future__ import annotations

import asyncio
import base64
import json
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from warren.broker.admin import management
from warren.broker.admin.auth import ADMINISTRATOR, AuthenticationError, UserRecord, authenticate
from warren.broker.admin.metrics import BrokerCollector

if TYPE_CHECKING:
    from warren.broker.node.broker import Broker

# A request is one line plus headers; anything longer is not a client of ours.
REQUEST_MAX_BYTES = 16384
REQUEST_TIMEOUT_SECONDS = 10
# The JSON body of a POST.
BODY_MAX_BYTES = 65536
STATUS_LINES = {200: b"200 OK", 400: b"400 Bad Request", 403: b"403 Forbidden", 404: b"404 Not Found",
                503: b"503 Service Unavailable"}

Response = tuple[bytes, bytes, bytes, bytes]   # status line, content type, body, extra header lines


async def start_http_server(broker: "Broker", host: str, port: int) -> asyncio.Server:
    registry = CollectorRegistry()
    registry.register(BrokerCollector(broker))

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=REQUEST_TIMEOUT_SECONDS)
            peer = writer.get_extra_info("peername")
            peer_host = peer[0] if peer else ""
            if head.startswith(b"POST "):
                status, content_type, body, extra = await _respond_post(broker, reader, head, peer_host)
            else:
                status, content_type, body, extra = _respond(broker, registry, head, peer_host)
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + content_type + extra +
                         b"\r\nContent-Length: " + str(len(body)).encode() +
                         b"\r\nConnection: close\r\n\r\n" + body)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port, limit=REQUEST_MAX_BYTES)


def _respond(broker: "Broker", registry: CollectorRegistry, head: bytes, peer_host: str) -> Response:
    lines = head.split(b"\r\n")
    request_line = lines[0].split()
    if len(request_line) < 2 or request_line[0] != b"GET":
        return b"405 Method Not Allowed", b"text/plain", b"only GET and POST\n", b"\r\nAllow: GET, POST"
    path = request_line[1].split(b"?")[0].decode("latin-1")
    if path in ("/metrics", "/"):
        return b"200 OK", CONTENT_TYPE_LATEST.encode(), generate_latest(registry), b""
    view = management.VIEWS.get(path)
    if view is None:
        if path in management.ACTIONS:
            return b"405 Method Not Allowed", b"text/plain", b"POST only\n", b"\r\nAllow: POST"
        return b"404 Not Found", b"text/plain", b"not found\n", b""
    refused = _refused(broker, path, lines[1:], peer_host)
    if refused is not None:
        return refused
    body = json.dumps(view(broker), default=str).encode()
    return b"200 OK", b"application/json", body, b""


async def _respond_post(broker: "Broker", reader: asyncio.StreamReader, head: bytes, peer_host: str) -> Response:
    lines = head.split(b"\r\n")
    request_line = lines[0].split()
    path = request_line[1].split(b"?")[0].decode("latin-1") if len(request_line) > 1 else ""
    action = management.ACTIONS.get(path)
    if action is None:
        if path in management.VIEWS or path in ("/metrics", "/"):
            return b"405 Method Not Allowed", b"text/plain", b"GET only\n", b"\r\nAllow: GET"
        return b"404 Not Found", b"text/plain", b"not found\n", b""
    length = _content_length(lines[1:])
    if length is None or length > BODY_MAX_BYTES:
        return _error(400, f"a JSON body of at most {BODY_MAX_BYTES} bytes, with its Content-Length, is required")
    raw = await asyncio.wait_for(reader.readexactly(length), timeout=REQUEST_TIMEOUT_SECONDS)
    refused = _refused(broker, path, lines[1:], peer_host)
    if refused is not None:
        return refused
    try:
        body = json.loads(raw) if raw.strip() else {}
    except ValueError:
        return _error(400, "the body is not JSON")
    if not isinstance(body, dict):
        return _error(400, "the body must be a JSON object")
    try:
        result = await action(broker, body)
    except management.ManagementError as error:
        return _error(error.status, error.text)
    return b"200 OK", b"application/json", json.dumps(result, default=str).encode(), b""


def _content_length(header_lines: list[bytes]) -> int | None:
    for line in header_lines:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                return None
            return length if length >= 0 else None
    return None


def _error(status: int, text: str) -> Response:
    line = STATUS_LINES.get(status, str(status).encode() + b" Error")
    return line, b"application/json", json.dumps({"error": text}).encode(), b""


def _unauthorized() -> Response:
    return (b"401 Unauthorized", b"text/plain", b"authentication required\n",
            b'\r\nWWW-Authenticate: Basic realm="warren"')


def _refused(broker: "Broker", path: str, header_lines: list[bytes], peer_host: str) -> Response | None:
    """None if the request's user may use `path`, else the 401 or 403 answer."""
    user = _authorized(broker, header_lines, peer_host)
    if user is None:
        return _unauthorized()
    if path in management.ADMIN_PATHS and ADMINISTRATOR not in user.tags:
        return _error(403, f"user '{user.name}' is not tagged '{ADMINISTRATOR}'")
    return None


def _authorized(broker: "Broker", header_lines: list[bytes], peer_host: str) -> UserRecord | None:
    for line in header_lines:
        name, _, value = line.partition(b":")
        if name.strip().lower() != b"authorization":
            continue
        scheme, _, encoded = value.strip().partition(b" ")
        if scheme.lower() != b"basic":
            return None
        try:
            user, _, password = base64.b64decode(encoded, validate=True).partition(b":")
        except ValueError:
            return None
        try:
            return authenticate(broker.access, "PLAIN", b"\0" + user + b"\0" + password, peer_host)
        except AuthenticationError:
            return None
    return None
