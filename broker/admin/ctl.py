"""``warrenctl``: look at a running node, named after rabbitmqctl's commands,
and change quorum queue membership, named after rabbitmq-queues' commands.

Talks to the node's HTTP endpoint (the metrics port) with HTTP Basic auth.
Output is tab-separated with a header line, like ``rabbitmqctl --formatter
tsv``, or JSON with ``--formatter json``. A change the node refuses (unknown
queue or node, already a member, last member, ...) prints its one-line reason
on stderr and exits 1.

Membership commands (they return once the metadata Raft group has committed
the change on every node; each queue's Raft group follows at once):

* ``add_member [--vhost /] <queue> <node>``: a replica of <queue> on <node>;
* ``delete_member [--vhost /] <queue> <node>``: remove one (never the last);
* ``grow <node> <all|even>``: <node> becomes a member of every quorum queue
  (``even``: of those with an even number of members);
* ``shrink <node>``: <node> leaves every quorum queue it is a member of;
* ``rebalance [all|quorum]``: move quorum queue leaders so they spread evenly
  over the running nodes.

``grow``, ``shrink`` and ``rebalance`` take ``--vhost-pattern`` and
``--queue-pattern`` (regular expressions, whole names).

Users, vhosts and permissions, as rabbitmqctl's (they return once the
metadata Raft group has committed the change and this node applied it; every
node of the cluster makes it; they need a user tagged administrator):

* ``add_user <name> <password>``, ``delete_user <name>``,
  ``change_password <name> <password>``, ``set_user_tags <name> [<tag> ...]``,
  ``list_users``;
* ``add_vhost <name>``, ``delete_vhost <name>``, ``list_vhosts``;
* ``set_permissions [-p <vhost>] <user> <conf> <write> <read>``,
  ``clear_permissions [-p <vhost>] <user>``, ``list_permissions [-p <vhost>]``
  (the vhost defaults to /).
"""
from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

