"""The final drain: a consumer on every node for every queue, until the queue is
empty and nothing arrived for a while, its deliveries recorded like any other."""
from __future__ import annotations

import asyncio
import time

import aiormq

from warren.verification.perf.link import LINK_ERRORS, node_label

POLL_SECONDS = 0.2
PREFETCH = 500
# One basic.ack (multiple) per this many deliveries, and whatever is left at every poll: an ack
# each is a settle command each for the queue's Raft group, and a drain of a few hundred
# thousand messages left by consumerless queues then outlasts --drain-max.
ACK_EVERY = 100


class QueueDrainer:
    def __init__(self, url: str, queue: str, consumer_id: str, recorder):
        self.url, self.queue, self.consumer_id, self.recorder = url, queue, consumer_id, recorder
        self.node = node_label(url)
        self.delivered = 0
        self.last_delivery = time.monotonic()
        self._unacked: list[tuple[str | None, bool]] = []   # (message id, redelivered) delivered, not yet acked
        self._last_tag = 0

    async def run(self, idle_seconds: float, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                connection = await asyncio.wait_for(aiormq.connect(self.url), 5)
            except LINK_ERRORS:
                await asyncio.sleep(POLL_SECONDS)  # the node is not back yet: retry until the deadline
                continue
            try:
                if await self._drain_on(connection, idle_seconds, deadline):
                    return
            except LINK_ERRORS:
                pass
            finally:
                await _close(connection)

    async def _drain_on(self, connection, idle_seconds: float, deadline: float) -> bool:
        channel = await connection.channel()
        self._unacked.clear()   # a new channel: what the last one delivered unacked comes again, flagged
        await channel.basic_qos(prefetch_count=PREFETCH)
        await channel.basic_consume(self.queue, self._on_message, no_ack=False)
        while time.monotonic() < deadline:
            await asyncio.sleep(POLL_SECONDS)  # polling emptiness and idleness, with a deadline
            await self._ack(channel)
            if time.monotonic() - self.last_delivery < idle_seconds:
                continue
            counts = await channel.queue_declare(self.queue, passive=True)
            if counts.message_count == 0:
                await self._ack(channel)   # anything delivered since this poll's ack
                return True
        await self._ack(channel)
        return False

    async def _on_message(self, message) -> None:
        self.last_delivery = time.monotonic()
        mid = message.header.properties.message_id
        redelivered = bool(message.delivery.redelivered)
        self._record("deliver", mid, redelivered)
        self._unacked.append((mid, redelivered))
        self._last_tag = message.delivery.delivery_tag
        if len(self._unacked) >= ACK_EVERY:
            await self._ack(message.channel)

    async def _ack(self, channel) -> None:
        """Ack every delivery so far with one basic.ack, then record each as acked."""
        if not self._unacked:
            return
        acked, self._unacked = self._unacked, []
        await channel.basic_ack(self._last_tag, multiple=True)
        self.delivered += len(acked)
        for mid, redelivered in acked:
            self._record("ack", mid, redelivered)

    def _record(self, event: str, mid: str | None, redelivered: bool) -> None:
        publisher_id, _, seq = (mid or "").rpartition(":")
        self.recorder.record(event, queue=self.queue, message_id=mid, publisher_id=publisher_id or None,
                             seq=int(seq) if seq.isdigit() else None, consumer_id=self.consumer_id,
                             node=self.node, redelivered=redelivered)


async def _close(connection) -> None:
    try:
        await asyncio.wait_for(connection.close(), 2)
    except (*LINK_ERRORS, asyncio.CancelledError):
        pass


async def drain_everything(urls: dict[str, str], queues: list[str], recorder, idle_seconds: float,
                           max_seconds: float) -> int:
    """Drain every queue through every node; the number of messages drained."""
    recorder.record("drain_start", detail=f"queues={','.join(queues)} nodes={','.join(urls)}")
    recorder.flush()
    deadline = time.monotonic() + max_seconds
    drainers = [QueueDrainer(url, queue, f"drain-{name}-{queue}", recorder)
                for name, url in urls.items() for queue in queues]
    await asyncio.gather(*(d.run(idle_seconds, deadline) for d in drainers))
    total = sum(d.delivered for d in drainers)
    timed_out = time.monotonic() >= deadline
    recorder.record("drain_end", detail=f"drained={total} timed_out={timed_out}")
    recorder.flush()
    return total
