"""Real ClusterTransports over loopback, several in one event loop.

Every wait is bounded: `until` polls a condition with a deadline (asyncio.wait_for);
nothing sleeps to synchronise.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import socket
import struct
import time
from collections import defaultdict
from typing import Any

import pytest
from structlog.testing import capture_logs

from tests.serverproc import free_port
from warren.config.settings import ClusterNode, Settings
from warren.raft.handshake import NONCE_BYTES, encode_frame, encode_object, hello_message
from warren.raft.transport import PEER_SILENT_HEARTBEATS_MAX, ClusterTransport, SharedPort, TransportLimits

SECRET = "integration-cookie"
HEARTBEAT_SECONDS = 0.1
FAST = TransportLimits(
    heartbeat_seconds=HEARTBEAT_SECONDS,
    handshake_timeout_seconds=0.5,
    reconnect_initial_seconds=0.02,
    reconnect_max_seconds=0.2,
    connect_timeout_seconds=1.0,
    frame_max_bytes=1024 * 1024,
)
WAIT_SECONDS = 5.0
DOWN_BOUND_SECONDS = (PEER_SILENT_HEARTBEATS_MAX + 1) * HEARTBEAT_SECONDS


async def until(predicate, what: str, timeout: float = WAIT_SECONDS) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.005)
    try:
        await asyncio.wait_for(poll(), timeout)
    except TimeoutError:
        pytest.fail(f"timed out after {timeout} s waiting for: {what}")


class Node:
    """A transport plus everything it reported, for assertions."""

    def __init__(self, name: str, members: list[ClusterNode], secret: str = SECRET,
                 limits: TransportLimits = FAST, seed: int = 0, shared_port: SharedPort | None = None):
        self.name = name
        self.members = members
        self.secret = secret
        self.limits = limits
        self.seed = seed
        self.frames: dict[str, list[Any]] = defaultdict(list)
        self.events: list[tuple[str, str]] = []
        port = next(member.port for member in members if member.name == name)
        settings = Settings(node_name=name, cluster_nodes=members, cluster_host="127.0.0.1",
                            cluster_port=port, cluster_secret=secret)
        self.transport = ClusterTransport(
            settings, self.on_frame, random.Random(seed), limits=limits,
            on_peer_up=lambda peer: self.events.append(("up", peer)),
            on_peer_down=lambda peer: self.events.append(("down", peer)), shared_port=shared_port)

    def on_frame(self, peer: str, obj: Any) -> None:
        self.frames[peer].append(obj)

    def ups(self, peer: str) -> int:
        return self.events.count(("up", peer))

    def downs(self, peer: str) -> int:
        return self.events.count(("down", peer))

    def restarted(self) -> Node:
        return Node(self.name, self.members, self.secret, self.limits, self.seed + 1)


def members(*names: str) -> list[ClusterNode]:
    return [ClusterNode(name=name, host="127.0.0.1", port=free_port()) for name in names]


@contextlib.asynccontextmanager
async def running(*nodes: Node):
    started: list[Node] = []
    try:
        for node in nodes:
            await node.transport.start()
            started.append(node)
        yield nodes
    finally:
        for node in started:
            await node.transport.stop()


def fully_connected(nodes: tuple[Node, ...] | list[Node]) -> bool:
    return all(node.transport.connected_peers() == {n.name for n in nodes} - {node.name} for node in nodes)


async def cluster_up(nodes) -> None:
    await until(lambda: fully_connected(nodes), "every pair connected")


class CountingTransport:
    """Wraps an asyncio transport and counts write calls."""

    def __init__(self, inner: asyncio.Transport):
        self.inner = inner
        self.writes: list[int] = []

    def write(self, data: bytes) -> None:
        self.writes.append(len(data))
        self.inner.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@contextlib.asynccontextmanager
async def two_nodes_counting_writes():
    """n1 and n2 linked, n1's writes to n2 counted: (n1, n2, the counter)."""
    config = members("n1", "n2")
    a, b = (Node(m.name, config) for m in config)
    async with running(a, b):
        await cluster_up([a, b])
        link = a.transport._links["n2"]
        counter = CountingTransport(link.transport)
        link.transport = counter
        yield a, b, counter


