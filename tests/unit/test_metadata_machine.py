"""The metadata machine (broker/node/metadata_machine.py): each command, its errors, effects; the codec; snapshots."""
from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warren.broker.admin.auth import hash_password
from warren.broker.node import metadata_commands as mc
from warren.broker.node import metadata_effects as fx
from warren.broker.node import metadata_machine as machine
from warren.broker.node.metadata_state import UserRecord, initial_state, restore, snapshot

NODES = ("a", "b", "c")
HASH = hash_password("secret", b"salt")


def fresh():
    return initial_state(["/"], {"guest": UserRecord(HASH, ("administrator",))}, {("guest", "/"): (".*", ".*", ".*")})


def run(state, command, index=1, nodes=NODES):
    state, reply, effects = machine.apply(machine.Meta(index, nodes), command, state)
    return reply, effects


def quorum(name="q", members=("a", "b", "c"), origin="a", **arguments):
    return mc.DeclareQueue("/", name, {"x-queue-type": "quorum", **arguments}, members, origin)


# -- codec ---------------------------------------------------------------------------------------
def test_the_codec_reads_the_list_shapes_already_in_logs_on_disk():
    old = [["qdecl", "/", "q", {"x-queue-type": "quorum"}, ["a", "b"], "a"], ["qdel", "/", "q"],
           ["xdecl", "/", "x", "topic", False, False, {}], ["xdel", "/", "x", True],
           ["bind", "/", "x", "queue", "q", "k", {}, 50, 20], ["unbind", "/", "x", "queue", "q", "k", {}, 50, 50],
           ["qmembers", "/", "q", ["a"], "remove", "b"], ["qrelease", "/", "q", "g", "b"],
           ["qleaving", "/", "q", "g", "b"], ["qlead", [["/", "q", "g", "b"]]], ["sync"],
           ["user_add", "u", HASH, ["t"]], ["user_del", "u"], ["user_pw", "u", HASH], ["user_tags", "u", []],
           ["vhost_add", "v"], ["vhost_del", "v"], ["perm_set", "u", "/", ".*", "", "^r"], ["perm_clear", "u", "/"],
           ["qdecl", "/", "ad", {}, ["a"], "a", True],
           ["seed", ["/"], [["u", HASH, ["t"]]], [["u", "/", ".*", "", ""]]]]
    assert {raw[0] for raw in old} == set(mc.COMMANDS)
    for raw in old:
        command = mc.decode(msgpack.packb(raw, use_bin_type=True))
        assert command.TAG == raw[0]
        assert mc.to_wire(command) == raw, "a command must encode to the shape it was read from"
        assert mc.decode(mc.encode(command)) == command


def test_the_codec_refuses_what_is_not_a_command():
    for raw in (["nope"], ["qdel", "/"], [], {"a": 1}, [1, 2]):
        with pytest.raises(mc.BadCommand):
            mc.from_wire(raw)


# -- queues ----------------------------------------------------------------------------------------
def test_declaring_a_quorum_queue_names_its_group_by_index_and_campaigns_from_the_declaring_node():
    state = fresh()
    reply, effects = run(state, quorum(origin="b"), index=7)
    assert reply is None
    assert effects == [fx.QueueDeclared("/", "q", {"x-queue-type": "quorum"}, "q:/:q:7", ("a", "b", "c")),
                       fx.Campaign("q:/:q:7", "b")]
    assert state.queue("/", "q").members == ["a", "b", "c"]
    assert run(state, quorum(origin="b"), index=8) == (None, []), "a second declare is a no-op"


def test_the_balanced_locator_picks_the_first_leader_by_index():
    state = fresh()
    _, effects = run(state, quorum(**{"x-queue-leader-locator": "balanced"}), index=4)
    assert effects[-1] == fx.Campaign("q:/:q:4", "b")


def test_a_queue_in_a_missing_vhost_is_not_declared():
    state = fresh()
    assert run(state, mc.DeclareQueue("nope", "q", {}, ("a",), "a")) == (None, [])


def test_deleting_a_queue_removes_its_bindings_and_an_auto_delete_source_left_without_any():
    state = fresh()
    run(state, quorum(), index=1)
    run(state, mc.DeclareExchange("/", "ad", "direct", True, False, {}), index=2)
    run(state, mc.Bind("/", "ad", "queue", "q", "k", {}, 50, 20), index=3)
    reply, effects = run(state, mc.DeleteQueue("/", "q"), index=4)
    assert reply == machine.MessageCountOfDeletedQueue("q:/:q:1")
    assert effects == [fx.QueueDeleted("/", "q", "q:/:q:1"), fx.ExchangeDeleted("/", "ad")]
    assert "ad" not in state.vhosts["/"].exchanges and not state.vhosts["/"].bindings
    assert run(state, mc.DeleteQueue("/", "q"), index=5) == (None, []), "deleting a missing queue succeeds"