COMMANDS = {
    "cluster_status": ("/api/overview", None),
    "status": ("/api/overview", None),
    "list_queues": ("/api/queues", ["name", "type", "leader", "members", "messages_ready",
                                    "messages_unacked", "consumers"]),
    "list_exchanges": ("/api/exchanges", ["name", "type", "durable", "auto_delete", "internal"]),
    "list_bindings": ("/api/bindings", ["source", "destination_kind", "destination", "routing_key"]),
    "list_connections": ("/api/connections", ["peer", "user", "vhost", "channels", "blocked", "client"]),
    "list_users": ("/api/users", ["user", "tags"]),
    "list_vhosts": ("/api/vhosts", ["name"]),
    "list_permissions": ("/api/permissions", ["user", "configure", "write", "read"]),
}
# command -> (path, required arguments, optional arguments)
ACTIONS = {
    "add_member": ("/api/queues/members", ["queue", "node"], []),
    "delete_member": ("/api/queues/members", ["queue", "node"], []),
    "grow": ("/api/queues/grow", ["node", "selector"], []),
    "shrink": ("/api/queues/shrink", ["node"], []),
    "rebalance": ("/api/queues/rebalance", [], ["type"]),
    "add_user": ("/api/users/add", ["name", "password"], []),
    "delete_user": ("/api/users/delete", ["name"], []),
    "change_password": ("/api/users/password", ["name", "password"], []),
    "set_user_tags": ("/api/users/tags", ["name"], ["tags..."]),
    "add_vhost": ("/api/vhosts/add", ["name"], []),
    "delete_vhost": ("/api/vhosts/delete", ["name"], []),
    "set_permissions": ("/api/permissions/set", ["user", "configure", "write", "read"], []),
    "clear_permissions": ("/api/permissions/clear", ["user"], []),
}
# what a definitions command prints when done, as rabbitmqctl's progress lines
DONE_MESSAGES = {
    "add_user": 'Added user "{name}"',
    "delete_user": 'Deleted user "{name}"',
    "change_password": 'Changed the password of user "{name}"',
    "set_user_tags": 'Set the tags of user "{name}" to {tags}',
    "add_vhost": 'Added vhost "{name}"',
    "delete_vhost": 'Deleted vhost "{name}"',
    "set_permissions": 'Set permissions for user "{user}" in vhost "{vhost}"',
    "clear_permissions": 'Cleared permissions for user "{user}" in vhost "{vhost}"',
}
MEMBER_ROW_COLUMNS = ["vhost", "name", "size", "result"]
REQUEST_TIMEOUT_SECONDS = 10
CHANGE_TIMEOUT_SECONDS = 60   # the node waits up to 30 s for the metadata group
EX_USAGE = 64
EX_UNAVAILABLE = 69
EX_PROTOCOL = 76  # sysexits: the remote end did not speak the protocol


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="warrenctl",
        description="Inspect a running Warren node, change quorum queue membership, users, vhosts and "
                    "permissions (over its HTTP port, default 15692).",
        epilog="add_member [--vhost /] <queue> <node>; delete_member [--vhost /] <queue> <node>; "
               "grow <node> <all|even>; shrink <node>; rebalance [all|quorum]; "
               "add_user <name> <password>; delete_user <name>; change_password <name> <password>; "
               "set_user_tags <name> [<tag> ...]; list_users; add_vhost <name>; delete_vhost <name>; list_vhosts; "
               "set_permissions [-p <vhost>] <user> <conf> <write> <read>; clear_permissions [-p <vhost>] <user>; "
               "list_permissions [-p <vhost>]")
    parser.add_argument("command", choices=sorted(COMMANDS | ACTIONS), help="what to show or do")
    parser.add_argument("args", nargs="*", metavar="argument",
                        help="list_* commands: the columns to show; the others: their arguments")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("WARREN_METRICS_PORT", "15692")))
    parser.add_argument("--vhost", "-p", default=None,
                        help="list_* commands: only this vhost (list_permissions: default /); add_member, "
                             "delete_member: the queue's, set_permissions, clear_permissions: the vhost (default /)")
    parser.add_argument("--vhost-pattern", default=None, help="grow, shrink, rebalance: vhosts matching this")
    parser.add_argument("--queue-pattern", default=None, help="grow, shrink, rebalance: queues matching this")
    parser.add_argument("--user", default=os.environ.get("WARREN_CTL_USER", "guest"))
    parser.add_argument("--password", default=None,
                        help="password (default: $WARREN_CTL_PASSWORD, else guest)")
    parser.add_argument("--formatter", choices=("tsv", "json"), default="tsv")
    parser.add_argument("--timeout", "-t", type=float, default=None, metavar="SECONDS",
                        help=f"how long to wait for the node's answer (default {REQUEST_TIMEOUT_SECONDS} s, "
                             f"{CHANGE_TIMEOUT_SECONDS} s for a change)")
    return parser.parse_intermixed_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    password = args.password if args.password is not None else os.environ.get("WARREN_CTL_PASSWORD", "guest")
    if args.command in ACTIONS:
        return change(args, password)
    path, default_columns = COMMANDS[args.command]
    try:
        data = fetch(args.host, args.port, path, args.user, password, args.timeout or REQUEST_TIMEOUT_SECONDS)
    except Exception as error:
        return _failed(args, error)
    vhost = args.vhost if args.vhost is not None or args.command != "list_permissions" else "/"
    if vhost is not None and isinstance(data, list) and args.command not in ("list_users", "list_vhosts"):
        data = [row for row in data if row.get("vhost") == vhost]
    if args.formatter == "json" or default_columns is None:
        print(json.dumps(data, indent=None if args.formatter == "json" else 2, default=str))
        return 0
    columns = args.args or default_columns
    known = data[0] if data else {}
    unknown = [c for c in columns if data and c not in known]
    if unknown:
        print(f"warrenctl: unknown column(s) {', '.join(unknown)}", file=sys.stderr)
        return EX_USAGE
    _print_table(columns, data)
    return 0


