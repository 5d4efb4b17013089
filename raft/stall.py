"""What a node does when it finds it stalled: SIGSTOP, or its loop held for seconds.

Its ticks stopped for longer than any follower's election timeout (twice the
longest, `STALL_ELECTION_TIMEOUTS`), so its peers counted it gone long ago and
may have acted since: another leader may have taken back what this node's
consumers held and given it to others, who settled it. The runtime checks
before anything else it does (a tick, a turn's applies, a peer's frame:
`RaftRuntime.check_stall`), and then:
* its leaders step down before applying (`step_down_leaders`; always safe in
  Raft), or their applies of entries committed before the stall would deliver
  from the past (tests/sim faults seed 122); whoever wins next resends what is
  checked out. A group of one voter cannot be led by anyone else and keeps
  leading;
* its links are dropped, unread (raft/transport.py `drop_links`): what they
  hold was sent before the peers gave up on this node, deliveries of messages
  since taken back among them (warren-chaos seed 43, tests/sim faults seed 28);
  the peers are dialed again and resend what matters.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

from warren.raft.messages import Role

if TYPE_CHECKING:
    from warren.raft.system import RaftSystem

log = structlog.get_logger("warren.raft")

STALL_ELECTION_TIMEOUTS = 2


def stall_limit_seconds(election_ticks: int, tick_seconds: float) -> float:
    """Ticks stopped for longer than this is a stall (a follower's timeout is at most twice the election ticks)."""
    return STALL_ELECTION_TIMEOUTS * 2 * election_ticks * tick_seconds


def step_down_leaders(system: "RaftSystem") -> int:
    """Every group this node leads with other voters steps down; how many did."""
    led = [group for group in system.groups.values() if group.raft.role == Role.LEADER and len(group.raft.voters) > 1]
    for group in led:
        group.raft.become_follower(group.raft.term, None)
        system.wake(group)
        system.touch(group)
    return len(led)


def step_down_while_disk_full(system: "RaftSystem", waiting_since: float | None, now: float, limit: float) -> int:
    """A node whose WAL waits for disk space (storage/group_commit.py, `waiting_for_space_since`)
    persists nothing, so a group it leads applies nothing (no confirm, no delivery) though its
    followers could commit without it. Past the stall limit its leaders step down, as after a
    stall, so that the groups elect a leader elsewhere (this node cannot win back a group
    before it can write its vote); a group of one keeps its leader. How many stepped down."""
    if waiting_since is None or now - waiting_since <= limit:
        return 0
    stepped_down = step_down_leaders(system)
    if stepped_down:
        log.warning("raft.disk_full_leaders_stepped_down", node=system.node_name, seconds=round(now - waiting_since, 3),
                    leaders_stepped_down=stepped_down)
    return stepped_down
