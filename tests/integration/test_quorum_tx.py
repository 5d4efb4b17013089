"""Transactions on quorum queues: tx.commit-ok means what a confirm means.

commit-ok goes out only once every quorum queue the transaction published to
has applied its publishes, and applied its acks (committed on a majority), and
its persistent messages to classic queues are on disk. A publish a queue
refuses (x-overflow reject-publish) fails the commit as RabbitMQ does:
406 "partial tx completion", the rest of the transaction stays done.
"""
from __future__ import annotations

import threading

import pika
import pytest

from tests.integration.quorum_cluster import (
    FREEZABLE_QUEUE,
    api,
    connect,
    declare_everywhere,
    freeze_queue_follower,
    leader_of,
    queue_view,
    start_cluster,
    stop_all,
    thaw,
    wait_for,
)

QUORUM = {"x-queue-type": "quorum"}
PERSISTENT = pika.BasicProperties(delivery_mode=2)
# How long commit-ok must stay missing once the leader holds the transaction's
# commands: a commit of one node's own fsync takes milliseconds on this machine.
OBSERVE_SECONDS = 2.0


def test_tx_publish_and_ack_on_a_quorum_queue(server, name):
    with pika.BlockingConnection(pika.URLParameters(server.url)) as connection:
        channel = connection.channel()
        channel.queue_declare(name, durable=True, arguments=QUORUM)
        channel.tx_select()
        for number in range(20):
            channel.basic_publish("", name, b"m%d" % number, PERSISTENT)
        assert channel.queue_declare(name, passive=True).method.message_count == 0, "published before commit"
        channel.tx_commit()
        # commit-ok came after the queue applied every publish: all are there at once
        assert channel.queue_declare(name, passive=True).method.message_count == 20
        got = []
        for _ in range(20):
            method, _, body = channel.basic_get(name, auto_ack=False)
            assert method is not None, f"queue ran dry after {len(got)} of 20 messages"
            got.append((method.delivery_tag, body))
        assert [body for _, body in got] == [b"m%d" % n for n in range(20)]
        channel.basic_ack(got[-1][0], multiple=True)
        channel.tx_commit()
        view = queue_view_single(server, name)
        assert (view["messages_ready"], view["messages_unacked"]) == (0, 0), f"acks not applied at commit-ok: {view}"


def queue_view_single(server, name: str) -> dict:
    view = queue_view(server, name)
    assert view is not None, f"/api/queues does not list {name}"
    return view


def test_tx_publish_refused_by_reject_publish_fails_the_commit(server, name):
    with pika.BlockingConnection(pika.URLParameters(server.url)) as connection:
        channel = connection.channel()
        channel.queue_declare(name, durable=True, arguments={
            **QUORUM, "x-max-length": 1, "x-overflow": "reject-publish"})
        channel.tx_select()
        channel.basic_publish("", name, b"first", PERSISTENT)
        channel.basic_publish("", name, b"second", PERSISTENT)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.tx_commit()
        assert (closed.value.reply_code, closed.value.reply_text) == (
            406, "PRECONDITION_FAILED - partial tx completion")
        channel = connection.channel()
        method, _, body = channel.basic_get(name, auto_ack=True)
        assert body == b"first", "the accepted part of the transaction was lost"
        assert channel.queue_declare(name, passive=True).method.message_count == 0


class Committer(threading.Thread):
    """Runs tx.commit on a channel of its own thread's connection; `done` is set at commit-ok."""

    def __init__(self, work):
        super().__init__(daemon=True)
        self.work = work
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.work()
            self.done.set()
        except BaseException as error:  # noqa: BLE001 -- reported by the test
            self.error = error
            self.done.set()


def test_tx_commit_ok_waits_for_the_quorum(tmp_path):
    """With its follower frozen (a two-member queue) the leader cannot commit: commit-ok must
    not come, for a transaction's publishes nor for its acks; after SIGCONT it does."""
    servers = start_cluster(tmp_path)
    frozen: list[str] = []

    def freeze() -> None:
        frozen.extend(freeze_queue_follower(servers, "txq", keep=leader)[1])

    try:
        declare_everywhere(servers, "a@local", "txq", **FREEZABLE_QUEUE)
        leader = leader_of(servers, "txq")
        count = 10
        unacked: list[int] = []

        marker = "tx-marker"  # a transient classic queue: it lives on the leader's node only
        with connect(servers[leader]) as setup:
            setup.channel().queue_declare(marker, durable=False)

        # 1. publishes: the commit waits until the queue applied them
        def publish_in_tx() -> None:
            with connect(servers[leader]) as connection:
                channel = connection.channel()
                channel.tx_select()
                for number in range(count):
                    channel.basic_publish("", "txq", b"tx%d" % number, PERSISTENT)
                channel.tx_commit()

        freeze()
        committer = Committer(publish_in_tx)
        committer.start()
        wait_for(lambda: committer.done.is_set()
                 or api(servers[leader], "/api/overview")["quorum_enqueues_pending"] == count,
                 f"the leader to hold the transaction's {count} publishes, unapplied")
        assert not committer.done.wait(OBSERVE_SECONDS), (
            f"tx.commit-ok came although the queue could not commit (error: {committer.error!r})")
        thaw(servers, frozen)
        assert committer.done.wait(30), "no tx.commit-ok after the follower came back"
        assert committer.error is None, f"the transaction failed: {committer.error!r}"

        # 2. acks: the commit waits until the queue applied the settle
        consumer = connect(servers[leader])
        try:
            channel = consumer.channel()
            received = []
            for _ in range(count):
                method, _, body = channel.basic_get("txq", auto_ack=False)
                assert method is not None, f"txq ran dry after {len(received)} of {count}"
                received.append(body)
                unacked.append(method.delivery_tag)
            assert received == [b"tx%d" % n for n in range(count)], "the committed messages are not all there"
            # The leader counted its follower down in the first freeze: it routes its clients'
            # publishes again once it caught up with the metadata group (broker/node/metadata_fence.py),
            # which may take a new metadata leader's election. A confirmed publish waits for that.
            caught_up = consumer.channel()
            caught_up.confirm_delivery()
            caught_up.basic_publish("", marker, b"caught up")
            channel.tx_select()
            channel.basic_ack(unacked[-1], multiple=True)
            # published to a classic queue on the leader (no Raft, no fsync) in the same
            # transaction: seeing it there tells the commit has been processed
            channel.basic_publish("", marker, b"commit processed")

            freeze()
            committer = Committer(channel.tx_commit)
            committer.start()
            wait_for(lambda: committer.done.is_set()
                     or (queue_view(servers[leader], marker) or {}).get("messages_ready") == 2,
                     "the leader to process the ack transaction's commit")
            assert not committer.done.wait(OBSERVE_SECONDS), (
                f"tx.commit-ok came although the queue could not apply the acks (error: {committer.error!r})")
            thaw(servers, frozen)
            assert committer.done.wait(30), "no tx.commit-ok for the acks after the follower came back"
            assert committer.error is None, f"the transaction failed: {committer.error!r}"
        finally:
            thaw(servers, frozen)   # a frozen follower would leave the close unanswered
            consumer.close()
        # Had the acks not been applied, the channel's end would return the messages.
        for node, server in servers.items():
            view = wait_for(lambda s=server: (v := queue_view(s, "txq")) and v["messages_unacked"] == 0 and v,
                            f"{node} to see nothing checked out of txq")
            assert view["messages_ready"] == 0, f"the committed acks were lost: {node} sees {view}"
    finally:
        thaw(servers, frozen)
        stop_all(servers)
