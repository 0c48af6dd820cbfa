"""Consumers: the async iterator of deliveries that `Channel.consume` returns."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import uuid
from typing import TYPE_CHECKING, Any

from pamqp import commands as cmd

from leveret.client import events as ev
from leveret.client._state import CLOSED as _CLOSED
from leveret.client._state import OPEN as _OPEN
from leveret.client.declared import Queue, _name
from leveret.client.errors import ChannelClosed, ClientError, ConnectionClosed, ConnectionLost
from leveret.client.message import Message
from leveret.protocol import methods as wire
from leveret.protocol.constants import BASIC_CANCEL_OK, BASIC_CONSUME_OK, BASIC_QOS_OK

if TYPE_CHECKING:
    from leveret.client.channel import Channel

log = logging.getLogger("leveret.client")

_ctag_ids = itertools.count(1)
_CTAG_PREFIX = f"leveret-{uuid.uuid4().hex[:8]}"


class Consumer:
    """An async iterator of messages from one queue.

        async for message in channel.consume("jobs", prefetch=100):
            ...
            message.ack()

    Leaving the loop early does not cancel the consumer; `await
    consumer.cancel()` (or `async with` around it) does: the broker stops
    delivering, and messages it had sent but the code has not yet taken are
    handed back (nack with requeue) so that nothing stays stuck unacked.
    """

    def __init__(
        self,
        channel: Channel,
        queue: str | Queue,
        prefetch: int | None,
        no_ack: bool,
        exclusive: bool,
        consumer_tag: str | None,
        arguments: dict[str, Any] | None,
        offset: Any,
    ) -> None:
        if prefetch is not None and not 0 <= prefetch <= 65535:
            raise ValueError(f"prefetch must be 0..65535, got {prefetch}")
        if offset is not None:
            if no_ack:
                raise ValueError("stream consumers need acks (no_ack=False)")
            if prefetch is None:
                prefetch = 100  # RabbitMQ refuses stream consumers without a prefetch
        self.channel = channel
        self.queue = queue
        self.prefetch = prefetch
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.consumer_tag = consumer_tag or f"{_CTAG_PREFIX}-{next(_ctag_ids)}"
        self.arguments = dict(arguments or {})
        self.offset = offset
        self.last_offset: int | None = None  # stream: the last offset handed to the code
        self._buffer: collections.deque[Message] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._started = False
        self._done = False
        self._error: BaseException | None = None
        self._cancelling = False
        self._callback: Any = None
        self._raw: Any = None
        self._plain = offset is None  # no stream offsets to track or skip

    def __repr__(self) -> str:
        return f"<leveret.client.Consumer {self.consumer_tag} on {self.queue_name!r}>"

    @property
    def queue_name(self) -> str:
        return _name(self.queue)

    @property
    def error(self) -> BaseException | None:
        """Why the consumer ended, if it did so by an error (its queue deleted, its
        channel or connection closed for good); None while it runs."""
        return self._error

    def _consume_method(self) -> Any:
        args = dict(self.arguments)
        offset = self.offset
        if offset is not None:
            args["x-stream-offset"] = offset if self.last_offset is None else self.last_offset + 1
        return wire.unchecked(
            cmd.Basic.Consume,
            queue=self.queue_name,
            consumer_tag=self.consumer_tag,
            no_ack=self.no_ack,
            exclusive=self.exclusive,
            arguments=args,
        )

    async def start(self) -> Consumer:
        """Send basic.consume (idempotent)."""
        if self._started:
            return self
        ch = self.channel
        if self.consumer_tag in ch._consumers:
            raise ClientError(f"consumer tag {self.consumer_tag!r} is in use on this channel")
        self._started = True
        await ch._ready()
        if self.prefetch is not None:
            await ch._call(cmd.Basic.Qos(0, self.prefetch, False), BASIC_QOS_OK)
        # Registered before consume-ok: deliveries can follow it in the same read.
        ch._consumers[self.consumer_tag] = self
        try:
            await ch._call(self._consume_method(), BASIC_CONSUME_OK)
        except ConnectionLost:
            if ch._state == _CLOSED or not ch.connection.recovery:
                ch._consumers.pop(self.consumer_tag, None)
                self._started = False
                raise
            # Registered consumers are restored by recovery: this one too.
            await ch.connection._wait_ready()
        except BaseException:
            ch._consumers.pop(self.consumer_tag, None)
            self._started = False
            raise
        return self

    def __await__(self) -> Any:
        return self.start().__await__()

    async def __aenter__(self) -> Consumer:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.cancel()

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        buffer = self._buffer
        if not buffer:
            if not self._started:
                await self.start()
            while not buffer:
                if self._error is not None:
                    raise self._error
                if self._done:
                    raise StopAsyncIteration
                self._waiter = self.channel.connection._loop.create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
        message = buffer.popleft()
        if self.offset is not None:
            self._handed_out(message)
        return message

    def _handed_out(self, message: Message) -> None:
        """Stream consumers remember the last offset the code got, to resume after it."""
        offset = message.offset
        if offset is not None:
            self.last_offset = offset

    async def get(self, timeout: float | None = None) -> Message:
        """The next message (TimeoutError after `timeout` s)."""
        return await asyncio.wait_for(self.__anext__(), timeout)

    def _push(self, message: Message) -> None:
        if self._cancelling:
            if not self.no_ack:
                self._hand_back(message)
            return
        callback = self._callback
        if self.offset is not None:
            offset = message.offset
            last = self.last_offset
            if offset is not None and last is not None and offset <= last:
                # A resumed stream consumer: a broker may start at the chunk holding
                # the requested offset; what the code already had is skipped.
                message.ack()
                return
            if callback is not None:
                if offset is not None:
                    self.last_offset = offset
                callback(message)
                return
        elif callback is not None:
            callback(message)
            return
        self._buffer.append(message)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _end(self, error: BaseException | None) -> None:
        """No more deliveries: StopAsyncIteration (or `error`) once the buffer is drained."""
        self._done = True
        if error is not None:
            self._error = error
            self._buffer.clear()
        self._wake()

    def _on_link_lost(self) -> None:
        # Deliveries not yet handed out die with the link; the broker redelivers them.
        self._buffer.clear()

    async def _restore(self) -> None:
        ch = self.channel
        if self.prefetch is not None:
            await ch._call_now(cmd.Basic.Qos(0, self.prefetch, False), BASIC_QOS_OK)
        method = self._consume_method()
        await ch._call_now(method, BASIC_CONSUME_OK)
        where = method.arguments.get("x-stream-offset")
        log.info(
            "consumer %s restored on queue %r%s",
            self.consumer_tag,
            self.queue_name,
            f" from offset {where!r}" if where is not None else "",
        )
        ch.connection._emit(ev.ConsumerRestored(self.consumer_tag, self.queue_name, where))

    async def cancel(self) -> None:
        """basic.cancel; messages received but not handed out are requeued."""
        ch = self.channel
        if not self._started or self._done:
            self._done = True
            self._wake()
            return
        self._cancelling = True
        self._plain = False
        try:
            if ch._state == _OPEN:
                await ch._call(
                    wire.unchecked(cmd.Basic.Cancel, consumer_tag=self.consumer_tag),
                    BASIC_CANCEL_OK,
                )
        except (ChannelClosed, ConnectionClosed):
            pass
        finally:
            ch._consumers.pop(self.consumer_tag, None)
            leftovers = list(self._buffer)
            self._buffer.clear()
            if not self.no_ack:
                for message in leftovers:
                    with contextlib.suppress(ClientError):
                        self._hand_back(message)
            self._end(None)

    def _hand_back(self, message: Message) -> None:
        """A delivery the code never saw: requeue it (a stream keeps it anyway, and
        RabbitMQ refuses nack on streams, so there it is just acked for credit)."""
        if self.offset is not None:
            message.ack()
        else:
            message.nack(requeue=True)
