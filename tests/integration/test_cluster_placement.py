"""Where queues live in a cluster: a durable classic queue is the queue machine on a
Raft group of one on the declaring node, reachable from every node; quorum queue
leaders follow x-queue-leader-locator."""
from __future__ import annotations

import pika

from tests.integration.quorum_cluster import Publisher, connect, queue_view, start_cluster, stop_all, wait_for


def test_a_durable_classic_queue_is_reachable_from_every_node(tmp_path):
    servers = start_cluster(tmp_path)
    try:
        with connect(servers["a@local"]) as connection:
            channel = connection.channel()
            channel.queue_declare("classic-here", durable=True)
            # exclusive and auto-delete queues stay on their node, as before
            local = channel.queue_declare("", exclusive=True).method.queue
        for node, server in servers.items():
            wait_for(lambda s=server: queue_view(s, "classic-here"), f"{node} to know classic-here")
        view = queue_view(servers["c@local"], "classic-here")
        assert (view["type"], view["members"], view["leader"]) == ("classic", ["a@local"], "a@local"), view
        assert queue_view(servers["b@local"], local) is None, "an exclusive queue was replicated"

        publisher = Publisher(servers["b@local"], "classic-here", 200, "c")
        publisher.run()
        assert publisher.error is None and len(publisher.confirmed) == 200, publisher.error
        received = []
        with connect(servers["c@local"]) as connection:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=20, global_qos=True)  # allowed: not a quorum queue
            for method, properties, body in channel.consume("classic-here", inactivity_timeout=20):
                assert method is not None, f"stalled after {len(received)} messages"
                assert properties.headers is None, "a classic queue's delivery carries x-delivery-count"
                received.append(body)
                channel.basic_ack(method.delivery_tag)
                if len(received) == 200:
                    break
            channel.cancel()
        assert received == [f"c:{n}".encode() for n in range(200)]
        with connect(servers["b@local"]) as connection:
            channel = connection.channel()
            channel.basic_publish("", "classic-here", b"last", pika.BasicProperties(delivery_mode=2))
            assert channel.queue_delete("classic-here").method.message_count in (0, 1)
        for node, server in servers.items():
            wait_for(lambda s=server: queue_view(s, "classic-here") is None, f"{node} to forget classic-here")
    finally:
        stop_all(servers)


def test_leader_locators_place_leaders(tmp_path):
    """client-local: the declaring node leads; balanced: leaders spread over the members."""
    servers = start_cluster(tmp_path)
    try:
        with connect(servers["b@local"]) as connection:
            channel = connection.channel()
            for i in range(6):
                channel.queue_declare(f"balanced-{i}", durable=True, arguments={
                    "x-queue-type": "quorum", "x-queue-leader-locator": "balanced"})
            channel.queue_declare("local", durable=True, arguments={"x-queue-type": "quorum"})
        leaders = {name: wait_for(lambda n=name: (queue_view(servers["a@local"], n) or {}).get("leader"),
                                  f"a leader for {name}")
                   for name in [f"balanced-{i}" for i in range(6)] + ["local"]}
        assert leaders.pop("local") == "b@local", "client-local did not put the leader on the declaring node"
        assert len(set(leaders.values())) >= 2, f"balanced put every leader on one node: {leaders}"
    finally:
        stop_all(servers)
