"""kill -9 under confirmed publishing: what was confirmed is there, once, in order.

Each round, several publisher connections publish numbered persistent messages
(body ``r<round>:p<publisher>:<seq>``) with publisher confirms to a few durable
queues, each keeping a window of unconfirmed messages in flight (so confirms
come in batches, with ``multiple``). When a seeded random number of confirms
has arrived the server is killed with SIGKILL, started again on the same data
dir, and every queue is drained. Then:

* every confirmed message is present (a confirm is sent only after fsync);
* no message appears twice (publishers never resend);
* per publisher, the sequence numbers in each queue increase;
* nothing appears that was not sent, or was sent to another queue, or in an
  earlier round (those were consumed and acked: they must stay gone).

The queues are reused round after round on the same data dir, with
small WAL limits so rollovers into segments happen under the load too.
Publishers speak AMQP over a plain socket (frames by pamqp) so that the
delivery tag of each publish is known exactly: in confirm mode the broker
numbers publishes 1, 2, ... in the order they arrive on the channel.

Every assertion message carries the round's seed; ``WARREN_CRASH_ROUNDS``
runs more rounds (seeds continue the fixed list), ``WARREN_CRASH_SEED``
runs one round with that seed. A seed fixes the kill point (in confirms), the
windows and each publisher's choice of queue; where the kill lands relative
to the broker's fsyncs and rollovers is up to timing, so a seed makes a
failure likely to recur rather than certain.
"""
from __future__ import annotations

import os
import random
import signal
import socket
import struct
import threading
import time
import traceback
from dataclasses import dataclass, field

from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from tests.integration.pika_support import connect
from tests.serverproc import ServerProcess, make_server

QUEUES = ("crash-a", "crash-b", "crash-c")
PUBLISHERS = 4
# unconfirmed publishes each publisher keeps in flight: 1 is pika's synchronous style
WINDOWS = (1, 8, 32, 128)
SEEDS = (11, 29, 1234, 20240601, 987654321)
ROUNDS = int(os.environ.get("WARREN_CRASH_ROUNDS", str(len(SEEDS))))
KILL_AFTER_CONFIRMS = (200, 12_000)  # the kill comes after a random number of confirms in this range
ROUND_SECONDS = 20.0
TEST_SECONDS = 120.0
PUBLISH_PHASE_SECONDS = 8.0  # if the confirms come slower than this, kill anyway
PUBLISHES_PER_PUBLISHER_MAX = 200_000
BODY_PADDING = b"." * 64
SMALL_WAL = {"WARREN_WAL_MAX_SIZE_BYTES": "262144", "WARREN_SEGMENT_MAX_ENTRIES": "256"}
SOCKET_SECONDS = 5.0
PERSISTENT = commands.Basic.Properties(delivery_mode=2)


def round_seeds() -> list[int]:
    if "WARREN_CRASH_SEED" in os.environ:
        return [int(os.environ["WARREN_CRASH_SEED"])]
    seeds = list(SEEDS)
    extra = random.Random(0)
    while len(seeds) < ROUNDS:
        seeds.append(extra.randrange(2**32))
    return seeds[:ROUNDS]


class ConfirmingClient:
    """The least AMQP a confirming publisher needs, over a blocking socket with timeouts."""

    FRAME_HEADER = struct.Struct(">BHI")

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=SOCKET_SECONDS)
        self.buffer = b""
        self.frame_max = 131072

    def close(self) -> None:
        self.sock.close()

    def send(self, channel: int, value) -> None:
        self.sock.sendall(pamqp_frame.marshal(value, channel))

    def read(self):
        """The next frame's (channel, value); raises on EOF, reset or timeout."""
        while True:
            if len(self.buffer) >= self.FRAME_HEADER.size:
                _, channel, size = self.FRAME_HEADER.unpack_from(self.buffer)
                total = self.FRAME_HEADER.size + size + 1
                if len(self.buffer) >= total:
                    raw, self.buffer = self.buffer[:total], self.buffer[total:]
                    _, channel, value = pamqp_frame.unmarshal(raw)
                    return channel, value
            chunk = self.sock.recv(65536)  # socket.timeout (an OSError) after SOCKET_SECONDS
            if not chunk:
                raise ConnectionError("the server closed the socket")
            self.buffer += chunk

    def expect(self, kind: type):
        _, value = self.read()
        assert isinstance(value, kind), f"expected {kind.__name__}, got {value!r}"
        return value

    def open_confirming_channel(self) -> None:
        self.sock.sendall(b"AMQP\x00\x00\x09\x01")
        self.expect(commands.Connection.Start)
        self.send(0, commands.Connection.StartOk(
            client_properties={"product": "warren-crash-test", "capabilities": {"publisher_confirms": True}},
            mechanism="PLAIN", response="\0guest\0guest", locale="en_US"))
        tune = self.expect(commands.Connection.Tune)
        self.frame_max = tune.frame_max
        self.send(0, commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max,
                                                heartbeat=0))
        self.send(0, commands.Connection.Open(virtual_host="/"))
        self.expect(commands.Connection.OpenOk)
        self.send(1, commands.Channel.Open())
        self.expect(commands.Channel.OpenOk)
        self.send(1, commands.Confirm.Select())
        self.expect(commands.Confirm.SelectOk)

    def publish(self, routing_key: str, body: bytes) -> None:
        assert len(body) < self.frame_max - 8, "one body frame is enough here"
        self.sock.sendall(
            pamqp_frame.marshal(commands.Basic.Publish(exchange="", routing_key=routing_key), 1)
            + pamqp_frame.marshal(ContentHeader(0, len(body), PERSISTENT), 1)
            + pamqp_frame.marshal(ContentBody(body), 1))


