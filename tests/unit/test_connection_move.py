"""The pure parts of moving a connection to its queue's shard (broker/amqp/connection_move.py):
the parser stopping before the first commitment, and what a replay may repeat.

The property that makes a move invisible to the client: the input before the stop,
parsed again by a fresh connection, gives the same events; the unparsed rest then
gives the events a connection that never stopped would have given."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands as spec

from tests.unit.test_parser_fuzz import chunked
from tests.unit.wire import (
    HANDSHAKE,
    channel_open,
    heartbeat,
    method,
    new_connection,
    normalise,
    publish,
)
from warren.broker.amqp.connection_move import MOVE_MAX_BYTES, MoveWatch
from warren.protocol.constants import BASIC_CONSUME, BASIC_PUBLISH
from warren.protocol.errors import AMQPConnectionError

BEFORE = (HANDSHAKE + channel_open(1) + channel_open(2)
          + method(1, spec.Confirm.Select()) + method(2, spec.Basic.Qos(prefetch_count=3)) + heartbeat()
          + method(1, spec.Queue.Declare(queue="q", durable=True)))
PUBLISH_ON = (publish(1, b"abc" * 40, exchange="", routing_key="q", chunk=50)
              + publish(2, b"x", exchange="", routing_key="q")
              + method(2, spec.Basic.Consume(queue="q", consumer_tag="c"))
              + method(1, spec.Basic.Ack(delivery_tag=1)))
CONSUME_ON = method(2, spec.Basic.Consume(queue="q", consumer_tag="c")) + publish(1, b"y", routing_key="q")


def parse_all(data: bytes) -> list[tuple]:
    return [normalise(e) for e in new_connection().receive_data(data)]


def stop_and_split(chunks: list[bytes]) -> tuple[list[tuple], bytes, bytes, object]:
    """Feed `chunks` to a watching parser until it stops: (events before the stop, the input
    parsed, the input not parsed, the parser)."""
    conn = new_connection()
    conn.stop_at_commitment = True
    events: list[tuple] = []
    fed = b""
    for at, chunk in enumerate(chunks):
        fed += chunk
        events += [normalise(e) for e in conn.receive_data(chunk)]
        if conn.stopped_at is not None:
            rest = b"".join(chunks[at + 1:])
            unparsed = conn.unparsed
            return events, fed[:len(fed) - len(unparsed)], unparsed + rest, conn
    raise AssertionError("the parser never stopped")


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=len(BEFORE + PUBLISH_ON)), max_size=12))
def test_a_stop_before_the_first_publish_splits_the_stream_into_a_replay_and_a_rest(cuts):
    stream = BEFORE + PUBLISH_ON
    events, parsed, rest, conn = stop_and_split(chunked(stream, cuts))
    assert parsed == BEFORE, "the stop is not at the first publish's method frame"
    assert conn.stopped_at is not None and conn.stopped_at[:2] == (1, BASIC_PUBLISH)
    assert events == parse_all(BEFORE), "the events before the stop differ from a plain parse"
    assert parse_all(parsed) == events, "a replay of the parsed input gives other events"
    not_fed = rest[len(conn.unparsed):]
    conn.resume()
    after = [normalise(e) for e in conn.receive_data(b"") + conn.receive_data(not_fed)]
    assert events + after == parse_all(stream), "parsing on after the stop lost or changed events"
    replayed = new_connection()
    replayed.receive_data(parsed)   # the receiving shard: the replay, then the rest as received
    assert [normalise(e) for e in replayed.receive_data(rest)] == after


def test_a_stop_before_the_first_consume():
    events, parsed, rest, conn = stop_and_split([BEFORE + CONSUME_ON])
    assert conn.stopped_at is not None and conn.stopped_at[:2] == (2, BASIC_CONSUME)
    consume = spec.Basic.Consume()
    consume.unmarshal(conn.stopped_at[2])
    assert consume.queue == "q"
    assert parsed == BEFORE and rest == CONSUME_ON


def test_a_parser_not_watching_never_stops():
    conn = new_connection()
    events = conn.receive_data(BEFORE + PUBLISH_ON)
    assert conn.stopped_at is None and conn.unparsed == b""
    assert [normalise(e) for e in events] == parse_all(BEFORE + PUBLISH_ON)


def test_a_publish_on_a_channel_not_open_is_no_commitment():
    conn = new_connection()
    conn.stop_at_commitment = True
    conn.receive_data(HANDSHAKE)
    with pytest.raises(AMQPConnectionError, match="expected 'channel.open'"):   # as without the watch
        conn.receive_data(publish(3, b"z", routing_key="q"))
    assert conn.stopped_at is None


def test_what_a_replay_may_repeat():
    watch = MoveWatch()
    for replayable in (spec.Connection.StartOk(), spec.Connection.TuneOk(), spec.Connection.Open(),
                       spec.Channel.Open(), spec.Basic.Qos(prefetch_count=1), spec.Confirm.Select(),
                       spec.Queue.Declare(queue="q", durable=True)):
        assert watch.note(replayable), f"{replayable.name} is repeated exactly by a replay"
    assert watch.declared == {"q"}
    for not_replayable in (spec.Queue.Declare(queue="", durable=True), spec.Queue.Declare(queue="t"),
                           spec.Queue.Declare(queue="e", durable=True, exclusive=True),
                           spec.Queue.Declare(queue="n", durable=True, nowait=True),
                           spec.Exchange.Declare(exchange="x"), spec.Queue.Bind(queue="q", exchange="x"),
                           spec.Basic.Get(queue="q"), spec.Tx.Select(), spec.Channel.Close(),
                           spec.Queue.Delete(queue="q"), spec.Basic.Recover()):
        assert not watch.note(not_replayable), f"{not_replayable.name} must end the watch"


def test_the_history_is_what_was_received_but_the_unparsed_end_and_is_bounded():
    watch = MoveWatch()
    assert watch.record(b"abc") and watch.record(b"defg")
    assert watch.history(2) == b"abcde" and watch.history(0) == b"abcdefg"
    assert not watch.record(bytes(MOVE_MAX_BYTES)), "more than a move carries must end the watch"
