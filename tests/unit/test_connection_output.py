"""How a connection's output reaches its socket (broker/amqp/connection.py).

Output made inside a Raft turn waits for the turn's end (one write per turn),
except a turn's output beyond EARLY_FLUSH_BYTES: that goes at once, so that a
consumer reads and acks the first deliveries of a long turn while the rest are
made (the backlog drain ran stop-and-wait, a prefetch window a turn, without it).
"""
from __future__ import annotations

from types import SimpleNamespace

from warren.broker.amqp.connection import EARLY_FLUSH_BYTES, AMQPConnection
from warren.config.settings import Settings


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return False


def connection_in_a_turn(tmp_path) -> tuple[AMQPConnection, RecordingTransport, list]:
    """A connection whose every write happens inside a Raft turn; the turn's
    end-of-turn callbacks are collected for the test to run."""
    end_of_turn: list = []

    def after_turn(callback) -> bool:
        end_of_turn.append(callback)
        return True

    broker = SimpleNamespace(settings=Settings(data_dir=tmp_path), handoff=None,
                             cluster=SimpleNamespace(runtime=SimpleNamespace(after_turn=after_turn)))
    connection = AMQPConnection(broker)  # type: ignore[arg-type]
    transport = RecordingTransport()
    connection.transport = transport  # type: ignore[assignment]
    return connection, transport, end_of_turn


def frames(count: int, size: int) -> list[bytes]:
    return [bytes([n % 251]) * size for n in range(count)]


def test_a_turns_small_output_waits_for_the_turns_end(tmp_path):
    connection, transport, end_of_turn = connection_in_a_turn(tmp_path)
    sent = frames(20, 1100)
    for frame in sent:
        connection.write(frame)
    assert transport.writes == [], "output under EARLY_FLUSH_BYTES must wait for the turn's end"
    for callback in end_of_turn:
        callback()
    assert transport.writes == [b"".join(sent)], "the turn's output should leave in one write, in order"


def test_a_long_turns_output_leaves_in_pieces_before_the_turn_ends(tmp_path):
    connection, transport, end_of_turn = connection_in_a_turn(tmp_path)
    sent = frames(256, 1100)   # a prefetch window of 1 KiB deliveries
    for frame in sent:
        connection.write(frame)
    before_end = sum(map(len, transport.writes))
    assert before_end >= len(sent) * 1100 // 2, (
        f"only {before_end} of {len(sent) * 1100} bytes reached the socket before the turn ended: "
        f"a consumer would see the whole window at once")
    assert all(len(piece) >= EARLY_FLUSH_BYTES for piece in transport.writes), (
        f"each early write should carry at least {EARLY_FLUSH_BYTES} bytes, got {[len(w) for w in transport.writes]}")
    for callback in end_of_turn:
        callback()
    assert b"".join(transport.writes) == b"".join(sent), "every byte should leave once, in the order written"
