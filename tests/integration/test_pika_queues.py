"""Queues over pika: declare rules, exclusivity, auto-delete, limits, dead-lettering."""
from __future__ import annotations

import asyncio

import pika
import pytest
from pamqp import commands as spec
from pika.exceptions import ChannelClosedByBroker, NackError

from tests.integration.pika_support import (  # noqa: F401
    assert_closed_by,
    cleanup,
    connect,
    connection,
    drain,
    get_one,
    message_count,
    pump_until,
    sync,
    wait_queue_gone,
)
from tests.integration.raw_async_amqp import RawClient


def test_server_named_queue(connection, cleanup):
    channel = connection.channel()
    declared = channel.queue_declare("", exclusive=True)
    queue = cleanup.queue(declared.method.queue)
    assert queue.startswith("amq.gen-"), f"server-named queue {queue!r} lacks the amq.gen- prefix"
    assert declared.method.message_count == 0
    assert declared.method.consumer_count == 0
    channel.basic_publish("", queue, b"x")
    assert get_one(channel, queue, auto_ack=True)[2] == b"x"


def test_passive_declare_of_missing_queue_is_404(connection, name):
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.queue_declare(name, passive=True)
    assert_closed_by(excinfo.value, 404, f"no queue '{name}' in vhost '/'")


def test_amq_prefix_is_reserved_for_queues(connection):
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.queue_declare("amq.warren-test")
    assert_closed_by(excinfo.value, 403, "reserved prefix 'amq.*'")


def test_declare_ok_reports_counts(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    for i in range(3):
        channel.basic_publish("", name, b"%d" % i)
    sync(channel)
    declared = channel.queue_declare(name, passive=True)
    assert declared.method.message_count == 3
    assert declared.method.consumer_count == 0


@pytest.mark.parametrize("operation", ["declare", "passive", "get", "consume", "purge", "delete", "bind"])
def test_exclusive_queue_is_locked_to_its_connection(server, name, cleanup, operation):
    with connect(server) as owner, connect(server) as other:
        owner.channel().queue_declare(cleanup.queue(name), exclusive=True)
        channel = other.channel()
        actions = {
            "declare": lambda: channel.queue_declare(name, exclusive=True),
            "passive": lambda: channel.queue_declare(name, passive=True),
            "get": lambda: channel.basic_get(name),
            "consume": lambda: channel.basic_consume(name, lambda *a: None),
            "purge": lambda: channel.queue_purge(name),
            "delete": lambda: channel.queue_delete(name),
            "bind": lambda: channel.queue_bind(name, "amq.fanout"),
        }
        with pytest.raises(ChannelClosedByBroker) as excinfo:
            actions[operation]()
        assert_closed_by(excinfo.value, 405, f"cannot obtain exclusive access to locked queue '{name}'")


def test_exclusive_queue_deleted_when_its_connection_closes(server, connection, name):
    with connect(server) as owner:
        owner.channel().queue_declare(name, exclusive=True)
        channel = connection.channel()
        with pytest.raises(ChannelClosedByBroker) as excinfo:
            channel.queue_declare(name, passive=True)
        assert excinfo.value.reply_code == 405
    wait_queue_gone(connection, name)


@pytest.mark.parametrize("closed_by", ["client", "server"])
def test_exclusive_queue_is_gone_once_close_ok_is_exchanged(server, connection, name, cleanup, closed_by):
    """RabbitMQ deletes a connection's exclusive queues before it sends close-ok (client's close)
    or connection.close (its own): a client that reconnects and declares the same exclusive
    queue at once must not meet 405 RESOURCE_LOCKED while its old socket is still open (aio-pika's
    robust connections do exactly this). The old socket here stays open throughout."""
    async def close_but_keep_the_socket() -> RawClient:
        owner = await RawClient.connect(server.amqp_port)
        await owner.handshake()
        await owner.send_frame(1, spec.Channel.Open())
        await owner.expect(spec.Channel.OpenOk)
        await owner.send_frame(1, spec.Queue.Declare(queue=name, exclusive=True))
        await owner.expect(spec.Queue.DeclareOk)
        if closed_by == "client":
            await owner.send_frame(0, spec.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
            await owner.expect(spec.Connection.CloseOk)
        else:   # a method channel 0 cannot take: the server closes the connection (504, as RabbitMQ)
            await owner.send_frame(0, spec.Basic.Get(queue=name))
            await owner.expect(spec.Connection.Close)
        return owner

    loop = asyncio.new_event_loop()
    owner = None
    try:
        owner = loop.run_until_complete(close_but_keep_the_socket())
        channel = connection.channel()
        with pytest.raises(ChannelClosedByBroker) as excinfo:
            channel.queue_declare(name, passive=True)
        assert excinfo.value.reply_code == 404, \
            f"the old connection's exclusive queue outlived its close ({closed_by}): {excinfo.value!r}"
        declared = connection.channel().queue_declare(cleanup.queue(name), exclusive=True)
        assert declared.method.queue == name
    finally:
        if owner is not None:
            loop.run_until_complete(owner.close())
        loop.close()


def test_auto_delete_queue_deleted_after_last_consumer_cancels(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name), auto_delete=True)
    first = channel.basic_consume(name, lambda *a: None)
    second = channel.basic_consume(name, lambda *a: None)
    channel.basic_cancel(first)
    assert message_count(connection, name) == 0  # still there: one consumer left
    channel.basic_cancel(second)
    wait_queue_gone(connection, name)


def test_auto_delete_queue_without_consumers_stays(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name), auto_delete=True)
    channel.basic_publish("", name, b"x")
    sync(channel)
    assert message_count(connection, name) == 1


