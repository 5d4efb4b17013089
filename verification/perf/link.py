"""One client's connection to "the cluster": a list of URLs tried in turn, so a
client whose node fails reconnects to the next one, recording the loss and the
regain in the history."""
from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import aiormq

from warren.verification.perf.stats import PerfStats

RETRY_INITIAL_SECONDS = 0.1
RETRY_MAX_SECONDS = 2.0
CONNECT_TIMEOUT_SECONDS = 5.0
CLOSE_TIMEOUT_SECONDS = 2.0
# What a failing broker or network raises; anything else is a bug and propagates.
LINK_ERRORS = (aiormq.exceptions.AMQPError, ConnectionError, OSError, asyncio.TimeoutError,
               aiormq.exceptions.ChannelInvalidStateError)


def node_label(url: str) -> str:
    """host:port, without the credentials."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 5672}"


class Link:
    def __init__(self, urls: list[str], first: int, client_id: str, stats: PerfStats, recorder=None,
                 is_publisher: bool = False):
        self.urls, self.index = urls, first % len(urls)
        self.client_id, self.stats, self.recorder = client_id, stats, recorder
        self.is_publisher = is_publisher
        self.connection: aiormq.abc.AbstractConnection | None = None
        self.node: str | None = None
        self._was_lost = False

    async def open(self) -> aiormq.abc.AbstractConnection:
        """Connect to the current URL, else the next ones, until one answers."""
        delay = RETRY_INITIAL_SECONDS
        while True:
            url = self.urls[self.index]
            try:
                self.connection = await asyncio.wait_for(aiormq.connect(url), CONNECT_TIMEOUT_SECONDS)
                self.node = node_label(url)
                if self._was_lost:
                    self._record("connection_regained", None)
                    self.stats.reconnects += 1
                    self._was_lost = False
                return self.connection
            except LINK_ERRORS:
                self.index = (self.index + 1) % len(self.urls)
                await asyncio.sleep(delay)  # backoff between attempts, not synchronisation
                delay = min(delay * 2, RETRY_MAX_SECONDS)

    def lost(self, error: BaseException) -> None:
        """The connection failed: record it once, and move on to the next node."""
        if not self._was_lost:
            self._record("connection_lost", f"{type(error).__name__}: {error}"[:500])
            self.stats.connection_losses += 1
            self._was_lost = True
        self.index = (self.index + 1) % len(self.urls)
        asyncio.ensure_future(self.close())

    async def close(self) -> None:
        connection, self.connection = self.connection, None
        if connection is not None and not connection.is_closed:
            try:
                await asyncio.wait_for(connection.close(), CLOSE_TIMEOUT_SECONDS)
            except (*LINK_ERRORS, asyncio.CancelledError):
                pass

    def _record(self, event: str, detail: str | None) -> None:
        if self.recorder is not None:
            client = {"publisher_id" if self.is_publisher else "consumer_id": self.client_id}
            self.recorder.record(event, node=self.node, detail=detail, **client)


async def declare_queue(channel, name: str, queue_type: str, arguments: dict) -> None:
    await channel.queue_declare(name, durable=True, arguments={"x-queue-type": queue_type, **arguments})