# -- exchanges -------------------------------------------------------------------------------------
def test_declaring_an_exchange_and_its_errors_in_rabbitmqs_words():
    state = fresh()
    assert run(state, mc.DeclareExchange("/", "x", "topic", False, False, {"k": 1})) == (
        None, [fx.ExchangeDeclared("/", "x", "topic", False, False, {"k": 1})])
    assert run(state, mc.DeclareExchange("/", "x", "topic", False, False, {})) == (None, [])
    assert run(state, mc.DeclareExchange("/", "x", "direct", False, False, {}))[0] == [
        406, "inequivalent arg 'type' for exchange 'x' in vhost '/': received 'direct' but current is 'topic'", 40, 10]
    assert run(state, mc.DeclareExchange("/", "x", "topic", True, False, {}))[0] == [
        406, "inequivalent arg 'auto_delete' for exchange 'x' in vhost '/': received 'true' but current is 'false'",
        40, 10]
    assert run(state, mc.DeclareExchange("/", "y", "nope", False, False, {}))[0] == [
        406, "unknown exchange type 'nope'", 40, 10]
    assert run(state, mc.DeclareExchange("/", "amq.x", "direct", False, False, {}))[0] == [
        403, "exchange name 'amq.x' contains reserved prefix 'amq.*'", 40, 10]
    assert run(state, mc.DeclareExchange("/", "", "direct", False, False, {}))[0] == [
        403, "operation not permitted on the default exchange", 40, 10]
    assert run(state, mc.DeclareExchange("/", "amq.direct", "direct", False, False, {})) == (None, [])


def test_deleting_an_exchange_and_its_errors():
    state = fresh()
    run(state, mc.DeclareExchange("/", "x", "direct", False, False, {}))
    run(state, mc.Bind("/", "x", "exchange", "amq.topic", "k", {}, 40, 30))
    assert run(state, mc.DeleteExchange("/", "x", True))[0] == [406, "exchange 'x' in vhost '/' in use", 40, 20]
    assert run(state, mc.DeleteExchange("/", "amq.topic", False))[0] == [
        403, "deletion of system exchange 'amq.topic' in vhost '/' not allowed", 40, 20]
    assert run(state, mc.DeleteExchange("/", "", False))[0] == [
        403, "operation not permitted on the default exchange", 40, 20]
    assert run(state, mc.DeleteExchange("/", "x", False)) == (None, [fx.ExchangeDeleted("/", "x")])
    assert not state.vhosts["/"].bindings
    assert run(state, mc.DeleteExchange("/", "x", False)) == (None, []), "deleting a missing exchange succeeds"


def test_deleting_an_exchange_removes_bindings_to_it_and_auto_deletes_their_sources():
    state = fresh()
    run(state, mc.DeclareExchange("/", "src", "fanout", True, False, {}))
    run(state, mc.DeclareExchange("/", "dst", "fanout", False, False, {}))
    run(state, mc.Bind("/", "src", "exchange", "dst", "", {}, 40, 30))
    assert run(state, mc.DeleteExchange("/", "dst", False))[1] == [
        fx.ExchangeDeleted("/", "dst"), fx.ExchangeDeleted("/", "src")]


# -- bindings --------------------------------------------------------------------------------------
def test_binding_and_its_errors_carry_the_methods_class_and_method_ids():
    state = fresh()
    run(state, quorum())
    assert run(state, mc.Bind("/", "amq.direct", "queue", "q", "k", {"a": 1}, 50, 20)) == (
        None, [fx.BindingChanged("/", "amq.direct", "queue", "q", "k", {"a": 1}, True)])
    assert run(state, mc.Bind("/", "amq.direct", "queue", "q", "k", {"a": 1}, 50, 20)) == (None, [])
    assert run(state, mc.Bind("/", "nope", "queue", "q", "k", {}, 50, 20))[0] == [
        404, "no exchange 'nope' in vhost '/'", 50, 20]
    assert run(state, mc.Bind("/", "amq.direct", "queue", "nope", "k", {}, 50, 20))[0] == [
        404, "no queue 'nope' in vhost '/'", 50, 20]
    assert run(state, mc.Bind("/", "", "queue", "q", "k", {}, 50, 20))[0] == [
        403, "operation not permitted on the default exchange", 50, 20]
    assert run(state, mc.Bind("/", "amq.direct", "exchange", "nope", "k", {}, 40, 30))[0] == [
        404, "no exchange 'nope' in vhost '/'", 40, 30]