def change(args: argparse.Namespace, password: str) -> int:
    """The membership commands: POST the arguments, print the node's answer."""
    path, required, optional = ACTIONS[args.command]
    many = optional[-1:] == ["tags..."]
    if not len(required) <= len(args.args) <= (len(required) + len(optional) if not many else len(args.args)):
        usage = " ".join([f"<{a}>" for a in required] + [f"[{a}]" for a in optional])
        print(f"warrenctl: usage: warrenctl {args.command} {usage}", file=sys.stderr)
        return EX_USAGE
    body: dict[str, Any] = dict(zip(required + optional, args.args))
    if many:
        body.pop("tags...", None)
        body["tags"] = args.args[len(required):]
    if args.command in ("set_permissions", "clear_permissions"):
        body["vhost"] = args.vhost if args.vhost is not None else "/"
    if args.command in ("add_member", "delete_member"):
        body["op"] = "add" if args.command == "add_member" else "delete"
        body["vhost"] = args.vhost if args.vhost is not None else "/"
    for key in ("vhost_pattern", "queue_pattern"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    try:
        result = post(args.host, args.port, path, body, args.user, password, args.timeout or CHANGE_TIMEOUT_SECONDS)
    except Exception as error:
        return _failed(args, error)
    if args.formatter == "json":
        print(json.dumps(result, default=str))
    elif args.command in DONE_MESSAGES:
        print(DONE_MESSAGES[args.command].format(**{**body, "tags": _cell(body.get("tags"))}))
    elif args.command == "add_member":
        print(f"Added a replica of queue {body['queue']} in vhost {body['vhost']} on node {body['node']}; "
              f"members: {_cell(result['members'])}")
    elif args.command == "delete_member":
        print(f"Removed the replica of queue {body['queue']} in vhost {body['vhost']} on node {body['node']}; "
              f"members: {_cell(result['members'])}")
    elif args.command == "rebalance":
        _print_table(["node", "quorum_leaders"], result["leaders"])
    else:
        _print_table(MEMBER_ROW_COLUMNS, result)
    return 0


def _failed(args: argparse.Namespace, error: Exception) -> int:
    """One line on stderr and an exit code for whatever went wrong talking to the node."""
    where = f"{args.host}:{args.port}"
    if isinstance(error, urllib.error.HTTPError):
        return _http_error(args, error)
    if isinstance(error, TimeoutError) or isinstance(getattr(error, "reason", None), TimeoutError):
        print(f"warrenctl: {where}: no answer, timed out", file=sys.stderr)
        return EX_UNAVAILABLE
    if isinstance(error, http.client.HTTPException):  # before OSError: RemoteDisconnected is both
        print(f"warrenctl: {where} is not an HTTP endpoint ({type(error).__name__}); warrenctl talks to "
              "the node's metrics port (--port, default 15692), not its AMQP port", file=sys.stderr)
        return EX_PROTOCOL
    if isinstance(error, (urllib.error.URLError, OSError)):
        return _unreachable(args, error)
    if isinstance(error, ValueError):  # the body is not JSON
        print(f"warrenctl: {where} answered HTTP but not as a Warren node (no JSON)", file=sys.stderr)
        return EX_PROTOCOL
    raise error


def _http_error(args: argparse.Namespace, error: urllib.error.HTTPError) -> int:
    if error.code == 401:
        print(f"warrenctl: {args.host}:{args.port}: authentication failed", file=sys.stderr)
        return 2
    try:
        text = json.loads(error.read())["error"]
    except (ValueError, KeyError, TypeError, OSError):
        text = f"{args.host}:{args.port}: HTTP {error.code}"
    print(f"warrenctl: {text}", file=sys.stderr)
    return 1 if args.command in ACTIONS else 2


def _unreachable(args: argparse.Namespace, error: Exception) -> int:
    print(f"warrenctl: cannot reach {args.host}:{args.port}: {getattr(error, 'reason', error)}", file=sys.stderr)
    return EX_UNAVAILABLE  # as rabbitmqctl exits when the node is down


def _request(host: str, port: int, path: str, user: str, password: str,
             body: bytes | None = None) -> urllib.request.Request:
    request = urllib.request.Request(f"http://{host}:{port}{path}", data=body,
                                     method="POST" if body is not None else "GET")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    if body is not None:
        request.add_header("Content-Type", "application/json")
    return request


def fetch(host: str, port: int, path: str, user: str, password: str,
          timeout: float = REQUEST_TIMEOUT_SECONDS) -> Any:
    with urllib.request.urlopen(_request(host, port, path, user, password), timeout=timeout) as response:
        return json.loads(response.read())


def post(host: str, port: int, path: str, body: dict, user: str, password: str,
         timeout: float = CHANGE_TIMEOUT_SECONDS) -> Any:
    request = _request(host, port, path, user, password, json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def _print_table(columns: list[str], rows: list[dict]) -> None:
    print("\t".join(columns))
    for row in rows:
        print("\t".join(_cell(row.get(c)) for c in columns))


def _cell(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ",".join(str(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


if __name__ == "__main__":
    raise SystemExit(main())
