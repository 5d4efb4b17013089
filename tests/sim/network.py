"""The simulated network between nodes, and each node's failure detector.

Theory of operation. A frame sent is msgpack-encoded as the transport does
and put on its directed link with a delivery time; faults act per frame:
dropped, delayed, duplicated (a second copy later), and so reordered (a
delay is drawn per frame, so a later frame may arrive first). A partition
is a set of cut directed links: majority/minority, a bridge (one node sees
both sides, the sides do not see each other), one-way. A cut link loses
what is in flight on it. A command a node forwards to the leader for
another (a CMD whose origin is not its sender) can be held back longer,
`forward_delay_rate` of the frames that carry one by `forward_delay_seconds`:
it then reaches the leader after what its origin sent straight there later.

The failure detector is the transport's: a node counts a peer up while it
heard from it within `DETECT_SECONDS` (nodes send heartbeats every
`HEARTBEAT_SECONDS` on every link they can); when that changes it calls the
runtime's `on_peer_down` / `on_peer_up`, as the transport does. A paused
node sends and hears nothing, so its peers count it down after a while, and
it counts them down when it wakes, then up again. What its peers sent it
before they counted it down waits for it, as in its kernel's socket buffers,
and arrives as it wakes, before anything else it does (a real loop handles
the ready sockets before its timers); a node that finds it stalled drops its
links unread (`RaftRuntime.check_stall`, `drop_links` here).
"""
from __future__ import annotations

import heapq
import itertools
import random
from typing import Any

import msgpack

from warren.broker.node.node_core import CMD
from warren.raft import packing

HEARTBEAT_SECONDS = 0.25
DETECT_SECONDS = 0.75


