"""The metadata shell on one node (no cluster): the machine's effects on the
vhosts' read model and users, and the same read model rebuilt by installing
the machine's snapshot on a node that starts from nothing
(broker/node/metadata_log.py, broker/node/metadata_diff.py)."""
from __future__ import annotations

from types import SimpleNamespace

from warren.broker.admin.auth import hash_password
from warren.broker.node import metadata_commands as mc
from warren.broker.node.broker import Broker
from warren.broker.node.metadata_log import seed_command
from warren.broker.node.metadata_state import snapshot
from warren.config import Settings
from warren.raft.messages import Snapshot

COMMANDS = [
    mc.DeclareExchange("/", "x", "topic", False, False, {}),
    mc.DeclareExchange("/", "ad", "fanout", True, False, {}),
    mc.Bind("/", "ad", "exchange", "x", "k", {"a": 1}, 40, 30),
    mc.Bind("/", "amq.direct", "exchange", "x", "r", {}, 40, 30),
    mc.AddUser("bob", hash_password("p"), ("t",)),
    mc.AddVhost("v"),
    mc.SetPermissions("bob", "v", ".*", "", "^a"),
    mc.Unbind("/", "ad", "exchange", "x", "k", {"a": 1}, 40, 40),   # "ad" auto-deletes
    mc.DeclareExchange("v", "gone", "direct", False, False, {}),
    mc.AddVhost("w"),
    mc.DeleteVhost("w"),
]


def read_model(broker: Broker) -> dict:
    """What a node routes and logs in with, as plain data."""
    return {
        "vhosts": {name: {"exchanges": sorted((x.name, x.type, x.durable, x.auto_delete, x.internal)
                                              for x in vhost.exchanges.values()),
                          "bindings": sorted(repr(b) for x in vhost.exchanges.values() for b in x.bindings),
                          "queues": sorted(vhost.queues)}
                   for name, vhost in broker.vhosts.items()},
        "users": {name: (user.password_hash, user.tags) for name, user in broker.access.users.items()},
        "permissions": {key: p.row() for key, p in broker.access.permissions.items()},
    }


def apply_all(broker: Broker, commands: list) -> None:
    for index, command in enumerate(commands, 1):
        answer = broker.metadata.apply(SimpleNamespace(index=index, data=mc.encode(command)))
        assert answer[:2] == ["@", index]


def test_the_configs_definitions_are_provisional_until_the_log_seeds_the_state(tmp_path):
    """A node that has not yet applied a seed (or a seeded snapshot) lets the config's users
    in; the first seed applied replaces them with the log's, extras included."""
    settings = Settings(data_dir=tmp_path, vhosts=["/", "cfg-only"])
    broker = Broker(settings)
    assert sorted(broker.vhosts) == ["/", "cfg-only"] and "guest" in broker.access.users
    elsewhere = mc.SeedDefinitions(("/", "v"), (("admin", hash_password("a"), ("administrator",)),),
                                   (("admin", "/", ".*", ".*", ".*"),))
    apply_all(broker, [elsewhere])   # another node's seed committed first: it is the cluster's
    assert sorted(broker.vhosts) == ["/", "v"]
    assert sorted(broker.access.users) == ["admin"], "the config's guest is not in the log"
    assert sorted(broker.access.permissions) == [("admin", "/")]
    assert broker.metadata.state.seeded


def test_a_node_seeded_from_its_own_config_keeps_the_configs_definitions(tmp_path):
    settings = Settings(data_dir=tmp_path)
    broker = Broker(settings)
    apply_all(broker, [seed_command(settings)])
    assert sorted(broker.vhosts) == list(settings.vhosts)
    assert sorted(broker.access.users) == sorted(user.name for user in settings.users)


def test_only_the_first_seed_counts_the_log_is_the_truth_afterwards(tmp_path):
    settings = Settings(data_dir=tmp_path)
    broker = Broker(settings)
    apply_all(broker, [seed_command(settings), mc.DeleteUser("guest"), mc.AddVhost("v"),
                       mc.SeedDefinitions(("other",), (("mallory", hash_password("m"), ()),), ())])
    assert "guest" not in broker.access.users and "mallory" not in broker.access.users
    assert sorted(broker.vhosts) == ["/", "v"]


def test_installing_the_machines_snapshot_on_an_empty_node_rebuilds_the_same_read_model(tmp_path):
    settings = Settings(data_dir=tmp_path)
    broker = Broker(settings)
    apply_all(broker, [seed_command(settings), *COMMANDS])
    data = snapshot(broker.metadata.state)

    again = Broker(settings)
    again.metadata.install_snapshot(Snapshot(len(COMMANDS) + 1, 1, ("warren@localhost",), data))
    assert read_model(again) == read_model(broker)
    assert snapshot(again.metadata.state) == data
    assert again.metadata.applied_index == len(COMMANDS) + 1
    assert "ad" not in again.vhosts["/"].exchanges and "x" in again.vhosts["/"].exchanges
    assert again.access.permission("bob", "v").row() == [".*", "", "^a"]


def test_a_snapshot_installed_over_a_live_read_model_performs_only_the_difference(tmp_path):
    """A follower that lagged behind the leader's compacted log (Raft §7) keeps what did not change."""
    settings = Settings(data_dir=tmp_path)
    leader, follower = Broker(settings), Broker(settings)
    apply_all(leader, [seed_command(settings), *COMMANDS])
    apply_all(follower, [seed_command(settings), *COMMANDS[:3]])
    kept = follower.vhosts["/"].exchanges["x"]
    follower.metadata.install_snapshot(Snapshot(len(COMMANDS) + 1, 1, ("warren@localhost",),
                                                snapshot(leader.metadata.state)))
    assert read_model(follower) == read_model(leader)
    assert follower.vhosts["/"].exchanges["x"] is kept, "an exchange in both states is not made again"


def test_a_log_entry_that_is_not_a_command_is_skipped(tmp_path):
    broker = Broker(Settings(data_dir=tmp_path))
    answer = broker.metadata.apply(SimpleNamespace(index=1, data=b"\x93\x01\x02\x03"))
    assert answer == ["@", 1, None]
