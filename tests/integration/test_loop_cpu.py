"""A node's event loop bound to a CPU of its own (the setting `loop_cpu_binding`,
broker/node/loop_cpu.py), with real warren-server processes: "always", the loop's thread
on one CPU and the threads it starts (the WAL writer, the rollovers' workers) on every
CPU, and a node of two processes' loops on two CPUs; by default, a single node's idle
loop and a cluster node's loop not bound; "never", nothing bound. (When "busy" binds is
tests/unit/test_cpus.py's.)"""
from __future__ import annotations

import json
import os

import pika
import pytest

from tests.integration.pika_support import publish_confirmed
from tests.integration.test_node_processes import SHARDS, sharded_server
from tests.serverproc import free_port, make_server

MACHINE_CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
pytestmark = [pytest.mark.timeout(90),
              pytest.mark.skipif(len(MACHINE_CPUS) < SHARDS,
                                 reason="needs Linux and two CPUs the tests may use (a machine condition)")]


def threads(pid: int) -> list[int]:
    return sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task"))


def bytes_written(pid: int, tid: int) -> int:
    """What the thread handed to write calls (files and sockets): /proc's `wchar`."""
    with open(f"/proc/{pid}/task/{tid}/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("wchar:"))


def server_with_the_default(tmp_path, **env: str):
    """A node as warren-server starts it unless told: the suite's nodes run with "never"."""
    server = make_server(tmp_path, **env)
    del server.env["WARREN_LOOP_CPU_BINDING"]
    return server


def publish_to_a_quorum_queue(url: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.queue_declare("bound", durable=True, arguments={"x-queue-type": "quorum"})
        publish_confirmed(channel, "bound", [b"x" * 1000] * 200)
    finally:
        connection.close()


def test_always_the_loop_is_bound_to_the_first_cpu_and_the_threads_it_starts_to_none(tmp_path):
    # a WAL of 64 KiB: the publishes roll it over, and the rollovers' workers write segments
    server = make_server(tmp_path, WARREN_LOOP_CPU_BINDING="always", WARREN_WAL_MAX_SIZE_BYTES="65536").start()
    try:
        publish_to_a_quorum_queue(server.url)   # the first WAL batch starts the writer thread
        pid = server.process.pid
        assert os.sched_getaffinity(pid) == {MACHINE_CPUS[0]}, "the loop's thread is not bound to the first CPU"
        writing = {tid: bytes_written(pid, tid) for tid in threads(pid) if tid != pid}
        writing = {tid: written for tid, written in writing.items() if written}
        assert len(writing) >= 2 and max(writing.values()) >= 200 * 1000, \
            f"not the WAL writer and a rollover's worker beside the loop (bytes written by thread: {writing})"
        assert {tid: os.sched_getaffinity(tid) for tid in writing} == {tid: set(MACHINE_CPUS) for tid in writing}, \
            "a thread the loop started kept its binding: it would take the loop's CPU"
        assert '"binding": "always"' in server.log()
    finally:
        server.stop()


def test_always_each_process_of_a_node_binds_its_loop_to_a_cpu_of_its_own(tmp_path):
    node = sharded_server(tmp_path)
    node.env["WARREN_LOOP_CPU_BINDING"] = "always"
    node.start()
    try:
        rows = sorted(node.shard_rows(), key=lambda row: row["shard"])
        assert [os.sched_getaffinity(row["pid"]) for row in rows] == [{MACHINE_CPUS[k]} for k in range(SHARDS)]
        assert os.sched_getaffinity(node.process.pid) == set(MACHINE_CPUS), "the supervisor is bound"
    finally:
        node.stop()


def assert_nothing_bound(pid: int) -> None:
    assert [os.sched_getaffinity(tid) for tid in threads(pid)] == [set(MACHINE_CPUS)] * len(threads(pid))


@pytest.mark.parametrize("binding", ["never", None])
def test_never_and_by_default_an_idle_loop_is_not_bound(tmp_path, binding):
    server = (make_server(tmp_path, WARREN_LOOP_CPU_BINDING=binding) if binding
              else server_with_the_default(tmp_path)).start()
    try:
        publish_to_a_quorum_queue(server.url)
        assert_nothing_bound(server.process.pid)
        assert ('"binding": "busy"' in server.log()) is (binding is None), "the binder ran, or did not"
    finally:
        server.stop()


def test_a_cluster_node_binds_nothing_unless_told(tmp_path):
    """Its nodes may share a machine, each binding its first loop to the same CPU."""
    ports = {"a@local": free_port(), "b@local": free_port()}   # b never starts
    members = json.dumps([{"name": name, "host": "127.0.0.1", "port": port} for name, port in ports.items()])
    server = server_with_the_default(
        tmp_path, WARREN_NODE_NAME="a@local", WARREN_CLUSTER_NODES=members, WARREN_CLUSTER_HOST="127.0.0.1",
        WARREN_CLUSTER_PORT=str(ports["a@local"]), WARREN_CLUSTER_SECRET="s3cret",
        WARREN_CLUSTER_STARTUP_CATCH_UP_SECONDS="0").start()
    try:
        assert_nothing_bound(server.process.pid)
        assert '"server.loop_binding"' not in server.log()
    finally:
        server.stop()
