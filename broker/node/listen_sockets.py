"""Listening sockets bound before the event loop runs: the supervisor of a node over
several processes binds the AMQP and HTTP ports once and hands them to its shards
(docs/multi-process.md, section 5), which listen on them with `sock=`."""
from __future__ import annotations

import errno
import ipaddress
import socket

import structlog

log = structlog.get_logger("warren.server")

LISTEN_BACKLOG = 1024
# A bind to an IPv6 address fails so on a host without IPv6 (kernel without it, or disabled).
IPV6_UNAVAILABLE_ERRNOS = (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL, errno.EPROTONOSUPPORT)


def skippable(host: str, error: OSError, addresses: list[str]) -> bool:
    """An IPv6 address the host cannot bind is skipped while another address listens."""
    return is_ipv6(host) and error.errno in IPV6_UNAVAILABLE_ERRNOS and len(addresses) > 1


def is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


def bind_listeners(hosts: str, port: int, listener: str) -> list[socket.socket]:
    """Listening sockets on every address of `hosts` (comma-separated), as
    `loop.create_server(host, port)` binds them (IPv6 sockets IPv6-only)."""
    addresses = [host.strip() for host in hosts.split(",") if host.strip()]
    sockets: list[socket.socket] = []
    for host in addresses:
        try:
            sockets.extend(_bind_host(host, port))
        except OSError as error:
            if not skippable(host, error, addresses):
                for sock in sockets:
                    sock.close()
                raise
            log.warning("server.ipv6_unavailable", listener=listener, host=host, error=str(error))
    if not sockets:
        raise OSError(errno.EADDRNOTAVAIL, f"no {listener} listener could bind any of {hosts}")
    return sockets


def _bind_host(host: str, port: int) -> list[socket.socket]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    bound: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(LISTEN_BACKLOG)
    except OSError:
        for sock in bound:
            sock.close()
        raise
    return bound
