"""AMQP exceptions as Python exceptions.

The model raises them with just a code and a text; the channel layer fills in
the class and method that failed before turning them into channel.close or
connection.close.
"""

from __future__ import annotations

from leveret.protocol.constants import CONNECTION_EXCEPTIONS, REPLY_NAMES


class AMQPError(Exception):
    """An error the peer must hear about as a close method with this code."""

    def __init__(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        name = REPLY_NAMES.get(code, str(code))
        # RabbitMQ prefixes every reply text with the code's name; clients and
        # people grepping logs both rely on it.
        self.reply_text = text if text.startswith(name) else f"{name} - {text}"
        super().__init__(self.reply_text)
        self.code = code
        self.class_id = class_id
        self.method_id = method_id

    def __reduce__(self) -> tuple:
        # Crosses between worker processes (workers/mesh.py) with its code intact.
        return (type(self), (self.code, self.reply_text, self.class_id, self.method_id))

    @property
    def is_connection_error(self) -> bool:
        return self.code in CONNECTION_EXCEPTIONS


class ChannelError(AMQPError):
    """A soft error: closes the channel, the connection carries on."""


class ConnectionError_(AMQPError):
    """A hard error: closes the whole connection."""


class FrameError(ConnectionError_):
    """The byte stream itself is broken; nothing after it can be trusted."""
