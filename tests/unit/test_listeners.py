"""warren-server's listeners: one per configured address, IPv6 skipped where the host has none."""
from __future__ import annotations

import errno

import pytest

from warren.broker.node.server import listen


class FakeServer:
    def __init__(self, host: str):
        self.host = host


def starter(refused: dict[str, int]):
    async def start(host: str) -> FakeServer:
        if host in refused:
            raise OSError(refused[host], f"cannot bind {host}")
        return FakeServer(host)
    return start


async def test_every_address_gets_a_listener():
    servers = await listen(starter({}), "::, 0.0.0.0", "amqp")
    assert [server.host for server in servers] == ["::", "0.0.0.0"]


@pytest.mark.parametrize("code", [errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL])
async def test_ipv6_is_skipped_on_a_host_without_it(code):
    servers = await listen(starter({"::": code}), "::,0.0.0.0", "amqp")
    assert [server.host for server in servers] == ["0.0.0.0"]


async def test_an_address_in_use_is_an_error_even_for_ipv6():
    with pytest.raises(OSError):
        await listen(starter({"::": errno.EADDRINUSE}), "::,0.0.0.0", "amqp")


async def test_a_single_configured_address_that_cannot_bind_is_an_error():
    with pytest.raises(OSError):
        await listen(starter({"::1": errno.EADDRNOTAVAIL}), "::1", "amqp")
