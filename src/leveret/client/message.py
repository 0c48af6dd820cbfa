"""Messages received from the broker, and how they are settled."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from leveret.client.errors import MessageStateError
from leveret.protocol.properties import BasicProperties, stream_offset

if TYPE_CHECKING:
    from leveret.client.channel import Channel

log = logging.getLogger("leveret.client")

_UNREAD = object()  # Message._offset before the offset is first read

# A message's settlement state.
_OPEN = 0
_SETTLED = 1
_NO_ACK = 2  # delivered with no_ack (auto-ack): nothing to settle


class Message:
    """One delivered (or returned, or fetched) message.

    Properties are decoded from the raw content header only when first read,
    so a consumer that looks at the body alone pays nothing for them.

    `ack()`, `nack()` and `reject()` queue the frame and return at once (it is
    written with the next batch). Settling a message twice raises
    MessageStateError. A message delivered before a reconnect cannot be
    settled any more: its delivery tag died with the old connection and the
    broker redelivers it; settling it then does nothing and returns False.
    """

    __slots__ = (
        "body",
        "delivery_tag",
        "redelivered",
        "exchange",
        "routing_key",
        "consumer_tag",
        "message_count",
        "_header",
        "_properties",
        "_channel",
        "_epoch",
        "_state",
        "_offset",
    )

    def __init__(
        self,
        body: bytes,
        delivery_tag: int = 0,
        redelivered: bool = False,
        exchange: str = "",
        routing_key: str = "",
        consumer_tag: str | None = None,
        header: bytes | None = None,
        channel: Channel | None = None,
        epoch: int = 0,
        no_ack: bool = True,
        properties: BasicProperties | None = None,
        message_count: int | None = None,
    ) -> None:
        self.body = body
        self.delivery_tag = delivery_tag
        self.redelivered = redelivered
        self.exchange = exchange
        self.routing_key = routing_key
        self.consumer_tag = consumer_tag
        self.message_count = message_count
        self._header = header
        self._properties = properties
        self._channel = channel
        self._epoch = epoch
        self._state = _NO_ACK if no_ack else _OPEN
        self._offset: Any = _UNREAD

    def __repr__(self) -> str:
        body = self.body if len(self.body) <= 40 else self.body[:40] + b"..."
        return (
            f"Message(body={body!r}, delivery_tag={self.delivery_tag}, "
            f"exchange={self.exchange!r}, routing_key={self.routing_key!r})"
        )

    # --- properties ---------------------------------------------------------

    @property
    def properties(self) -> BasicProperties:
        props = self._properties
        if props is None:
            header = self._header
            props = BasicProperties.decode(header) if header else BasicProperties()
            self._properties = props
        return props

    @property
    def headers(self) -> dict[str, Any]:
        return self.properties.headers or {}

    @property
    def raw_header(self) -> bytes | None:
        """The content header payload as it arrived (class, weight, body size, flags,
        properties), for forwarding a message unchanged (Channel.publish_nowait)."""
        return self._header

    @property
    def message_id(self) -> str | None:
        return self.properties.message_id

    @property
    def correlation_id(self) -> str | None:
        return self.properties.correlation_id

    @property
    def reply_to(self) -> str | None:
        return self.properties.reply_to

    @property
    def content_type(self) -> str | None:
        return self.properties.content_type

    @property
    def offset(self) -> int | None:
        """The stream offset (the x-stream-offset header of stream deliveries)."""
        offset = self._offset
        if offset is not _UNREAD:
            return offset  # read once: a stream consumer and its code both ask
        if self._properties is None:
            header = self._header
            # read from the raw header: the other properties stay undecoded
            offset = stream_offset(header) if header else None
        else:
            value = self.headers.get("x-stream-offset")
            offset = value if isinstance(value, int) and not isinstance(value, bool) else None
        self._offset = offset
        return offset

    def text(self, encoding: str = "utf-8") -> str:
        return self.body.decode(encoding)

    # --- settling -----------------------------------------------------------

    @property
    def settled(self) -> bool:
        return self._state != _OPEN

    def _take(self, what: str) -> Channel | None:
        state = self._state
        if state == _NO_ACK:
            raise MessageStateError(
                f"cannot {what} message {self.delivery_tag}: it was delivered with no_ack "
                "(the broker considered it acknowledged when it sent it)"
            )
        if state == _SETTLED:
            raise MessageStateError(
                f"message {self.delivery_tag} was already acknowledged, nacked or rejected"
            )
        self._state = _SETTLED
        channel = self._channel
        if channel is None or channel._epoch != self._epoch:
            log.debug(
                "not settling delivery %d: it belongs to a connection that was lost; "
                "the broker redelivers it",
                self.delivery_tag,
            )
            return None
        return channel

    def ack(self, multiple: bool = False) -> bool:
        """Acknowledge (with `multiple`, also every earlier unsettled delivery on the channel)."""
        channel = self._take("ack")
        if channel is None:
            return False
        return channel._settle(0, self.delivery_tag, multiple, False)

    def nack(self, requeue: bool = True, multiple: bool = False) -> bool:
        """Negative-acknowledge: requeue it, or drop / dead-letter it (requeue=False)."""
        channel = self._take("nack")
        if channel is None:
            return False
        return channel._settle(1, self.delivery_tag, multiple, requeue)

    def reject(self, requeue: bool = True) -> bool:
        channel = self._take("reject")
        if channel is None:
            return False
        return channel._settle(2, self.delivery_tag, False, requeue)