class Network:
    def __init__(self, world: Any, rng: random.Random) -> None:
        self.world = world
        self.rng = rng
        self.in_flight: list[tuple[float, int, str, str, bytes]] = []   # (due, order, sender, to, raw)
        self.order = itertools.count()
        self.cut: set[tuple[str, str]] = set()
        self.drop_rate = 0.0
        self.duplicate_rate = 0.0
        self.delay_max = 0.004
        self.forward_delay_rate = 0.0
        self.forward_delay_seconds = 0.0
        self.heard: dict[tuple[str, str], float] = {}   # (listener, peer) -> last heard
        self.up: set[tuple[str, str]] = set()           # (listener, peer): the listener counts peer up
        self.next_heartbeat = 0.0
        self.frames = 0
        self.dropped = 0

    def linked(self, sender: str, to: str) -> bool:
        return (sender, to) in self.up

    def passable(self, sender: str, to: str) -> bool:
        nodes = self.world.nodes
        return ((sender, to) not in self.cut and nodes[sender].up and nodes[to].up
                and not self.world.paused(sender) and not self.world.paused(to))

    def send(self, sender: str, to: str, frame: Any) -> bool:
        if (sender, to) not in self.up:
            return False   # the transport drops frames to a peer it does not count linked
        raw = packing.packb(frame)   # as the transport encodes it (raft/handshake.py encode_object)
        self.frames += 1
        if self.into_a_pause(sender, to):
            self._put(self.world.paused_until[to], sender, to, raw)
            return True
        if not self.passable(sender, to) or self.rng.random() < self.drop_rate:
            self.dropped += 1
            return True
        now = self.world.clock.now
        self._put(now + self.rng.uniform(0.0002, self.delay_max) + self._forward_delay(sender, frame), sender, to, raw)
        if self.rng.random() < self.duplicate_rate:
            self._put(now + self.rng.uniform(0.0002, 4 * self.delay_max), sender, to, raw)
        return True

    def into_a_pause(self, sender: str, to: str) -> bool:
        """Only `to` is paused: its kernel takes the bytes, it reads them when it wakes."""
        nodes = self.world.nodes
        return ((sender, to) not in self.cut and nodes[sender].up and nodes[to].up
                and not self.world.paused(sender) and self.world.paused(to))

    def wake(self, name: str) -> None:
        """`name`'s pause ends early (the heal): what waits for it arrives now."""
        now = self.world.clock.now
        self.in_flight = [(min(due, now), order, sender, to, raw) if to == name else (due, order, sender, to, raw)
                          for due, order, sender, to, raw in self.in_flight]
        heapq.heapify(self.in_flight)

    def drop_links(self, name: str) -> None:
        """`name` dropped its links unread: what was on its way to it is lost, and it
        counts every peer down until it hears from it again."""
        self.in_flight = [item for item in self.in_flight if item[3] != name]
        heapq.heapify(self.in_flight)
        node = self.world.nodes[name]
        for peer in self.world.names:
            if (name, peer) in self.up:
                self.up.discard((name, peer))
                self.heard.pop((name, peer), None)
                node.cluster.runtime.on_peer_down(peer)

    def _forward_delay(self, sender: str, frame: Any) -> float:
        # no draw unless the scenario asks: the other scenarios' seeds replay as before
        if not self.forward_delay_rate or not isinstance(frame, dict):
            return 0.0
        forwards = any(message[0] == CMD and message[3] != sender for message in frame.get("a", ()))
        if not forwards or self.rng.random() >= self.forward_delay_rate:
            return 0.0
        self.world.note("forward held back")
        return self.forward_delay_seconds

    def _put(self, due: float, sender: str, to: str, raw: bytes) -> None:
        heapq.heappush(self.in_flight, (due, next(self.order), sender, to, raw))

    def cut_links(self, links: set[tuple[str, str]]) -> None:
        self.cut |= links
        self.in_flight = [item for item in self.in_flight if (item[2], item[3]) not in self.cut]
        heapq.heapify(self.in_flight)

    def heal(self) -> None:
        self.cut.clear()

    def deliver_due(self) -> None:
        now = self.world.clock.now
        while self.in_flight and self.in_flight[0][0] <= now:
            _, _, sender, to, raw = heapq.heappop(self.in_flight)
            if not self.passable(sender, to):
                continue
            node = self.world.nodes[to]
            self.heard[(to, sender)] = now
            node.cluster.runtime.on_frame(sender, msgpack.unpackb(raw, raw=False, strict_map_key=False))

    def detect(self) -> None:
        """Heartbeats on every passable link, then each node's view of its peers."""
        now = self.world.clock.now
        if now >= self.next_heartbeat:
            self.next_heartbeat = now + HEARTBEAT_SECONDS
            for sender in self.world.names:
                for to in self.world.names:
                    if sender != to and self.passable(sender, to):
                        self.heard[(to, sender)] = now
        for listener in self.world.names:
            node = self.world.nodes[listener]
            if not node.up or self.world.paused(listener):
                continue
            for peer in self.world.names:
                if peer == listener:
                    continue
                alive = now - self.heard.get((listener, peer), -1e9) < DETECT_SECONDS
                if alive and (listener, peer) not in self.up:
                    self.up.add((listener, peer))
                    node.cluster.runtime.on_peer_up(peer)
                elif not alive and (listener, peer) in self.up:
                    self.up.discard((listener, peer))
                    node.cluster.runtime.on_peer_down(peer)

    def forget(self, name: str) -> None:
        """`name` crashed: its own view is gone (a restart starts with every peer down), and
        its connections closed, which every peer that counted it up notices at once."""
        for listener in self.world.names:
            if (listener, name) in self.up:
                self.up.discard((listener, name))
                self.heard.pop((listener, name), None)
                node = self.world.nodes[listener]
                if node.up:
                    node.cluster.runtime.on_peer_down(name)
        self.up = {(listener, peer) for listener, peer in self.up if listener != name}
        self.heard = {key: at for key, at in self.heard.items() if key[0] != name}
        self.in_flight = [item for item in self.in_flight if name not in (item[2], item[3])]
        heapq.heapify(self.in_flight)
