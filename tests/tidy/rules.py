"""The intended shape of the project, as data the tidy tests check the code against."""
from __future__ import annotations

from tests.tidy.imports import project_modules

# Standard modules that do I/O, read the clock, use the global RNG or run things concurrently.
# The pure cores get their time, randomness and bytes handed in (deterministic tests and simulations).
IMPURE_STDLIB = frozenset({"asyncio", "os", "random", "selectors", "socket", "subprocess", "threading", "time",
                           "importlib"})

PURE_BROKER = ("broker.queues.fifo", "broker.queues.message_table", "broker.queues.quorum_machine",
               "broker.queues.queue_commands", "broker.queues.queue_codec", "broker.queues.queue_snapshots",
               "broker.queues.snapshot_codec",
               "broker.routing.exchanges",
               "broker.amqp.confirms", "broker.routing.arguments",
               "broker.node.metadata_machine", "broker.node.metadata_state", "broker.node.metadata_commands",
               "broker.node.metadata_effects", "broker.node.definition_checks", "broker.node.node_core",
               "broker.node.metadata_answers", "broker.node.cluster_alarms")
# raft's transport.py and runtime.py (with its turns.py, persistence.py, entry_locations.py) are the
# asyncio shells; raft_storage is listed below. carried_commits, reelection, system_counters and system_views
# were cut out of raft.system.
PURE_RAFT = ("raft", "raft.core", "raft.election", "raft.log", "raft.progress", "raft.replication", "raft.messages",
             "raft.group", "raft.system", "raft.carried_commits", "raft.reelection", "raft.system_counters",
             "raft.system_views",
             "raft.handshake", "raft.frames", "raft.member_ids", "raft.stall", "raft.packing")


def pure_cores() -> list[str]:
    """Modules that, with everything of the project they import, touch none of IMPURE_STDLIB."""
    protocol = [name for name in project_modules() if name.split(".")[0] == "protocol"]
    return sorted([*protocol, *PURE_BROKER, *PURE_RAFT])


# More that one pure core must not import: the handshake's nonces are handed in, not drawn from `secrets`.
EXTRA_IMPURE = {"raft.handshake": frozenset({"secrets"})}

# Pure in their own imports, but they reach storage's file layer (raft_storage encodes the Raft log
# records that storage.wal writes): checked directly only.
NO_DIRECT_IO = ("raft.raft_storage",)

# Package -> project packages it must not depend on, directly or through other modules (every import
# counts here, TYPE_CHECKING ones too: a type-only import still ties the layers together).
LAYERS = {
    "protocol": frozenset({"broker", "raft", "storage", "config", "verification"}),   # the bottom: sans-I/O AMQP
    "storage": frozenset({"raft", "broker"}),
    "raft": frozenset({"broker", "protocol"}),
}

# Type-checked by mypy (tests/tidy/test_mypy.py; options in pyproject.toml [tool.mypy]).
MYPY_SCOPE = ("protocol", "protocol.codec", "protocol.connection", "protocol.constants", "protocol.errors",
              *PURE_BROKER, "raft.core", "raft.election", "raft.log", "raft.progress", "raft.replication",
              "raft.messages")