def test_unbinding_what_is_gone_succeeds_and_an_auto_delete_source_goes_with_its_last_binding():
    state = fresh()
    run(state, quorum())
    run(state, mc.DeclareExchange("/", "ad", "direct", True, False, {}))
    run(state, mc.Bind("/", "ad", "queue", "q", "k", {}, 50, 20))
    assert run(state, mc.Unbind("/", "ad", "queue", "q", "other", {}, 50, 50)) == (None, [])
    assert run(state, mc.Unbind("/", "ad", "queue", "q", "k", {}, 50, 50)) == (None, [
        fx.BindingChanged("/", "ad", "queue", "q", "k", {}, False), fx.ExchangeDeleted("/", "ad")])
    assert run(state, mc.Unbind("/", "", "queue", "q", "k", {}, 50, 50))[0] == [
        403, "operation not permitted on the default exchange", 50, 50]


# -- membership --------------------------------------------------------------------------------------
def test_adding_and_removing_members_notes_leaving_nodes_and_asks_members_to_host():
    state = fresh()
    run(state, quorum(members=("a", "b")), index=1)
    group = "q:/:q:1"
    reply, effects = run(state, mc.SetMembers("/", "q", ("a", "b", "c"), "add", "c"), index=2)
    assert reply == {"members": ["a", "b", "c"]}
    assert effects == [fx.MembersChanged("/", "q", group, ("a", "b", "c"), "add", "c"),
                       fx.HostIfMember("/", "q", group, ("a", "b"), ("a", "b", "c!2"))], \
        "a node added later is a new voter, named by the change's index"
    reply, effects = run(state, mc.SetMembers("/", "q", ("b", "c"), "remove", "a"), index=3)
    assert reply == {"members": ["b", "c"]} and state.leaving == {group: {"a"}}
    assert effects[1] == fx.HostIfMember("/", "q", group, ("a", "b", "c!2"), ("b", "c!2"))
    assert run(state, mc.SetMembers("/", "q", ("c", "b"), "remove", "a"), index=4) == (
        {"members": ["b", "c"]}, [fx.HostIfMember("/", "q", group, None, ("b", "c!2"))]), \
        "applied again: the same members"
    assert run(state, mc.NoteLeaving("/", "q", group, "b"), index=5) == (None, []), "b is a member"
    assert run(state, mc.ReleaseReplica("/", "q", group, "a"), index=6) == (
        None, [fx.ReplicaReleased("/", "q", group, "a")])
    assert state.leaving == {}
    assert run(state, mc.NoteLeaving("/", "q", group, "a"), index=7) == (None, [fx.LeavingNoted(group, "a")])
    assert state.leaving == {group: {"a"}}
    assert run(state, mc.ReleaseReplica("/", "q", "other-group", "a"), index=8) == (None, [])


def test_a_node_added_again_keeps_its_voter_until_released_and_is_a_new_voter_after():
    """raft/member_ids.py: a replica made empty must not be the voter that voted before."""
    state = fresh()
    run(state, quorum(members=("a", "b", "c")), index=1)
    group = "q:/:q:1"
    run(state, mc.SetMembers("/", "q", ("a", "b"), "remove", "c"), index=2)
    _, effects = run(state, mc.SetMembers("/", "q", ("a", "b", "c"), "add", "c"), index=3)
    assert effects[1].member_ids == ("a", "b", "c"), "not released yet: c still holds its replica, same voter"
    run(state, mc.SetMembers("/", "q", ("a", "b"), "remove", "c"), index=4)
    run(state, mc.ReleaseReplica("/", "q", group, "c"), index=5)
    _, effects = run(state, mc.SetMembers("/", "q", ("a", "b", "c"), "add", "c"), index=6)
    assert effects[1] == fx.HostIfMember("/", "q", group, ("a", "b"), ("a", "b", "c!6"))
    restored = restore(snapshot(state))
    assert restored.queue("/", "q").member_ids() == ["a", "b", "c!6"], "the epochs survive a snapshot"