# --- the tests ---------------------------------------------------------------------

async def test_all_pairs_connect_and_frames_arrive_in_order_per_pair():
    config = members("n1", "n2", "n3")
    nodes = [Node(m.name, config, seed=i) for i, m in enumerate(config)]
    async with running(*nodes):
        await cluster_up(nodes)
        for node in nodes:
            for peer in node.transport.connected_peers():
                assert node.ups(peer) == 1 and node.downs(peer) == 0
        sent = 0
        for turn in range(20):
            for node in nodes:
                for peer in sorted(node.transport.connected_peers()):
                    for k in range(10):
                        assert node.transport.send(peer, [node.name, turn * 10 + k, b"x" * k])
                        sent += 1
            await asyncio.sleep(0)  # let this turn's writes go; not a synchronisation
        await until(lambda: sum(len(f) for n in nodes for f in n.frames.values()) == sent, "all frames delivered")
        for node in nodes:
            for peer, frames in node.frames.items():
                assert [f[1] for f in frames] == list(range(200)), f"{peer}->{node.name} out of order"
                assert all(f[0] == peer for f in frames)


async def test_many_frames_in_one_turn_are_one_write_and_all_arrive():
    async with two_nodes_counting_writes() as (a, b, counter):
        frame_count = 5000
        assert all(a.transport.send("n2", ["seq", i]) for i in range(frame_count))
        assert counter.writes == [], "nothing is written before the turn ends"
        await until(lambda: counter.writes, "the turn's flush")
        assert len(counter.writes) == 1, f"one write per turn, got {len(counter.writes)}"
        await until(lambda: len(b.frames["n1"]) == frame_count, "all frames of the turn")
        assert [f[1] for f in b.frames["n1"]] == list(range(frame_count))


async def test_a_frame_sent_now_is_written_at_once_with_what_was_queued_before_it():
    async with two_nodes_counting_writes() as (a, b, counter):
        assert a.transport.send("n2", ["seq", 0]) and a.transport.send("n2", ["seq", 1], now=True)
        assert len(counter.writes) == 1, "written in the same callback, the queued frame with it"
        assert a.transport.send("n2", ["seq", 2])
        assert len(counter.writes) == 1, "the next frame waits for the turn's end again"
        await until(lambda: len(b.frames["n1"]) == 3, "all three frames")
        assert [f[1] for f in b.frames["n1"]] == [0, 1, 2]
        assert len(counter.writes) == 2


async def test_outbound_queue_is_bounded_and_send_drops_when_full_or_not_connected():
    config = members("n1", "n2")
    limits = dataclasses.replace(FAST, peer_outbound_max_bytes=64 * 1024)
    a, b = (Node(m.name, config, limits=limits) for m in config)
    assert not a.transport.send("n2", ["before start"]), "not connected: dropped"
    async with running(a, b):
        await cluster_up([a, b])
        assert not a.transport.send("nobody", ["x"])
        accepted = 0
        while a.transport.send("n2", [accepted, b"p" * 1000]):
            accepted += 1
        link = a.transport._links["n2"]
        assert 0 < link.outbound_bytes <= 64 * 1024
        assert accepted < 70, "the queue must refuse once it holds its limit"
        await until(lambda: len(b.frames["n1"]) == accepted, "the accepted frames")
        assert [f[0] for f in b.frames["n1"]] == list(range(accepted))
        assert a.transport.send("n2", ["room again"]), "the queue drained"


