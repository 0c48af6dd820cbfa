"""The exchanges, queues and bindings a channel declared.

`Channel.declare_exchange` and `declare_queue` return these handles; the connection
keeps them (with their bindings) so that recovery after a reconnect can declare
them again, in order, on the new connection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pamqp import commands as cmd

from leveret.protocol import methods as wire
from leveret.protocol.constants import (
    EXCHANGE_BIND_OK,
    EXCHANGE_DECLARE_OK,
    QUEUE_BIND_OK,
    QUEUE_DECLARE_OK,
)

if TYPE_CHECKING:
    from leveret.client.channel import Channel
    from leveret.client.consumer import Consumer
    from leveret.client.message import Message


def _name(obj: str | Queue | Exchange) -> str:
    return obj if isinstance(obj, str) else obj.name


class Exchange:
    """A declared exchange (what declare_exchange returned)."""

    def __init__(
        self,
        channel: Channel,
        name: str,
        type: str,  # noqa: A002
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: dict[str, Any] | None,
    ) -> None:
        self.channel = channel
        self.name = name
        self.type = type
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = dict(arguments or {})

    def __repr__(self) -> str:
        return f"<leveret.client.Exchange {self.name!r} ({self.type})>"

    def _method(self, passive: bool = False) -> Any:
        return wire.unchecked(
            cmd.Exchange.Declare,
            exchange=self.name,
            exchange_type=self.type,
            passive=passive,
            durable=self.durable,
            auto_delete=self.auto_delete,
            internal=self.internal,
            arguments=self.arguments,
        )

    async def _redeclare(self, channel: Channel) -> None:
        await channel._call_now(self._method(), EXCHANGE_DECLARE_OK)

    async def publish(self, body: bytes | str, routing_key: str = "", **kwargs: Any) -> None:
        await self.channel.publish(body, routing_key, self.name, **kwargs)

    async def delete(self, *, if_unused: bool = False) -> None:
        await self.channel.delete_exchange(self.name, if_unused=if_unused)


class Queue:
    """A declared queue with the counts from its declare-ok.

    `name` follows the queue across reconnects: a server-named queue gets a
    new name when recovery declares it again.
    """

    def __init__(
        self,
        channel: Channel,
        name: str,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        arguments: dict[str, Any] | None,
    ) -> None:
        self.channel = channel
        self.name = name
        self.server_named = name == ""
        self.durable = durable
        self.exclusive = exclusive
        self.auto_delete = auto_delete
        self.arguments = dict(arguments or {})
        self.message_count = 0
        self.consumer_count = 0

    def __repr__(self) -> str:
        return (
            f"<leveret.client.Queue {self.name!r} messages={self.message_count} "
            f"consumers={self.consumer_count}>"
        )

    def _method(self, passive: bool = False) -> Any:
        return wire.unchecked(
            cmd.Queue.Declare,
            queue="" if self.server_named else self.name,
            passive=passive,
            durable=self.durable,
            exclusive=self.exclusive,
            auto_delete=self.auto_delete,
            arguments=self.arguments,
        )

    def _update(self, ok: Any) -> None:
        self.name = ok.queue
        self.message_count = ok.message_count
        self.consumer_count = ok.consumer_count

    async def _redeclare(self, channel: Channel) -> None:
        ok = await channel._call_now(self._method(), QUEUE_DECLARE_OK)
        self._update(ok)

    def consume(self, **kwargs: Any) -> Consumer:
        return self.channel.consume(self, **kwargs)

    async def get(self, *, no_ack: bool = False) -> Message | None:
        return await self.channel.get(self, no_ack=no_ack)

    async def bind(
        self,
        exchange: str | Exchange,
        routing_key: str = "",
        arguments: dict[str, Any] | None = None,
    ) -> None:
        await self.channel.bind_queue(self, exchange, routing_key, arguments)

    async def unbind(
        self,
        exchange: str | Exchange,
        routing_key: str = "",
        arguments: dict[str, Any] | None = None,
    ) -> None:
        await self.channel.unbind_queue(self, exchange, routing_key, arguments)

    async def purge(self) -> int:
        return await self.channel.purge_queue(self)

    async def delete(self, *, if_unused: bool = False, if_empty: bool = False) -> int:
        return await self.channel.delete_queue(self, if_unused=if_unused, if_empty=if_empty)


class _Binding:
    """A queue or exchange binding, as recovery re-declares it."""

    def __init__(
        self,
        kind: str,
        destination: str | Queue,
        source: str,
        routing_key: str,
        arguments: dict[str, Any] | None,
    ) -> None:
        self.kind = kind
        self.destination = destination
        self.source = source
        self.routing_key = routing_key
        self.arguments = dict(arguments or {})

    def queue_name(self) -> str | None:
        return _name(self.destination) if self.kind == "queue" else None

    def involves_exchange(self, name: str) -> bool:
        return self.source == name or (self.kind == "exchange" and self.destination == name)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Binding):
            return NotImplemented
        return (
            self.kind == other.kind
            and _name(self.destination) == _name(other.destination)
            and self.source == other.source
            and self.routing_key == other.routing_key
            and self.arguments == other.arguments
        )

    __hash__ = None  # type: ignore[assignment]

    def describe(self) -> str:
        return (
            f"binding {self.source!r} -> {self.kind} {_name(self.destination)!r} "
            f"({self.routing_key!r})"
        )

    def method(self, bind: bool) -> Any:
        dest = _name(self.destination)
        if self.kind == "queue":
            cls = cmd.Queue.Bind if bind else cmd.Queue.Unbind
            return wire.unchecked(
                cls,
                queue=dest,
                exchange=self.source,
                routing_key=self.routing_key,
                arguments=self.arguments,
            )
        cls = cmd.Exchange.Bind if bind else cmd.Exchange.Unbind
        return wire.unchecked(
            cls,
            destination=dest,
            source=self.source,
            routing_key=self.routing_key,
            arguments=self.arguments,
        )

    async def redeclare(self, channel: Channel) -> None:
        expect = QUEUE_BIND_OK if self.kind == "queue" else EXCHANGE_BIND_OK
        await channel._call_now(self.method(bind=True), expect)