@pytest.mark.parametrize("command, status, text", [
    (mc.SetMembers("/", "q", (), "add", "a"), 400, "node 'a' is already a member of queue 'q' in vhost '/'"),
    (mc.SetMembers("/", "q", (), "add", "z"), 400, "node 'z' is not a cluster node (cluster_nodes: a, b, c)"),
    (mc.SetMembers("/", "q", (), "remove", "c"), 400, "node 'c' is not a member of queue 'q' in vhost '/'"),
    (mc.SetMembers("/", "nope", (), "add", "c"), 404, "queue 'nope' in vhost '/' not found"),
    (mc.SetMembers("v", "q", (), "add", "c"), 404, "vhost 'v' not found"),
    (mc.SetMembers("/", "classic", (), "add", "c"), 400, "queue 'classic' in vhost '/' is not a quorum queue"),
    (mc.SetMembers("/", "one", (), "remove", "a"), 400,
     "node 'a' is the last member of queue 'one' in vhost '/'; delete the queue instead"),
    (mc.SetMembers("/", "q", (), "swap", "c"), 400, "unknown membership operation 'swap'"),
])
def test_membership_errors(command, status, text):
    state = fresh()
    run(state, quorum(members=("a", "b")))
    run(state, quorum("one", members=("a",)))
    run(state, mc.DeclareQueue("/", "classic", {}, ("a",), "a"))
    assert run(state, command) == ({"error": text, "status": status}, [])


def test_transfer_leaders_is_an_effect_only():
    state = fresh()
    assert run(state, mc.TransferLeaders((("/", "q", "g", "b"),))) == (
        None, [fx.TransferLeadership((("/", "q", "g", "b"),))])
    assert run(state, mc.Sync()) == (None, [])


# -- users, vhosts, permissions ---------------------------------------------------------------------------
def test_users_and_their_errors_in_rabbitmqctls_words():
    state = fresh()
    assert run(state, mc.AddUser("bob", HASH, ("t",))) == ({"ok": True}, [fx.UserSet("bob", HASH, ("t",), "added")])
    assert run(state, mc.AddUser("bob", HASH, ())) == ({"error": 'User "bob" already exists', "status": 400}, [])
    assert run(state, mc.AddUser("eve", "not a hash", ()))[0] == {
        "error": "the password hash is not a base64 salted SHA-256 hash", "status": 400}
    assert run(state, mc.SetUserTags("bob", ()))[1] == [fx.UserSet("bob", HASH, (), "tags_set")]
    other = hash_password("other", b"salt")
    assert run(state, mc.ChangePassword("bob", other))[1] == [fx.UserSet("bob", other, (), "password_changed")]
    run(state, mc.SetPermissions("bob", "/", ".*", ".*", ".*"))
    assert run(state, mc.DeleteUser("bob")) == ({"ok": True}, [
        fx.UserDeleted("bob"), fx.CloseConnections(320, "CONNECTION_FORCED - user 'bob' is deleted", user="bob")])
    assert ("bob", "/") not in state.permissions
    for command in (mc.DeleteUser("bob"), mc.ChangePassword("bob", HASH), mc.SetUserTags("bob", ())):
        assert run(state, command) == ({"error": 'User "bob" does not exist', "status": 404}, [])


def test_deleting_a_vhost_closes_its_connections_deletes_its_queues_then_the_vhost():
    state = fresh()
    assert run(state, mc.AddVhost("v")) == ({"ok": True}, [fx.VhostAdded("v")])
    assert "amq.topic" in state.vhosts["v"].exchanges
    assert run(state, mc.AddVhost("v"))[0] == {"error": 'Virtual host "v" already exists', "status": 400}
    run(state, mc.DeclareQueue("v", "q", {}, ("a",), "a"), index=3)
    run(state, mc.SetPermissions("guest", "v", ".*", ".*", ".*"))
    assert run(state, mc.DeleteVhost("v")) == ({"ok": True}, [
        fx.CloseConnections(320, "CONNECTION_FORCED - vhost 'v' is deleted", vhost="v"),
        fx.QueueDeleted("v", "q", "q:v:q:3"), fx.VhostDeleted("v")])
    assert "v" not in state.vhosts and ("guest", "v") not in state.permissions
    assert run(state, mc.DeleteVhost("v"))[0] == {"error": 'Virtual host "v" does not exist', "status": 404}


