"""Resource alarms are cluster-wide, as RabbitMQ's (broker/node/cluster_alarms.py): a node
tells its running peers of its own alarms, and blocks its publishers while any node it
hears of is in alarm. Driven by hand through the pure node core."""
from __future__ import annotations

from tests.unit.test_node_core import FakeRaft
from warren.broker.node.cluster_alarms import PEER_ALARM_STALE_SECONDS, ClusterAlarms
from warren.broker.node.node_core import ALARMS, HOUSEKEEPING_SECONDS, NodeCore


def running_core(node: str) -> NodeCore:
    core = NodeCore(node, "inc1", ["a", "b", "c"], FakeRaft({}), node_gone_seconds=60.0)
    for peer in ("a", "b", "c"):
        if peer != node:
            core.peer_up(peer)
    core.end_turn()
    return core


def took_change(core: NodeCore) -> bool:
    """Whether the resources in alarm changed since the shell last acted on them (it acts now)."""
    changed = core.alarms.changed
    core.alarms.take_resources()
    return changed


def alarms_sent(messages: dict, peer: str) -> list[list]:
    return [message[1] for message in messages.get(peer, []) if message[0] == ALARMS]


def test_a_node_tells_every_running_peer_when_its_alarms_change_and_blocks_on_its_own():
    core = running_core("a")
    core.set_local_alarms(["disk"])
    assert took_change(core) and core.alarms.resources == {"disk"}
    messages = core.end_turn()
    assert alarms_sent(messages, "b") == [["disk"]] and alarms_sent(messages, "c") == [["disk"]]
    core.set_local_alarms(["disk"])   # unchanged: nothing said, nothing to re-block
    assert not took_change(core) and alarms_sent(core.end_turn(), "b") == []
    core.set_local_alarms([])
    assert took_change(core) and core.alarms.resources == set()
    assert alarms_sent(core.end_turn(), "b") == [[]], "a cleared alarm is said too"


def test_a_peers_alarm_blocks_here_until_it_clears_or_the_peer_goes_down():
    core = running_core("a")
    core.on_messages("b", [[ALARMS, ["memory"]]])
    assert took_change(core) and core.alarms.resources == {"memory"}
    assert core.alarms.nodes_in_alarm() == {"b": ["memory"]}
    core.on_messages("b", [[ALARMS, []]])
    assert took_change(core) and core.alarms.resources == set()

    core.on_messages("c", [[ALARMS, ["disk", "memory"]]])
    assert took_change(core)
    core.peer_down("c")   # RabbitMQ clears a down node's alarms
    assert took_change(core) and core.alarms.resources == set()


def test_a_peer_that_comes_up_hears_of_this_nodes_alarm_and_it_is_repeated_while_on():
    core = running_core("a")
    core.set_local_alarms(["disk"])
    core.end_turn()
    core.peer_down("b")
    core.peer_up("b")
    assert alarms_sent(core.end_turn(), "b") == [["disk"]]
    core.tick(core.now + HOUSEKEEPING_SECONDS + 0.01)
    assert alarms_sent(core.end_turn(), "c") == [["disk"]], "said again every housekeeping pass"
    core.set_local_alarms([])
    core.end_turn()
    core.tick(core.now + 2 * HOUSEKEEPING_SECONDS + 0.01)
    assert alarms_sent(core.end_turn(), "c") == [], "nothing is repeated once cleared"


def test_an_alarm_not_said_again_stops_counting():
    """A lost 'cleared' must not block the cluster for good."""
    core = running_core("a")
    core.on_messages("b", [[ALARMS, ["disk"]]])
    took_change(core)
    start = core.now
    core.tick(start + PEER_ALARM_STALE_SECONDS / 2)
    core.on_messages("b", [[ALARMS, ["disk"]]])   # said again: it stands
    core.tick(start + PEER_ALARM_STALE_SECONDS + 0.1)
    assert core.alarms.resources == {"disk"} and not took_change(core)
    core.tick(start + 2 * PEER_ALARM_STALE_SECONDS + 0.1)
    assert core.alarms.resources == set() and took_change(core)


def test_a_malformed_alarms_message_is_refused():
    core = running_core("a")
    assert core.on_messages("b", [[ALARMS, ["cpu"]], [ALARMS, "disk"]]) == [[ALARMS, ["cpu"]], [ALARMS, "disk"]]
    assert core.alarms.resources == set()


def test_the_resources_in_alarm_are_this_nodes_and_every_peers():
    alarms = ClusterAlarms()
    assert alarms.set_local(["memory"]) and not alarms.set_local(["memory"])
    alarms.on_peer("b", ["disk"], now=1.0)
    assert alarms.resources == {"memory", "disk"}
