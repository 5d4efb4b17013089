"""The asyncio shell for one client connection: socket ⇄ sans-I/O protocol ⇄ channels.

One ``asyncio.Protocol`` per TCP connection. Per socket read it parses all
whole frames, dispatches their events and then writes everything produced in
one ``transport.write``; output produced outside a read (deliveries caused by
another connection's publish) is flushed once per loop turn. Backpressure:
when the transport's buffer is over its high-water mark, the connection stops
reading and its consumers stop receiving until it drains.
"""
from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import structlog
from pamqp import commands as spec

from warren.broker.admin.auth import AuthenticationError, authenticate
from warren.broker.amqp import connection_move
from warren.broker.amqp.channel import Channel
from warren.broker.amqp.fence_hold import FenceHold
from warren.broker.amqp.handshake import negotiated_limits, vhost_to_open
from warren.broker.amqp.server_properties import server_properties
from warren.broker.weak_callbacks import weak_method
from warren.protocol import codec
from warren.protocol.connection import (
    AWAIT_HEADER,
    EV_ACK,
    EV_CHANNEL_ERROR,
    EV_HEARTBEAT,
    EV_METHOD,
    EV_NACK,
    EV_PUBLISH,
    EV_REJECT,
    BadProtocolHeader,
    ServerConnection,
)
from warren.protocol.constants import (
    ACCESS_REFUSED,
    CONNECTION_FORCED,
    INTERNAL_ERROR,
    PRECONDITION_FAILED,
    PROTOCOL_HEADER,
)
from warren.protocol.errors import AMQPConnectionError, AMQPError, ChannelError

if TYPE_CHECKING:
    from warren.broker.node.broker import Broker

log = structlog.get_logger("warren.connection")
_connection_ids = itertools.count(1)
# How long we wait for connection.close-ok before dropping the socket.
CLOSE_OK_TIMEOUT_SECONDS = 3.0
# The client's connection.close is answered this much later, about when RabbitMQ's channel
# processes have ended: aiormq 7.2.4 loses the close's cause when close-ok beats its writer's
# drain, and aio-pika's robust channels then log errors (README, Status).
CLOSE_OK_DELAY_SECONDS = 0.002
# Frames held behind a channel's pending reply before the socket stops being read.
HELD_EVENTS_MAX = 4096
# Output of one turn beyond this goes to the socket at once, not at the turn's end:
# a consumer then reads (and acks) the first deliveries of a long turn while the
# rest are made, instead of a whole prefetch window at once and one ack for it.
EARLY_FLUSH_BYTES = 64 * 1024


