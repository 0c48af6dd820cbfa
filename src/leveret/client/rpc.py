"""Request/reply over direct reply-to (RabbitMQ's amq.rabbitmq.reply-to).

The caller consumes the pseudo-queue `amq.rabbitmq.reply-to` (no_ack) on its
channel and publishes requests with reply_to set to it; the broker routes the
reply straight back to that consumer, with no reply queue to declare.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import uuid
from typing import Any

from leveret.client.channel import DIRECT_REPLY_TO, Channel, Consumer, Queue, _properties
from leveret.client.errors import ClientError, RPCTimeout
from leveret.client.message import Message
from leveret.protocol.properties import BasicProperties

log = logging.getLogger("leveret.client")


class _ReplyConsumer(Consumer):
    """The direct reply-to consumer of a channel: hands replies to waiting calls."""

    def __init__(self, channel: Channel) -> None:
        super().__init__(channel, DIRECT_REPLY_TO, None, True, False, None, None, None)
        self.calls: dict[str, asyncio.Future[Message]] = {}
        self.started: asyncio.Future[Any] | None = None

    def _push(self, message: Message) -> None:
        fut = self.calls.pop(message.correlation_id or "", None)
        if fut is None or fut.done():
            log.debug("reply with unknown correlation id %r dropped", message.correlation_id)
            return
        fut.set_result(message)

    def _end(self, error: BaseException | None) -> None:
        super()._end(error)
        calls, self.calls = self.calls, {}
        for fut in calls.values():
            if not fut.done():
                fut.set_exception(error or ClientError("the RPC channel was closed"))

    def _on_link_lost(self) -> None:
        # Replies to calls in flight are addressed to the old connection: lost.
        calls, self.calls = self.calls, {}
        for fut in calls.values():
            if not fut.done():
                fut.set_exception(ClientError("connection lost while waiting for the reply"))


async def _reply_consumer(channel: Channel) -> _ReplyConsumer:
    rc = channel._reply_consumer
    if not isinstance(rc, _ReplyConsumer) or rc._done:
        rc = _ReplyConsumer(channel)
        channel._reply_consumer = rc
        rc.started = asyncio.ensure_future(rc.start())
    assert rc.started is not None
    await asyncio.shield(rc.started)
    return rc


async def rpc_call(
    channel: Channel,
    body: bytes | str,
    routing_key: str,
    exchange: str,
    timeout: float,
    properties: BasicProperties | None,
    values: dict[str, Any],
    mandatory: bool = False,
) -> Message:
    rc = await _reply_consumer(channel)
    correlation_id = uuid.uuid4().hex
    props = _properties(
        properties, {**values, "reply_to": DIRECT_REPLY_TO, "correlation_id": correlation_id}
    )
    fut: asyncio.Future[Message] = channel.connection._loop.create_future()
    rc.calls[correlation_id] = fut
    try:
        await channel.publish(
            body, routing_key, exchange, properties=props, timeout=timeout, mandatory=mandatory
        )
        return await asyncio.wait_for(fut, timeout)
    except TimeoutError:
        raise RPCTimeout(
            f"no reply to the request sent to {routing_key!r} within {timeout:g} s"
        ) from None
    finally:
        rc.calls.pop(correlation_id, None)


async def serve(channel: Channel, queue: str | Queue, handler: Any, prefetch: int) -> None:
    """Consume requests, reply with the handler's result, then ack.

    A handler that raises gets its request rejected without requeue (to a
    dead-letter exchange if the queue has one), and the error is logged.
    """
    async for request in channel.consume(queue, prefetch=prefetch):
        try:
            result = handler(request)
            if inspect.isawaitable(result):
                result = await result
        except Exception:
            log.exception("RPC handler failed on a request from queue %r", _qname(queue))
            request.reject(requeue=False)
            continue
        if request.reply_to:
            await channel.publish(
                result if result is not None else b"",
                request.reply_to,
                properties=BasicProperties(correlation_id=request.correlation_id),
            )
        request.ack()


def _qname(queue: str | Queue) -> str:
    return queue if isinstance(queue, str) else queue.name
