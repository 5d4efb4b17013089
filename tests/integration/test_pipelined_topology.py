"""Frames sent right behind a durable declare or bind, in the same write, before its reply.

A channel handles its methods in order: RabbitMQ's channel process blocks on
its metadata store while a durable queue, exchange or binding is made, and the
frames behind it wait in its mailbox. So a publish pipelined after a declare
(or a bind, nowait or not, as kombu sends them) is routed by it, and its
confirm comes after the declare-ok. Warren submits the change to the metadata
Raft group; until it is applied the connection holds that channel's frames.
Each case writes everything in one ``sendall`` so the broker reads the
publishes before the change can be applied.
"""
from __future__ import annotations

import pytest
from pamqp import commands as spec

from tests.integration.pika_raw_client import RawClient
from tests.integration.pika_support import connect, drain, message_count

COUNT = 4
QUEUE_KINDS = {"classic": {}, "quorum": {"x-queue-type": "quorum"}}


def _publishes(client: RawClient, exchange: str, routing_key: str, count: int = COUNT) -> bytes:
    return b"".join(client.publish_frames(1, spec.Basic.Publish(exchange=exchange, routing_key=routing_key),
                                          b"m%d" % i, spec.Basic.Properties(delivery_mode=2))[1]
                    for i in range(count))


def _confirming_client(server) -> RawClient:
    client = RawClient(server.amqp_port)
    client.handshake()
    client.open_channel()
    client.send(1, spec.Confirm.Select())
    client.expect(spec.Confirm.SelectOk)
    return client


def _acked(client: RawClient, count: int) -> None:
    acked = 0
    while acked < count:
        ack = client.expect(spec.Basic.Ack)
        acked = ack.delivery_tag if ack.multiple else acked + 1


@pytest.mark.parametrize("kind", QUEUE_KINDS)
def test_publishes_behind_a_queue_declare_are_routed_to_it_and_confirmed_after_declare_ok(server, name, kind):
    with _confirming_client(server) as client:
        declare = spec.Queue.Declare(queue=name, durable=True, arguments=QUEUE_KINDS[kind])
        client.sock.sendall(client.marshal(1, declare) + _publishes(client, "", name))
        first = client.expect(spec.Queue.DeclareOk)   # fails naming the Basic.Ack that overtook it
        assert first.queue == name
        _acked(client, COUNT)
    with connect(server) as connection:
        assert drain(connection.channel(), name) == [b"m%d" % i for i in range(COUNT)], \
            f"confirmed messages published behind the {kind} queue's declare were not in it"


def test_publishes_behind_nowait_declare_and_bindings_are_routed(server, name):
    """kombu's way: exchange, queue and binding declared nowait, then publish at once."""
    exchange = name + "-x"
    with _confirming_client(server) as client:
        client.sock.sendall(
            client.marshal(1,
                          spec.Exchange.Declare(exchange=exchange, exchange_type="direct", durable=True, nowait=True),
                          spec.Queue.Declare(queue=name, durable=True, nowait=True),
                          spec.Queue.Bind(queue=name, exchange=exchange, routing_key="k", nowait=True))
            + _publishes(client, exchange, "k"))
        _acked(client, COUNT)
    with connect(server) as connection:
        assert message_count(connection, name) == COUNT, "confirmed messages behind nowait topology were lost"


def test_publish_behind_a_queue_delete_is_unroutable(server, name):
    """The delete is applied before the publish behind it is routed: mandatory returns it."""
    with connect(server) as connection:
        connection.channel().queue_declare(name, durable=True)
    with _confirming_client(server) as client:
        client.sock.sendall(client.marshal(1, spec.Queue.Delete(queue=name))
                            + client.publish_frames(1, spec.Basic.Publish(exchange="", routing_key=name,
                                                                          mandatory=True), b"late")[1])
        client.expect(spec.Queue.DeleteOk)
        returned = client.expect(spec.Basic.Return)
        assert returned.reply_code == 312, f"expected NO_ROUTE, got {returned!r}"


def test_other_frames_of_the_channel_keep_their_order_behind_the_declare(server, name):
    """A basic.get behind the declare and a publish gets that message."""
    with _confirming_client(server) as client:
        client.sock.sendall(client.marshal(1, spec.Queue.Declare(queue=name, durable=True))
                            + _publishes(client, "", name, count=1)
                            + client.marshal(1, spec.Basic.Get(queue=name, no_ack=True)))
        client.expect(spec.Queue.DeclareOk)
        methods = set()
        while len(methods) < 2:   # the confirm may come either side of the get-ok and its content
            got = client.read_frame()
            assert got is not None, f"only {methods} came back"
            if isinstance(got[1], (spec.Basic.Ack, spec.Basic.GetOk, spec.Basic.GetEmpty)):
                methods.add(type(got[1]))
        assert methods == {spec.Basic.Ack, spec.Basic.GetOk}, f"expected the publish's ack and a get-ok: {methods}"


def test_a_connection_error_among_the_held_frames_closes_the_connection_as_it_would_unheld(server, name):
    """The frames behind the declare meet the same errors as if never held: a reused
    consumer tag is 530 NOT_ALLOWED on the connection, and the broker goes on."""
    with _confirming_client(server) as client:
        consume = spec.Basic.Consume(queue=name, consumer_tag="twice")
        client.sock.sendall(client.marshal(1, spec.Queue.Declare(queue=name, durable=True), consume, consume))
        client.expect(spec.Queue.DeclareOk)
        client.expect(spec.Basic.ConsumeOk)
        closed = client.expect(spec.Connection.Close)
        assert (closed.reply_code, closed.reply_text) == (530, "NOT_ALLOWED - attempt to reuse consumer tag 'twice'")
    with connect(server) as connection:
        assert message_count(connection, name) == 0
