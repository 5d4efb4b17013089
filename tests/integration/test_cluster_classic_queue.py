"""In a cluster, a durable classic queue is the queue machine on a Raft group of
one on the declaring node, reachable from every node."""
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
