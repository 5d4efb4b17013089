"""The chaos run's final drain acks in batches and records every ack it sent, no more."""
from __future__ import annotations

from types import SimpleNamespace

from warren.verification.chaos.drain import ACK_EVERY, QueueDrainer


class Recorder:
    def __init__(self):
        self.events: list[tuple[str, str, bool]] = []

    def record(self, event, *, message_id=None, redelivered=None, **_):
        self.events.append((event, message_id, redelivered))


class Channel:
    def __init__(self):
        self.acks: list[tuple[int, bool]] = []

    async def basic_ack(self, delivery_tag, multiple=False):
        self.acks.append((delivery_tag, multiple))


def message(channel, tag: int, redelivered: bool = False):
    return SimpleNamespace(channel=channel, header=SimpleNamespace(properties=SimpleNamespace(message_id=f"p:{tag}")),
                           delivery=SimpleNamespace(delivery_tag=tag, redelivered=redelivered))


async def test_one_multiple_ack_per_batch_then_the_rest_at_the_poll():
    recorder, channel = Recorder(), Channel()
    drainer = QueueDrainer("amqp://guest:guest@127.0.0.1:1/", "q", "drain-n1-q", recorder)
    count = ACK_EVERY * 2 + 7
    for tag in range(1, count + 1):
        await drainer._on_message(message(channel, tag, redelivered=tag == 3))

    assert channel.acks == [(ACK_EVERY, True), (2 * ACK_EVERY, True)]
    assert drainer.delivered == 2 * ACK_EVERY
    await drainer._ack(channel)   # what the poll does
    assert channel.acks[-1] == (count, True) and drainer.delivered == count
    await drainer._ack(channel)   # nothing new: no frame
    assert len(channel.acks) == 3

    delivers = [e for e in recorder.events if e[0] == "deliver"]
    acks = [e for e in recorder.events if e[0] == "ack"]
    assert [e[1] for e in delivers] == [e[1] for e in acks] == [f"p:{t}" for t in range(1, count + 1)]
    assert [e[1] for e in acks if e[2]] == ["p:3"], "an ack is recorded with its delivery's redelivered flag"


async def test_an_ack_is_recorded_only_once_sent():
    recorder, channel = Recorder(), Channel()
    drainer = QueueDrainer("amqp://guest:guest@127.0.0.1:1/", "q", "drain-n1-q", recorder)
    for tag in range(1, 6):
        await drainer._on_message(message(channel, tag))
    assert channel.acks == [] and drainer.delivered == 0
    assert not [e for e in recorder.events if e[0] == "ack"], "nothing acked yet, nothing recorded as acked"
