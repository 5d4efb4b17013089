"""The node's pure core (broker/node_core.py), driven by hand: inputs in, messages per peer and answers out."""
from __future__ import annotations

from warren.broker.node.metadata_answers import APPLIED_AT, SPREAD_WAIT_SECONDS
from warren.broker.node.node_core import CMD, DONE, HELLO, META, METADATA_APPLIED, RESEND_SECONDS, NodeCore
from warren.broker.queues import queue_codec
from warren.broker.queues import queue_commands as qc


class FakeRaft:
    """The groups hosted here, their leaders, and what was proposed."""

    def __init__(self, leaders: dict[str, str | None]) -> None:
        self.leaders = leaders
        self.proposed: list[tuple[str, bytes]] = []

    def propose(self, group, data):
        if self.leaders.get(group) != "a":
            return None
        self.proposed.append((group, data))
        return len(self.proposed)

    def leader_of(self, group):
        return self.leaders.get(group)

    def hosts(self, group):
        return group in self.leaders

    def campaign(self, group):
        return True


class StubQueue:
    """A queue known here: its hooks record nothing but node gone."""

    def __init__(self, group: str) -> None:
        self.group, self.members, self.leader_hint = group, ["a", "b"], None
        self.gone: list[str] = []

    def __getattr__(self, name):
        return lambda *args, **kwargs: None

    def on_node_gone(self, peer):
        self.gone.append(peer)


def core_on_a(leaders: dict[str, str | None]) -> NodeCore:
    core = NodeCore("a", "inc1", ["a", "b", "c"], FakeRaft(leaders), node_gone_seconds=60.0)
    for group in leaders:
        if group != META:
            core.queues[group] = StubQueue(group)
    core.peer_up("b")
    core.peer_up("c")
    core.end_turn()
    return core


def commands_sent(messages: dict, peer: str) -> list[list]:
    return [message for message in messages.get(peer, []) if message[0] == CMD]


def test_a_command_goes_to_the_leader_and_its_answer_comes_back():
    core = core_on_a({"g": "b"})
    answers = []
    core.submit("g", b"x", answers.append)
    messages = core.end_turn()
    [(_, group, data, origin, token)] = commands_sent(messages, "b")
    assert (group, data, origin) == ("g", b"x", "a")
    core.on_messages("b", [[DONE, "g", token, 7]])
    assert answers == [7]


def test_a_leader_answers_the_origin_when_it_applies():
    core = core_on_a({"g": "a"})
    core.on_messages("b", [[CMD, "g", queue_codec.encode(qc.Purge("b", 1, 0)), "b", 5]])
    core.on_applied("g", 1, 3)
    assert core.end_turn()["b"] == [[DONE, "g", 5, 3]]


def test_a_forwarded_liveness_command_is_refused():
    core = core_on_a({"g": "a"})
    bad = core.on_messages("b", [[CMD, "g", queue_codec.encode(qc.NodeDown("c", 0)), "b", 5]])
    assert len(bad) == 1 and core.raft.proposed == []


def test_unanswered_commands_are_resent_after_a_while():
    core = core_on_a({"g": "b"})
    core.submit("g", b"x")
    core.end_turn()
    core.tick(RESEND_SECONDS / 2)
    assert commands_sent(core.end_turn(), "b") == []
    core.tick(RESEND_SECONDS + 0.1)
    assert [m[2] for m in commands_sent(core.end_turn(), "b")] == [b"x"]


def test_a_channels_down_stops_the_resends_of_its_commands():
    """A CHECKOUT resent after its channel's DOWN was applied would register a
    consumer nobody closes (found by tests/sim, seeds 32 and 58)."""
    core = core_on_a({"g": "b"})
    owner, other = "a/inc1/1/1", "a/inc1/2/1"
    answers = []
    core.submit("g", queue_codec.encode(qc.Checkout(owner, "t", 0, 8, 0, False, True)), answers.append)
    core.submit("g", queue_codec.encode(qc.Checkout(other, "t", 0, 8, 0, False, True)))
    core.submit_down("g", owner, queue_codec.encode(qc.Down(owner, 0)))
    assert answers == [None]
    core.end_turn()
    core.tick(RESEND_SECONDS + 0.1)
    resent = [queue_codec.decode(m[2]) for m in commands_sent(core.end_turn(), "b")]
    assert [(type(c), c.owner) for c in resent] == [(qc.Checkout, other), (qc.Down, owner)]


