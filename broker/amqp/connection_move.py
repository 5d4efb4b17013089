"""Moving a connection to its queue's shard at its first commitment
(docs/multi-process.md, section 11).

On a node over several processes a connection stays on the shard that accepted
it, and every publish to, or delivery from, a queue on another shard crosses
the shards' link: two wake-ups of two processes per confirm and per settle.
Most connections use one queue. So until its first basic.publish or
basic.consume a connection records what it receives (`MoveWatch`); at that
frame its parser stops (`ServerConnection.stop_at_commitment`), and if the
queue it names lives on another shard and nothing is in flight, the socket
goes there (broker/node/connection_handoff.py) with the recorded input and the
unparsed rest. The receiving shard replays the recorded input through a new
connection with its output dropped (the client has had those replies) and
parses on from the commitment: the client sees nothing.

What makes the replay exact: only methods whose replies are made at once from
the node-wide state, and that change nothing a replay would do twice, may come
before the move (the handshake, channel.open, basic.qos, confirm.select, and
the declaration of the very queue the connection then uses, which exists by
then); anything else ends the watch and the connection stays, as it does when
it is blocked, holds frames behind a reply, or received too much.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog
from pamqp import commands as spec

from warren.broker.queues.queue_factory import split_shard
from warren.protocol.connection import OPEN, ServerConnection
from warren.protocol.constants import BASIC_PUBLISH, CONNECTION_FORCED

if TYPE_CHECKING:
    from warren.broker.amqp.connection import AMQPConnection

log = structlog.get_logger("warren.connection")

# A move carries at most this much received input; more stays where it is.
MOVE_MAX_BYTES = 192 * 1024
_REPLAYABLE = (spec.Connection.StartOk, spec.Connection.TuneOk, spec.Connection.Open, spec.Channel.Open,
               spec.Basic.Qos, spec.Confirm.Select)


class MoveWatch:
    """A connection's input from its first byte, while it may still move."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.size = 0
        self.declared: set[str] = set()   # queues declared before the move

    def record(self, data: bytes) -> bool:
        """Keep `data`; False when the input is over what a move carries."""
        self.received.append(data)
        self.size += len(data)
        return self.size <= MOVE_MAX_BYTES

    def note(self, method: Any) -> bool:
        """A method dispatched before the move; False when a replay could not repeat it."""
        if isinstance(method, _REPLAYABLE):
            return True
        if isinstance(method, spec.Queue.Declare):
            if not method.queue or method.exclusive or not method.durable or method.nowait:
                return False
            self.declared.add(method.queue)
            return True
        return False

    def history(self, unparsed: int) -> bytes:
        """What was parsed: everything received but the `unparsed` bytes at the end."""
        data = b"".join(self.received)
        return data[:len(data) - unparsed]


def try_move(connection: "AMQPConnection") -> bool:
    """At the stop before the first commitment: hand the connection to its queue's
    shard; True once it has gone (this shard then forgets it), False to stay."""
    handoff = connection.broker.handoff
    watch = connection.move_watch
    stopped = connection.protocol.stopped_at
    if handoff is None or watch is None or stopped is None or not _settled(connection):
        return False
    number, method_id, args = stopped
    queue_name = _committed_queue(connection, number, method_id, args)
    if queue_name is None or not watch.declared <= {queue_name}:
        return False
    shard = _home_shard(connection, queue_name)
    if shard is None or shard == handoff.shard:
        return False
    transport = connection.transport
    connection.flush()
    if transport is None or transport.is_closing() or transport.get_write_buffer_size():
        return False
    unparsed = connection.protocol.unparsed
    transport.pause_reading()
    history = watch.history(len(unparsed))
    if len(history) + len(unparsed) > MOVE_MAX_BYTES or not handoff.send(
            shard, transport.get_extra_info("socket").fileno(), [history, unparsed, sorted(connection.channels)]):
        transport.resume_reading()
        return False
    connection.broker.counters.connections_moved_out += 1
    connection.moved_away(shard, queue_name)
    return True


def replay(connection: "AMQPConnection", history: bytes, unparsed: bytes, channels: list[int]) -> None:
    """On the receiving shard, as the moved socket's connection starts: what the
    client sent before the move, its replies dropped; then the rest, as received."""
    connection.replaying = True
    try:
        connection.data_received(history)
    finally:
        connection.replaying = False
    if not (_settled(connection) and sorted(connection.channels) == channels):
        # the node changed under the move (a user, a permission, the queue): not where the client thinks
        log.warning("connection.move_replay_differs", peer=connection.peer, channels=channels)
        if connection.closing and connection.transport is not None:   # the replay's own close went nowhere
            connection.transport.abort()
        else:
            connection.close(CONNECTION_FORCED, "CONNECTION_FORCED - the connection could not move to its "
                             "queue's process; connect again")
        return
    log.info("connection.moved_in", peer=connection.peer, user=connection.user_name, channels=channels)
    connection.broker.counters.connections_moved_in += 1
    if unparsed:
        connection.data_received(unparsed)


def _settled(connection: "AMQPConnection") -> bool:
    """Open, nothing held, paused or awaited: nothing in flight to carry over."""
    return (connection.protocol.state == OPEN and connection.vhost is not None and not connection.closed
            and not connection.closing and not connection.reading_paused and not connection.holds_events
            and not any(channel.closed or channel.awaiting_replies for channel in connection.channels.values()))


def _committed_queue(connection: "AMQPConnection", number: int, method_id: int, args: bytes) -> str | None:
    """The one queue the publish (to the default exchange) or the consume names."""
    channel = connection.channels.get(number)
    if channel is None:
        return None
    try:
        if method_id == BASIC_PUBLISH:
            exchange, routing_key, _mandatory, _immediate = ServerConnection._publish_args(args, 0, len(args))
            return routing_key if exchange == "" and routing_key else None
        consume = spec.Basic.Consume()
        consume.unmarshal(args)
    except Exception:  # noqa: BLE001 -- malformed: the parser says so once it goes on
        return None
    return consume.queue or channel.last_queue_name


def _home_shard(connection: "AMQPConnection", queue_name: str) -> int | None:
    """The shard of this node holding a member of a replicated queue (`<node>#k`; on a
    cluster the same k on each member node); None for a queue with no member here."""
    queue = connection.vhost.queues.get(queue_name)
    if queue is None or not queue.replicated:
        return None
    node, _ = split_shard(connection.broker.cluster.node)
    return next((shard for name, shard in map(split_shard, map(str, queue.members))
                 if name == node and shard is not None), None)
