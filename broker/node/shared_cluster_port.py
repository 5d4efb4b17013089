"""A node's one cluster port, shared by its shards (docs/multi-process.md section 12).

The supervisor binds the port once and every shard accepts on it, as on the AMQP
port; the other nodes dial `<node>#k` at the node's one address. Whichever shard
accepts reads the dialer's hello (raft/transport.py), and a link meant for
another shard goes to it over that shard's pair of link sockets with the bytes
read (broker/node/connection_handoff.py); it answers as if it had accepted it.
"""
from __future__ import annotations

import asyncio
import socket

from warren.broker.node.connection_handoff import ConnectionHandoff
from warren.raft.transport import Adopt


class SharedClusterPort:
    """`raft.transport.SharedPort` for one shard: its listening sockets and its way
    to its siblings, whom it knows by name (`shard_of`: every shard's name to its index)."""

    def __init__(self, listening: list[socket.socket], shard_of: dict[str, int], links: ConnectionHandoff) -> None:
        self.listening = listening
        self.shard_of = shard_of
        self.links = links

    def forward(self, target: str, fd: int, head: bytes) -> bool:
        shard = self.shard_of.get(target)
        if shard is None or shard == self.links.shard:
            return False
        return self.links.send(shard, fd, [head])

    def start(self, loop: asyncio.AbstractEventLoop, adopt: Adopt) -> None:
        self.links.start(loop, lambda sock, fields: adopt(sock, _head(fields)))

    def stop(self, loop: asyncio.AbstractEventLoop) -> None:
        self.links.stop(loop)


def _head(fields: list) -> bytes:
    if len(fields) != 1 or not isinstance(fields[0], bytes):
        raise ValueError("a passed cluster link without the bytes its dialer sent")
    return fields[0]
