"""Count event-loop hops on a publish's path (issue 11, item 8).

`python -c "from tests.looptrace import main; main()"` runs the real server on
a plain asyncio loop (the same callbacks as uvloop's) whose `call_soon`,
`call_soon_threadsafe` and `call_later` tag every callback with its chain: a
socket read starts a chain at hop 0 (I/O callbacks are not scheduled through
`call_soon`), a callback a thread schedules starts one at hop 1, and a
callback scheduled from inside a callback of hop n is at hop n + 1 (a Task's
steps and a Future's done-callbacks go through `call_soon` too). Two events
are appended to the file named by WARREN_HOPS_FILE as JSON lines:

* `{"to_fsync": n}`: a WAL batch handed to the writer thread `n` hops after
  the socket read whose chain it is in;
* `{"to_confirm": n}`: a basic.ack written to a client socket `n` hops after
  the writer thread handed a result back (the fsync completing is hop 1).

Chains started by timers are not counted (`"timer"`).
"""
from __future__ import annotations

import asyncio
import json
import os
import sys

BASIC_ACK = b"\x00\x3c\x00\x50"   # class 60 (basic), method 80 (ack)
IDLE = ("io", 0)
_current = IDLE


def _record(event: str, hops: int) -> None:
    with open(os.environ["WARREN_HOPS_FILE"], "a") as out:
        out.write(json.dumps({event: hops}) + "\n")


def _tagged(tag, callback):
    def run(*args):
        global _current
        _current = tag
        try:
            return callback(*args)
        finally:
            _current = IDLE   # what runs next unwrapped is an I/O callback: a new chain
    return run


def _next_tag():
    origin, hops = _current
    return origin, hops + 1


class TracingLoop(asyncio.SelectorEventLoop):
    def call_soon(self, callback, *args, context=None):
        return super().call_soon(_tagged(_next_tag(), callback), *args, context=context)

    def call_soon_threadsafe(self, callback, *args, context=None):
        return super().call_soon_threadsafe(_tagged(("thread", 1), callback), *args, context=context)

    def call_later(self, delay, callback, *args, context=None):
        return super().call_later(delay, _tagged(("timer", 0), callback), *args, context=context)

    def call_at(self, when, callback, *args, context=None):
        return super().call_at(when, _tagged(("timer", 0), callback), *args, context=context)


def _patch() -> None:
    from warren.storage.writer_thread import WriterThread
    submit = WriterThread.submit

    def traced_submit(self, *args):
        if _current[0] == "io":
            _record("to_fsync", _current[1])
        return submit(self, *args)
    WriterThread.submit = traced_submit

    from asyncio import selector_events
    write = selector_events._SelectorSocketTransport.write

    def traced_write(self, data):
        if _current[0] == "thread" and BASIC_ACK in bytes(data):
            _record("to_confirm", _current[1])
        return write(self, data)
    selector_events._SelectorSocketTransport.write = traced_write

    import uvloop

    def run(main_coroutine):
        loop = TracingLoop()
        try:
            return loop.run_until_complete(main_coroutine)
        finally:
            loop.close()
    uvloop.run = run


def main() -> None:
    _patch()
    from warren.broker.node import server
    sys.exit(server.main())
