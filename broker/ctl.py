"""``warrenctl``: look at a running node, named after rabbitmqctl's commands.

Talks to the node's HTTP endpoint (the metrics port) with HTTP Basic auth.
Output is tab-separated with a header line, like ``rabbitmqctl --formatter
tsv``, or JSON with ``--formatter json``.
"""
from __future__ import annotations

import argparse
import base64
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
}
REQUEST_TIMEOUT_SECONDS = 10


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="warrenctl", description="Inspect a running Warren node (over its HTTP port, default 15692).")
    parser.add_argument("command", choices=sorted(COMMANDS), help="what to show")
    parser.add_argument("columns", nargs="*", help="columns to show (list_* commands)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("WARREN_METRICS_PORT", "15692")))
    parser.add_argument("--vhost", "-p", default=None, help="only this vhost (list_* commands)")
    parser.add_argument("--user", default=os.environ.get("WARREN_CTL_USER", "guest"))
    parser.add_argument("--password", default=None,
                        help="password (default: $WARREN_CTL_PASSWORD, else guest)")
    parser.add_argument("--formatter", choices=("tsv", "json"), default="tsv")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    path, default_columns = COMMANDS[args.command]
    password = args.password if args.password is not None else os.environ.get("WARREN_CTL_PASSWORD", "guest")
    try:
        data = fetch(args.host, args.port, path, args.user, password)
    except urllib.error.HTTPError as error:
        reason = "authentication failed" if error.code == 401 else f"HTTP {error.code}"
        print(f"warrenctl: {args.host}:{args.port}: {reason}", file=sys.stderr)
        return 2
    except (urllib.error.URLError, OSError) as error:
        print(f"warrenctl: cannot reach {args.host}:{args.port}: {getattr(error, 'reason', error)}",
              file=sys.stderr)
        return 69  # EX_UNAVAILABLE, as rabbitmqctl exits when the node is down
    if args.vhost is not None and isinstance(data, list):
        data = [row for row in data if row.get("vhost") == args.vhost]
    if args.formatter == "json" or default_columns is None:
        print(json.dumps(data, indent=None if args.formatter == "json" else 2, default=str))
        return 0
    columns = args.columns or default_columns
    unknown = [c for c in columns if data and c not in data[0]]
    if unknown:
        print(f"warrenctl: unknown column(s) {', '.join(unknown)}", file=sys.stderr)
        return 64  # EX_USAGE
    print("\t".join(columns))
    for row in data:
        print("\t".join(_cell(row.get(c)) for c in columns))
    return 0


def fetch(host: str, port: int, path: str, user: str, password: str) -> Any:
    request = urllib.request.Request(f"http://{host}:{port}{path}")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_SECONDS) as response:
        return json.loads(response.read())


def _cell(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ",".join(str(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


if __name__ == "__main__":
    raise SystemExit(main())
