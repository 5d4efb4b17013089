"""A consumer with a prefetch and manual acks: one per delivery, or one `multiple` ack
every --multi-ack-every deliveries (and whatever is left once deliveries pause)."""
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
        self.ack_channel = None
        self.unacked: list[tuple[int, str | None, bool]] = []  # (delivery tag, message id, redelivered)

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
        if message.channel is not self.ack_channel:
            self.ack_channel, self.unacked = message.channel, []  # a lost channel's tags mean nothing now
        self.unacked.append((message.delivery.delivery_tag, properties.message_id, redelivered))
        if len(self.unacked) >= self.options.multi_ack_every:
            await self.ack_unacked()

    async def ack_unacked(self) -> None:
        """One basic.ack for every delivery not acked yet (`multiple` when there are several)."""
        if not self.unacked:
            return
        acking, self.unacked = self.unacked, []
        try:
            await self.ack_channel.basic_ack(acking[-1][0], multiple=len(acking) > 1)
        except LINK_ERRORS:
            return  # the connection is going: the broker will redeliver
        self.stats.acked += len(acking)
        for _, mid, redelivered in acking:
            self._record("ack", mid, redelivered)

    def _record(self, event: str, mid: str | None, redelivered: bool) -> None:
        if self.recorder is not None:
            publisher_id, _, seq = (mid or "").rpartition(":")
            self.recorder.record(event, queue=self.queue, message_id=mid, publisher_id=publisher_id or None,
                                 seq=int(seq) if seq.isdigit() else None, consumer_id=self.consumer_id,
                                 node=self.link.node, redelivered=redelivered)