class AMQPConnection(asyncio.Protocol):
    def __init__(self, broker: "Broker", moved_in: tuple[bytes, bytes, list[int]] | None = None):
        self.broker = broker
        settings = broker.settings
        self.id = next(_connection_ids)
        self.protocol = ServerConnection(settings.frame_max, settings.channel_max, settings.max_message_size_bytes)
        # Until its first publish or consume a connection may move to its queue's shard
        # (connection_move.py); one that moved here replays `moved_in` first and stays.
        self.move_watch = connection_move.MoveWatch() if broker.handoff is not None and moved_in is None else None
        self.protocol.stop_at_commitment = self.move_watch is not None
        self._moved_in = moved_in
        self.replaying = False   # output is dropped: the client had it from the shard it came from
        self.frame_max = settings.frame_max
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.user_name: str | None = None
        self.vhost: Any = None
        self.client_capabilities: dict = {}
        self.client_properties: dict = {}
        self.channels: dict[int, Channel] = {}
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._in_receive = False
        self._flush_scheduled = False
        self._confirm_channels: set[Channel] = set()
        self.writes_paused = False
        self.has_published = False
        self.blocked = False  # by a resource alarm (connection.blocked sent)
        # channels past their publish credit (publish_credit.py): reading the socket waits for them
        self.paused_channels: set[Channel] = set()
        # frames of channels waiting for a reply, by channel number (release_held)
        self._held: dict[int, deque[tuple]] = {}
        self._releasing: set[int] = set()
        self._held_over_limit = False
        # weakly: the hold calls back into its connection, which must not be kept alive by it
        self.fence_hold = FenceHold(broker.cluster, weak_method(self._read_on_released),
                                    weak_method(self._update_reading))
        self.heartbeat_seconds = 0
        self._last_received = time.monotonic()
        self._held_unread = False  # reading was paused since the last resume
        self._wrote_since_tick = False
        self._timer: asyncio.TimerHandle | None = None
        self._closing = False
        self.closed = False

    # -- asyncio.Protocol -------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.peer_host = peer[0] if peer else ""
        transport.set_write_buffer_limits(high=self.broker.settings.connection_write_buffer_max_bytes)  # type: ignore[attr-defined]
        self.broker.connection_opened(self)
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.broker.settings.handshake_timeout_seconds, self._on_handshake_timeout)
        if self._moved_in is not None:
            connection_move.replay(self, *self._moved_in)
            self._moved_in = None

    def data_received(self, data: bytes) -> None:
        self._last_received = time.monotonic()
        if self._closing and self.protocol.state == "closed":
            return
        if self.move_watch is not None and not self.move_watch.record(data):
            self._stop_watching()
        self._in_receive = True
        try:
            try:
                awaiting_header = self.protocol.state == AWAIT_HEADER
                events = self.protocol.receive_data(data)
                if awaiting_header and self.protocol.state != AWAIT_HEADER:
                    self._send_start()
            except BadProtocolHeader:
                log.info("connection.bad_protocol_header", peer=self.peer)
                self._write_now(PROTOCOL_HEADER)
                self._drop()
                return
            except AMQPConnectionError as error:
                if awaiting_header and self.protocol.state != AWAIT_HEADER:
                    self._send_start()
                self._dispatch(self.protocol.pending_events)
                self._hard_error(error)
                return
            self._dispatch(self.fence_hold.take(events, self._last_received, self.move_watch is not None))
            if self.protocol.stopped_at is not None and not connection_move.try_move(self):
                # it stays: parse on from its first publish or consume, as any read
                self._stop_watching()
                self.protocol.resume()
                self.data_received(b"")
        except Exception:  # a bug must not take the node down: close just this connection
            log.exception("connection.internal_error", peer=self.peer)
            self._hard_error(AMQPConnectionError(INTERNAL_ERROR, "internal error"))
        finally:
            self._in_receive = False
            self.flush()

    def _stop_watching(self) -> None:
        self.move_watch = None
        self.protocol.stop_at_commitment = False

    def moved_away(self, shard: int, queue: str) -> None:
        """The socket went to shard `shard`: forget the connection here, telling the client nothing."""
        log.info("connection.moved", peer=self.peer, user=self.user_name, shard=shard, queue=queue)
        self._teardown()
        if self.transport is not None:
            self.transport.abort()

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def holds_events(self) -> bool:
        return bool(self._held)

    def eof_received(self) -> bool | None:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed and not self._closing:
            log.info("connection.closed", peer=self.peer, user=self.user_name,
                     reason="client closed the socket" if exc is None else str(exc))
        self._teardown()

    def pause_writing(self) -> None:
        self._set_writes_paused(True)

    def resume_writing(self) -> None:
        self._set_writes_paused(False)

    def _set_writes_paused(self, paused: bool) -> None:
        self.writes_paused = paused
        self._update_reading()
        for channel in list(self.channels.values()):
            channel.on_writes_paused_changed()

    @property
    def reading_paused(self) -> bool:
        """We hold the socket unread: backpressure, a resource alarm, a channel past its publish credit
        or the metadata fence."""
        return bool(self.writes_paused or self.blocked or self.paused_channels or self._held_over_limit
                    or self.fence_hold.holding)

    def _read_on_released(self) -> None:
        if not self.closed:
            self.data_received(b"")

    def _update_reading(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if self.reading_paused:
            self.transport.pause_reading()
            self._held_unread = True
        else:
            if self._held_unread:
                # The peer's silence counts from here: what it sent meanwhile waits unread in our socket.
                self._last_received = time.monotonic()
                self._held_unread = False
            self.transport.resume_reading()

    def set_channel_paused(self, channel: Channel, paused: bool) -> None:
        """A channel has too many quorum-queue commands in flight (or no longer)."""
        if paused:
            self.paused_channels.add(channel)
        else:
            self.paused_channels.discard(channel)
        self._update_reading()

    def update_blocked(self) -> None:
        """Block a publishing connection while a resource alarm is on (RabbitMQ's rule)."""
        reason = self.broker.alarm
        blocked = reason is not None and self.has_published
        if blocked == self.blocked or self._closing or self.closed:
            return
        self.blocked = blocked
        if self.client_capabilities.get("connection.blocked"):
            method = spec.Connection.Blocked(reason=reason) if blocked else spec.Connection.Unblocked()
            self._write_now(codec.encode_method(0, method))
        log.info("connection.blocked" if blocked else "connection.unblocked", peer=self.peer, user=self.user_name)
        self._update_reading()

    # -- output -----------------------------------------------------------
    def write(self, data: bytes) -> None:
        self.write_parts((data,), len(data))

    def write_parts(self, parts: Iterable[bytes], size: int) -> None:
        """Output in parts (a run of deliveries' frames), `size` bytes: joined once, at the flush."""
        self._out += parts
        self._out_bytes += size
        if self._out_bytes >= EARLY_FLUSH_BYTES:
            self.flush()
        elif not self._in_receive and not self._flush_scheduled:
            self._schedule_flush()

    def want_flush(self, channel: Channel) -> None:
        """A channel has confirms to send at the end of this turn."""
        self._confirm_channels.add(channel)
        if not self._in_receive and not self._flush_scheduled:
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        """Once per turn: at the end of the Raft turn that produced the output
        (its confirms and deliveries), else one call_soon later."""
        self._flush_scheduled = True
        if not self.broker.cluster.runtime.after_turn(self.flush):
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        if self.replaying:
            self._out.clear()
            self._out_bytes = 0
            return
        if self._confirm_channels:
            channels, self._confirm_channels = self._confirm_channels, set()
            for channel in channels:
                if not channel.closed:
                    channel.flush_confirms()
        if self._out and self.transport is not None and not self.transport.is_closing():
            data = b"".join(self._out) if len(self._out) > 1 else self._out[0]
            self._out.clear()
            self._out_bytes = 0
            self._wrote_since_tick = True
            self.transport.write(data)
        else:
            self._out.clear()
            self._out_bytes = 0

    def _write_now(self, data: bytes) -> None:
        self._out.append(data)
        self.flush()

    # -- dispatch ---------------------------------------------------------
    def _dispatch(self, events: list) -> None:
        channels = self.channels
        held = self._held
        for event in events:
            number = event[1]
            if held:
                waiting = held.get(number)
                if waiting is not None:
                    waiting.append(event)
                    continue
            if not self._dispatch_event(event, channels.get(number)):
                return
            if event[0] == EV_METHOD:
                channel = channels.get(number)
                if channel is not None and channel.awaiting_replies:
                    # later frames of this channel wait for its reply, in order (RabbitMQ's channel
                    # process blocks on its metadata call; its mailbox keeps what follows)
                    held[number] = deque()
        if self._held:
            self._hold_reading()
        if not self.blocked and self.has_published and self.broker.alarm is not None:
            self.update_blocked()

    def _dispatch_event(self, event: tuple, channel: Channel | None) -> bool:
        """One parsed event; False once the connection is closing."""
        kind = event[0]
        number = event[1]
        try:
            if kind == EV_PUBLISH:
                self.has_published = True
                if channel is not None and not channel.closed:
                    channel.on_publish(event[2], event[3], event[4], event[5], event[6], event[7])
            elif kind == EV_ACK:
                if channel is not None and not channel.closed:
                    channel.on_ack(event[2], event[3])
            elif kind == EV_METHOD:
                self._on_method(number, channel, event[2])
            elif kind == EV_NACK:
                if channel is not None and not channel.closed:
                    channel.on_nack(event[2], event[3], event[4])
            elif kind == EV_REJECT:
                if channel is not None and not channel.closed:
                    channel.on_reject(event[2], event[3])
            elif kind == EV_CHANNEL_ERROR:
                raise event[2]
            elif kind == EV_HEARTBEAT:
                pass
        except ChannelError as error:
            self._channel_error(number, error)
        except AMQPConnectionError as error:
            self._hard_error(error)
            return False
        return not self._closing

    def release_held(self, number: int) -> None:
        """Channel `number` got its reply (or is gone): dispatch what it held, in order,
        until it waits again."""
        waiting = self._held.get(number)
        if waiting is None or number in self._releasing:
            return
        self._releasing.add(number)
        try:
            while waiting:
                channel = self.channels.get(number)
                if channel is not None and channel.awaiting_replies:
                    return
                event = waiting.popleft()
                if self._closing or self.closed:
                    waiting.clear()
                elif not self._dispatch_event(event, channel):
                    waiting.clear()
            channel = self.channels.get(number)
            if channel is None or not channel.awaiting_replies:
                self._held.pop(number, None)
        except Exception:  # called from the metadata group's apply: a bug closes this connection only
            log.exception("connection.internal_error", peer=self.peer)
            self._hard_error(AMQPConnectionError(INTERNAL_ERROR, "internal error"))
        finally:
            self._releasing.discard(number)
            self._hold_reading()

    def _hold_reading(self) -> None:
        """Frames held behind replies are bounded: past HELD_EVENTS_MAX stop reading the socket."""
        over = sum(len(waiting) for waiting in self._held.values()) > HELD_EVENTS_MAX
        if over != self._held_over_limit:
            self._held_over_limit = over
            self._update_reading()

    def _on_method(self, number: int, channel: Channel | None, method: Any) -> None:
        if self.move_watch is not None and not self.move_watch.note(method):
            self._stop_watching()
        if number == 0:
            self._on_connection_method(method)
            return
        if isinstance(method, spec.Channel.Open):
            self.channels[number] = Channel(self, number)
            self.write(codec.encode_method(number, spec.Channel.OpenOk()))
            return
        if isinstance(method, spec.Channel.Close):
            self._close_channel(number)
            self.protocol.channel_closed(number)
            self.write(codec.encode_method(number, spec.Channel.CloseOk()))
            return
        if isinstance(method, spec.Channel.CloseOk):
            return  # the protocol already forgot the channel
        if channel is None or channel.closed:
            return  # parsed in the same read as the error that closed it
        channel.on_method(method)

    def _on_connection_method(self, method: Any) -> None:
        match method:
            case spec.Connection.StartOk():
                self._on_start_ok(method)
            case spec.Connection.TuneOk():
                self._on_tune_ok(method)
            case spec.Connection.Open():
                self._on_open(method)
            case spec.Connection.Close():
                log.info("connection.closed", peer=self.peer, user=self.user_name,
                         reason=f"client: {method.reply_code} {method.reply_text}")
                self._close_all_channels()
                self._delete_exclusive_queues()   # before close-ok, as RabbitMQ: a reconnect may declare them again
                self.protocol.start_closing()
                self._closing = True
                self._cancel_timer()
                self._timer = asyncio.get_running_loop().call_later(CLOSE_OK_DELAY_SECONDS, self._send_close_ok)
            case spec.Connection.CloseOk():
                self._drop()
            case spec.Connection.UpdateSecret():
                self._on_update_secret(method)
            case _:
                pass  # blocked/unblocked from a client: nothing to do

    def _send_close_ok(self) -> None:
        self._write_now(codec.encode_method(0, spec.Connection.CloseOk()))
        # The client closes the socket once it has read close-ok; we do if it does not.
        self._timer = asyncio.get_running_loop().call_later(CLOSE_OK_TIMEOUT_SECONDS, self._drop)

    # -- handshake (AMQP 0-9-1 §2.2.4) ------------------------------------
    def _send_start(self) -> None:
        settings = self.broker.settings
        self.write(codec.encode_method(0, spec.Connection.Start(
            version_major=0, version_minor=9,
            server_properties=server_properties(self.broker.version, settings.node_name,
                                                [node.name for node in settings.cluster_nodes]),
            mechanisms="PLAIN AMQPLAIN", locales="en_US")))

    def _on_start_ok(self, method: spec.Connection.StartOk) -> None:
        self.client_properties = method.client_properties or {}
        self.client_capabilities = self.client_properties.get("capabilities") or {}
        try:
            user = authenticate(self.broker.access, method.mechanism, method.response, self.peer_host)
        except AuthenticationError as error:
            log.warning("connection.auth_failed", peer=self.peer, mechanism=method.mechanism, reason=str(error))
            raise AMQPConnectionError(
                ACCESS_REFUSED, f"Login was refused using authentication mechanism {method.mechanism}. "
                "For details see the broker logfile.", 10, 11) from None
        self.user = user
        self.user_name = user.name
        settings = self.broker.settings
        self.write(codec.encode_method(0, spec.Connection.Tune(
            channel_max=settings.channel_max, frame_max=settings.frame_max, heartbeat=settings.heartbeat)))

    def _on_tune_ok(self, method: spec.Connection.TuneOk) -> None:
        settings = self.broker.settings
        self.frame_max, channel_max = negotiated_limits(method, settings.frame_max, settings.channel_max)
        self.protocol.tune(self.frame_max, channel_max)
        self.heartbeat_seconds = method.heartbeat

    def _on_open(self, method: spec.Connection.Open) -> None:
        self.vhost = vhost = vhost_to_open(self.broker, self.user_name, method.virtual_host)
        self.write(codec.encode_method(0, spec.Connection.OpenOk()))
        self._cancel_timer()
        if self.heartbeat_seconds:
            self._schedule_heartbeat()
        log.info("connection.opened", peer=self.peer, user=self.user_name, vhost=vhost.name,
                 client=str(self.client_properties.get("product", "")))

    def _on_update_secret(self, method: spec.Connection.UpdateSecret) -> None:
        """As RabbitMQ with its internal user store: a password cannot expire, so
        rabbit_access_control:update_state keeps the user as it is and the new
        secret is accepted unchecked (it is for token backends such as OAuth 2)."""
        log.info("connection.secret_updated", peer=self.peer, user=self.user_name, reason=method.reason)
        self.write(codec.encode_method(0, spec.Connection.UpdateSecretOk()))

    # -- heartbeats (AMQP 0-9-1 §4.2.7) -----------------------------------
    def _schedule_heartbeat(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.heartbeat_seconds / 2, self._on_heartbeat_tick)

    def _on_heartbeat_tick(self) -> None:
        if self.closed:
            return
        if self.reading_paused:
            self._last_received = time.monotonic()  # we stopped reading, not the peer (as RabbitMQ)
        silent_for = time.monotonic() - self._last_received
        if silent_for > 2 * self.heartbeat_seconds:
            log.warning("connection.heartbeat_timeout", peer=self.peer, user=self.user_name,
                        timeout_seconds=self.heartbeat_seconds)
            self._drop()
            return
        if not self._wrote_since_tick:
            self._write_now(codec.HEARTBEAT_FRAME)
        self._wrote_since_tick = False
        self._schedule_heartbeat()

    def _on_handshake_timeout(self) -> None:
        if self.vhost is None and not self.closed:
            log.warning("connection.handshake_timeout", peer=self.peer)
            self._drop()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- errors and closing -----------------------------------------------
    def check_consumer_timeout(self, now: float, timeout_seconds: float) -> None:
        """Close channels whose oldest unacknowledged delivery is too old (RabbitMQ's rule)."""
        for number, channel in list(self.channels.items()):
            if channel.timed_out(now, timeout_seconds):
                self._channel_error(number, ChannelError(
                    PRECONDITION_FAILED, f"delivery acknowledgement on channel {number} timed out. "
                    f"Timeout value used: {int(timeout_seconds * 1000)} ms. This timeout value can be "
                    "configured, see consumers doc guide to learn more"))
                self.flush()

    def _channel_error(self, number: int, error: ChannelError) -> None:
        self._stop_watching()   # a replay of what closed a channel is not exact
        log.info("channel.error", peer=self.peer, channel=number, reply_code=error.reply_code, text=error.text)
        self.broker.counters.channel_errors += 1
        self._close_channel(number)
        self.protocol.close_channel(number)
        self.write(codec.encode_method(number, spec.Channel.Close(
            reply_code=error.reply_code, reply_text=error.reply_text,
            class_id=error.class_id, method_id=error.method_id)))

    def _hard_error(self, error: AMQPError) -> None:
        if self._closing:
            return
        log.warning("connection.error", peer=self.peer, user=self.user_name,
                    reply_code=error.reply_code, text=error.text)
        self.close(error.reply_code, error.reply_text, error.class_id, error.method_id)

    def close(self, reply_code: int, reply_text: str, class_id: int = 0, method_id: int = 0) -> None:
        """Server-initiated connection.close; the socket goes after close-ok."""
        if self._closing or self.closed:
            return
        self._closing = True
        self._stop_watching()
        self._close_all_channels()
        self._delete_exclusive_queues()
        self.protocol.start_closing()
        self._write_now(codec.encode_method(0, spec.Connection.Close(
            reply_code=reply_code, reply_text=reply_text, class_id=class_id, method_id=method_id)))
        self._cancel_timer()
        self._timer = asyncio.get_running_loop().call_later(CLOSE_OK_TIMEOUT_SECONDS, self._drop)

    def shutdown(self) -> None:
        """The node is stopping (AMQP 0-9-1: 320 CONNECTION_FORCED)."""
        self.close(CONNECTION_FORCED, "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'")

    def _close_channel(self, number: int) -> None:
        channel = self.channels.pop(number, None)
        if channel is not None:
            channel.close()
        self._confirm_channels.discard(channel)  # type: ignore[arg-type]
        if number in self._held:
            self.release_held(number)  # what it held meets a closed channel, as if parsed with the close

    def _close_all_channels(self) -> None:
        self._held.clear()   # the connection is going: nothing held is for a channel any more
        self._hold_reading()
        for number in list(self.channels):
            self._close_channel(number)

    def _drop(self) -> None:
        self.flush()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self._teardown()

    def _teardown(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._cancel_timer()
        self._close_all_channels()
        self._delete_exclusive_queues()
        self.broker.connection_closed(self)

    def _delete_exclusive_queues(self) -> None:
        if self.vhost is not None:
            self.vhost.delete_exclusive_queues(self.id)