@dataclass
class Publisher:
    """One connection publishing with confirms; records what it sent and what was confirmed."""

    round_number: int
    publisher_id: int
    port: int
    window: int
    rng: random.Random
    sent_to: list[str] = field(default_factory=list)  # seq -> queue (delivery tag = seq + 1)
    confirmed: set[int] = field(default_factory=set)
    nacked: set[int] = field(default_factory=set)
    error: str | None = None  # anything other than the server going away
    ended_by: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name=f"publisher-{self.publisher_id}", daemon=True)
        self.thread.start()

    def confirmed_count(self) -> int:
        with self._lock:
            return len(self.confirmed)

    def _body(self, seq: int) -> bytes:
        return b"r%d:p%d:%d:" % (self.round_number, self.publisher_id, seq) + BODY_PADDING

    def _run(self) -> None:
        client = None
        try:
            client = ConfirmingClient(self.port)
            client.open_confirming_channel()
            self._publish_loop(client)
        except OSError as error:  # the kill: reset, EOF (ConnectionError) or a timeout
            self.ended_by = f"{type(error).__name__}: {error}"
        except BaseException as error:  # noqa: BLE001 - reported by the test thread
            self.error = "".join(traceback.format_exception(error))
        finally:
            if client is not None:
                client.close()

    def _publish_loop(self, client: ConfirmingClient) -> None:
        outstanding = 0
        unsettled: set[int] = set()
        while len(self.sent_to) < PUBLISHES_PER_PUBLISHER_MAX:
            while outstanding < self.window and len(self.sent_to) < PUBLISHES_PER_PUBLISHER_MAX:
                seq = len(self.sent_to)
                queue = QUEUES[self.rng.randrange(len(QUEUES))]
                self.sent_to.append(queue)  # recorded before sending: it may arrive even if we die now
                client.publish(queue, self._body(seq))
                unsettled.add(seq + 1)
                outstanding += 1
            _, frame = client.read()
            if isinstance(frame, (commands.Basic.Ack, commands.Basic.Nack)):
                tags = ([t for t in unsettled if t <= frame.delivery_tag] if frame.multiple
                        else [frame.delivery_tag])
                assert tags, f"confirm for unknown delivery tag {frame.delivery_tag} (multiple={frame.multiple})"
                with self._lock:
                    for tag in tags:
                        assert tag in unsettled, f"delivery tag {tag} confirmed twice"
                        unsettled.discard(tag)
                        (self.confirmed if isinstance(frame, commands.Basic.Ack) else self.nacked).add(tag - 1)
                outstanding -= len(tags)
            elif isinstance(frame, commands.Channel.Close):
                raise AssertionError(f"channel closed by the broker: {frame.reply_code} {frame.reply_text}")
            # connection.blocked / unblocked and heartbeats: nothing to do


def _wait_for(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)  # polling a condition with a deadline, not synchronising by time
    return True


def _drain_all(server: ServerProcess, seed: int) -> dict[str, list[bytes]]:
    """Consume every queue to the end (auto-ack: settled on delivery), bounded in time."""
    found: dict[str, list[bytes]] = {}
    with connect(server) as connection:
        channel = connection.channel()
        for queue in QUEUES:
            expected = channel.queue_declare(queue, durable=True).method.message_count
            bodies: list[bytes] = []
            tag = channel.basic_consume(queue, lambda ch, method, props, body, bodies=bodies: bodies.append(body),
                                        auto_ack=True)
            deadline = time.monotonic() + ROUND_SECONDS / 2
            while len(bodies) < expected:
                assert time.monotonic() < deadline, (
                    f"seed {seed}: {queue}: consumed {len(bodies)} of {expected} in time")
                connection.process_data_events(time_limit=0.05)
            channel.basic_cancel(tag)
            assert len(bodies) == expected, f"seed {seed}: {queue}: {len(bodies)} delivered, {expected} counted"
            assert channel.queue_declare(queue, durable=True).method.message_count == 0, (
                f"seed {seed}: {queue}: messages left after draining")
            found[queue] = bodies
    return found