def declared_here(answers: list) -> NodeCore:
    """A core on `a` whose declaration the metadata group applied, on `a` only so far."""
    core = core_on_a({META: "a"})
    core.submit_meta(b"declare", answers.append)
    core.on_meta_applied(1)
    core.on_applied(META, 1, [APPLIED_AT, 1, "ok"])
    return core


def test_a_metadata_answer_waits_for_every_running_node():
    answers = []
    core = declared_here(answers)
    messages = core.end_turn()
    assert [m[:2] for m in messages["b"] if m[0] == METADATA_APPLIED] == [[METADATA_APPLIED, 1]]
    assert answers == []   # b and c have not applied it
    core.on_messages("b", [[METADATA_APPLIED, 1]])
    assert answers == []
    core.peer_down("c")    # a node that goes down holds no one back
    assert answers == ["ok"]


def test_a_metadata_answer_waits_for_a_node_counted_down_until_it_counted_this_one_down():
    """A node cut off silently counts this one down by its own heartbeats, maybe later:
    until it surely has (its fence is up), an answer waits for it too."""
    answers = []
    core = declared_here(answers)
    core.answer_grace_seconds = 1.5
    core.on_messages("b", [[METADATA_APPLIED, 1]])
    core.peer_down("c")    # at 0.0
    core.tick(1.0)
    assert answers == []
    core.tick(1.6)
    assert answers == ["ok"]


def test_a_metadata_answer_waits_for_a_node_another_peer_still_reaches():
    """A bridge: c is cut off from this node only and still serves its clients (b reaches
    it). Past the grace the answer waits for c all the same, hearing of its progress from b."""
    answers = []
    core = declared_here(answers)
    core.answer_grace_seconds = 1.5
    core.peer_down("c")    # at 0.0
    core.on_messages("b", [[METADATA_APPLIED, 1, {"c": 0}]])
    core.tick(2.0)
    assert answers == []
    core.on_messages("b", [[METADATA_APPLIED, 1, {"c": 1}]])
    assert answers == ["ok"]


def test_a_node_no_peer_reaches_holds_no_answer_past_the_grace():
    answers = []
    core = declared_here(answers)
    core.answer_grace_seconds = 1.5
    core.peer_down("c")
    core.on_messages("b", [[METADATA_APPLIED, 1, {"c": 0}]])
    core.on_messages("b", [[METADATA_APPLIED, 1, {}]])   # b counted c down too
    core.tick(2.0)
    assert answers == ["ok"]


def test_a_view_read_after_its_senders_link_went_down_is_not_kept():
    """Only running peers relay: a node that went down says nothing about the others any more."""
    answers = []
    core = declared_here(answers)
    core.answer_grace_seconds = 1.5
    core.on_messages("b", [[METADATA_APPLIED, 1, {}]])
    core.peer_down("c")    # at 0.0
    core.peer_down("b")
    core.on_messages("b", [[METADATA_APPLIED, 1, {"c": 0}]])   # read late, from the closed link
    core.tick(2.0)
    assert answers == ["ok"]


def test_a_peer_that_does_not_reach_a_node_hears_how_far_it_applied():
    """This node relays c's progress to b, which said it does not reach c, whenever it moves;
    not to a peer that reaches c itself."""
    core = core_on_a({META: "a"})
    core.on_messages("b", [[METADATA_APPLIED, 0, {}]])   # b reaches only this node
    told = core.end_turn()
    assert [m for m in told["b"] if m[0] == METADATA_APPLIED] == [[METADATA_APPLIED, 0, {"c": 0}]]
    core.on_messages("c", [[METADATA_APPLIED, 3, {}]])   # c does not reach b either
    told = core.end_turn()
    assert [m for m in told.get("b", []) if m[0] == METADATA_APPLIED] == [[METADATA_APPLIED, 0, {"c": 3}]]
    assert [m for m in told.get("c", []) if m[0] == METADATA_APPLIED] == [[METADATA_APPLIED, 0, {"b": 0}]]
    core.on_messages("b", [[METADATA_APPLIED, 0, {"c": 3}]])   # the two reach each other again
    core.on_messages("c", [[METADATA_APPLIED, 3, {"b": 0}]])
    assert core.end_turn() == {}


