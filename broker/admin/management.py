"""Management views and changes of the node, as JSON-ready dicts (for warrenctl).

Views are pure functions over the broker's state; the HTTP shell serves them
under /api/ with HTTP Basic authentication against the configured users.

Changes (`ACTIONS`, served as POST with a JSON body, same authentication)
are quorum queue membership commands named after rabbitmq-queues':
add_member, delete_member, grow, shrink, rebalance; and users, vhosts and
permissions named after rabbitmqctl's (broker/admin/definitions.py): add_user,
delete_user, change_password, set_user_tags, add_vhost, delete_vhost,
set_permissions, clear_permissions. They go through the metadata Raft group
(broker/node/metadata.py) and answer once it has committed and this node applied
them: the change is then made on every node (each queue's Raft group follows
a membership change in the background). A change that cannot be made raises
`ManagementError` (an HTTP status and one line of text). `ADMIN_PATHS` (the
users, vhosts and permissions) need a user tagged "administrator".
"""
from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from warren.broker.admin.auth import hash_password
from warren.broker.admin.definitions import DefinitionError
from warren.broker.node import metadata_commands as mc
from warren.broker.node.metadata import MembershipError
from warren.broker.node.node_core import META
from warren.broker.queues.queue_factory import split_shard
from warren.raft.member_ids import node_of

if TYPE_CHECKING:
    from warren.broker.node.broker import Broker


def overview(broker: "Broker") -> dict[str, Any]:
    settings = broker.settings
    queues = [q for v in broker.vhosts.values() for q in v.queues.values()]
    store = broker.node_log.store
    return {
        "node": settings.node_name,
        "version": broker.version,
        "uptime_seconds": round(time.monotonic() - broker.started_monotonic, 3),
        "cluster_nodes": broker.cluster.nodes,
        "running_nodes": sorted(broker.peers_up | {settings.node_name}),
        # the metadata group's leader as this node knows it (None: none known now)
        "metadata_leader": broker.cluster.local_leader(META),
        "listeners": broker.listeners,   # the addresses bound: ["[::]:5672", "0.0.0.0:5672"]
        "alarms": [a for a, on in (("memory", broker.memory_alarm), ("disk", broker.disk_alarm)) if on],
        "connections": len(broker.connections),
        "channels": broker.channel_count,
        "queues": len(queues),
        "messages_ready": sum(q.state.ready_count for q in queues),
        "messages_unacked": sum(q.state.unacked_count for q in queues),
        "quorum_enqueues_pending": broker.cluster.enqueues_pending,
        "wal": {"size_bytes": store.wal_size_bytes, "segments": store.segment_count,
                "segment_bytes": store.segment_bytes, "fsyncs": store.fsyncs, "rollovers": store.rollovers},
    }


def _placement(broker: "Broker", queue: Any) -> tuple[str | None, list[str]]:
    """(leader, members): a quorum queue's Raft group; a classic queue lives on this node."""
    node = broker.settings.node_name
    if queue.forwarded:   # another shard's queue without a log (broker/node/shard_queues.py)
        return queue.home, [queue.home]
    if not queue.replicated:
        return node, [node]
    return broker.cluster.leader_hint(queue.group), list(queue.members)


def queues(broker: "Broker") -> list[dict[str, Any]]:
    return [_queue_row(broker, vhost.name, queue)
            for vhost in broker.vhosts.values() for queue in vhost.queues.values()]


def _queue_row(broker: "Broker", vhost_name: str, queue: Any) -> dict[str, Any]:
    leader, members = _placement(broker, queue)
    return {
        "vhost": vhost_name,
        "name": queue.name,
        "type": queue.queue_type,
        "durable": queue.durable,
        "auto_delete": queue.auto_delete,
        "exclusive": queue.exclusive_owner is not None,
        "leader": leader,
        "members": members,
        "messages_ready": queue.state.ready_count,
        "messages_unacked": queue.state.unacked_count,
        "consumers": queue.consumer_count,
        "arguments": queue.arguments,
    }


