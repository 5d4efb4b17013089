"""Exchanges over pika: declare rules, deletion, and routing by every type."""
from __future__ import annotations

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from tests.integration.pika_support import (  # noqa: F401
    assert_closed_by,
    cleanup,
    connection,
    drain,
    get_one,
    sync,
)

BUILT_IN = (("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"),
            ("amq.headers", "headers"), ("amq.match", "headers"))


@pytest.mark.parametrize("exchange_type", ["direct", "fanout", "topic", "headers"])
def test_declare_each_type_then_passive(connection, name, cleanup, exchange_type):
    channel = connection.channel()
    channel.exchange_declare(cleanup.exchange(name), exchange_type)
    channel.exchange_declare(name, exchange_type)  # equivalent redeclare is fine
    channel.exchange_declare(name, passive=True)


def test_passive_declare_of_missing_exchange_is_404(connection, name):
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.exchange_declare(name, passive=True)
    assert_closed_by(excinfo.value, 404, f"no exchange '{name}' in vhost '/'")
    assert connection.is_open, "a 404 is a channel error, the connection must stay open"


def test_amq_prefix_is_reserved(connection):
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.exchange_declare("amq.foo-warren-test", "direct")
    assert_closed_by(excinfo.value, 403, "reserved prefix 'amq.*'")


def test_declaring_the_default_exchange_is_refused(connection):
    """RabbitMQ: 403 'ACCESS_REFUSED - operation not permitted on the default exchange'."""
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.exchange_declare("", "direct")
    assert_closed_by(excinfo.value, 403, "operation not permitted on the default exchange")


def test_redeclare_with_another_type_is_406(connection, name, cleanup):
    channel = connection.channel()
    channel.exchange_declare(cleanup.exchange(name), "direct")
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.exchange_declare(name, "fanout")
    assert_closed_by(excinfo.value, 406, "inequivalent arg 'type'")


def test_redeclare_with_another_alternate_exchange_is_406(connection, name, cleanup):
    """rabbit_exchange:assert_args_equivalence compares alternate-exchange (only it)."""
    channel = connection.channel()
    channel.exchange_declare(cleanup.exchange(name), "direct", arguments={"other": 1})
    channel.exchange_declare(name, "direct", arguments={"other": 2})   # not compared
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.exchange_declare(name, "direct", arguments={"alternate-exchange": "elsewhere"})
    assert (excinfo.value.reply_code, excinfo.value.reply_text) == (
        406, f"PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange '{name}' in vhost '/': "
             "received the value 'elsewhere' of type 'longstr' but current is none")


def test_deleting_a_system_exchange_is_403_with_rabbitmqs_text(connection):
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        connection.channel().exchange_delete("amq.direct")
    assert (excinfo.value.reply_code, excinfo.value.reply_text) == (
        403, "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed")


def test_redeclare_with_other_durable_is_406(connection, name, cleanup):
    channel = connection.channel()
    channel.exchange_declare(cleanup.exchange(name), "direct", durable=False)
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.exchange_declare(name, "direct", durable=True)
    assert_closed_by(excinfo.value, 406, "inequivalent arg 'durable'")


def test_unknown_exchange_type_closes_the_channel_with_406(connection, name):
    """As RabbitMQ since 2024 (rabbitmq-server#11214, in 3.12.x, 3.13 and 4.x:
    rabbit_exchange:check_type's precondition_failed; 3.10 closed the connection with 503),
    which pika 1.4.4's own acceptance test (TestInvalidExchangeTypeRaisesConnectionClosed)
    holds it to: one channel's mistake no longer takes the connection's other channels."""
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.exchange_declare(name, "x-no-such-type-warren")
    assert_closed_by(excinfo.value, 406, "PRECONDITION_FAILED - unknown exchange type 'x-no-such-type-warren'")
    assert connection.is_open and connection.channel().is_open


def test_delete_if_unused_with_bindings_is_406(connection, name, cleanup):
    channel = connection.channel()
    channel.exchange_declare(cleanup.exchange(name), "direct")
    channel.queue_declare(cleanup.queue(name))
    channel.queue_bind(name, name, "k")
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.exchange_delete(name, if_unused=True)
    assert_closed_by(excinfo.value, 406, f"exchange '{name}' in vhost '/' in use")
    channel = connection.channel()
    channel.exchange_declare(name, passive=True)


