"""`kill -STOP` of a node over several processes pauses the node, as it does a node of one
process: its shards stop with their supervisor and go on with its SIGCONT
(broker/node/supervisor_pause.py); real processes."""
from __future__ import annotations

import signal

import pika
import pytest
from pika.adapters.utils.connection_workflow import AMQPConnectorStackTimeout

from tests.integration.pika_support import publish_confirmed
from tests.integration.quorum_cluster import wait_for
from tests.integration.test_node_processes import QUORUM, assert_no_shards_left, drain, sharded_server
from warren.broker.node.supervisor_pause import process_state

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def node(tmp_path):
    server = sharded_server(tmp_path).start()
    yield server
    server.process.send_signal(signal.SIGCONT)   # whatever the test left stopped
    server.stop()
    assert_no_shards_left(server)


def states(pids: list[int]) -> list[str | None]:
    return [process_state(pid) for pid in pids]


def test_stopping_the_supervisors_pid_stops_its_shards_and_its_sigcont_resumes_them(node):
    pids = [row["pid"] for row in node.shard_rows()]
    with pika.BlockingConnection(pika.URLParameters(node.url)) as connection:
        channel = connection.channel()
        channel.queue_declare("paused", durable=True, arguments=QUORUM)
        publish_confirmed(channel, "paused", [b"before"])
    node.process.send_signal(signal.SIGSTOP)   # the pid the node was started as, alone
    wait_for(lambda: states(pids) == ["T"] * len(pids), "every shard to stop with its supervisor", seconds=10)
    with pytest.raises(AMQPConnectorStackTimeout):   # the kernel accepts; nobody answers while the node is stopped
        pika.BlockingConnection(pika.URLParameters(node.url + "?connection_attempts=1&stack_timeout=2"))
    node.process.send_signal(signal.SIGCONT)
    wait_for(lambda: "T" not in states(pids), "every shard to go on with its supervisor", seconds=10)
    with pika.BlockingConnection(pika.URLParameters(node.url)) as connection:
        channel = connection.channel()
        publish_confirmed(channel, "paused", [b"after"])
        assert drain(channel, "paused", 2) == [b"before", b"after"]
    assert [row["pid"] for row in node.shard_rows()] == pids, "no shard was restarted"