def test_permissions_and_their_errors():
    state = fresh()
    assert run(state, mc.SetPermissions("guest", "/", "^a", "", "b")) == (
        {"ok": True}, [fx.PermissionSet("guest", "/", "^a", "", "b")])
    assert state.permissions[("guest", "/")] == ("^a", "", "b")
    assert run(state, mc.SetPermissions("guest", "/", "(", "", ""))[0]["error"].startswith(
        "invalid regular expression '(': ")
    assert run(state, mc.SetPermissions("nobody", "/", "", "", ""))[0]["status"] == 404
    assert run(state, mc.ClearPermissions("guest", "nope"))[0] == {
        "error": 'Virtual host "nope" does not exist', "status": 404}
    assert run(state, mc.ClearPermissions("guest", "/")) == ({"ok": True}, [fx.PermissionCleared("guest", "/")])
    assert ("guest", "/") not in state.permissions


# -- snapshots ------------------------------------------------------------------------------------------
NAMES = st.sampled_from(["a", "b", "q1", "x.y"])
VHOSTS = st.sampled_from(["/", "v"])
ARGS = st.dictionaries(st.sampled_from(["k", "x-match"]), st.one_of(st.integers(0, 3), st.sampled_from(["s", "all"])),
                       max_size=2)
KINDS = st.sampled_from(["queue", "exchange"])
MEMBERS = st.lists(st.sampled_from(NODES), min_size=1, max_size=3, unique=True).map(tuple)

COMMAND_STRATEGY = st.one_of(
    st.builds(mc.DeclareQueue, VHOSTS, NAMES,
              st.sampled_from([{"x-queue-type": "quorum"}, {}, {"x-queue-type": "quorum",
                                                              "x-queue-leader-locator": "balanced"}]),
              MEMBERS, st.sampled_from(NODES)),
    st.builds(mc.DeleteQueue, VHOSTS, NAMES),
    st.builds(mc.DeclareExchange, VHOSTS, NAMES, st.sampled_from(["direct", "topic", "fanout"]), st.booleans(),
              st.booleans(), ARGS),
    st.builds(mc.DeleteExchange, VHOSTS, NAMES, st.booleans()),
    st.builds(mc.Bind, VHOSTS, st.one_of(NAMES, st.just("amq.direct")), KINDS, NAMES, st.sampled_from(["", "k"]),
              ARGS, st.just(50), st.just(20)),
    st.builds(mc.Unbind, VHOSTS, NAMES, KINDS, NAMES, st.sampled_from(["", "k"]), ARGS, st.just(50), st.just(50)),
    st.builds(mc.SetMembers, VHOSTS, NAMES, MEMBERS, st.sampled_from(["add", "remove"]), st.sampled_from(NODES)),
    st.builds(mc.NoteLeaving, VHOSTS, NAMES, st.builds(lambda v, n, i: f"q:{v}:{n}:{i}", VHOSTS, NAMES,
                                                       st.integers(1, 30)), st.sampled_from(NODES)),
    st.builds(mc.AddUser, NAMES, st.just(HASH), st.lists(NAMES, max_size=2).map(tuple)),
    st.builds(mc.DeleteUser, NAMES),
    st.builds(mc.AddVhost, st.just("v")),
    st.builds(mc.DeleteVhost, VHOSTS),
    st.builds(mc.SetPermissions, NAMES, VHOSTS, st.just(".*"), st.just(""), st.just("^a")),
    st.builds(mc.ClearPermissions, NAMES, VHOSTS),
)


def fold(state, commands, first_index):
    outputs = []
    for offset, command in enumerate(commands):
        # through the codec, as the log carries them
        state, reply, effects = machine.apply(machine.Meta(first_index + offset, NODES),
                                              mc.decode(mc.encode(command)), state)
        outputs.append((reply, effects))
    return state, outputs


@settings(max_examples=150, deadline=None)
@given(st.lists(COMMAND_STRATEGY, max_size=40), st.lists(COMMAND_STRATEGY, max_size=40))
def test_a_snapshot_restored_and_folded_further_equals_the_unsnapshotted_fold(before, after):
    straight, straight_outputs = fold(fresh(), before + after, 1)
    halfway, _ = fold(fresh(), before, 1)
    data = snapshot(halfway)
    restored = restore(data)
    assert restored == halfway and snapshot(restored) == data
    resumed, resumed_outputs = fold(restored, after, 1 + len(before))
    assert resumed == straight
    assert resumed_outputs == straight_outputs[len(before):]
    assert snapshot(resumed) == snapshot(straight)


def test_a_snapshot_of_another_version_is_refused():
    data = msgpack.packb({"version": 99})
    with pytest.raises(ValueError, match="version 99"):
        restore(data)
