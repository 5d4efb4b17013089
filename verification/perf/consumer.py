"""A consumer with a prefetch and manual acks, one ack per delivery."""
from __future__ import annotations

import time

from warren.verification.perf.link import LINK_ERRORS, Link, declare_queue
from warren.verification.perf.options import PerfOptions
from warren.verification.perf.stats import PerfStats


class Consumer:
    def __init__(self, consumer_id: str, queue: str, link: Link, options: PerfOptions, stats: PerfStats, recorder):
        self.consumer_id, self.queue, self.link = consumer_id, queue, link
        self.options, self.stats, self.recorder = options, stats, recorder
        self.last_delivery = time.monotonic()

    async def run(self) -> None:
        """Consume until cancelled, reconnecting (to the next node) when the connection fails."""
        while True:
            connection = await self.link.open()
            try:
                channel = await connection.channel()
                await declare_queue(channel, self.queue, self.options.queue_type, self.options.queue_args)
                await channel.basic_qos(prefetch_count=self.options.prefetch)
                await channel.basic_consume(self.queue, self._on_message, no_ack=False)
                await channel.closing
                raise ConnectionError("channel closed")
            except LINK_ERRORS as error:
                self.link.lost(error)

    async def _on_message(self, message) -> None:
        self.last_delivery = time.monotonic()
        properties = message.header.properties
        redelivered = bool(message.delivery.redelivered)
        self.stats.delivered += 1
        self.stats.redelivered += redelivered
        sent_ns = (properties.headers or {}).get("sent_ns")
        if isinstance(sent_ns, int):
            self.stats.delivery_took(time.monotonic_ns() - sent_ns)
        self._record("deliver", properties.message_id, redelivered)
        try:
            await message.channel.basic_ack(message.delivery.delivery_tag)
        except LINK_ERRORS:
            return  # the connection is going: the broker will redeliver
        self.stats.acked += 1
        self._record("ack", properties.message_id, redelivered)

    def _record(self, event: str, mid: str | None, redelivered: bool) -> None:
        if self.recorder is not None:
            publisher_id, _, seq = (mid or "").rpartition(":")
            self.recorder.record(event, queue=self.queue, message_id=mid, publisher_id=publisher_id or None,
                                 seq=int(seq) if seq.isdigit() else None, consumer_id=self.consumer_id,
                                 node=self.link.node, redelivered=redelivered)