async def test_a_backed_up_socket_stops_draining_and_sends_drop_until_it_clears():
    config = members("n1", "n2")
    limits = dataclasses.replace(FAST, heartbeat_seconds=1.0, write_buffer_high_bytes=64 * 1024,
                                 peer_outbound_max_bytes=256 * 1024)
    a, b = (Node(m.name, config, limits=limits) for m in config)
    async with running(a, b):
        await cluster_up([a, b])
        b.transport._links["n1"].transport.pause_reading()  # n2 stops reading: the socket backs up
        link = a.transport._links["n2"]
        chunk = b"c" * (60 * 1024)
        accepted = 0

        def fill_one_turn() -> bool:
            nonlocal accepted
            while a.transport.send("n2", [accepted, chunk]):
                accepted += 1
            return link.writes_paused

        async def fill() -> None:
            while not fill_one_turn():
                await asyncio.sleep(0)  # let the flush run; the condition is the loop's exit

        await asyncio.wait_for(fill(), WAIT_SECONDS)
        await asyncio.sleep(0)
        fill_one_turn()  # paused: nothing drains, so this fills the queue to its bound
        assert link.writes_paused
        assert limits.peer_outbound_max_bytes - len(chunk) < link.outbound_bytes <= limits.peer_outbound_max_bytes
        assert not a.transport.send("n2", [-1, chunk]), "dropped while backed up"
        b.transport._links["n1"].transport.resume_reading()
        await until(lambda: len(b.frames["n1"]) == accepted, "every accepted frame once n2 reads again")
        assert [f[0] for f in b.frames["n1"]] == list(range(accepted))
        assert not link.writes_paused and link.outbound_bytes == 0


async def test_a_frame_over_the_limit_is_not_sent():
    config = members("n1", "n2")
    a, b = (Node(m.name, config) for m in config)
    async with running(a, b):
        await cluster_up([a, b])
        assert not a.transport.send("n2", b"x" * (FAST.frame_max_bytes + 1))
        assert a.transport.send("n2", b"x" * (FAST.frame_max_bytes - 8))
        await until(lambda: b.frames["n1"], "the big frame under the limit")
        assert a.transport.connected_peers() == {"n2"}


async def test_wrong_secret_never_connects_and_the_others_log_and_drop_it():
    config = members("n0", "n1", "n2", "n3")  # n0 sorts first, so it dials everyone
    intruder = Node("n0", config, secret="not-the-cookie")
    honest = [Node(m.name, config, seed=i) for i, m in enumerate(config[1:])]
    with capture_logs() as logs:
        async with running(intruder, *honest):
            await cluster_up(honest)

            def rejecters() -> set[str]:
                return {e["node"] for e in logs if e["event"] == "cluster.handshake_failed"
                        and e["reason"] == "bad_proof" and e["peer"] == "n0"}

            await until(lambda: rejecters() == {"n1", "n2", "n3"}, "each honest node rejecting n0's proof")
            assert intruder.transport.connected_peers() == set()
            assert intruder.events == []
            for node in honest:
                assert node.ups("n0") == 0
                assert "n0" not in node.transport.connected_peers()
            assert fully_connected(honest)
    assert not any(SECRET in str(entry) or "not-the-cookie" in str(entry) for entry in logs)


async def test_garbage_on_the_cluster_port_is_dropped_and_the_node_keeps_serving():
    config = members("n1", "n2", "n3")
    nodes = [Node(m.name, config, seed=i) for i, m in enumerate(config)]
    target = nodes[1]
    async with running(*nodes):
        await cluster_up(nodes)
        with capture_logs() as logs:
            for garbage in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", encode_frame(b"\xc1"),
                            struct.pack(">I", 2**32 - 1) + b"x" * 100):
                reader, writer = await asyncio.open_connection("127.0.0.1", config[1].port)
                writer.write(garbage)
                received = await asyncio.wait_for(reader.read(), WAIT_SECONDS)  # until the node closes
                assert received == b"", "the node answers no hello but a dialer's: it closed without a word"
                writer.close()
        failures = [e for e in logs if e["event"] == "cluster.handshake_failed"]
        assert [e["reason"] for e in failures] == ["bad_frame", "bad_message", "bad_frame"]
        assert all(node.events.count(("down", "n2")) == 0 for node in nodes)
        assert target.transport.send("n1", ["still", "here"]) and target.transport.send("n3", ["and", "here"])
        assert nodes[0].transport.send("n2", ["to", "n2"])
        await until(lambda: nodes[0].frames["n2"] and nodes[2].frames["n2"] and target.frames["n1"],
                    "frames to and from the node that got garbage")


