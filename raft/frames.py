"""One frame per peer per turn: the Raft system's messages and the host's, together.

Theory of operation. In one turn the node's `RaftSystem` leaves one frame of
Raft items per peer (split only beyond its `frame_max_messages`) and the host
leaves its own messages per peer, in parts of its own: the broker's node core
its forwards, deliveries and answers under "a", the shards of one node what
they tell each other under "s" (broker/node/shard_link.py). The runtime puts
all of them in ONE frame per peer, encoded once and handed to the transport
with one `send`:

    {"r": [raft item, ...], "a": [host message, ...], "s": [...]}

a key left out when it has nothing. (One exception: a turn that delivers a
consumer's window to a peer sends those host messages ahead, in frames of
their own as they are made: broker/node/cluster.py, `_maybe_early_frame`.)
A receiver steps the Raft items first,
then hands the frame to the host for the rest: the order the sender made
them in (its Raft frame went out before its host frame when they were two).
Nodes of one cluster run one version: no other form is read.
"""
from __future__ import annotations

from collections.abc import Iterator
from itertools import zip_longest
from typing import Any

RAFT = "r"
HOST = "a"
HOST_FRAME_MESSAGES_MAX = 4096


def assemble(raft: dict[str, list[list]], parts: dict[str, dict[str, list]],
             host_max: int = HOST_FRAME_MESSAGES_MAX) -> Iterator[tuple[str, dict]]:
    """(peer, frame) for every peer with something to send: the peer's Raft frames
    (`raft`: the system's, one per peer) beside the host's messages (`parts`: part key ->
    peer -> messages), each part cut every `host_max`. One frame per peer unless a part
    is over its bound."""
    peers = dict.fromkeys(raft)
    for by_peer in parts.values():
        peers.update(dict.fromkeys(by_peer))
    for peer in peers:
        keys, chunked = [], []
        for key, by_peer in parts.items():
            messages = by_peer.get(peer, ())
            if messages:
                keys.append(key)
                chunked.append([messages[start:start + host_max] for start in range(0, len(messages), host_max)])
        for items, *chunks in zip_longest(raft.get(peer, ()), *chunked):
            frame = {RAFT: items} if items else {}
            for key, chunk in zip(keys, chunks):
                if chunk:
                    frame[key] = chunk
            if frame:
                yield peer, frame


def raft_items(frame: Any) -> list:
    """A received frame's Raft items; TypeError if it is not a frame."""
    if not isinstance(frame, dict):
        raise TypeError(f"a cluster frame is a dict, not a {type(frame).__name__}")
    items = frame.get(RAFT, [])
    if not isinstance(items, list):
        raise TypeError("a cluster frame's Raft part is a list")
    return items


def has_host_parts(frame: dict) -> bool:
    """Whether the frame carries anything for the host (its messages, or another part of its own)."""
    return any(key != RAFT for key in frame)