def _check(round_number: int, seed: int, publishers: list[Publisher], found: dict[str, list[bytes]]) -> int:
    """Check every rule, collecting all violations into one assertion; returns confirms checked."""
    by_publisher = {p.publisher_id: p for p in publishers}
    present: set[tuple[int, int]] = set()
    problems: list[str] = []
    stale: dict[tuple[str, int], int] = {}
    for queue, bodies in found.items():
        last_seq: dict[int, int] = {}
        for body in bodies:
            round_part, publisher_part, seq_part, _ = body.split(b":", 3)
            got_round, publisher_id, seq = int(round_part[1:]), int(publisher_part[1:]), int(seq_part)
            if got_round != round_number:  # consumed with auto-ack in its own round
                stale[(queue, got_round)] = stale.get((queue, got_round), 0) + 1
                continue
            publisher = by_publisher[publisher_id]
            if seq >= len(publisher.sent_to):
                problems.append(f"{queue}: {body[:24]!r} was never sent")
            elif publisher.sent_to[seq] != queue:
                problems.append(f"{queue}: {body[:24]!r} was sent to {publisher.sent_to[seq]}")
            if (publisher_id, seq) in present:
                problems.append(f"{queue}: duplicate {body[:24]!r}")
            present.add((publisher_id, seq))
            if seq <= last_seq.get(publisher_id, -1):
                problems.append(f"{queue}: publisher {publisher_id} seq {seq} after seq {last_seq[publisher_id]}")
            last_seq[publisher_id] = max(seq, last_seq.get(publisher_id, -1))
    for (queue, got_round), count in sorted(stale.items()):
        problems.append(f"{queue}: {count} messages of round {got_round} came back, consumed and acked then")
    checked = 0
    for publisher in publishers:
        missing = sorted(seq for seq in publisher.confirmed if (publisher.publisher_id, seq) not in present)
        if missing:
            problems.append(
                f"publisher {publisher.publisher_id} (window {publisher.window}): {len(missing)} confirmed "
                f"messages lost, first {missing[:10]}; confirmed {len(publisher.confirmed)} of "
                f"{len(publisher.sent_to)} sent")
        checked += len(publisher.confirmed)
    assert not problems, (f"seed {seed} (round {round_number}): {len(problems)} problems:\n  "
                          + "\n  ".join(problems[:30]))
    return checked


def _crash_round(server: ServerProcess, round_number: int, seed: int) -> str:
    rng = random.Random(seed)
    kill_after = rng.randint(*KILL_AFTER_CONFIRMS)
    publishers = [Publisher(round_number, i, server.amqp_port, WINDOWS[i % len(WINDOWS)],
                            random.Random(f"{seed}-{i}")) for i in range(PUBLISHERS)]
    for publisher in publishers:
        publisher.start()
    reached = _wait_for(lambda: sum(p.confirmed_count() for p in publishers) >= kill_after
                        or any(p.error or not p.thread.is_alive() for p in publishers),
                        PUBLISH_PHASE_SECONDS)
    code = server.stop(signal.SIGKILL)
    assert code == -signal.SIGKILL, f"seed {seed}: the server had exited with {code} before the kill:\n{server.log()}"
    for publisher in publishers:
        publisher.thread.join(SOCKET_SECONDS * 2)
        assert not publisher.thread.is_alive(), f"seed {seed}: publisher {publisher.publisher_id} did not stop"
        assert publisher.error is None, f"seed {seed}: publisher {publisher.publisher_id}: {publisher.error}"
    confirmed = sum(len(p.confirmed) for p in publishers)
    assert confirmed > 0, f"seed {seed}: no confirms before the kill"
    server.start()
    found = _drain_all(server, seed)
    checked = _check(round_number, seed, publishers, found)
    sent = sum(len(p.sent_to) for p in publishers)
    return (f"round {round_number} seed {seed}: kill after {kill_after} confirms (reached: {reached}); "
            f"sent {sent}, confirmed {checked}, recovered {sum(len(b) for b in found.values())}")


def test_confirmed_messages_survive_kill_9(tmp_path):
    started = time.monotonic()
    server = make_server(tmp_path, **SMALL_WAL).start()
    try:
        with connect(server) as connection:
            channel = connection.channel()
            for queue in QUEUES:
                channel.queue_declare(queue, durable=True)
        for round_number, seed in enumerate(round_seeds()):
            round_started = time.monotonic()
            summary = _crash_round(server, round_number, seed)
            print(summary, f"in {time.monotonic() - round_started:.1f}s")
            assert time.monotonic() - round_started < ROUND_SECONDS, f"seed {seed}: round took too long"
            assert time.monotonic() - started < TEST_SECONDS * max(1, ROUNDS / len(SEEDS)), (
                f"seed {seed}: the test ran over its time bound")
    finally:
        server.stop()
