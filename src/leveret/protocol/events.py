"""What `Connection.receive_data()` returns: one event per thing the peer did.

Plain objects with `__slots__`, compiled with the rest of the protocol core (their
constructors run once per message on the hot path). `leveret.protocol.connection`
re-exports every one of them, so callers import them from either module.
"""

from __future__ import annotations

from typing import Any

from leveret.protocol.errors import AMQPError


class Event:
    """Base class of everything receive_data() returns."""

    __slots__ = ()

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__)
        return f"{type(self).__name__}({fields})"


class StartOkReceived(Event):
    """Server role: the client's credentials; answer with accept_login() or close()."""

    __slots__ = ("mechanism", "username", "password", "client_properties", "locale")

    def __init__(
        self,
        mechanism: str,
        username: str | None,
        password: str | None,
        client_properties: dict[str, Any],
        locale: str,
    ) -> None:
        self.mechanism = mechanism
        self.username = username
        self.password = password
        self.client_properties = client_properties
        self.locale = locale


class OpenRequested(Event):
    """Server role: connection.open; answer with accept_open() or close()."""

    __slots__ = ("virtual_host",)

    def __init__(self, virtual_host: str) -> None:
        self.virtual_host = virtual_host


class ConnectionOpened(Event):
    """Client role: connection.open-ok arrived; the tuned limits are final."""

    __slots__ = ("server_properties", "channel_max", "frame_max", "heartbeat")

    def __init__(
        self, server_properties: dict[str, Any], channel_max: int, frame_max: int, heartbeat: int
    ) -> None:
        self.server_properties = server_properties
        self.channel_max = channel_max
        self.frame_max = frame_max
        self.heartbeat = heartbeat


class ConnectionClosed(Event):
    """The peer sent connection.close; close-ok is queued and the state is CLOSED."""

    __slots__ = ("reply_code", "reply_text", "class_id", "method_id")

    def __init__(self, reply_code: int, reply_text: str, class_id: int, method_id: int) -> None:
        self.reply_code = reply_code
        self.reply_text = reply_text
        self.class_id = class_id
        self.method_id = method_id


class ConnectionCloseOk(Event):
    """The peer acknowledged our connection.close; the state is CLOSED."""

    __slots__ = ()


class ConnectionBlocked(Event):
    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class ConnectionUnblocked(Event):
    __slots__ = ()


class ProtocolError(Event):
    """The peer broke the protocol. connection.close with the error is queued
    (unless `drop`: the byte stream is unusable and the caller should just drop
    the connection after writing what is queued)."""

    __slots__ = ("error", "drop")

    def __init__(self, error: AMQPError, drop: bool) -> None:
        self.error = error
        self.drop = drop


class ChannelProtocolError(Event):
    """A frame broke a channel-level rule (a message over max_body_size);
    channel.close with the error is queued and the channel's frames are
    dropped until close-ok."""

    __slots__ = ("channel", "error")

    def __init__(self, channel: int, error: AMQPError) -> None:
        self.channel = channel
        self.error = error


class BadProtocolHeader(Event):
    """Server role: not an AMQP 0-9-1 header; ours is queued; drop the connection."""

    __slots__ = ("received",)

    def __init__(self, received: bytes) -> None:
        self.received = received


class ChannelOpened(Event):
    """Client: channel.open-ok arrived. Server: the peer opened it (open-ok is queued)."""

    __slots__ = ("channel",)

    def __init__(self, channel: int) -> None:
        self.channel = channel


class ChannelClosed(Event):
    """The peer closed a channel; close-ok is queued and the number is free again."""

    __slots__ = ("channel", "reply_code", "reply_text", "class_id", "method_id")

    def __init__(
        self, channel: int, reply_code: int, reply_text: str, class_id: int, method_id: int
    ) -> None:
        self.channel = channel
        self.reply_code = reply_code
        self.reply_text = reply_text
        self.class_id = class_id
        self.method_id = method_id