def exchanges(broker: "Broker") -> list[dict[str, Any]]:
    return [{"vhost": vhost.name, "name": e.name, "type": e.type, "durable": e.durable,
             "auto_delete": e.auto_delete, "internal": e.internal, "arguments": e.arguments}
            for vhost in broker.vhosts.values() for e in vhost.exchanges.values()]


def bindings(broker: "Broker") -> list[dict[str, Any]]:
    return [{"vhost": vhost.name, "source": b.source, "destination_kind": b.destination[0],
             "destination": b.destination[1], "routing_key": b.routing_key, "arguments": b.table}
            for vhost in broker.vhosts.values() for e in vhost.exchanges.values() for b in e.bindings]


def connections(broker: "Broker") -> list[dict[str, Any]]:
    return [{"peer": c.peer, "user": c.user_name, "vhost": c.vhost.name if c.vhost else None,
             "channels": len(c.channels), "blocked": c.blocked,
             "client": str(c.client_properties.get("product", ""))}
            for c in broker.connections]


def users(broker: "Broker") -> list[dict[str, Any]]:
    """Names and tags; never a password or its hash."""
    return [{"user": u.name, "tags": list(u.tags)} for u in broker.access.users.values()]


def vhosts(broker: "Broker") -> list[dict[str, Any]]:
    return [{"name": name} for name in broker.vhosts]


def permissions(broker: "Broker") -> list[dict[str, Any]]:
    return [{"vhost": vhost, "user": user, "configure": p.configure, "write": p.write, "read": p.read}
            for (user, vhost), p in broker.access.permissions.items()]


VIEWS: dict[str, Callable[["Broker"], Any]] = {
    "/api/overview": overview,
    "/api/queues": queues,
    "/api/exchanges": exchanges,
    "/api/bindings": bindings,
    "/api/connections": connections,
    "/api/users": users,
    "/api/vhosts": vhosts,
    "/api/permissions": permissions,
}


# -- changes: quorum queue membership (POST) ----------------------------------------------

COMMIT_TIMEOUT_SECONDS = 30.0


