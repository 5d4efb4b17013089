"""One frame per peer per turn: the Raft system's messages and the host's, together.

Theory of operation. In one turn the node's `RaftSystem` leaves one frame of
Raft items per peer (split only beyond its `frame_max_messages`) and the host
(the broker's node core) leaves its own messages per peer: forwards,
deliveries, answers. The runtime puts both in ONE frame per peer, encoded
once and handed to the transport with one `send`:

    {"r": [raft item, ...], "a": [host message, ...]}

either key left out when it has nothing. A receiver steps the Raft items
first, then hands the frame to the host for the rest: the order the sender
made them in (its Raft frame went out before its host frame when they were
two). The host may send frames of its own with other keys beside "r".
Nodes of one cluster run one version: no other form is read.
"""
from __future__ import annotations

from collections.abc import Iterator
from itertools import zip_longest
from typing import Any

RAFT = "r"
HOST = "a"
HOST_FRAME_MESSAGES_MAX = 4096


def assemble(raft: dict[str, list[list]], host: dict[str, list],
             host_max: int = HOST_FRAME_MESSAGES_MAX) -> Iterator[tuple[str, dict]]:
    """(peer, frame) for every peer with something to send: the peer's Raft frames
    (`raft`: the system's, one per peer) beside its host messages, cut every `host_max`.
    One frame per peer unless a side is over its bound."""
    for peer in [*raft, *(peer for peer in host if peer not in raft)]:
        messages = host.get(peer, ())
        chunks = [messages[start:start + host_max] for start in range(0, len(messages), host_max)]
        for items, chunk in zip_longest(raft.get(peer, ()), chunks):
            frame = {}
            if items:
                frame[RAFT] = items
            if chunk:
                frame[HOST] = chunk
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
