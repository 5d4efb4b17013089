"""The checks of the connection handshake (AMQP 0-9-1 §2.2.4), with RabbitMQ's codes and texts."""
from __future__ import annotations

from typing import TYPE_CHECKING

from pamqp import commands as spec

from warren.protocol.constants import FRAME_MIN_SIZE, NOT_ALLOWED
from warren.protocol.errors import AMQPConnectionError

if TYPE_CHECKING:
    from warren.broker.node.broker import Broker
    from warren.broker.routing.vhost import VirtualHost


def negotiated_limits(tune_ok: spec.Connection.TuneOk, frame_max_limit: int, channel_max_limit: int) -> tuple[int, int]:
    """(frame_max, channel_max) the client chose within ours (0: ours); 530 NOT_ALLOWED beyond them."""
    frame_max = tune_ok.frame_max or frame_max_limit
    if frame_max < FRAME_MIN_SIZE:
        raise AMQPConnectionError(NOT_ALLOWED, f"frame_max={frame_max} < {FRAME_MIN_SIZE} min size", 10, 31)
    if frame_max > frame_max_limit:
        raise AMQPConnectionError(NOT_ALLOWED, f"frame_max={frame_max} > {frame_max_limit} max size", 10, 31)
    channel_max = tune_ok.channel_max or channel_max_limit
    if channel_max > channel_max_limit:
        raise AMQPConnectionError(NOT_ALLOWED, f"channel_max={channel_max} > {channel_max_limit} max size", 10, 31)
    return frame_max, channel_max


def vhost_to_open(broker: "Broker", user_name: str, name: str) -> "VirtualHost":
    """The vhost connection.open names, if it exists and the user has any permission on it (530 NOT_ALLOWED)."""
    vhost = broker.vhosts.get(name)
    if vhost is None:
        raise AMQPConnectionError(NOT_ALLOWED, f"vhost {name} not found", 10, 40)
    if broker.access.permission(user_name, name) is None:
        # RabbitMQ's check_vhost_access: no permissions at all on the vhost
        raise AMQPConnectionError(NOT_ALLOWED, f"access to vhost '{name}' refused for user '{user_name}'", 10, 40)
    return vhost
