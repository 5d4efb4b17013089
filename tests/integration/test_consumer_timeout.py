"""consumer_timeout: an unacknowledged delivery held too long closes its channel (406)."""
from __future__ import annotations

import time

import pika
from pika.exceptions import ChannelClosedByBroker

from tests.serverproc import make_server

WAIT_SECONDS = 10.0


def test_a_delivery_held_past_the_timeout_closes_the_channel_and_is_requeued(tmp_path):
    server = make_server(tmp_path, WARREN_CONSUMER_TIMEOUT_MS="500",
                         WARREN_ALARM_CHECK_INTERVAL_SECONDS="0.05").start()
    try:
        connection = pika.BlockingConnection(pika.URLParameters(server.url))
        prompt = connection.channel()
        slow = connection.channel()
        prompt.queue_declare("work")
        for body in (b"kept", b"acked"):
            prompt.basic_publish("", "work", body)
        reasons = []
        slow._impl.add_on_close_callback(lambda _channel, reason: reasons.append(reason))  # pika has no public hook
        held = slow.basic_get("work", auto_ack=False)
        assert held[2] == b"kept"
        acked = prompt.basic_get("work", auto_ack=False)
        prompt.basic_ack(acked[0].delivery_tag)  # acknowledged in time: this channel stays
        deadline = time.monotonic() + WAIT_SECONDS
        while not reasons:
            assert time.monotonic() < deadline, "the channel holding the delivery was never closed"
            connection.process_data_events(time_limit=0.05)
        closed = reasons[0]
        assert isinstance(closed, ChannelClosedByBroker), closed
        assert closed.reply_code == 406 and "delivery acknowledgement on channel" in closed.reply_text, closed
        assert prompt.is_open, "the channel that acknowledged in time was closed too"
        again = prompt.basic_get("work", auto_ack=True)
        assert again[2] == b"kept" and again[0].redelivered, "the timed-out delivery did not come back"
        connection.close()
    finally:
        server.stop()