def test_delete_if_unused_ignores_bindings_to_it(connection, name, cleanup):
    """RabbitMQ's if_unused looks at bindings *from* the exchange only (rabbit_binding:has_for_source)."""
    channel = connection.channel()
    source = cleanup.exchange(name + "-src")
    channel.exchange_declare(source, "fanout")
    channel.exchange_declare(cleanup.exchange(name), "fanout")
    channel.exchange_bind(destination=name, source=source)
    channel.exchange_delete(name, if_unused=True)
    with pytest.raises(ChannelClosedByBroker):
        channel.exchange_declare(name, passive=True)


def test_delete_if_unused_without_bindings_succeeds(connection, name):
    channel = connection.channel()
    channel.exchange_declare(name, "topic")
    channel.exchange_delete(name, if_unused=True)
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.exchange_declare(name, passive=True)
    assert excinfo.value.reply_code == 404


def test_delete_missing_exchange_succeeds(connection, name):
    channel = connection.channel()
    channel.exchange_delete(name)
    assert channel.is_open


def test_built_in_exchanges_exist(connection):
    channel = connection.channel()
    for exchange, exchange_type in BUILT_IN:
        channel.exchange_declare(exchange, passive=True)
        channel.exchange_declare(exchange, exchange_type, durable=True)  # equivalent redeclare allowed


def test_publish_to_missing_exchange_is_404(connection, name):
    channel = connection.channel()
    channel.basic_publish(name, "k", b"x")
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        sync(channel)
    assert_closed_by(excinfo.value, 404, f"no exchange '{name}' in vhost '/'")


def test_exchange_to_exchange_binding_routes(connection, name, cleanup):
    channel = connection.channel()
    upstream, downstream = cleanup.exchange(name + "-up"), cleanup.exchange(name + "-down")
    channel.exchange_declare(upstream, "direct")
    channel.exchange_declare(downstream, "fanout")
    channel.exchange_bind(destination=downstream, source=upstream, routing_key="go")
    channel.queue_declare(cleanup.queue(name))
    channel.queue_bind(name, downstream)
    channel.basic_publish(upstream, "go", b"routed")
    channel.basic_publish(upstream, "stop", b"not routed")
    assert get_one(channel, name, auto_ack=True)[2] == b"routed"
    assert drain(channel, name) == []
    channel.exchange_unbind(destination=downstream, source=upstream, routing_key="go")
    channel.basic_publish(upstream, "go", b"after unbind")
    sync(channel)
    assert drain(channel, name) == []


def test_alternate_exchange_receives_unroutable(connection, name, cleanup):
    channel = connection.channel()
    alternate = cleanup.exchange(name + "-ae")
    channel.exchange_declare(alternate, "fanout")
    channel.queue_declare(cleanup.queue(name + "-unrouted"))
    channel.queue_bind(name + "-unrouted", alternate)
    channel.exchange_declare(cleanup.exchange(name), "direct", arguments={"alternate-exchange": alternate})
    channel.queue_declare(cleanup.queue(name + "-routed"))
    channel.queue_bind(name + "-routed", name, "known")
    returned = []
    channel.add_on_return_callback(lambda *args: returned.append(args))
    channel.basic_publish(name, "known", b"a", mandatory=True)
    channel.basic_publish(name, "unknown", b"b", mandatory=True)
    assert get_one(channel, name + "-routed", auto_ack=True)[2] == b"a"
    assert get_one(channel, name + "-unrouted", auto_ack=True)[2] == b"b"
    assert drain(channel, name + "-routed") == []
    assert drain(channel, name + "-unrouted") == []
    connection.process_data_events(time_limit=0)
    assert returned == [], "a message the alternate exchange took must not be returned as unroutable"


def test_internal_exchange_cannot_be_published_to(connection, name, cleanup):
    channel = connection.channel()
    channel.exchange_declare(cleanup.exchange(name), "fanout", internal=True)
    channel.basic_publish(name, "", b"x")
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        sync(channel)
    assert_closed_by(excinfo.value, 403, f"cannot publish to internal exchange '{name}' in vhost '/'")


def test_internal_exchange_routes_from_another_exchange(connection, name, cleanup):
    channel = connection.channel()
    channel.exchange_declare(cleanup.exchange(name + "-internal"), "fanout", internal=True)
    channel.exchange_declare(cleanup.exchange(name + "-front"), "fanout")
    channel.exchange_bind(destination=name + "-internal", source=name + "-front")
    channel.queue_declare(cleanup.queue(name))
    channel.queue_bind(name, name + "-internal")
    channel.basic_publish(name + "-front", "", b"via internal")
    assert get_one(channel, name, auto_ack=True)[2] == b"via internal"


