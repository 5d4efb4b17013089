"""AMQP errors by scope (AMQP 0-9-1 §1.9 "soft" and "hard" errors).

A ChannelError closes only the channel; an AMQPConnectionError closes the
whole connection. Both carry the reply code and the text RabbitMQ would send,
plus the class and method ids of the method that caused them (0, 0 if none).
"""
from __future__ import annotations

from warren.protocol.constants import REPLY_NAMES


class AMQPError(Exception):
    def __init__(self, reply_code: int, text: str, class_id: int = 0, method_id: int = 0):
        super().__init__(text)
        self.reply_code = reply_code
        self.text = text
        self.class_id = class_id
        self.method_id = method_id

    @property
    def reply_text(self) -> str:
        """The text on the wire: RabbitMQ prefixes it with the code's name."""
        return f"{REPLY_NAMES.get(self.reply_code, 'ERROR')} - {self.text}"[:255]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reply_code}, {self.text!r})"


class ChannelError(AMQPError):
    """Soft error: the channel is closed with channel.close."""


class AMQPConnectionError(AMQPError):
    """Hard error: the connection is closed with connection.close."""
