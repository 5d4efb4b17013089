"""The node-to-node transport: one authenticated TCP connection per peer node.

Theory of operation. The wire protocol (frames, handshake) is the pure core
in raft/handshake.py; this module is its asyncio shell. Per pair of nodes
there is exactly one connection, and it is the node whose name sorts first
that dials it: the other only accepts (and the handshake refuses a dialer
whose name does not sort first), so no tie-break race and no duplicate
links. The dialer keeps one task per peer that reconnects with capped,
jittered exponential backoff (the jitter comes from the `rng` it is given).
An acceptor that authenticates a second connection from a peer it already
has keeps the new one (the peer restarted, or gave up on the old one): the
old link is reported down, then the new one up.

Sending is fire-and-forget, as Raft expects of its network (Raft §5.1:
messages may be lost; the leader retries). `send(peer, obj)` encodes the
object into a frame and puts it on that peer's outbound queue; frames queued
during one loop turn go out with ONE `transport.write` at its end. It
returns False, dropping the frame, when the peer is not connected (nothing
is queued across reconnects: what Raft would resend anyway is stale) or when
the queue already holds `peer_outbound_max_bytes` (etcd-raft's transport
drops the same way when its send buffer is full). While the socket's write
buffer is over its high-water mark the queue is not drained, so a slow peer
turns into dropped sends, never into memory growth.

Failure detection is per node pair (DESIGN.md, raft/), not per group: a peer
is down when its connection closes or when nothing (data or heartbeat) came
from it for `PEER_SILENT_HEARTBEATS_MAX` heartbeat intervals. One timer per
transport sends a heartbeat (a zero-length frame) to every peer we sent
nothing to since the previous tick, and checks every peer's silence, so a
peer is reported down at most 4 intervals after it went quiet.

Several processes of one node may accept on one port (a `SharedPort`, the
node's cluster port shared by its shards, broker/node/shared_cluster_port.py):
an acceptor reads the dialer's hello first, and a connection meant for another
of them is passed to it with the bytes read (`adopt` on its side), which
answers it as if it had accepted it.

Bad input closes only the connection it came on, with a log line: a failed
handshake (wrong secret, unknown node, wrong version, garbage, timeout), a
frame over `frame_max_bytes` or one that is not msgpack. The secret is
never logged.
"""
from __future__ import annotations

import asyncio
import random
import secrets
import socket
from collections.abc import Callable
from typing import Any, Protocol

import structlog

from warren.raft.handshake import (
    HEARTBEAT_FRAME,
    NONCE_BYTES,
    FrameDecoder,
    FrameError,
    Handshake,
    HandshakeError,
    Role,
    decode_payload,
    encode_object,
    hello_target,
)
from warren.raft.transport_limits import Backoff, TransportLimits

log = structlog.get_logger("warren.cluster")

# A peer that sent nothing for this many heartbeat intervals is down.
PEER_SILENT_HEARTBEATS_MAX = 3

OnFrame = Callable[[str, Any], None]
OnPeer = Callable[[str], None]
Adopt = Callable[[socket.socket, bytes], None]


class SharedPort(Protocol):
    """Listening sockets a node's processes all accept on, and the way to the others."""

    listening: list[socket.socket]

    def forward(self, target: str, fd: int, head: bytes) -> bool:
        """Pass the connection `fd` and what it sent so far to the process `target` is;
        False (nothing passed) if none of the others is `target`, or it cannot go."""

    def start(self, loop: asyncio.AbstractEventLoop, adopt: Adopt) -> None:
        """From now on, connections the others pass here go to `adopt`."""

    def stop(self, loop: asyncio.AbstractEventLoop) -> None: ...


