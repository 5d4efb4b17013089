"""A publisher with confirms and a window of unconfirmed messages (PerfTest's -c)."""
from __future__ import annotations

import asyncio
import time

import aiormq
from pamqp import commands as spec

from warren.verification.history import message_id
from warren.verification.perf.link import LINK_ERRORS, Link, declare_queue
from warren.verification.perf.options import PerfOptions
from warren.verification.perf.stats import PerfStats

FINAL_CONFIRMS_TIMEOUT_SECONDS = 30.0


class Publisher:
    def __init__(self, publisher_id: str, queue: str, link: Link, options: PerfOptions, stats: PerfStats, recorder):
        self.publisher_id, self.queue, self.link = publisher_id, queue, link
        self.options, self.stats, self.recorder = options, stats, recorder
        self.body = b"x" * options.size
        self.next_seq = 0
        self.window = asyncio.Semaphore(options.confirm_window)
        self.in_flight: set[asyncio.Task] = set()
        self.stopping = False  # set at the run's deadline

    async def run(self) -> None:
        """Publish until the message count (the run's deadline cancels us), across reconnects."""
        while not self._done():
            connection = await self.link.open()
            try:
                channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
                await declare_queue(channel, self.queue, self.options.queue_type, self.options.queue_args)
                await self._publish_on(channel)
            except LINK_ERRORS as error:
                self.link.lost(error)
        await self._await_last_confirms()
        await self.link.close()

    def _done(self) -> bool:
        return self.stopping or 0 < self.options.pmessages <= self.next_seq

    async def _publish_on(self, channel) -> None:
        interval = 1.0 / self.options.rate if self.options.rate > 0 else 0.0
        next_send = time.monotonic()
        while not self._done():
            if interval:
                next_send += interval
                if (pause := next_send - time.monotonic()) > 0:
                    await asyncio.sleep(pause)  # the rate limit
            await self.window.acquire()
            if channel.is_closed:
                self.window.release()
                raise aiormq.exceptions.ChannelInvalidStateError("channel closed")
            self._send(channel)

    def _send(self, channel) -> None:
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        mid = message_id(self.publisher_id, seq)
        sent_ns = time.monotonic_ns()
        if self.recorder is not None:
            self.recorder.record("publish", queue=self.queue, message_id=mid, publisher_id=self.publisher_id,
                                 seq=seq, node=self.link.node)
        self.stats.published += 1
        self.stats.outstanding_confirms += 1
        properties = spec.Basic.Properties(message_id=mid, delivery_mode=2, headers={"sent_ns": sent_ns})
        task = asyncio.ensure_future(self._confirm(channel, seq, mid, sent_ns, properties))
        self.in_flight.add(task)
        task.add_done_callback(self.in_flight.discard)

    async def _confirm(self, channel, seq: int, mid: str, sent_ns: int, properties) -> None:
        event, detail = None, None
        try:
            await channel.basic_publish(self.body, routing_key=self.queue, properties=properties, mandatory=True)
            event = "confirm"
            self.stats.confirmed += 1
            self.stats.confirm_took(time.monotonic_ns() - sent_ns)
        except aiormq.exceptions.PublishError as error:
            event, detail = "return", str(getattr(error.frame, "reply_text", ""))
            self.stats.returned += 1
        except aiormq.exceptions.DeliveryError:
            event = "nack"
            self.stats.nacked += 1
        except LINK_ERRORS:
            pass  # no answer: the outcome is unknown, which the history shows by the missing confirm
        finally:
            self.window.release()
            self.stats.outstanding_confirms -= 1
        if event and self.recorder is not None:
            self.recorder.record(event, queue=self.queue, message_id=mid, publisher_id=self.publisher_id,
                                 seq=seq, node=self.link.node, detail=detail)

    async def _await_last_confirms(self) -> None:
        if self.in_flight:
            await asyncio.wait(set(self.in_flight), timeout=FINAL_CONFIRMS_TIMEOUT_SECONDS)