def test_topic_wildcards(connection, name, cleanup):
    channel = connection.channel()
    patterns = {"star": "a.*", "hash": "a.#", "all": "#", "middle": "*.b.*", "exact": "a.b"}
    for suffix, pattern in patterns.items():
        queue = cleanup.queue(f"{name}-{suffix}")
        channel.queue_declare(queue)
        channel.queue_bind(queue, "amq.topic", pattern)
    keys = ["a", "a.b", "a.b.c", "x.b.y", "b", ""]
    for key in keys:
        channel.basic_publish("amq.topic", key, key.encode() or b"<empty>")
    sync(channel)
    got = {suffix: drain(channel, f"{name}-{suffix}") for suffix in patterns}
    assert got == {
        "star": [b"a.b"],
        "hash": [b"a", b"a.b", b"a.b.c"],
        "all": [b"a", b"a.b", b"a.b.c", b"x.b.y", b"b", b"<empty>"],
        "middle": [b"a.b.c", b"x.b.y"],
        "exact": [b"a.b"],
    }


def test_headers_exchange_x_match_all_and_any(connection, name, cleanup):
    channel = connection.channel()
    channel.exchange_declare(cleanup.exchange(name), "headers")
    for mode in ("all", "any"):
        queue = cleanup.queue(f"{name}-{mode}")
        channel.queue_declare(queue)
        channel.queue_bind(queue, name, arguments={"x-match": mode, "format": "pdf", "type": "report"})
    for body, headers in ((b"both", {"format": "pdf", "type": "report"}),
                          (b"one", {"format": "pdf"}),
                          (b"wrong", {"format": "zip", "type": "log"}),
                          (b"extra", {"format": "pdf", "type": "report", "other": 1}),
                          (b"none", None)):
        channel.basic_publish(name, "ignored", body, pika.BasicProperties(headers=headers))
    sync(channel)
    assert drain(channel, f"{name}-all") == [b"both", b"extra"]
    assert drain(channel, f"{name}-any") == [b"both", b"one", b"extra"]


def test_amq_match_is_a_headers_exchange(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    channel.queue_bind(name, "amq.match", arguments={"x-match": "all", "k": name})
    channel.basic_publish("amq.match", "", b"hit", pika.BasicProperties(headers={"k": name}))
    channel.basic_publish("amq.match", "", b"miss", pika.BasicProperties(headers={"k": "other"}))
    assert get_one(channel, name, auto_ack=True)[2] == b"hit"
    assert drain(channel, name) == []


def test_a_transient_exchange_binds_again_to_a_durable_queue_declared_again(connection, name, cleanup):
    """The binding of a transient exchange is the node's own; the durable queue's deletion (the
    metadata group's) takes it: a bind to the queue declared again is a new binding and routes."""
    channel = connection.channel()
    exchange = cleanup.exchange(name + "-tx")
    channel.exchange_declare(exchange, "direct", durable=False)
    for attempt in ("first", "again"):
        channel.queue_declare(cleanup.queue(name), durable=True)
        channel.queue_bind(name, exchange, routing_key="k")
        channel.basic_publish(exchange, "k", attempt.encode())
        assert get_one(channel, name, auto_ack=True)[2] == attempt.encode(), \
            f"a publish to the transient exchange did not reach the queue declared {attempt}"
        channel.queue_delete(name)


def test_deleting_an_exclusive_queue_auto_deletes_its_transient_source_and_keeps_a_shared_one(connection, name,
                                                                                              cleanup):
    channel = connection.channel()
    transient, shared = cleanup.exchange(name + "-tx"), cleanup.exchange(name + "-dx")
    channel.exchange_declare(transient, "fanout", durable=False, auto_delete=True)
    channel.exchange_declare(shared, "fanout", durable=True, auto_delete=True)
    channel.queue_declare(cleanup.queue(name + "-kept"), durable=True)
    channel.queue_bind(name + "-kept", shared)
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue, transient)
    channel.queue_bind(queue, shared)
    channel.queue_delete(queue)
    channel.exchange_declare(shared, passive=True)   # a shared binding is left: it stays
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.exchange_declare(transient, passive=True)
    assert_closed_by(excinfo.value, 404, f"no exchange '{transient}' in vhost '/'")
