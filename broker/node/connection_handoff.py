"""Handing a socket to another shard of the node (docs/multi-process.md, sections 11
and 12): the thin shell around one Unix datagram socket pair per shard.

The supervisor makes the pairs before it starts the shards and keeps them for the
node's life: shard k reads its pair's first end (its inbox); every other shard
writes to the second (k's outbox), which the kernel delivers to that inbox. One
datagram is one moved connection: the socket itself (SCM_RIGHTS: the receiver
gets its own descriptor of the same open socket) and a msgpack list of what the
receiver needs to go on with it: for a client's connection what it received
before the move (replayed there with its output dropped), what it received and
did not parse yet, and its open channels' numbers; for a cluster link (a second
set of pairs, broker/node/shared_cluster_port.py) the bytes its dialer sent. A
datagram is whole or not sent at all, so a send that cannot go (the inbox full,
the bytes over the socket's size) fails at once and the connection stays where
it is. While a shard restarts, what is sent to it waits in its inbox, which the
supervisor holds.
"""
from __future__ import annotations

import array
import asyncio
import os
import socket
from collections.abc import Callable

import msgpack
import structlog

from warren.broker.amqp.connection_move import MOVE_MAX_BYTES

log = structlog.get_logger("warren.connection")

# Room for the datagram's msgpack framing beside the input it carries.
_DATAGRAM_MAX_BYTES = MOVE_MAX_BYTES + 4096
_FD_SPACE = socket.CMSG_SPACE(array.array("i", [0]).itemsize)

OnMoved = Callable[[socket.socket, list], None]


def handoff_pairs(count: int) -> list[tuple[socket.socket, socket.socket]]:
    """The supervisor's: one (inbox, outbox) pair per shard, sized for a whole move."""
    pairs = []
    for _ in range(count):
        inbox, outbox = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        for sock in (inbox, outbox):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2 * _DATAGRAM_MAX_BYTES)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * _DATAGRAM_MAX_BYTES)
        pairs.append((inbox, outbox))
    return pairs


class ConnectionHandoff:
    """Shard `shard`'s end: sends connections to the other shards' inboxes and
    hands what arrives in its own to `on_moved`."""

    def __init__(self, shard: int, inbox: socket.socket, outboxes: dict[int, socket.socket]) -> None:
        self.shard = shard
        self.inbox = inbox
        self.outboxes = outboxes
        self.on_moved: OnMoved | None = None

    @classmethod
    def of(cls, shard: int, inbox_fds: list[int], outbox_fds: list[int]) -> "ConnectionHandoff":
        """From the descriptors a shard inherited: its own inbox and the others' outboxes
        (the rest are closed here; the supervisor keeps them)."""
        for k, (inbox_fd, outbox_fd) in enumerate(zip(inbox_fds, outbox_fds)):
            if k != shard:
                os.close(inbox_fd)
            else:
                os.close(outbox_fd)
        inbox = socket.socket(fileno=inbox_fds[shard])
        inbox.setblocking(False)
        outboxes = {k: socket.socket(fileno=fd) for k, fd in enumerate(outbox_fds) if k != shard}
        for sock in outboxes.values():
            sock.setblocking(False)
        return cls(shard, inbox, outboxes)

    def start(self, loop: asyncio.AbstractEventLoop, on_moved: OnMoved) -> None:
        self.on_moved = on_moved
        loop.add_reader(self.inbox.fileno(), self._on_readable)

    def stop(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.remove_reader(self.inbox.fileno())

    def send(self, shard: int, fd: int, fields: list) -> bool:
        """Hand the socket `fd` and what its receiver needs to `shard`; False (nothing sent)
        if it cannot go."""
        outbox = self.outboxes.get(shard)
        payload = msgpack.packb(fields)
        if outbox is None or len(payload) > _DATAGRAM_MAX_BYTES:
            return False
        try:
            outbox.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
        except OSError as error:   # full inbox, too large: the connection stays
            log.info("connection.move_not_sent", shard=shard, error=str(error))
            return False
        return True

    def _on_readable(self) -> None:
        while True:
            try:
                data, ancillary, flags, _ = self.inbox.recvmsg(_DATAGRAM_MAX_BYTES, _FD_SPACE)
            except (BlockingIOError, InterruptedError):
                return
            fds = _received_fds(ancillary)
            try:
                if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) != 1:
                    raise ValueError(f"a move datagram with {len(fds)} descriptors, flags {flags}")
                fields = msgpack.unpackb(data)
                if not isinstance(fields, list):
                    raise ValueError("a move datagram without its list of fields")
                sock = socket.socket(fileno=fds.pop())
            except Exception as error:  # noqa: BLE001 -- a bad datagram costs its connection only
                log.warning("connection.move_refused", error=str(error))
                for fd in fds:
                    os.close(fd)
                continue
            assert self.on_moved is not None
            try:
                self.on_moved(sock, fields)
            except Exception:  # noqa: BLE001 -- a bug here must not stop the inbox: this connection goes
                log.exception("connection.move_failed")
                sock.close()


def _received_fds(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            received = array.array("i")
            received.frombytes(data[:len(data) - len(data) % received.itemsize])
            fds.extend(received)
    return fds
