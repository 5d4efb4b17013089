"""A deleted queue and a closed connection are freed at once, by reference counting.

The node spaces its cyclic collections far apart (broker/node/gc_tuning.py: a full
one only after 100 middle ones, minutes under load), so whatever a reference cycle
holds stays in memory until then, and the collection that frees it stops the node
for as long as it takes to walk it (68 ms for a deleted queue of 1.1M messages).
A queue's shell, its client, route and replica, and a connection and its parts,
must therefore form no cycle: the last reference dropped frees them.

Real broker in this process (its loop is the test's), real sockets, aio-pika; the
cyclic collector is off for the whole test, so only reference counting frees.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref
from collections.abc import AsyncIterator

import aio_pika
import pytest

from tests.integration.test_raft_runtime import until
from warren.broker.amqp.connection import AMQPConnection
from warren.broker.node.broker import Broker
from warren.config.settings import Settings

pytestmark = pytest.mark.timeout(60)

MESSAGES = 300
SETTLE_SECONDS = 10.0


@contextlib.contextmanager
def cyclic_collector_off():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextlib.asynccontextmanager
async def broker_in_process(tmp_path) -> AsyncIterator[tuple[Broker, int]]:
    broker = Broker(Settings(data_dir=tmp_path / "data", amqp_host="127.0.0.1", amqp_port=0, metrics_port=0))
    await broker.start()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: AMQPConnection(broker), "127.0.0.1", 0)
    try:
        yield broker, server.sockets[0].getsockname()[1]
    finally:
        server.close()
        broker.shutdown_connections()
        await broker.cluster.stop()
        await broker.node_log.close()


def holders(obj: object, depth: int = 3) -> str:
    """What still refers to `obj`, a few levels up, for the failure's message."""
    lines: list[str] = []
    seen = {id(obj)}

    def walk(target: object, level: int) -> None:
        referrers = gc.get_referrers(target)
        seen.add(id(referrers))   # the walk's own lists are no holders
        for referrer in referrers:
            if id(referrer) in seen or type(referrer).__name__ == "frame" or referrer is lines:
                continue
            seen.add(id(referrer))
            lines.append("  " * level + type(referrer).__qualname__)
            if level + 1 < depth:
                walk(referrer, level + 1)
    walk(obj, 0)
    return "\n".join(lines[:40])


def assert_freed(ref: weakref.ref, what: str) -> None:
    alive = ref()
    if alive is not None:
        detail = holders(alive)
        del alive
        pytest.fail(f"{what} outlived its last use (a reference cycle is freed only at the next full "
                    f"collection, minutes away). Held by:\n{detail}")


async def test_a_deleted_quorum_queue_with_messages_is_freed_at_once(tmp_path, name):
    with cyclic_collector_off():
        async with broker_in_process(tmp_path) as (broker, port):
            connection = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
            async with connection:
                channel = await connection.channel(publisher_confirms=True)
                queue = await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
                for number in range(MESSAGES):
                    await channel.default_exchange.publish(aio_pika.Message(b"m%d" % number), routing_key=name)
                shell = broker.vhosts["/"].queues[name]
                group = shell.group
                shell_ref = weakref.ref(shell)
                state_ref = weakref.ref(shell.replica.machine.state.ready)   # its messages' ids
                assert shell.message_count == MESSAGES
                got = await queue.get(no_ack=False)    # one message held unacked, by a channel
                assert got is not None
                del shell, got
                await queue.delete(if_unused=False, if_empty=False)
                await until(lambda: name not in broker.vhosts["/"].queues
                            and group not in broker.cluster.runtime.groups,
                            f"queue {name} and its group {group} removed", SETTLE_SECONDS)
            assert_freed(state_ref, f"the deleted queue's state ({MESSAGES} messages)")
            assert_freed(shell_ref, "the deleted queue's shell")


async def test_a_closed_connection_is_freed_at_once(tmp_path):
    with cyclic_collector_off():
        async with broker_in_process(tmp_path) as (broker, port):
            connection = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
            channel = await connection.channel(publisher_confirms=True)
            await channel.default_exchange.publish(aio_pika.Message(b"x"), routing_key="nowhere")
            (server_side,) = broker.connections
            ref = weakref.ref(server_side)
            del server_side
            await connection.close()
            await until(lambda: not broker.connections, "the server side of the connection closed", SETTLE_SECONDS)
            assert_freed(ref, "a closed connection")


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
async def test_a_deleted_queue_is_freed_while_the_channel_that_used_it_stays_open(tmp_path, name, queue_type):
    """A long-lived channel that publishes to, gets from and consumes from queues
    it later deletes (temporary work queues, reply queues) must not keep them."""
    with cyclic_collector_off():
        async with broker_in_process(tmp_path) as (broker, port):
            connection = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
            async with connection:
                channel = await connection.channel(publisher_confirms=True)
                queue = await channel.declare_queue(name, durable=True, arguments={"x-queue-type": queue_type})
                for number in range(MESSAGES):
                    await channel.default_exchange.publish(aio_pika.Message(b"m%d" % number), routing_key=name)
                got = await queue.get(no_ack=False)
                assert got is not None
                await got.ack()
                consumed = asyncio.Event()

                async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                    await message.ack()
                    consumed.set()
                tag = await queue.consume(on_message)
                await asyncio.wait_for(consumed.wait(), SETTLE_SECONDS)
                await queue.cancel(tag)
                consumed.clear()
                await queue.consume(on_message)   # left to the delete's basic.cancel
                await asyncio.wait_for(consumed.wait(), SETTLE_SECONDS)
                shell = broker.vhosts["/"].queues[name]
                shell_ref = weakref.ref(shell)
                group = shell.group
                del shell, got
                await queue.delete(if_unused=False, if_empty=False)
                await until(lambda: name not in broker.vhosts["/"].queues
                            and (group is None or group not in broker.cluster.runtime.groups),
                            f"queue {name} removed", SETTLE_SECONDS)
                # the channel is still open: publishing elsewhere on it still works
                await channel.default_exchange.publish(aio_pika.Message(b"after"), routing_key="nowhere")
                assert_freed(shell_ref, f"a deleted {queue_type} queue, while a channel that used it is open")