class ChannelCloseOk(Event):
    """The peer acknowledged our channel.close; the number is free again."""

    __slots__ = ("channel",)

    def __init__(self, channel: int) -> None:
        self.channel = channel


class MethodReceived(Event):
    """Any other method, as a pamqp object (the cold path)."""

    __slots__ = ("channel", "method")

    def __init__(self, channel: int, method: Any) -> None:
        self.channel = channel
        self.method = method


class Deliver(Event):
    """basic.deliver with its content. `header` is the raw content header payload
    (BasicProperties.decode() reads it); `body` is the whole body."""

    __slots__ = (
        "channel",
        "consumer_tag",
        "delivery_tag",
        "redelivered",
        "exchange",
        "routing_key",
        "header",
        "body",
    )

    def __init__(
        self,
        channel: int,
        consumer_tag: str,
        delivery_tag: int,
        redelivered: bool,
        exchange: str,
        routing_key: str,
        header: bytes,
        body: bytes,
    ) -> None:
        self.channel = channel
        self.consumer_tag = consumer_tag
        self.delivery_tag = delivery_tag
        self.redelivered = redelivered
        self.exchange = exchange
        self.routing_key = routing_key
        self.header = header
        self.body = body


class GetOk(Event):
    __slots__ = (
        "channel",
        "delivery_tag",
        "redelivered",
        "exchange",
        "routing_key",
        "message_count",
        "header",
        "body",
    )

    def __init__(
        self,
        channel: int,
        delivery_tag: int,
        redelivered: bool,
        exchange: str,
        routing_key: str,
        message_count: int,
        header: bytes,
        body: bytes,
    ) -> None:
        self.channel = channel
        self.delivery_tag = delivery_tag
        self.redelivered = redelivered
        self.exchange = exchange
        self.routing_key = routing_key
        self.message_count = message_count
        self.header = header
        self.body = body


class Return(Event):
    """basic.return with its content: a mandatory publish that could not be routed."""

    __slots__ = ("channel", "reply_code", "reply_text", "exchange", "routing_key", "header", "body")

    def __init__(
        self,
        channel: int,
        reply_code: int,
        reply_text: str,
        exchange: str,
        routing_key: str,
        header: bytes,
        body: bytes,
    ) -> None:
        self.channel = channel
        self.reply_code = reply_code
        self.reply_text = reply_text
        self.exchange = exchange
        self.routing_key = routing_key
        self.header = header
        self.body = body


class Publish(Event):
    """Server role: basic.publish with its content."""

    __slots__ = (
        "channel",
        "exchange",
        "routing_key",
        "mandatory",
        "immediate",
        "names",
        "header",
        "body",
    )

    def __init__(
        self,
        channel: int,
        exchange: str,
        routing_key: str,
        mandatory: bool,
        immediate: bool,
        names: bytes,
        header: bytes,
        body: bytes,
    ) -> None:
        self.channel = channel
        self.exchange = exchange
        self.routing_key = routing_key
        self.mandatory = mandatory
        self.immediate = immediate
        # Exchange and routing key as the two short strings that arrived (see
        # methods.decode_publish); deliveries reuse them.
        self.names = names
        self.header = header
        self.body = body


class Ack(Event):
    """basic.ack: a confirm (client role) or a consumer's ack (server role)."""

    __slots__ = ("channel", "delivery_tag", "multiple")

    def __init__(self, channel: int, delivery_tag: int, multiple: bool) -> None:
        self.channel = channel
        self.delivery_tag = delivery_tag
        self.multiple = multiple


class Nack(Event):
    __slots__ = ("channel", "delivery_tag", "multiple", "requeue")

    def __init__(self, channel: int, delivery_tag: int, multiple: bool, requeue: bool) -> None:
        self.channel = channel
        self.delivery_tag = delivery_tag
        self.multiple = multiple
        self.requeue = requeue