def test_redeclare_with_different_arguments_is_406(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name), arguments={"x-max-length": 10})
    channel.queue_declare(name, arguments={"x-max-length": 10})
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.queue_declare(name, arguments={"x-max-length": 20})
    assert_closed_by(excinfo.value, 406, f"inequivalent arg 'x-max-length' for queue '{name}' in vhost '/'")


def test_redeclare_with_different_durable_is_406(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name), durable=False)
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.queue_declare(name, durable=True)
    assert_closed_by(excinfo.value, 406, "inequivalent arg 'durable'")


@pytest.mark.parametrize("argument,value,problem", [   # RabbitMQ 3.10.8's texts, measured beside it
    ("x-max-length", "ten", '"expected integer, got longstr"'),
    ("x-max-length", -1, "{value_negative,-1}"),
    ("x-message-ttl", "soon", '"expected integer, got longstr"'),
    ("x-expires", 0, "{value_zero,0}"),
    ("x-max-priority", 300, "{max_value_exceeded,300}"),
    ("x-overflow", "explode", "invalid_overflow"),
    ("x-overflow", 5, "{unacceptable_type,signedint}"),
    ("x-queue-type", "stack", "\"unsupported queue type 'stack'\""),
    ("x-queue-mode", "eager", "\"unsupported queue mode 'eager'\""),
    ("x-single-active-consumer", "yes", "{unacceptable_type,longstr}"),
])
def test_bad_argument_value_is_406_naming_it(connection, name, argument, value, problem):
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.queue_declare(name, arguments={argument: value})
    assert (excinfo.value.reply_code, excinfo.value.reply_text) == (
        406, f"PRECONDITION_FAILED - invalid arg '{argument}' for queue '{name}' in vhost '/': {problem}")
    assert connection.is_open


def test_a_dead_letter_exchange_that_is_not_a_string_is_406_in_rabbitmqs_words(connection, name):
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        connection.channel().queue_declare(name, arguments={"x-dead-letter-exchange": 5})
    assert (excinfo.value.reply_code, excinfo.value.reply_text) == (
        406, f"PRECONDITION_FAILED - invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue '{name}' "
             "in vhost '/'")


