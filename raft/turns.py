"""When the runtime's Raft turn runs, and the host's callbacks around it.

Theory of operation. Inputs reach the system from three places: frames from
the transport (`step`), its per-node failure detector (`peer_up` /
`peer_down`), and ONE timer for all groups (`tick`; quiet groups cost
nothing). Any of them may leave work; the system then calls `request_turn`,
which schedules one turn with `loop.call_soon`, at most once per loop turn.
Hops cost latency, so the turn also runs where it batches as well (issue 11,
item 8): the host's proposals of a loop turn are made at the start of the
Raft turn (`before_turn`), the WAL batch goes to the writer at its end
(`GroupCommitter.flush`), a durable batch's turn runs in the callback that
reports it (`turn_now`), and the host's output of a turn (confirms) is written
at its end (`after_turn`). The runtime's `end_of_turn` runs at the end of
every turn, still inside it: the turn's Raft messages and the host's (the
node core's), one frame per peer, leave in the turn that made them.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

log = structlog.get_logger("warren.cluster")


class TurnScheduler:
    """Runs `process` (the Raft turn) then `flush` (the WAL batch to the
    writer) once per requested turn, unless `halted()` (stopped or failed)."""

    def __init__(self, node_name: str, process: Callable[[], None], flush: Callable[[], None],
                 halted: Callable[[], bool]) -> None:
        self.node_name = node_name
        self.process = process
        self.flush = flush
        self.halted = halted
        self.loop: asyncio.AbstractEventLoop | None = None   # set by the runtime's start()
        self._turn_handle: asyncio.Handle | None = None
        self._in_turn = False
        self._proposing = False   # the host's before_turn callbacks run
        # the host's callbacks around the next turn (dicts as ordered sets)
        self._before_turn: dict[Callable[[], None], None] = {}
        self._after_turn: dict[Callable[[], None], None] = {}
        # the end of every turn, still inside it (the runtime's: one frame per peer)
        self.end_of_turn: Callable[[], None] | None = None
        self.turns_run = 0

    @property
    def in_turn(self) -> bool:
        return self._in_turn

    @property
    def proposals_waiting(self) -> bool:
        """Whether the host asked for `before_turn` callbacks not yet run."""
        return bool(self._before_turn)

    def cancel(self) -> None:
        """Forget a scheduled turn (the runtime stops or failed)."""
        if self._turn_handle is not None:
            self._turn_handle.cancel()
            self._turn_handle = None

    def request_turn(self) -> None:
        if self._proposing:
            return   # the turn that runs the host's proposals processes them (on_turn)
        if self._turn_handle is None and not self.halted() and self.loop is not None:
            self._turn_handle = self.loop.call_soon(self.on_turn)

    def turn_now(self) -> None:
        """Run the turn in this callback (instead of one `call_soon` later),
        unless one is running: then the system's request schedules the next."""
        if self._in_turn:
            self.request_turn()
            return
        self.cancel()
        self.on_turn()

    def before_turn(self, callback: Callable[[], None]) -> None:
        """Have `callback` run at the start of the next turn, before the
        Readies are taken: the host's proposals of this loop turn (the
        broker's publishes, one ENQUEUE_BATCH per queue) are then persisted in
        that same turn, not one `call_soon` later. Each callback once."""
        self._before_turn[callback] = None
        self.request_turn()

    def after_turn(self, callback: Callable[[], None]) -> bool:
        """Inside a turn: have `callback` run once at its end, after the applies
        (the broker writes the confirms and deliveries they produced there, not
        one `call_soon` later); True. Outside a turn: False, nothing is done."""
        if not self._in_turn:
            return False
        self._after_turn[callback] = None
        return True

    def on_turn(self) -> None:
        """One turn: the host's proposals (`before_turn`), Raft's Ready
        processing, deferred compactions; then hand the WAL batch to the
        writer at once (everything the turn writes is in it), then the host's
        `after_turn` callbacks."""
        self._turn_handle = None
        self._in_turn = True
        self.turns_run += 1
        try:
            self._proposing = True
            try:
                self.run_hooks(self._before_turn)
            finally:
                self._proposing = False
            if self.halted():
                return
            self.process()
            self.flush()
        finally:
            if self.end_of_turn is not None:
                self.run_hooks({self.end_of_turn: None})
            self._in_turn = False
            self.run_hooks(self._after_turn)

    def run_hooks(self, hooks: dict[Callable[[], None], None]) -> None:
        """The host's callbacks: one that raises is logged, the others run."""
        while hooks:
            callbacks = list(hooks)
            hooks.clear()
            for callback in callbacks:
                try:
                    callback()
                except Exception:  # noqa: BLE001 -- the host's bug, not Raft's: as a loop callback's
                    log.exception("raft.turn_hook_failed", node=self.node_name)