def test_a_metadata_answer_waits_for_a_lagging_node_only_so_long():
    answers = []
    core = declared_here(answers)
    core.end_turn()
    core.tick(SPREAD_WAIT_SECONDS + 1)
    assert answers == ["ok"]
    assert core.answers.late == [(1, ["b", "c"])]


def test_a_peer_down_long_enough_is_gone_for_the_queues():
    core = core_on_a({"g": "a"})
    core.peer_down("b")
    core.tick(30.0)
    assert core.queues["g"].gone == []
    core.tick(61.0)
    assert core.queues["g"].gone == ["b"]


def test_a_lost_metadata_applied_is_said_again():
    """The answer does not wait for the bounded wait when a peer's METADATA_APPLIED was
    lost (tests/sim seeds 12 and 28 declared for 10 s before): peers say it again."""
    answers = []
    core = declared_here(answers)
    core.peer_down("c")
    core.end_turn()
    core.tick(0.6)
    repeated = [m[:2] for m in core.end_turn()["b"] if m[0] == METADATA_APPLIED]
    assert repeated == [[METADATA_APPLIED, 1]]
    core.on_messages("b", [[METADATA_APPLIED, 1]])   # b's own repeat
    assert answers == ["ok"]


def test_a_repeated_hello_states_a_node_up_once_per_link():
    ups = []
    core = core_on_a({"g": "a"})
    core.queues["g"].on_node_up = lambda peer, incarnation: ups.append((peer, incarnation))
    core.on_messages("b", [[HELLO, "b1"]])
    core.on_messages("b", [[HELLO, "b1"]])
    assert ups == [("b", "b1")]
    core.on_messages("b", [[HELLO, "b2"]])   # restarted
    core.peer_down("b")
    core.peer_up("b")
    core.on_messages("b", [[HELLO, "b2"]])   # after the link came up again
    assert ups == [("b", "b1"), ("b", "b2"), ("b", "b2")]


def test_a_peer_greets_this_node_once_it_counts_it_running():
    """A restarted node opens its port once every linked peer greeted it (Cluster._await_links):
    a peer sends HELLO from its own peer_up, after which its answers wait for this node."""
    core = core_on_a({"g": "a"})
    core.peer_down("b")
    core.peer_down("c")
    core.peer_up("b")
    core.peer_up("c")
    assert core.running_peers() == ["b", "c"] and core.greeting_peers() == []
    core.on_messages("c", [[HELLO, "c1"]])
    assert core.greeting_peers() == ["c"]
    core.peer_down("c")
    core.on_messages("b", [[HELLO, "b1"]])
    assert core.greeting_peers() == ["b"]


def test_consumers_ask_the_leader_again_for_lost_deliveries():
    """A delivery lost at the end of a consumer's window leaves no gap to notice
    (tests/sim seed 33): now and then the queue asks its leader (its link-up hook)."""
    asked = []
    core = core_on_a({})
    queue = core.queues["q"] = StubQueue("q")
    queue.leader_hint = "b"
    queue.on_link_up = asked.append
    core.tick(0.6)
    assert asked == ["b"]
    queue.leader_hint = "a"   # led here: nothing to ask
    core.tick(1.2)
    assert asked == ["b"]


def test_a_leader_hint_that_left_the_members_is_not_used():
    """A node not hosting the queue's group sends to its hint; once the hint is no longer
    a member (it released its replica and drops what it is sent), a live member instead."""
    core = core_on_a({META: "b"})
    queue = core.queues["q"] = StubQueue("q")
    queue.members, queue.leader_hint = ["b", "c"], "c"
    assert core.leader_hint("q") == "c"
    queue.members = ["b"]   # c was removed
    assert core.leader_hint("q") == "b"