async def test_a_silent_connection_is_dropped_after_the_handshake_timeout():
    config = members("n1", "n2")
    a, b = (Node(m.name, config) for m in config)
    async with running(a, b):
        with capture_logs() as logs:
            reader, writer = await asyncio.open_connection("127.0.0.1", config[0].port)
            started = time.monotonic()
            await asyncio.wait_for(reader.read(), FAST.handshake_timeout_seconds + WAIT_SECONDS)
            elapsed = time.monotonic() - started
            writer.close()
        assert FAST.handshake_timeout_seconds * 0.9 <= elapsed < FAST.handshake_timeout_seconds + 2
        assert any(e["event"] == "cluster.handshake_failed" and e["reason"] == "timeout" for e in logs)


@pytest.mark.parametrize("bad_bytes,reason", [
    (struct.pack(">I", FAST.frame_max_bytes + 1), "frame_too_large"),
    (encode_frame(b"\xc1"), "undecodable"),
], ids=["too_large", "undecodable"])
async def test_a_bad_frame_from_a_peer_closes_that_link_which_then_reconnects(bad_bytes, reason):
    config = members("n1", "n2", "n3")
    nodes = [Node(m.name, config, seed=i) for i, m in enumerate(config)]
    n1, n2, n3 = nodes
    async with running(*nodes):
        await cluster_up(nodes)
        with capture_logs() as logs:
            n2.transport._links["n1"].transport.write(bad_bytes)  # n2 misbehaves towards n1
            await until(lambda: n1.downs("n2") == 1 and n2.downs("n1") == 1, "the link dropped on both sides")
        errors = [e for e in logs if e["event"] == "cluster.frame_error"]
        assert [(e["node"], e["peer"], e["reason"]) for e in errors] == [("n1", "n2", reason)]
        assert n1.transport.connected_peers() >= {"n3"}, "other links are untouched"
        await until(lambda: n1.ups("n2") == 2 and n2.ups("n1") == 2, "the dialer reconnected")
        assert n1.transport.send("n2", ["after", "reconnect"])
        await until(lambda: n2.frames["n1"] == [["after", "reconnect"]], "a frame on the new link")
        assert n3.downs("n1") == 0 and n3.downs("n2") == 0


async def test_a_stopped_peer_is_down_within_the_bound_and_up_after_restart():
    config = members("n1", "n2", "n3")
    nodes = [Node(m.name, config, seed=i) for i, m in enumerate(config)]
    n1, n2, n3 = nodes
    async with running(n1, n2):
        async with running(n3):
            await cluster_up(nodes)
        started = time.monotonic()
        await until(lambda: n1.downs("n3") == 1 and n2.downs("n3") == 1, "n3 reported down",
                    timeout=DOWN_BOUND_SECONDS + 1)
        assert time.monotonic() - started <= DOWN_BOUND_SECONDS + 0.5
        assert n1.transport.connected_peers() == {"n2"} and n2.transport.connected_peers() == {"n1"}
        # While n3 is away, n1 and n2 keep redialling it with backoff; sends to it are dropped.
        assert not n1.transport.send("n3", ["lost"])
        restarted = n3.restarted()
        async with running(restarted):
            await cluster_up([n1, n2, restarted])
            assert n1.ups("n3") == 2 and n2.ups("n3") == 2
            assert n1.transport.send("n3", ["welcome", "back"])
            await until(lambda: restarted.frames["n1"] == [["welcome", "back"]], "a frame to the restarted n3")


async def test_a_silent_peer_is_down_after_three_heartbeats():
    config = members("n1", "n2")
    a, b = (Node(m.name, config) for m in config)
    async with running(a, b):
        await cluster_up([a, b])
        # Heartbeats keep an idle link up for many intervals.
        idle_until = asyncio.get_running_loop().time() + 5 * HEARTBEAT_SECONDS
        await until(lambda: asyncio.get_running_loop().time() > idle_until, "an idle stretch")
        assert a.downs("n2") == 0 and b.downs("n1") == 0
        with capture_logs() as logs:
            # A one-way stall: n1 stops reading, so nothing arrives from n2.
            a.transport._links["n2"].transport.pause_reading()
            started = time.monotonic()
            await until(lambda: a.downs("n2") == 1, "n2 reported down by n1",
                        timeout=DOWN_BOUND_SECONDS + 1)
            elapsed = time.monotonic() - started
        assert PEER_SILENT_HEARTBEATS_MAX * HEARTBEAT_SECONDS * 0.9 <= elapsed <= DOWN_BOUND_SECONDS + 0.2
        assert any(e["event"] == "cluster.heartbeat_timeout" and e["peer"] == "n2" for e in logs)
        await until(lambda: a.ups("n2") == 2, "n1 redialled n2")