class ManagementError(Exception):
    """A change refused or failed: an HTTP status and one line of text."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


def _string(body: dict, key: str, default: str | None = None) -> str:
    value = body.get(key, default)
    if not isinstance(value, str) or not value:
        raise ManagementError(400, f"'{key}' must be a non-empty string")
    return value


def _pattern(body: dict, key: str) -> re.Pattern:
    try:
        return re.compile(_string(body, key, ".*"))
    except re.error as error:
        raise ManagementError(400, f"'{key}' is not a valid regular expression: {error}") from None


def _running(broker: "Broker") -> set[str]:
    return broker.peers_up | {broker.settings.node_name}


def _cluster_node(broker: "Broker", node: str, running: bool) -> None:
    """A cluster member, or a node whose shards are members (docs/multi-process.md section 12)."""
    nodes = broker.cluster.nodes
    shards = [member for member in nodes if member == node or split_shard(member)[0] == node]
    if not shards:
        raise ManagementError(400, f"node '{node}' is not a cluster node (cluster_nodes: {', '.join(nodes)})")
    if running and not _running(broker).intersection(shards):
        raise ManagementError(400, f"node '{node}' is not running")


def _member_for(broker: "Broker", members: list[str], node: str) -> str:
    """The member `node` means for a queue with `members`: itself, or for a node over several
    processes its shard of the queue's shard index (a queue's members share one index)."""
    indexes = {split_shard(str(member))[1] for member in members}
    if node in broker.cluster.nodes or len(indexes) != 1 or None in indexes:
        return node
    shard = f"{node}#{indexes.pop()}"
    return shard if shard in broker.cluster.nodes else node


def member_node(member: str) -> str:
    """The node a member (`<node>`, `<node>#k`, `<node>#k!epoch`) runs on, as RabbitMQ names members."""
    return split_shard(node_of(member))[0]


def _queue_members(broker: "Broker", vhost: str, name: str) -> list[str]:
    queue = broker.vhosts[vhost].queues.get(name) if vhost in broker.vhosts else None
    return list(queue.members) if queue is not None and queue.replicated else []


def _quorum_queues(broker: "Broker", body: dict) -> list[Any]:
    vhost_pattern, queue_pattern = _pattern(body, "vhost_pattern"), _pattern(body, "queue_pattern")
    return [queue for vhost in broker.vhosts.values() if vhost_pattern.fullmatch(vhost.name)
            for queue in vhost.queues.values()
            if queue.replicated and queue.queue_type == "quorum" and queue_pattern.fullmatch(queue.name)]


async def _commit(broker: "Broker", command: mc.Command) -> Any:
    """Submit a metadata command; its reply once the group has applied it."""
    future = asyncio.get_running_loop().create_future()

    def done(result: Any) -> None:
        if not future.done():
            future.set_result(result)

    broker.metadata.submit(command, done)
    try:
        result = await asyncio.wait_for(future, COMMIT_TIMEOUT_SECONDS)
    except TimeoutError:
        raise ManagementError(503, f"the metadata Raft group did not commit the change within "
                                   f"{COMMIT_TIMEOUT_SECONDS:g} s (is a majority of the nodes running?); "
                                   "it may still be made") from None
    if isinstance(result, dict) and "error" in result:
        raise ManagementError(int(result.get("status", 400)), str(result["error"]))
    return result


async def _change_member(broker: "Broker", vhost: str, name: str, op: str, node: str) -> list[str]:
    try:
        members = broker.metadata.check_membership(vhost, name, op, node)
    except MembershipError as error:
        raise ManagementError(error.status, error.text) from None
    result = await _commit(broker, mc.SetMembers(vhost, name, tuple(members), op, node))
    if isinstance(result, dict):
        return list(result["members"])
    return members   # None: the leader had applied it before it restarted


async def queue_members(broker: "Broker", body: dict) -> dict[str, Any]:
    """{"op": "add" | "delete", "vhost": "/", "queue": name, "node": node}:
    add_member / delete_member."""
    op = _string(body, "op")
    if op not in ("add", "delete"):
        raise ManagementError(400, f"'op' must be 'add' or 'delete', not '{op}'")
    vhost, name, node = _string(body, "vhost", "/"), _string(body, "queue"), _string(body, "node")
    _cluster_node(broker, node, running=False)
    member = _member_for(broker, _queue_members(broker, vhost, name), node)
    if op == "add":
        try:
            broker.metadata.check_membership(vhost, name, "add", member)
        except MembershipError as error:
            raise ManagementError(error.status, error.text) from None
        _cluster_node(broker, member, running=True)
    members = await _change_member(broker, vhost, name, "add" if op == "add" else "remove", member)
    # named by node, as /api/queues names them; the shards beside (docs/multi-process.md section 12)
    return {"vhost": vhost, "queue": name, "node": node, "op": op, "members": [member_node(m) for m in members],
            "member_shards": members}


async def _member_rows(broker: "Broker", queues: list[Any], op: str, node: str) -> list[dict[str, Any]]:
    async def one(queue: Any) -> dict[str, Any]:
        row = {"vhost": queue.vhost.name, "name": queue.name, "size": len(queue.members), "result": "ok"}
        try:
            members = await _change_member(broker, queue.vhost.name, queue.name, op,
                                           _member_for(broker, queue.members, node))
            row["size"] = len(members)
        except ManagementError as error:
            row["result"] = f"error: {error.text}"
        return row
    return list(await asyncio.gather(*(one(queue) for queue in queues)))


async def grow(broker: "Broker", body: dict) -> list[dict[str, Any]]:
    """{"node": node, "selector": "all" | "even", "vhost_pattern", "queue_pattern"}:
    add `node` to every matching quorum queue it is not a member of (`even`:
    only those with an even number of members), as rabbitmq-queues grow."""
    node, selector = _string(body, "node"), _string(body, "selector", "all")
    if selector not in ("all", "even"):
        raise ManagementError(400, f"'selector' must be 'all' or 'even', not '{selector}'")
    _cluster_node(broker, node, running=True)
    queues = [q for q in _quorum_queues(broker, body) if _member_for(broker, q.members, node) not in q.members
              and (selector == "all" or len(q.members) % 2 == 0)]
    return await _member_rows(broker, queues, "add", node)


async def shrink(broker: "Broker", body: dict) -> list[dict[str, Any]]:
    """{"node": node}: remove `node` from every quorum queue it is a member
    of, but never a queue's last member (that row says so), as
    rabbitmq-queues shrink. The node need not be running."""
    node = _string(body, "node")
    _cluster_node(broker, node, running=False)
    queues = [q for q in _quorum_queues(broker, body) if _member_for(broker, q.members, node) in q.members]
    last = [q for q in queues if len(q.members) == 1]
    rows = await _member_rows(broker, [q for q in queues if len(q.members) > 1], "remove", node)
    rows += [{"vhost": q.vhost.name, "name": q.name, "size": 1,
              "result": f"error: '{node}' is the last member, not removed"} for q in last]
    return rows


def plan_rebalance(leaders: dict[Any, str], members: dict[Any, list[str]],
                   running: set[str]) -> list[tuple[Any, str, str]]:
    """Moves (queue, from, to) that spread the leaders evenly over the
    running nodes: the node leading the most hands one of its queues to a
    running member leading at least two fewer, until none can."""
    counts = {node: 0 for node in sorted(running)}
    for leader in leaders.values():
        if leader in counts:
            counts[leader] += 1
    leaders = dict(leaders)
    moves: list[tuple[Any, str, str]] = []
    for _ in range(len(leaders)):
        move = None
        for source in sorted(counts, key=lambda n: (-counts[n], n)):
            options = [(counts[m], m, queue) for queue, leader in leaders.items() if leader == source
                       for m in members[queue] if m in counts and counts[m] <= counts[source] - 2]
            if options:
                _, target, queue = min(options, key=lambda o: (o[0], o[1]))
                move = (queue, source, target)
                break
        if move is None:
            break
        queue, source, target = move
        leaders[queue] = target
        counts[source] -= 1
        counts[target] += 1
        moves.append(move)
    return moves


async def rebalance(broker: "Broker", body: dict) -> dict[str, Any]:
    """{"type": "all" | "quorum", "vhost_pattern", "queue_pattern"}: move
    quorum queue leaders so that they spread evenly over the running nodes
    (leadership transfer, best effort), as rabbitmq-queues rebalance. The
    leaders are those this node knows of."""
    kind = _string(body, "type", "all")
    if kind not in ("all", "quorum"):
        raise ManagementError(400, f"'type' must be 'all' or 'quorum', not '{kind}'")
    running = _running(broker)
    queues = _quorum_queues(broker, body)
    leaders = {q: broker.cluster.leader_hint(q.group) for q in queues}
    leaders = {q: leader for q, leader in leaders.items() if leader is not None}
    moves = plan_rebalance(leaders, {q: list(q.members) for q in queues}, running)
    if moves:
        await _commit(broker, mc.TransferLeaders(tuple((q.vhost.name, q.name, q.group, to) for q, _, to in moves)))
    after = {node: 0 for node in sorted(running)}
    for leader in leaders.values():
        if leader in after:
            after[leader] += 1
    for _, source, target in moves:
        after[source] -= 1
        after[target] += 1
    return {"moves": [{"vhost": q.vhost.name, "name": q.name, "from": source, "to": target}
                      for q, source, target in moves],
            "leaders": [{"node": node, "quorum_leaders": count} for node, count in after.items()]}


# -- changes: users, vhosts, permissions (broker/admin/definitions.py) ---------------------------

async def _define(broker: "Broker", command: mc.Command) -> dict[str, Any]:
    try:
        broker.definitions.check(command)
    except DefinitionError as error:
        raise ManagementError(error.status, error.text) from None
    await _commit(broker, command)
    return {"ok": True}


def _password(body: dict) -> str:
    # the password only ever leaves this function as its salted hash
    return hash_password(_string(body, "password"))


def _tags(body: dict) -> list[str]:
    tags = body.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(tag, str) and tag for tag in tags):
        raise ManagementError(400, "'tags' must be a list of non-empty strings")
    return tags


async def add_user(broker: "Broker", body: dict) -> dict[str, Any]:
    """{"name", "password", "tags": []}: rabbitmqctl add_user."""
    return await _define(broker, mc.AddUser(_string(body, "name"), _password(body), tuple(_tags(body))))


async def delete_user(broker: "Broker", body: dict) -> dict[str, Any]:
    """{"name"}: rabbitmqctl delete_user; the user's connections are closed."""
    return await _define(broker, mc.DeleteUser(_string(body, "name")))