@pytest.mark.parametrize("argument,value,queue_type", [
    ("x-max-priority", 5, "quorum"),
    ("x-queue-mode", "lazy", "quorum"),
    ("x-max-age", "1D", "quorum"),
    ("x-delivery-limit", 3, "classic"),
    ("x-quorum-initial-group-size", 3, "classic"),
    ("x-dead-letter-strategy", "at-least-once", "classic"),
])
def test_an_argument_the_queue_type_does_not_take_is_406(connection, name, argument, value, queue_type):
    """RabbitMQ 3.10's texts, measured beside it; the type is checked before the value
    and before the type's properties, and only for a new queue."""
    arguments = {argument: value, **({"x-queue-type": "quorum"} if queue_type == "quorum" else {})}
    module = {"quorum": "rabbit_quorum_queue", "classic": "rabbit_classic_queue"}[queue_type]
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        connection.channel().queue_declare(name, durable=True, arguments=arguments)
    assert (excinfo.value.reply_code, excinfo.value.reply_text) == (
        406, f"PRECONDITION_FAILED - invalid arg '{argument}' for queue '{name}' in vhost '/' "
             f"of queue type {module}")


@pytest.mark.parametrize("argument,value,queue_type", [
    ("x-delivery-limit", 3, "classic"),
    ("x-dead-letter-strategy", "at-most-once", "classic"),
    ("x-max-priority", 3, "quorum"),
])
def test_a_redeclare_does_not_compare_an_argument_the_type_does_not_take(connection, name, cleanup, argument,
                                                                         value, queue_type):
    """RabbitMQ compares only its type's arguments on redeclare (measured beside 3.10.8)."""
    typed = {"x-queue-type": "quorum"} if queue_type == "quorum" else {}
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name), durable=True, arguments=typed)
    channel.queue_declare(name, durable=True, arguments={**typed, argument: value})
    assert connection.is_open


def test_unknown_x_arguments_are_accepted(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name), arguments={"x-warren-custom": "one", "plain": 1})
    channel.queue_declare(name, arguments={"x-warren-custom": "two"})  # not compared on redeclare
    channel.basic_publish("", name, b"x")
    assert get_one(channel, name, auto_ack=True)[2] == b"x"