# --- a port shared by a node's processes (broker/node/shared_cluster_port.py) -------------------

class InProcessSharedPort:
    """`SharedPort` for transports in one loop: a link passed to a sibling goes to its `adopt`."""

    def __init__(self, listening: list[socket.socket], siblings: dict[str, InProcessSharedPort]):
        self.listening = listening
        self.siblings = siblings
        self.adopt: Any = None
        self.passed: list[str] = []

    def forward(self, target: str, fd: int, head: bytes) -> bool:
        sibling = self.siblings.get(target)
        if sibling is None or sibling is self or sibling.adopt is None:
            return False
        self.passed.append(target)
        sibling.adopt(socket.socket(fileno=os.dup(fd)), head)   # as SCM_RIGHTS would: a descriptor of its own
        return True

    def start(self, loop: Any, adopt: Any) -> None:
        self.adopt = adopt

    def stop(self, loop: Any) -> None:
        self.adopt = None


@contextlib.contextmanager
def one_port_for_b_and_its_shards():
    """Node a alone, node b's two processes b0 and b1 at one address (as shards `b#0`, `b#1`
    would be): only b0 accepts on it, so every link meant for b1 (a's, and b0's own to its
    sibling) must be passed on."""
    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    config = [ClusterNode(name="a", host="127.0.0.1", port=free_port()),
              *(ClusterNode(name=name, host="127.0.0.1", port=port) for name in ("b0", "b1"))]
    siblings: dict[str, InProcessSharedPort] = {}
    siblings["b0"] = InProcessSharedPort([listening], siblings)
    siblings["b1"] = InProcessSharedPort([], siblings)
    try:
        yield config, port, siblings
    finally:
        listening.close()


async def test_links_for_another_process_of_a_node_are_passed_to_it_on_its_shared_port():
    with one_port_for_b_and_its_shards() as (config, _, siblings):
        nodes = [Node("a", config), Node("b0", config, seed=1, shared_port=siblings["b0"]),
                 Node("b1", config, seed=2, shared_port=siblings["b1"])]
        a, b0, b1 = nodes
        async with running(*nodes):
            await cluster_up(nodes)
            assert sorted(siblings["b0"].passed) == ["b1", "b1"], "a's link and b0's own, both for b1"
            assert a.transport.send("b1", ["to", "b1"]) and b0.transport.send("b1", ["from", "b0"])
            assert b1.transport.send("a", ["from", "b1"])
            await until(lambda: b1.frames["a"] and b1.frames["b0"] and a.frames["b1"], "frames over passed links")
            assert (b1.frames["a"], b1.frames["b0"], a.frames["b1"]) == (
                [["to", "b1"]], [["from", "b0"]], [["from", "b1"]])


async def test_a_hello_for_no_process_of_the_node_is_refused_on_a_shared_port():
    with one_port_for_b_and_its_shards() as (config, port, siblings):
        b0 = Node("b0", config, shared_port=siblings["b0"])
        async with running(b0):
            with capture_logs() as logs:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(encode_object(hello_message("a", b"\x01" * NONCE_BYTES, "b7")))
                received = await asyncio.wait_for(reader.read(), WAIT_SECONDS)  # until the node closes
                host, port_used = writer.get_extra_info("sockname")[:2]
                address = f"{host}:{port_used}"
                writer.close()
            assert received == b""
            assert "b7" not in siblings["b0"].passed
            # (b0's own dial of b1, whom nobody adopts here, fails too: not this connection)
            failures = [e for e in logs if e["event"] == "cluster.handshake_failed" and e["address"] == address]
            assert [(e["node"], e["reason"]) for e in failures] == [("b0", "unexpected_node")], failures
