"""Values that cross the Raft core's boundary: log entries, snapshots, the
persistent state and the RPC messages.

Theory of operation. Everything here is an immutable value with plain,
msgpack-friendly fields (ints, strs, bytes, bools, lists). The core consumes
messages in `RaftNode.step` and emits them in `Ready.messages`; the transport
sends `to_wire(message)` (a list, msgpack-able without pickle) and rebuilds
it with `from_wire`. The message set is the one of the Raft paper (Figure 2:
RequestVote, AppendEntries; Figure 13: InstallSnapshot) plus what the thesis
adds: pre-vote (§9.6), leadership transfer's TimeoutNow (§3.10), and
etcd-style heartbeats, which carry only a safe commit index so that a leader
can assert its leadership without a log-consistency check.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum

import msgpack


class EntryKind(IntEnum):
    NORMAL = 0
    CONFIG = 1   # data is an encoded ConfigChange (thesis §4.1)
    NOOP = 2     # a new leader's first entry (Raft §5.4.2, §8)


@dataclass(frozen=True, slots=True)
class Entry:
    term: int
    index: int
    kind: EntryKind
    data: bytes | None   # None only inside a RaftLog: evicted, on disk (raft/log.py)

    def size_bytes(self) -> int:
        return len(self.data) + ENTRY_OVERHEAD_BYTES


# What an entry costs on the wire beyond its data, for batching limits.
ENTRY_OVERHEAD_BYTES = 16


class ConfigChangeOp(IntEnum):
    ADD = 0
    REMOVE = 1


@dataclass(frozen=True, slots=True)
class ConfigChange:
    """A single-server membership change (thesis §4.1) and the voter set it
    produces, so that a config entry alone says what the configuration is."""
    op: ConfigChangeOp
    node_id: str
    voters: tuple[str, ...]

    def encode(self) -> bytes:
        return msgpack.packb([int(self.op), self.node_id, list(self.voters)])

    @classmethod
    def decode(cls, data: bytes) -> ConfigChange:
        op, node_id, voters = msgpack.unpackb(data)
        return cls(ConfigChangeOp(op), node_id, tuple(voters))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Raft §7: everything up to `index` (whose term is `term`) captured by the
    application as `data`, with the configuration in force at `index`."""
    index: int
    term: int
    voters: tuple[str, ...]
    data: bytes


@dataclass(frozen=True, slots=True)
class HardState:
    """What must be on stable storage before responding to RPCs (Figure 2:
    currentTerm, votedFor; plus commit_index so a restart applies no less)."""
    term: int = 0
    voted_for: str | None = None
    commit_index: int = 0


class Role(str, Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass(frozen=True, slots=True)
class SoftState:
    leader_id: str | None
    role: str


# --- messages (each has term, sender, to) -------------------------------------

@dataclass(frozen=True, slots=True)
class RequestVote:
    """Raft §5.2; with pre_vote, §9.6: `term` is the term the sender would
    campaign in, and nobody's state changes. `transfer` marks a campaign
    started by TimeoutNow, which may disturb a live leader's lease (§3.10)."""
    term: int
    sender: str
    to: str
    last_log_index: int
    last_log_term: int
    pre_vote: bool = False
    transfer: bool = False


@dataclass(frozen=True, slots=True)
class RequestVoteResponse:
    term: int
    sender: str
    to: str
    vote_granted: bool
    pre_vote: bool = False


@dataclass(frozen=True, slots=True)
class AppendEntries:
    """Raft §5.3."""
    term: int
    sender: str
    to: str
    prev_log_index: int
    prev_log_term: int
    entries: tuple[Entry, ...]
    leader_commit: int


@dataclass(frozen=True, slots=True)
class AppendEntriesResponse:
    """Success: the follower's log matches the leader's up to `match_index`.
    Rejection of the AppendEntries whose prev_log_index was `reject_index`:
    `conflict_term`/`conflict_index` let the leader skip a whole term per
    round trip (Raft §5.3, the optimisation at its end). Also the answer to
    InstallSnapshot and, with success False and a higher term, to a stale
    leader."""
    term: int
    sender: str
    to: str
    success: bool
    match_index: int = 0
    reject_index: int = 0
    conflict_index: int = 0
    conflict_term: int = 0


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Leader liveness; `commit_index` is min(leader commit, follower match),
    an index the follower is known to hold, so it may commit up to it."""
    term: int
    sender: str
    to: str
    commit_index: int


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    term: int
    sender: str
    to: str


@dataclass(frozen=True, slots=True)
class InstallSnapshot:
    """Raft §7, the whole snapshot in one message."""
    term: int
    sender: str
    to: str
    snapshot: Snapshot


@dataclass(frozen=True, slots=True)
class TimeoutNow:
    """Thesis §3.10: the leader tells a caught-up follower to campaign now."""
    term: int
    sender: str
    to: str


Message = (RequestVote | RequestVoteResponse | AppendEntries | AppendEntriesResponse
           | Heartbeat | HeartbeatResponse | InstallSnapshot | TimeoutNow)

# Wire codes are part of the cluster protocol: append, never renumber.
_WIRE_CODES: dict[type, int] = {
    RequestVote: 1, RequestVoteResponse: 2, AppendEntries: 3, AppendEntriesResponse: 4,
    Heartbeat: 5, HeartbeatResponse: 6, InstallSnapshot: 7, TimeoutNow: 8,
}
_WIRE_TYPES: dict[int, type] = {code: kind for kind, code in _WIRE_CODES.items()}


def entry_to_wire(entry: Entry) -> list:
    return [entry.term, entry.index, int(entry.kind), entry.data]


def entry_from_wire(fields: list) -> Entry:
    term, index, kind, data = fields
    return Entry(term, index, EntryKind(kind), bytes(data))


def snapshot_to_wire(snapshot: Snapshot) -> list:
    return [snapshot.index, snapshot.term, list(snapshot.voters), snapshot.data]


def snapshot_from_wire(fields: list) -> Snapshot:
    index, term, voters, data = fields
    return Snapshot(index, term, tuple(voters), bytes(data))


def to_wire(message: Message) -> list:
    """A list of plain values: [code, field, ...] in dataclass field order."""
    values: list = [_WIRE_CODES[type(message)]]
    for name in message.__slots__:
        value = getattr(message, name)
        if name == "entries":
            value = [entry_to_wire(entry) for entry in value]
        elif name == "snapshot":
            value = snapshot_to_wire(value)
        values.append(value)
    return values


def from_wire(values: list | tuple) -> Message:
    kind = _WIRE_TYPES[values[0]]
    fields = list(values[1:])
    assert len(fields) == len(kind.__slots__), f"{kind.__name__}: {len(fields)} fields on the wire"
    for position, name in enumerate(kind.__slots__):
        if name == "entries":
            fields[position] = tuple(entry_from_wire(entry) for entry in fields[position])
        elif name == "snapshot":
            fields[position] = snapshot_from_wire(fields[position])
    return kind(*fields)
