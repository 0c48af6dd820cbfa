"""The exceptions leveret.client raises.

Every error the broker reports carries its reply code and text; the common
codes get their own subclass so that callers can catch, say, `NotFound`
without comparing numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from leveret.protocol.constants import (
    ACCESS_REFUSED,
    NOT_FOUND,
    PRECONDITION_FAILED,
    REPLY_NAMES,
    RESOURCE_LOCKED,
)

if TYPE_CHECKING:
    from leveret.client.message import Message


class ClientError(Exception):
    """Base class of every leveret.client error."""


class InvalidURL(ClientError, ValueError):
    """The connection URL (or an option in it) is malformed."""


class ConnectError(ClientError):
    """No broker could be reached, or the AMQP handshake failed."""


class AuthenticationError(ConnectError):
    """The broker refused the credentials. Never retried: retrying cannot help."""


class BrokerError(ClientError):
    """The broker closed a channel or the connection with a reply code."""

    def __init__(self, reply_code: int, reply_text: str, class_id: int = 0, method_id: int = 0):
        self.reply_code = reply_code
        self.reply_text = reply_text
        self.class_id = class_id
        self.method_id = method_id
        where = ""
        if class_id:
            from leveret.protocol.methods import method_name

            where = f" (in reply to {method_name((class_id << 16) | method_id)})"
        super().__init__(f"{reply_code} {reply_text}{where}")

    @property
    def reply_name(self) -> str:
        return REPLY_NAMES.get(self.reply_code, str(self.reply_code))


class ConnectionClosed(BrokerError):
    """The connection is closed: by the broker (with its code), by us, or lost."""


class ConnectionLost(ConnectionClosed):
    """The TCP connection went away (broker restart, network cut, missed heartbeats).

    An operation that was in flight may or may not have taken effect.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(0, reason)

    def __str__(self) -> str:
        return f"connection lost: {self.reply_text}"


class ChannelClosed(BrokerError):
    """The channel is closed: by the broker (with its code and text) or by us.

    The connection and its other channels carry on.
    """

    @classmethod
    def from_reply(
        cls, reply_code: int, reply_text: str, class_id: int = 0, method_id: int = 0
    ) -> ChannelClosed:
        sub = _BY_CODE.get(reply_code, ChannelClosed)
        return sub(reply_code, reply_text, class_id, method_id)


class NotFound(ChannelClosed):
    """404: the exchange or queue does not exist."""


class AccessRefused(ChannelClosed):
    """403: not allowed (for example an exclusive queue of another connection)."""


class ResourceLocked(ChannelClosed):
    """405: the queue is locked by another connection (exclusive)."""


class PreconditionFailed(ChannelClosed):
    """406: for example a redeclare with different arguments, or an unknown delivery tag."""


_BY_CODE: dict[int, type[ChannelClosed]] = {
    NOT_FOUND: NotFound,
    ACCESS_REFUSED: AccessRefused,
    RESOURCE_LOCKED: ResourceLocked,
    PRECONDITION_FAILED: PreconditionFailed,
}


class PublishError(ClientError):
    """A publish was not accepted."""


class MessageReturned(PublishError):
    """A mandatory publish could not be routed to any queue; the broker returned it."""

    def __init__(self, reply_code: int, reply_text: str, message: Message) -> None:
        self.reply_code = reply_code
        self.reply_text = reply_text
        self.message = message
        super().__init__(
            f"message returned: {reply_code} {reply_text} "
            f"(exchange {message.exchange!r}, routing key {message.routing_key!r})"
        )


class MessageNacked(PublishError):
    """The broker nacked the publish: it could not take responsibility for it."""


class Unconfirmed(PublishError):
    """The connection was lost before the publish was confirmed, and it was not retried.

    The broker may or may not have the message.
    """


class PublishTimeout(Unconfirmed):
    """No confirm arrived within the timeout given to publish()."""


class BlockedTimeout(PublishError):
    """The broker blocked publishing (connection.blocked) for longer than the timeout."""


class PublishFailed(PublishError):
    """publish_many(): some messages failed; `failures` holds (index, exception) pairs."""

    def __init__(self, failures: list[tuple[int, Exception]], total: int) -> None:
        self.failures = failures
        first = failures[0][1] if failures else None
        super().__init__(f"{len(failures)} of {total} publishes failed; first: {first}")


class MessageStateError(ClientError):
    """ack/nack/reject on a message that was already settled, or consumed with no_ack."""


class ConsumerCancelled(ClientError):
    """The broker cancelled the consumer (its queue was deleted, for example)."""

    def __init__(self, consumer_tag: str, reason: str = "cancelled by the broker") -> None:
        self.consumer_tag = consumer_tag
        super().__init__(f"consumer {consumer_tag!r} {reason}")


class RPCTimeout(ClientError, TimeoutError):
    """No reply to an RPC call within its timeout."""
