"""The metadata shell on one node (no cluster): the machine's effects on the
vhosts' read model and users, and the machine's state rebuilt from what
recovery reads back (broker/routing/metadata_read_model.py)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from warren.broker.admin.auth import hash_password
from warren.broker.node import metadata_commands as mc
from warren.broker.node.broker import Broker
from warren.broker.node.metadata_state import snapshot
from warren.broker.routing.metadata_read_model import state_from_read_model
from warren.config import Settings

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


def test_effects_feed_the_read_model_and_a_restart_rebuilds_the_same_state(tmp_path):
    async def run_and_restart() -> tuple[bytes, bytes, Broker]:
        broker = Broker(Settings(data_dir=tmp_path))
        broker.durability.recover(broker)
        for index, command in enumerate(COMMANDS, 1):
            answer = broker.metadata.apply(SimpleNamespace(index=index, data=mc.encode(command)))
            assert answer[:2] == ["@", index]
            broker.durability.meta_applied(index)
        assert state_from_read_model(broker) == broker.metadata.state
        before = snapshot(broker.metadata.state)
        await broker.durability.close()

        again = Broker(Settings(data_dir=tmp_path))
        again.durability.recover(again)
        again.metadata.load_state()
        after = snapshot(again.metadata.state)
        await again.durability.close()
        return before, after, again

    before, after, again = asyncio.run(run_and_restart())
    assert after == before
    assert "ad" not in again.vhosts["/"].exchanges and "x" in again.vhosts["/"].exchanges
    assert sorted(again.vhosts) == ["/", "v"] and "gone" in again.vhosts["v"].exchanges
    assert again.access.permission("bob", "v").row() == [".*", "", "^a"]
    assert again.durability.meta_applied_index == len(COMMANDS)


def test_a_log_entry_that_is_not_a_command_is_skipped(tmp_path):
    async def run() -> list:
        broker = Broker(Settings(data_dir=tmp_path))
        broker.durability.recover(broker)
        answer = broker.metadata.apply(SimpleNamespace(index=1, data=b"\x93\x01\x02\x03"))
        await broker.durability.close()
        return answer
    assert asyncio.run(run()) == ["@", 1, None]