class PeerLink(asyncio.Protocol):
    """One cluster connection: handshake, then frames both ways."""

    def __init__(self, owner: ClusterTransport, role: Role, expected_peer: str | None, passed: bytes | None = None):
        self.owner = owner
        self.limits = owner.limits
        self.role = role
        self.peer_name = expected_peer  # the acceptor learns it from the hello
        self.address = "?"
        self.transport: asyncio.Transport | None = None
        self.handshake: Handshake | None = None
        self.decoder = FrameDecoder(self.limits.frame_max_bytes)
        self.established = False
        self.closing = False
        self.loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[None] = self.loop.create_future()
        self.last_received_at = self.loop.time()
        self.sent_since_tick = False
        self.writes_paused = False
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        # An acceptor on a shared port reads whom the dialer meant before it answers;
        # a link passed here from another process was read there (`passed`: its bytes).
        self._routed = role is Role.DIALER or owner.shared_port is None or passed is not None
        self._head = bytearray(passed or b"")

    # -- asyncio.Protocol -------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.address = f"{peer[0]}:{peer[1]}" if peer else "?"
        if not self.owner.on_link_made(self):
            return
        transport.set_write_buffer_limits(high=self.limits.write_buffer_high_bytes)  # type: ignore[attr-defined]
        self.handshake = self.owner.new_handshake(self.role, self.expected_peer_name())
        hello = self.handshake.start()   # the acceptor's answers the dialer's
        if hello:
            self.transport.write(hello)
        self._timer = self.loop.call_later(self.limits.handshake_timeout_seconds, self._on_handshake_timeout)
        if self._routed and self._head:   # passed here: what the other process read first
            passed = bytes(self._head)
            self._head.clear()
            self.data_received(passed)

    def data_received(self, data: bytes) -> None:
        self.last_received_at = self.loop.time()
        if self.closing:
            return
        if not self.established:
            data = self._on_handshake_data(data)
            if not data:
                return
        try:
            self._on_frames(data)
        except FrameError as exc:
            log.warning("cluster.frame_error", node=self.owner.node_name, peer=self.peer_name, address=self.address,
                        reason=exc.reason, detail=exc.detail)
            self.close(f"frame error: {exc.reason}")

    def eof_received(self) -> bool | None:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if not self.established and not self.closing and self.handshake is not None:
            try:
                self.handshake.receive_eof()
            except HandshakeError as error:
                self._log_handshake_failure(error)
        self.closing = True
        self._out.clear()
        self._out_bytes = 0
        self.owner.on_link_lost(self, exc)
        if not self.closed.done():
            self.closed.set_result(None)

    def pause_writing(self) -> None:
        self.writes_paused = True

    def resume_writing(self) -> None:
        self.writes_paused = False
        self._schedule_flush()

    # -- handshake ----------------------------------------------------------
    def expected_peer_name(self) -> str | None:
        return self.peer_name if self.role is Role.DIALER else None

    def _on_handshake_data(self, data: bytes) -> bytes:
        """Feed the handshake; bytes that follow it once it is done, else b""."""
        assert self.handshake is not None and self.transport is not None
        if not self._routed:
            data = self._route(data)
            if not data:
                return b""
        try:
            reply = self.handshake.receive_data(data)
        except HandshakeError as error:
            self._log_handshake_failure(error)
            self.close(f"handshake failed: {error.reason}")
            return b""
        if reply:
            self.transport.write(reply)
        if not self.handshake.done:
            return b""
        self._cancel_timer()
        self.peer_name = self.handshake.peer_name
        self.established = True
        trailing = self.handshake.trailing_data()
        self.owner.on_link_established(self)
        return b"" if self.closing else trailing

    def _route(self, data: bytes) -> bytes:
        """On a shared port: read the dialer's hello; a link meant for another of the
        node's processes goes there (b""), one for this one gets every byte read."""
        self._head += data
        try:
            target = hello_target(bytes(self._head))
        except HandshakeError as error:
            self._log_handshake_failure(error)
            self.close(f"handshake failed: {error.reason}")
            return b""
        if target is None:
            return b""
        self._routed = True
        head = bytes(self._head)
        self._head.clear()
        if target != self.owner.node_name and self.owner.pass_on(self, target, head):
            return b""
        return head   # ours, or for nobody here: the handshake says so

    def _on_handshake_timeout(self) -> None:
        self._timer = None
        if self.established or self.closing:
            return
        log.warning("cluster.handshake_failed", node=self.owner.node_name, address=self.address, role=self.role.value,
                    peer=self.peer_name, reason="timeout",
                    detail=f"no handshake within {self.limits.handshake_timeout_seconds} s")
        self.close("handshake timeout", abort=True)

    def _log_handshake_failure(self, error: HandshakeError) -> None:
        claimed = self.handshake.peer_name if self.handshake is not None else None
        log.warning("cluster.handshake_failed", node=self.owner.node_name, address=self.address, role=self.role.value,
                    peer=claimed or self.peer_name, reason=error.reason, detail=error.detail)

    # -- frames in ------------------------------------------------------------
    def _on_frames(self, data: bytes) -> None:
        decoder = self.decoder
        decoder.feed(data)
        deliver = self.owner.deliver
        peer_name = self.peer_name
        assert peer_name is not None
        while not self.closing:
            payload = decoder.next_frame()
            if payload is None:
                return
            if payload:  # an empty one is a heartbeat: its arrival was the point
                deliver(peer_name, decode_payload(payload))

    # -- frames out -----------------------------------------------------------
    def enqueue(self, frame: bytes) -> bool:
        """Queue an encoded frame for this turn's write; False if it does not fit."""
        if self.closing:
            return False
        if self._out_bytes + len(frame) > self.limits.peer_outbound_max_bytes:
            return False
        self._out.append(frame)
        self._out_bytes += len(frame)
        self._schedule_flush()
        return True

    @property
    def outbound_bytes(self) -> int:
        return self._out_bytes

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled and not self.writes_paused and self._out:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Everything queued this turn in one write, unless the socket is backed up."""
        self._flush_scheduled = False
        if self.closing or self.writes_paused or not self._out:
            return
        assert self.transport is not None
        data = b"".join(self._out) if len(self._out) > 1 else self._out[0]
        self._out.clear()
        self._out_bytes = 0
        self.transport.write(data)

    # -- closing --------------------------------------------------------------
    def close(self, reason: str, abort: bool = False) -> None:
        if self.closing:
            return
        self.closing = True
        self._cancel_timer()
        log.debug("cluster.link_closing", peer=self.peer_name, address=self.address, reason=reason)
        if self.transport is not None and not self.transport.is_closing():
            if abort:
                self.transport.abort()
            else:
                self.transport.close()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class ClusterTransport:
    """The node's links to its peers. `on_frame(peer_name, obj)` is called for
    every frame, in order per peer; `on_peer_up(name)` / `on_peer_down(name)`
    when a peer's link is established / lost (not after `stop()`)."""

    def __init__(self, settings: Any, on_frame: OnFrame, rng: random.Random | None = None, *,
                 limits: TransportLimits | None = None,
                 on_peer_up: OnPeer | None = None, on_peer_down: OnPeer | None = None,
                 shared_port: SharedPort | None = None):
        self.node_name: str = settings.node_name
        self.shared_port = shared_port   # else this node listens on cluster_host:cluster_port alone
        self.limits = limits or TransportLimits.from_settings(settings)
        self.host: str = settings.cluster_host
        self.port: int = settings.cluster_port
        names = [node.name for node in settings.cluster_nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"cluster_nodes lists a node name twice: {names}")
        if names and self.node_name not in names:
            raise ValueError(f"cluster_nodes must include this node ({self.node_name})")
        self.known_nodes = frozenset(names)
        self.peers = {node.name: node for node in settings.cluster_nodes if node.name != self.node_name}
        secret = settings.cluster_secret.get_secret_value() if settings.cluster_secret is not None else ""
        if self.peers and not secret:
            raise ValueError("cluster_secret must be set (and not empty) when cluster_nodes has peers")
        self._secret = secret.encode()
        self.on_frame = on_frame
        self.on_peer_up = on_peer_up
        self.on_peer_down = on_peer_down
        self._rng = rng or random.Random()
        self._links: dict[str, PeerLink] = {}
        self._pending: set[PeerLink] = set()
        self._dialers: list[asyncio.Task] = []
        self._servers: list[asyncio.AbstractServer] = []
        self._tick: asyncio.TimerHandle | None = None
        self._started = False
        self._stopping = False

    def __repr__(self) -> str:  # never show the secret
        return f"ClusterTransport(node={self.node_name}, peers={sorted(self.peers)})"

    # -- the API ------------------------------------------------------------
    async def start(self) -> None:
        """Listen on cluster_host:cluster_port and dial the peers that sort after us."""
        assert not self._started, "a transport starts once; make a new one to restart"
        self._started = True
        if not self.peers:
            return  # a cluster of one has nobody to talk to
        loop = asyncio.get_running_loop()

        def accept() -> PeerLink:
            return PeerLink(self, Role.ACCEPTOR, None)
        if self.shared_port is None:
            self._servers = [await loop.create_server(accept, self.host, self.port)]
        else:
            self._servers = [await loop.create_server(accept, sock=sock) for sock in self.shared_port.listening]
            self.shared_port.start(loop, self.adopt)
        log.info("cluster.listening", node=self.node_name, host=self.host, port=self.listening_port,
                 peers=sorted(self.peers))
        for name in sorted(self.peers):
            if self.node_name < name:  # the smaller name dials
                self._dialers.append(asyncio.create_task(self._dial_forever(name), name=f"cluster-dial-{name}"))
        self._tick = loop.call_later(self.limits.heartbeat_seconds, self._on_tick)

    def send(self, peer_name: str, frame_obj: Any, now: bool = False) -> bool:
        """Queue a msgpack-able object for the peer (`now`: and write what is queued
        at once); False if dropped (not connected, queue full, or over the frame
        limit). TypeError if the object cannot be encoded: that is the caller's bug."""
        link = self._links.get(peer_name)
        if link is None:
            return False
        frame = encode_object(frame_obj)
        if len(frame) - len(HEARTBEAT_FRAME) > self.limits.frame_max_bytes:
            log.warning("cluster.frame_too_large_to_send", peer=peer_name, size_bytes=len(frame),
                        frame_max_bytes=self.limits.frame_max_bytes)
            return False
        if not link.enqueue(frame):
            return False
        link.sent_since_tick = True
        if now:
            link.flush()
        return True

    def connected_peers(self) -> set[str]:
        return set(self._links)

    @property
    def listening_port(self) -> int | None:
        if not self._servers or not self._servers[0].sockets:
            return None
        return self._servers[0].sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Close the listener and every link; no peer callbacks from here on."""
        self._stopping = True
        if self._tick is not None:
            self._tick.cancel()
            self._tick = None
        for server in self._servers:
            server.close()
        if self.shared_port is not None and self._started and self.peers:   # started with the servers
            self.shared_port.stop(asyncio.get_running_loop())
        for task in self._dialers:
            task.cancel()
        await asyncio.gather(*self._dialers, return_exceptions=True)
        self._dialers.clear()
        links = list(self._pending) + list(self._links.values())
        self._links.clear()
        self._pending.clear()
        for link in links:
            link.close("node stopping", abort=True)
        for server in self._servers:
            await server.wait_closed()
        log.info("cluster.stopped", node=self.node_name)

    # -- called by links ------------------------------------------------------
    def new_handshake(self, role: Role, expected_peer: str | None) -> Handshake:
        return Handshake(role=role, node_name=self.node_name, secret=self._secret,
                         nonce=secrets.token_bytes(NONCE_BYTES), known_nodes=self.known_nodes,
                         expected_peer=expected_peer)

    def on_link_made(self, link: PeerLink) -> bool:
        """Admit a new connection to the handshake, within the pending bound."""
        if self._stopping:
            link.close("node stopping", abort=True)
            return False
        if link.role is Role.ACCEPTOR and len(self._pending) >= self.limits.pending_handshakes_max:
            log.warning("cluster.too_many_handshakes", node=self.node_name, address=link.address,
                        pending_handshakes_max=self.limits.pending_handshakes_max)
            link.close("too many pending handshakes", abort=True)
            return False
        self._pending.add(link)
        return True

    def pass_on(self, link: PeerLink, target: str, head: bytes) -> bool:
        """Hand an accepted link to the process of the node that `target` is (it answers
        the handshake); True once it has gone, False to answer it here."""
        transport = link.transport
        if self.shared_port is None or transport is None or transport.is_closing():
            return False
        transport.pause_reading()
        if not self.shared_port.forward(target, transport.get_extra_info("socket").fileno(), head):
            transport.resume_reading()
            return False
        self._pending.discard(link)
        link.close(f"passed on to {target}", abort=True)   # closes this process's descriptor only
        return True

    def adopt(self, sock: socket.socket, head: bytes) -> None:
        """A link another process of this node accepted and passed here, with what it read."""
        if self._stopping:
            sock.close()
            return
        sock.setblocking(False)
        task = asyncio.ensure_future(asyncio.get_running_loop().connect_accepted_socket(
            lambda: PeerLink(self, Role.ACCEPTOR, None, passed=head), sock))
        task.add_done_callback(lambda done: _close_unadopted(sock, done))

    def on_link_established(self, link: PeerLink) -> None:
        self._pending.discard(link)
        name = link.peer_name
        assert name is not None and name in self.peers
        if self._stopping:
            link.close("node stopping", abort=True)
            return
        old = self._links.pop(name, None)
        if old is not None:
            self._report_down(name, "replaced by a new connection")
            old.close("replaced by a new connection", abort=True)
        self._links[name] = link
        log.info("cluster.peer_up", node=self.node_name, peer=name, address=link.address, role=link.role.value)
        self._callback(self.on_peer_up, name)

    def on_link_lost(self, link: PeerLink, exc: Exception | None) -> None:
        self._pending.discard(link)
        name = link.peer_name
        if name is not None and self._links.get(name) is link:
            del self._links[name]
            self._report_down(name, "connection closed" if exc is None else f"connection lost: {exc}")

    def drop_links(self, reason: str) -> None:
        """Close every established link at once, discarding what it holds unread (its
        peers are dialed again as after any lost link)."""
        for name, link in list(self._links.items()):
            del self._links[name]
            self._report_down(name, reason)
            link.close(reason, abort=True)

    def deliver(self, peer_name: str, obj: Any) -> None:
        try:
            self.on_frame(peer_name, obj)
        except Exception:  # a bug in a handler must not cut the link to a whole node
            log.exception("cluster.on_frame_failed", node=self.node_name, peer=peer_name)

    # -- internals ------------------------------------------------------------
    def _report_down(self, name: str, reason: str) -> None:
        log.info("cluster.peer_down", node=self.node_name, peer=name, reason=reason)
        if not self._stopping:
            self._callback(self.on_peer_down, name)

    def _callback(self, callback: OnPeer | None, name: str) -> None:
        if callback is None:
            return
        try:
            callback(name)
        except Exception:
            log.exception("cluster.peer_callback_failed", node=self.node_name, peer=name)

    def _on_tick(self) -> None:
        """Heartbeat the quiet links and drop the silent ones."""
        now = asyncio.get_running_loop().time()
        silence_max_seconds = PEER_SILENT_HEARTBEATS_MAX * self.limits.heartbeat_seconds
        for name, link in list(self._links.items()):
            silent_seconds = now - link.last_received_at
            if silent_seconds > silence_max_seconds:
                log.warning("cluster.heartbeat_timeout", node=self.node_name, peer=name,
                            silent_seconds=round(silent_seconds, 3))
                del self._links[name]
                self._report_down(name, "heartbeat timeout")
                link.close("heartbeat timeout", abort=True)
                continue
            if not link.sent_since_tick:
                link.enqueue(HEARTBEAT_FRAME)
            link.sent_since_tick = False
        self._tick = asyncio.get_running_loop().call_later(self.limits.heartbeat_seconds, self._on_tick)

    async def _dial_forever(self, name: str) -> None:
        """Keep one link to a peer that sorts after us, reconnecting with backoff."""
        peer = self.peers[name]
        backoff = Backoff(self.limits.reconnect_initial_seconds, self.limits.reconnect_max_seconds, self._rng)
        loop = asyncio.get_running_loop()
        failures = 0
        while not self._stopping:
            try:
                _, link = await asyncio.wait_for(
                    loop.create_connection(lambda: PeerLink(self, Role.DIALER, name), peer.host, peer.port),
                    self.limits.connect_timeout_seconds)
            except (TimeoutError, OSError) as exc:
                failures += 1
                # The first failure in a row at info, the rest at debug: a down peer must not flood the log.
                (log.info if failures == 1 else log.debug)(
                    "cluster.dial_failed", node=self.node_name, peer=name, address=f"{peer.host}:{peer.port}",
                    error=str(exc) or type(exc).__name__, failures=failures)
            else:
                await link.closed
                if link.established:
                    backoff.reset()
                    failures = 0
            await asyncio.sleep(backoff.next_delay())


def _close_unadopted(sock: socket.socket, task: asyncio.Future) -> None:
    if task.cancelled() or task.exception() is not None:
        log.warning("cluster.link_not_adopted", error=str(None if task.cancelled() else task.exception()))
        sock.close()