def test_purge_returns_the_count(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    for i in range(5):
        channel.basic_publish("", name, b"%d" % i)
    purged = channel.queue_purge(name)
    assert purged.method.message_count == 5
    assert message_count(connection, name) == 0


def test_delete_if_unused_with_a_consumer_is_406(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    channel.basic_consume(name, lambda *a: None)
    other = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        other.queue_delete(name, if_unused=True)
    assert_closed_by(excinfo.value, 406, f"queue '{name}' in vhost '/' in use")


def test_delete_if_empty_with_messages_is_406(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    channel.basic_publish("", name, b"x")
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.queue_delete(name, if_empty=True)
    assert_closed_by(excinfo.value, 406, f"queue '{name}' in vhost '/' is not empty")


def test_delete_returns_the_count(connection, name):
    channel = connection.channel()
    channel.queue_declare(name)
    channel.basic_publish("", name, b"1")
    channel.basic_publish("", name, b"2")
    deleted = channel.queue_delete(name, if_unused=True, if_empty=False)
    assert deleted.method.message_count == 2
    wait_queue_gone(connection, name)


def test_delete_missing_queue_succeeds(connection, name):
    channel = connection.channel()
    deleted = channel.queue_delete(name)
    assert deleted.method.message_count == 0
    assert channel.is_open


def test_bind_and_unbind(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    channel.queue_bind(name, "amq.direct", routing_key=name)
    channel.basic_publish("amq.direct", name, b"bound")
    assert get_one(channel, name, auto_ack=True)[2] == b"bound"
    channel.queue_unbind(name, "amq.direct", routing_key=name)
    channel.basic_publish("amq.direct", name, b"unbound")
    sync(channel)
    assert drain(channel, name) == []


def test_bind_to_missing_exchange_is_404(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.queue_bind(name, name + "-missing")
    assert_closed_by(excinfo.value, 404, f"no exchange '{name}-missing' in vhost '/'")


def test_bind_missing_queue_is_404(connection, name):
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.queue_bind(name, "amq.direct")
    assert_closed_by(excinfo.value, 404, f"no queue '{name}' in vhost '/'")


def test_max_length_drop_head(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name), arguments={"x-max-length": 2})
    for body in (b"1", b"2", b"3"):
        channel.basic_publish("", name, body)
    sync(channel)
    assert drain(channel, name) == [b"2", b"3"]


def test_max_length_reject_publish_nacks_under_confirms(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name), arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    channel.confirm_delivery()
    channel.basic_publish("", name, b"kept")
    with pytest.raises(NackError):
        channel.basic_publish("", name, b"refused")
    assert drain(channel, name) == [b"kept"]
    channel.basic_publish("", name, b"room again")  # acked: no exception
    assert drain(channel, name) == [b"room again"]


def _dead_letter_setup(channel, name, cleanup) -> tuple[str, str]:
    dlx, dead = cleanup.exchange(name + "-dlx"), cleanup.queue(name + "-dead")
    channel.exchange_declare(dlx, "fanout")
    channel.queue_declare(dead)
    channel.queue_bind(dead, dlx)
    channel.queue_declare(cleanup.queue(name), arguments={"x-dead-letter-exchange": dlx})
    return dlx, dead


def test_rejected_message_is_dead_lettered_once_with_x_death(connection, name, cleanup):
    channel = connection.channel()
    _, dead = _dead_letter_setup(channel, name, cleanup)
    channel.basic_publish("", name, b"doomed", pika.BasicProperties(headers={"keep": "me"}))
    method, _, _ = get_one(channel, name)
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, properties, body = get_one(channel, dead, auto_ack=True)
    assert body == b"doomed"
    assert drain(channel, dead) == [], "the rejected message was dead-lettered more than once"
    assert drain(channel, name) == []
    headers = properties.headers
    assert headers.get("keep") == "me", f"original headers lost: {headers}"
    deaths = headers.get("x-death")
    assert isinstance(deaths, list) and len(deaths) == 1, f"expected one x-death entry, got {deaths!r}"
    death = deaths[0]
    assert death.get("count") == 1, death
    assert death.get("reason") == "rejected", death
    assert death.get("queue") == name, death
    assert death.get("exchange") == "", death
    assert death.get("routing-keys") == [name], death
    assert headers.get("x-first-death-reason") == "rejected", headers
    assert headers.get("x-first-death-queue") == name, headers


def test_x_death_entry_has_a_time(connection, name, cleanup):
    """RabbitMQ stamps every x-death entry with 'time' (an AMQP timestamp)."""
    channel = connection.channel()
    _, dead = _dead_letter_setup(channel, name, cleanup)
    channel.basic_publish("", name, b"doomed")
    method, _, _ = get_one(channel, name)
    channel.basic_reject(method.delivery_tag, requeue=False)
    _, properties, _ = get_one(channel, dead, auto_ack=True)
    death = properties.headers["x-death"][0]
    assert "time" in death, f"x-death entry has no 'time': {death}"


def test_nack_multiple_without_requeue_dead_letters_each_once(connection, name, cleanup):
    channel = connection.channel()
    _, dead = _dead_letter_setup(channel, name, cleanup)
    for i in range(3):
        channel.basic_publish("", name, b"%d" % i)
    tags = [get_one(channel, name)[0].delivery_tag for _ in range(3)]
    channel.basic_nack(tags[-1], multiple=True, requeue=False)
    sync(channel)
    assert sorted(drain(channel, dead)) == [b"0", b"1", b"2"]


def test_requeued_reject_is_not_dead_lettered(connection, name, cleanup):
    channel = connection.channel()
    _, dead = _dead_letter_setup(channel, name, cleanup)
    channel.basic_publish("", name, b"again")
    method, _, _ = get_one(channel, name)
    channel.basic_reject(method.delivery_tag, requeue=True)
    sync(channel)
    assert drain(channel, dead) == []
    assert drain(channel, name) == [b"again"]


@pytest.mark.parametrize("exclusive,durable,auto_delete,prop", [
    (True, True, False, "exclusive"),
    (False, False, False, "non-durable"),
    (False, True, True, "auto-delete"),
])
def test_quorum_queue_property_rules(connection, name, exclusive, durable, auto_delete, prop):
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.queue_declare(name, durable=durable, exclusive=exclusive, auto_delete=auto_delete,
                              arguments={"x-queue-type": "quorum"})
    assert_closed_by(excinfo.value, 406, f"invalid property '{prop}'")


def test_a_redeclare_without_a_type_of_a_quorum_queue_is_406_as_rabbitmq(connection, name, cleanup):
    """RabbitMQ 3.10 compares x-queue-type like any argument: none is not 'quorum'."""
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name), durable=True, arguments={"x-queue-type": "quorum"})
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.queue_declare(name, durable=True)
    assert (excinfo.value.reply_code, excinfo.value.reply_text) == (
        406, f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '{name}' in vhost '/': "
             "received none but current is the value 'quorum' of type 'longstr'")
    channel = connection.channel()
    channel.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})   # the same type: fine
    channel.queue_declare(name, passive=True)                                          # passive: no check


