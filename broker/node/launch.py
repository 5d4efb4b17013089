"""`warren-server` and `python -m warren.broker`: the malloc tunable first, then the server.

The tunable (broker/node/malloc_tuning.py) is read when a process starts, so the
server executes itself again with it set. That happens here, before the server's
modules are imported: they take about half a second to import, which an exec after
importing them paid twice on every start (a test suite starts hundreds of nodes)."""
from __future__ import annotations

import os
import sys

from warren.broker.node import malloc_tuning


def main() -> int:
    _execute_again_with_huge_pages()
    from warren.broker.node import server  # after the exec: imported once
    return server.main(sys.argv[1:])


def _execute_again_with_huge_pages() -> None:
    """Replace this process (same pid, same command line) by one whose malloc uses
    transparent huge pages, unless it already does."""
    env = malloc_tuning.environment_with_huge_pages(os.environ, sys.platform)
    if env is None:
        return
    try:
        os.execve(sys.executable, sys.orig_argv, env)
    except OSError as error:   # run on with 4 KiB pages: slower, not wrong
        print(f"warren-server: could not restart with huge pages: {error}", file=sys.stderr)
