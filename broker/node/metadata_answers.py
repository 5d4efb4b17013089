"""When a metadata change is answered: once this node, and every running node, applied it.

Theory of operation. RabbitMQ answers a declaration only once every running
node can use it: a client that declares through one node and publishes
through another never meets a name the other does not know yet. The
metadata group's leader answers when it has applied a change (its reply is
`[APPLIED_AT, index, result]`), which may be before the asking node, or
another running node, applied it: the answer then waits here until this node
applied `index` and every running peer said (METADATA_APPLIED) it did too,
or `SPREAD_WAIT_SECONDS` passed (a node that is up but cannot apply, say cut
off from the group's leader alone, holds no one back). A peer's progress is
heard from the peer itself, or relayed by another running peer that still
reaches it (`relayed`: a node cut off from this one alone still serves its
clients, and this node must wait for it all the same). Pure: the time and
the peers to wait for are handed in (the running ones, those counted down only
just now, and those another peer relays: NodeCore.answer_peers).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# An apply's reply is [APPLIED_AT, index, result]: the asking node answers once it applied `index` too.
APPLIED_AT = "@"
SPREAD_WAIT_SECONDS = 10.0


@dataclass(slots=True, eq=False)
class AwaitingApply:
    index: int
    on_done: Callable[[Any], None]
    result: Any
    everywhere: bool
    deadline: float


class MetadataAnswers:
    def __init__(self) -> None:
        self.awaiting: list[AwaitingApply] = []
        self.peer_applied: dict[str, int] = {}   # how far each running peer has applied the group
        # running peer -> {a node it reaches: how far that one applied}, as the peer last said
        self.relayed: dict[str, dict[str, int]] = {}
        self.late: list[tuple[int, list[str]]] = []   # (index, peers lagging) answered at the deadline

    def on_answer(self, answer: Any, on_done: Callable[[Any], None], everywhere: bool, now: float,
                  applied_here: int, running_peers: list[str]) -> None:
        if not (isinstance(answer, list) and len(answer) == 3 and answer[0] == APPLIED_AT):
            on_done(answer)   # None: the leader had applied it before a restart
            return
        _, index, result = answer
        waiting = AwaitingApply(index, on_done, result, everywhere, now + SPREAD_WAIT_SECONDS)
        if not self.applied_where_needed(waiting, now, applied_here, running_peers):
            self.awaiting.append(waiting)
            return
        on_done(result)

    def applied_where_needed(self, waiting: AwaitingApply, now: float, applied_here: int,
                             running_peers: list[str]) -> bool:
        if applied_here < waiting.index:
            return False
        if not waiting.everywhere:
            return True
        lagging = [peer for peer in running_peers if self.applied_by(peer) < waiting.index]
        if lagging and now >= waiting.deadline:
            self.late.append((waiting.index, lagging))
            return True
        return not lagging

    def applied_by(self, peer: str) -> int:
        """How far `peer` applied the group, as heard from it or through another peer."""
        applied = self.peer_applied.get(peer, 0)
        for view in self.relayed.values():
            applied = max(applied, view.get(peer, 0))
        return applied

    def relayed_peers(self) -> set[str]:
        """The nodes some running peer says it reaches."""
        return {peer for view in self.relayed.values() for peer in view}

    def release(self, now: float, applied_here: int, running_peers: list[str]) -> None:
        """Answer what every node it waits for has applied now: after a local
        apply, a peer's METADATA_APPLIED, a peer going down, and now and then
        (the wait is bounded)."""
        if not self.awaiting:
            return
        ready = [waiting for waiting in self.awaiting
                 if self.applied_where_needed(waiting, now, applied_here, running_peers)]
        if ready:
            self.awaiting = [waiting for waiting in self.awaiting if waiting not in ready]
            for waiting in ready:
                waiting.on_done(waiting.result)