def test_quorum_queue_durable_declare_works(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name), durable=True, arguments={"x-queue-type": "quorum"})
    channel.basic_publish("", name, b"q")
    assert get_one(channel, name, auto_ack=True)[2] == b"q"
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.queue_declare(name, durable=True, arguments={"x-queue-type": "classic"})
    assert_closed_by(excinfo.value, 406, "inequivalent arg 'x-queue-type'")


def test_dead_letter_routing_key_override(connection, name, cleanup):
    channel = connection.channel()
    dlx, dead = cleanup.exchange(name + "-dlx"), cleanup.queue(name + "-dead")
    channel.exchange_declare(dlx, "direct")
    channel.queue_declare(dead)
    channel.queue_bind(dead, dlx, "graveyard")
    channel.queue_declare(cleanup.queue(name), arguments={"x-dead-letter-exchange": dlx,
                                                          "x-dead-letter-routing-key": "graveyard"})
    channel.basic_publish("", name, b"x")
    method, _, _ = get_one(channel, name)
    channel.basic_nack(method.delivery_tag, requeue=False)
    method, properties, body = get_one(channel, dead, auto_ack=True)
    assert body == b"x"
    assert method.routing_key == "graveyard"
    assert properties.headers["x-death"][0]["routing-keys"] == [name]


def test_drop_head_overflow_dead_letters_with_reason_maxlen(connection, name, cleanup):
    channel = connection.channel()
    dlx, dead = cleanup.exchange(name + "-dlx"), cleanup.queue(name + "-dead")
    channel.exchange_declare(dlx, "fanout")
    channel.queue_declare(dead)
    channel.queue_bind(dead, dlx)
    channel.queue_declare(cleanup.queue(name), arguments={"x-max-length": 1, "x-dead-letter-exchange": dlx})
    channel.basic_publish("", name, b"old")
    channel.basic_publish("", name, b"new")
    _, properties, body = get_one(channel, dead, auto_ack=True)
    assert body == b"old"
    assert properties.headers["x-death"][0]["reason"] == "maxlen"
    assert drain(channel, name) == [b"new"]


def test_reject_publish_dlx_dead_letters_the_refused_message(connection, name, cleanup):
    channel = connection.channel()
    dlx, dead = cleanup.exchange(name + "-dlx"), cleanup.queue(name + "-dead")
    channel.exchange_declare(dlx, "fanout")
    channel.queue_declare(dead)
    channel.queue_bind(dead, dlx)
    channel.queue_declare(cleanup.queue(name), arguments={"x-max-length": 1, "x-overflow": "reject-publish-dlx",
                                                          "x-dead-letter-exchange": dlx})
    channel.confirm_delivery()
    channel.basic_publish("", name, b"kept")
    with pytest.raises(NackError):
        channel.basic_publish("", name, b"refused")
    assert drain(channel, name) == [b"kept"]
    _, properties, body = get_one(channel, dead, auto_ack=True)
    assert body == b"refused"
    assert properties.headers["x-death"][0]["reason"] == "maxlen"


def test_binding_to_the_default_exchange_is_403(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    with pytest.raises(ChannelClosedByBroker) as excinfo:
        channel.queue_bind(name, "", routing_key="other")
    assert_closed_by(excinfo.value, 403, "operation not permitted on the default exchange")


def test_unbind_of_a_missing_binding_succeeds(connection, name, cleanup):
    channel = connection.channel()
    channel.queue_declare(cleanup.queue(name))
    channel.queue_unbind(name, "amq.direct", routing_key="never-bound")
    assert channel.is_open
