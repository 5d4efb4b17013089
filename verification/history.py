"""The history format shared by the recorders (warren-perf, warren-chaos) and the
judge (warren-verify): Parquet files of events, one row per event.

A history is a directory. Every recording process writes its own files,
`<writer>-<part:06d>.parquet`, each closed (footer written) before the next
is started, so a crash of a recorder loses at most the batch it was writing.
The judge reads every `*.parquet` under the directory.

Columns (all nullable except `event`, `writer`, `mono_ns`, `wall_ns`):

| column | type | meaning |
| --- | --- | --- |
| run_id | string | one run (a chaos run and its perf processes share it) |
| writer | string | the recording process (`perf-<pid>-<n>`, `chaos`) |
| event | string | one of EVENTS |
| queue | string | the queue published to / consumed from |
| message_id | string | `<publisher_id>:<seq>`, carried in the message's `message_id` property |
| publisher_id | string | a publisher (unique in the run) |
| seq | int64 | the publisher's sequence number, from 0, in publish order |
| consumer_id | string | a consumer (unique in the run), for deliver / ack |
| node | string | the broker URL or node name the client was connected to (faults: the target) |
| redelivered | bool | the redelivered flag of a delivery |
| mono_ns | int64 | time.monotonic_ns() (one clock for all processes of one machine) |
| wall_ns | int64 | time.time_ns() |
| detail | string | a fault's kind and parameters, an error text, a returned message's reply text |

Events: `publish` (sent), `confirm` (basic.ack from the broker), `nack`
(basic.nack), `return` (basic.return: unroutable), `deliver` (a delivery
handed to a consumer), `ack` (the consumer acknowledged it),
`connection_lost`, `connection_regained`, `fault_start`, `fault_end` (the
chaos schedule: `detail` names the fault, `node` its target), `drain_start`,
`drain_end` (the final drain of every queue on every node).
"""
from __future__ import annotations

import pyarrow as pa

EVENTS = ("publish", "confirm", "nack", "return", "deliver", "ack", "connection_lost", "connection_regained",
          "fault_start", "fault_end", "drain_start", "drain_end")

SCHEMA = pa.schema([
    pa.field("run_id", pa.string()),
    pa.field("writer", pa.string(), nullable=False),
    pa.field("event", pa.string(), nullable=False),
    pa.field("queue", pa.string()),
    pa.field("message_id", pa.string()),
    pa.field("publisher_id", pa.string()),
    pa.field("seq", pa.int64()),
    pa.field("consumer_id", pa.string()),
    pa.field("node", pa.string()),
    pa.field("redelivered", pa.bool_()),
    pa.field("mono_ns", pa.int64(), nullable=False),
    pa.field("wall_ns", pa.int64(), nullable=False),
    pa.field("detail", pa.string()),
])


def message_id(publisher_id: str, seq: int) -> str:
    return f"{publisher_id}:{seq}"
