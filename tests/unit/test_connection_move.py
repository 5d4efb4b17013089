"""The pure parts of moving a connection to its queue's shard (broker/amqp/connection_move.py):
the parser stopping before the first commitment, and what a replay may repeat.

The property that makes a move invisible to the client: the input before the stop,
parsed again by a fresh connection, gives the same events; the unparsed rest then
gives the events a connection that never stopped would have given."""
from __future__ import annotations

import asyncio

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
from warren.broker.amqp.connection import AMQPConnection
from warren.broker.amqp.connection_move import MOVE_MAX_BYTES, MoveWatch
from warren.broker.node.broker import Broker
from warren.config.settings import Settings
from warren.protocol import codec
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


class MovedSocket:
    """The transport of a socket another shard handed over: records what the client would read."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.aborted

    def get_extra_info(self, name: str, default=None):
        return ("127.0.0.1", 40000) if name == "peername" else default

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def abort(self) -> None:
        self.aborted = True

    close = abort


def moved_in(tmp_path, history: bytes, unparsed: bytes, channels: list[int]) -> tuple[AMQPConnection, MovedSocket]:
    """A connection made on a moved socket, as the receiving shard's server makes it."""
    async def arrive() -> tuple[AMQPConnection, MovedSocket]:
        connection = AMQPConnection(Broker(Settings(data_dir=tmp_path)), (history, unparsed, channels))
        transport = MovedSocket()
        connection.connection_made(transport)  # type: ignore[arg-type]
        return connection, transport
    return asyncio.run(arrive())


def test_a_moved_connection_replays_without_a_word_and_answers_from_its_commitment_on(tmp_path):
    history = (HANDSHAKE + channel_open(1) + method(1, spec.Confirm.Select())
               + method(1, spec.Basic.Qos(prefetch_count=7)))
    connection, socket = moved_in(tmp_path, history, method(1, spec.Basic.Qos(prefetch_count=9)), [1])
    assert socket.writes == [codec.encode_method(1, spec.Basic.QosOk())], (
        "the client had every reply to the replayed input from the shard it left; only the rest's go out")
    channel = connection.channels[1]
    assert channel.prefetch_count == 9 and channel.confirms is not None and not socket.aborted


def test_a_replay_that_cannot_log_in_again_drops_the_socket_without_a_word(tmp_path):
    history = (HANDSHAKE.replace(b"\0guest\0guest", b"\0guest\0wrong!") + channel_open(1))
    connection, socket = moved_in(tmp_path, history, b"", [1])
    assert socket.aborted and socket.writes == [], "a refused replay must not answer for the shard it came from"


def test_a_replay_that_ends_elsewhere_than_the_client_thinks_closes_with_320(tmp_path):
    connection, socket = moved_in(tmp_path, HANDSHAKE + channel_open(1), method(1, spec.Basic.Qos()), [1, 2])
    assert len(socket.writes) == 1 and not socket.aborted
    close = spec.Connection.Close()
    close.unmarshal(socket.writes[0][11:-1])
    assert close.reply_code == 320 and "could not move" in close.reply_text, close
    assert connection.closing