async def change_password(broker: "Broker", body: dict) -> dict[str, Any]:
    """{"name", "password"}: rabbitmqctl change_password."""
    return await _define(broker, mc.ChangePassword(_string(body, "name"), _password(body)))


async def set_user_tags(broker: "Broker", body: dict) -> dict[str, Any]:
    """{"name", "tags": [...]}: rabbitmqctl set_user_tags."""
    return await _define(broker, mc.SetUserTags(_string(body, "name"), tuple(_tags(body))))


async def add_vhost(broker: "Broker", body: dict) -> dict[str, Any]:
    """{"name"}: rabbitmqctl add_vhost; it has the default exchanges (amq.direct, ...)."""
    return await _define(broker, mc.AddVhost(_string(body, "name")))


async def delete_vhost(broker: "Broker", body: dict) -> dict[str, Any]:
    """{"name"}: rabbitmqctl delete_vhost: its connections closed, its queues and exchanges deleted."""
    return await _define(broker, mc.DeleteVhost(_string(body, "name")))


async def set_permissions(broker: "Broker", body: dict) -> dict[str, Any]:
    """{"vhost": "/", "user", "configure", "write", "read"}: rabbitmqctl set_permissions."""
    expressions = []
    for key in ("configure", "write", "read"):
        value = body.get(key)
        if not isinstance(value, str):
            raise ManagementError(400, f"'{key}' must be a string (a regular expression)")
        expressions.append(value)
    return await _define(broker, mc.SetPermissions(_string(body, "user"), _string(body, "vhost", "/"), *expressions))


async def clear_permissions(broker: "Broker", body: dict) -> dict[str, Any]:
    """{"vhost": "/", "user"}: rabbitmqctl clear_permissions."""
    return await _define(broker, mc.ClearPermissions(_string(body, "user"), _string(body, "vhost", "/")))


ACTIONS: dict[str, Callable[["Broker", dict], Awaitable[Any]]] = {
    "/api/queues/members": queue_members,
    "/api/queues/grow": grow,
    "/api/queues/shrink": shrink,
    "/api/queues/rebalance": rebalance,
    "/api/users/add": add_user,
    "/api/users/delete": delete_user,
    "/api/users/password": change_password,
    "/api/users/tags": set_user_tags,
    "/api/vhosts/add": add_vhost,
    "/api/vhosts/delete": delete_vhost,
    "/api/permissions/set": set_permissions,
    "/api/permissions/clear": clear_permissions,
}
# users, vhosts and permissions: seen and changed only by users tagged "administrator"
ADMIN_PATHS = frozenset({"/api/users", "/api/permissions"} |
                        {path for path in ACTIONS if path.startswith(("/api/users/", "/api/vhosts/",
                                                                      "/api/permissions/"))})
