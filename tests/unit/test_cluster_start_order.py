"""broker/node/cluster.py at start: a queue group may apply its recovered committed
entries before the metadata group re-applies the queue's declaration (an entry after
the metadata snapshot). The replica made by that declaration takes them then; it
started empty before (tests/sim, faults seed 186: a restarted member led with a
machine that had lost the queue's first messages and delivered a settled one again)."""
from __future__ import annotations

from tests.sim.disk import SimCommitter
from tests.sim.node import VHOST, SimBroker, settings_for
from warren.broker.node import metadata_effects as fx
from warren.broker.node.cluster import Cluster
from warren.broker.node.metadata import Metadata
from warren.broker.queues import queue_codec
from warren.broker.queues import queue_commands as qc
from warren.protocol.codec import EMPTY_PROPERTIES
from warren.raft.messages import Entry, EntryKind

GROUP = "q:/:q1:1"


def test_entries_applied_before_the_declaration_reach_the_replica_made_by_it(monkeypatch):
    broker = SimBroker(settings_for("n1", ["n1", "n2", "n3"]), SimCommitter(None, None))
    cluster = Cluster(broker, incarnation="i1")
    broker.cluster = cluster
    metadata = broker.metadata = Metadata(broker, cluster)
    cluster.runtime.groups[GROUP] = None   # recovered and hosted: its entries apply at the first turn
    monkeypatch.setattr(cluster.runtime, "add_group", lambda group, members, hosted_at=0: None)   # hosted already
    batch = qc.EnqueueBatch("n2/i1/7/1", 1, 0, [["", "q1", EMPTY_PROPERTIES, b"m1", None, 0],
                                                ["", "q1", EMPTY_PROPERTIES, b"m2", None, 0]])
    cluster.apply(GROUP, Entry(1, 1, EntryKind.NORMAL, queue_codec.encode(batch)))
    metadata.perform(fx.QueueDeclared(VHOST, "q1", {"x-queue-type": "quorum"}, GROUP, ("n1", "n2", "n3"), False), 5)
    queue = broker.vhosts[VHOST].queues["q1"]
    assert queue.message_count == 2
