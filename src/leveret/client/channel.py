"""Channels: declarations, publishing with confirms, gets, transactions and recovery.

The handles a channel returns live beside it: the declared exchanges, queues and
bindings in `declared.py`, consumers in `consumer.py` (both re-exported here).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from pamqp import commands as cmd

from leveret.client import events as ev
from leveret.client._state import CLOSED, OPEN, OPENING, RECOVERING
from leveret.client.consumer import Consumer
from leveret.client.declared import Exchange, Queue, _Binding, _name
from leveret.client.errors import (
    BlockedTimeout,
    ChannelClosed,
    ClientError,
    ConnectionClosed,
    ConnectionLost,
    ConsumerCancelled,
    MessageNacked,
    MessageReturned,
    PublishFailed,
    PublishTimeout,
    Unconfirmed,
)
from leveret.client.message import Message
from leveret.protocol import connection as pc
from leveret.protocol import methods as wire
from leveret.protocol.constants import (
    BASIC_CANCEL,
    BASIC_GET_EMPTY,
    BASIC_GET_OK,
    BASIC_QOS_OK,
    BASIC_RECOVER_OK,
    CHANNEL_FLOW,
    CONFIRM_SELECT_OK,
    EXCHANGE_BIND_OK,
    EXCHANGE_DECLARE_OK,
    EXCHANGE_DELETE_OK,
    EXCHANGE_UNBIND_OK,
    QUEUE_BIND_OK,
    QUEUE_DECLARE_OK,
    QUEUE_DELETE_OK,
    QUEUE_PURGE_OK,
    QUEUE_UNBIND_OK,
    REPLY_SUCCESS,
    TX_COMMIT_OK,
    TX_ROLLBACK_OK,
    TX_SELECT_OK,
)
from leveret.protocol.frames import body_frames
from leveret.protocol.properties import EMPTY_PROPERTIES, BasicProperties, content_header_frame

if TYPE_CHECKING:
    from leveret.client.connection import Connection

log = logging.getLogger("leveret.client")

DIRECT_REPLY_TO = "amq.rabbitmq.reply-to"

# Channel states (client/_state.py, shared with the consumers).
_OPENING = OPENING
_OPEN = OPEN
_RECOVERING = RECOVERING
_CLOSED = CLOSED


class OutgoingMessage(NamedTuple):
    """One item for publish_many() when it needs more than a body.

    Unset fields take the values given to publish_many() itself.
    """

    body: bytes | str
    routing_key: str | None = None
    exchange: str | None = None
    properties: BasicProperties | None = None


class _Pending:
    """A publish waiting for its confirm: its bytes (to send again after a
    reconnect) and who waits (a future, or a publish_many batch)."""

    __slots__ = ("frames", "future", "batch", "index", "mandatory", "returned")

    def __init__(
        self,
        frames: bytes,
        future: asyncio.Future[None] | None,
        batch: _Batch | None,
        index: int,
        mandatory: tuple[str, str, bytes] | None,
    ) -> None:
        self.frames = frames
        self.future = future
        self.batch = batch
        self.index = index
        self.mandatory = mandatory
        self.returned: MessageReturned | None = None

    def settle(self, exc: Exception | None) -> None:
        if self.returned is not None:
            exc = self.returned
        fut = self.future
        if fut is not None:
            if not fut.done():
                if exc is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(exc)
        elif self.batch is not None:
            self.batch.settle(self.index, exc)


class _Batch:
    """publish_many() bookkeeping: how many are out, which failed."""

    __slots__ = ("outstanding", "failures", "done")

    def __init__(self) -> None:
        self.outstanding = 0
        self.failures: list[tuple[int, Exception]] = []
        self.done = asyncio.Event()

    def settle(self, index: int, exc: Exception | None) -> None:
        self.outstanding -= 1
        if exc is not None:
            self.failures.append((index, exc))
        if self.outstanding <= 0:
            self.done.set()

    async def wait_all(self) -> None:
        """Until every publish added so far is settled.

        `done` is set each time the count touches zero, which happens between
        windows too; so it is cleared and waited on again while any is out.
        """
        while self.outstanding > 0:
            self.done.clear()
            await self.done.wait()


class Channel:
    """One AMQP channel. Get it from `await connection.channel()`.

    Operations wait while the connection is being recovered and raise
    ChannelClosed (with the broker's code and text) once the channel is
    closed; a channel the broker closed stays closed (its error was ours),
    while the connection and its other channels carry on.
    """

    def __init__(
        self, conn: Connection, number: int, confirms: bool, internal: bool = False
    ) -> None:
        self.connection = conn
        self.number = number
        self.confirms = confirms
        self._internal = internal
        self._state = _OPENING
        self._epoch = 0  # bumped whenever delivery tags stop meaning anything
        self._close_exc: ChannelClosed | ConnectionClosed | None = None
        self._open_fut: asyncio.Future[None] = conn._loop.create_future()
        self._close_fut: asyncio.Future[None] | None = None
        self._rpc: collections.deque[tuple[frozenset[int], asyncio.Future[Any]]] = (
            collections.deque()
        )
        self._consumers: dict[str, Consumer] = {}
        self._seq = 0
        self._unconfirmed: dict[int, _Pending] = {}
        self._order: collections.deque[int] = collections.deque()
        self._room = asyncio.Event()
        self._room.set()
        self._prefetch: tuple[int, int, bool] | None = None
        self._tx = False
        self._publish_frames: dict[tuple[str, str, bool], bytes] = {}
        self._return_callbacks: list[Any] = []
        self._confirm_listeners: list[Any] = []
        self._reply_consumer: Consumer | None = None

    def __repr__(self) -> str:
        states = {_OPENING: "opening", _OPEN: "open", _RECOVERING: "recovering", _CLOSED: "closed"}
        return f"<leveret.client.Channel {self.number} {states[self._state]}>"

    @property
    def is_open(self) -> bool:
        return self._state == _OPEN

    @property
    def _is_open(self) -> bool:
        return self._state == _OPEN

    # --- lifecycle (called by the connection) --------------------------------------

    async def _opened_now(self) -> None:
        try:
            await self._open_fut
        except ConnectionLost:
            if self._state != _RECOVERING:
                raise
            await self._ready()  # recovery reopens it, confirms included
            return
        if self.confirms:
            await self._call_now(cmd.Confirm.Select(), CONFIRM_SELECT_OK)

    def _on_open_ok(self) -> None:
        self._state = _OPEN
        if not self._open_fut.done():
            self._open_fut.set_result(None)

    def _on_broker_close(self, exc: ChannelClosed) -> None:
        log.warning("channel %d closed by the broker: %s", self.number, exc)
        self.connection._emit(ev.ChannelClosedByBroker(self.number, exc.reply_code, exc.reply_text))
        self._close(exc)

    def _on_close_ok(self) -> None:
        if self._close_fut is not None and not self._close_fut.done():
            self._close_fut.set_result(None)

    def _on_connection_closed(self, exc: ConnectionClosed) -> None:
        self._close(exc)

    def _close(self, exc: ChannelClosed | ConnectionClosed) -> None:
        """Closed for good: fail everything that waits, end every consumer."""
        if self._state == _CLOSED:
            return
        self._state = _CLOSED
        self._epoch += 1
        self._close_exc = exc
        self.connection._channels.pop(self.number, None)
        if not self._open_fut.done():
            self._open_fut.set_exception(exc)
            self._open_fut.exception()
        self._fail_rpcs(exc)
        pending = self._unconfirmed
        self._unconfirmed = {}
        self._order.clear()
        closed_by_us = exc.reply_code == REPLY_SUCCESS
        broker_error = isinstance(exc, ChannelClosed) and not closed_by_us
        for p in pending.values():
            p.returned = None
            if broker_error:
                # The broker closed the channel (a publish to a missing exchange: 404):
                # what waits raises its error, NotFound and the like, with the code.
                # The broker sent every confirm it had before its close, so these
                # were not confirmed; one waiting for the disk may still be stored.
                p.settle(
                    ChannelClosed.from_reply(
                        exc.reply_code, exc.reply_text, exc.class_id, exc.method_id
                    )
                )
            else:
                p.settle(Unconfirmed(f"channel closed before the confirm arrived: {exc}"))
        self._room.set()
        for consumer in list(self._consumers.values()):
            consumer._end(None if closed_by_us else exc)
        self._consumers.clear()
        if self._close_fut is not None and not self._close_fut.done():
            self._close_fut.set_result(None)

    def _fail_rpcs(self, exc: Exception) -> None:
        rpc = self._rpc
        self._rpc = collections.deque()
        for _, fut in rpc:
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()

    def _on_link_lost(self, exc: ConnectionLost) -> None:
        """The TCP connection went; the channel will be reopened by recovery."""
        if self._state == _CLOSED:
            return
        if self._internal:
            self._close(exc)
            return
        self._state = _RECOVERING
        self._epoch += 1
        if not self._open_fut.done():
            # An open (the first, or recovery's reopen) was waiting for open-ok
            # on the link that just went: wake it now rather than never.
            self._open_fut.set_exception(exc)
            self._open_fut.exception()
        self._open_fut = self.connection._loop.create_future()
        self._fail_rpcs(exc)
        for consumer in self._consumers.values():
            consumer._on_link_lost()
        if not self.connection.republish and self._unconfirmed:
            pending = self._unconfirmed
            self._unconfirmed = {}
            self._order.clear()
            for p in pending.values():
                p.returned = None
                p.settle(Unconfirmed(f"connection lost before the confirm arrived ({exc})"))
            self.connection._emit(ev.PublishesFailed(self.number, len(pending)))
            log.warning(
                "%d publishes on channel %d were not confirmed before the connection was "
                "lost; raised as Unconfirmed",
                len(pending),
                self.number,
            )
            self._room.set()

    async def _reopen(self) -> None:
        conn = self.connection
        core = conn._live_core()
        if self._open_fut.done():
            self._open_fut = conn._loop.create_future()
        self._state = _OPENING
        self._seq = 0  # a new channel numbers its publishes from 1 again
        core.open_channel(self.number)
        conn._flush_soon()
        await asyncio.wait_for(asyncio.shield(self._open_fut), 30)
        if self.confirms:
            await self._call_now(cmd.Confirm.Select(), CONFIRM_SELECT_OK)
        if self._tx:
            await self._call_now(cmd.Tx.Select(), TX_SELECT_OK)

    async def _restore_state(self) -> int:
        """Qos, consumers, then the unconfirmed publishes; returns the consumer count."""
        if self._prefetch is not None:
            count, size, global_ = self._prefetch
            await self._call_now(cmd.Basic.Qos(size, count, global_), BASIC_QOS_OK)
        restored = 0
        for consumer in list(self._consumers.values()):
            await consumer._restore()
            restored += 1
        pending = self._unconfirmed
        if pending:
            core = self.connection._live_core()  # raises before the list is touched
            self._unconfirmed = {}
            self._order.clear()
            for p in pending.values():
                self._seq += 1
                self._unconfirmed[self._seq] = p
                self._order.append(self._seq)
                core.send_publish_frames(self.number, p.frames)
            self.connection._flush_soon()
            log.info("sent %d unconfirmed publishes again on channel %d", len(pending), self.number)
            self.connection._emit(ev.PublishesRetried(self.number, len(pending)))
        return restored

    def _after_recovery(self) -> None:
        self._room.set()

    # --- waiting and calling ------------------------------------------------------------

    async def _ready(self) -> None:
        while self._state != _OPEN:
            if self._state == _CLOSED:
                assert self._close_exc is not None
                raise self._close_exc
            await self.connection._wait_ready()
            if self._state == _OPENING:
                with contextlib.suppress(ConnectionLost):  # lost again: go round
                    await asyncio.shield(self._open_fut)

    def _check_closed(self) -> None:
        if self._state == _CLOSED:
            assert self._close_exc is not None
            raise self._close_exc

    async def _call(self, method: Any, *expect: int) -> Any:
        """Send a synchronous method once the channel is usable; return the reply."""
        while True:
            if self._state != _OPEN or not self.connection.is_open:
                await self._ready()
                await self.connection._wait_ready()
            try:
                return await self._call_now(method, *expect)
            except ConnectionLost:
                if self._state == _CLOSED or not self.connection.recovery:
                    raise
                # The reply was lost with the link; the method is sent again once
                # the channel is back (the declares, binds and qos are idempotent).
                if not _idempotent(method):
                    raise

    async def _call_now(self, method: Any, *expect: int) -> Any:
        conn = self.connection
        fut: asyncio.Future[Any] = conn._loop.create_future()
        try:
            conn._send_method(self.number, method)
        except pc.UsageError:
            self._check_closed()
            raise ConnectionLost("the connection is not open") from None
        if expect:
            self._rpc.append((frozenset(expect), fut))
            return await fut
        return None

    def _on_method(self, method: Any) -> None:
        index = method.index
        rpc = self._rpc
        if rpc and index in rpc[0][0]:
            _, fut = rpc.popleft()
            if not fut.done():
                fut.set_result(method)
            return
        if index == BASIC_CANCEL:
            consumer = self._consumers.pop(method.consumer_tag, None)
            if consumer is not None:
                log.warning(
                    "broker cancelled consumer %r on queue %r",
                    consumer.consumer_tag,
                    consumer.queue_name,
                )
                self.connection._emit(
                    ev.ConsumerCancelledByBroker(consumer.consumer_tag, consumer.queue_name)
                )
                consumer._end(ConsumerCancelled(consumer.consumer_tag))
            return
        if index == CHANNEL_FLOW:
            self.connection._send_method(self.number, cmd.Channel.FlowOk(method.active))
            return
        log.warning("unexpected %s on channel %d; ignored", method.name, self.number)

    # --- exchanges -------------------------------------------------------------------------

    async def declare_exchange(
        self,
        name: str,
        type: str = "direct",  # noqa: A002 - AMQP's name
        *,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        passive: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> Exchange:
        """exchange.declare; the Exchange is re-declared after a reconnect (unless passive)."""
        exchange = Exchange(self, name, type, durable, auto_delete, internal, arguments)
        await self._call(exchange._method(passive), EXCHANGE_DECLARE_OK)
        if not passive and not name.startswith("amq.") and name:
            self.connection._remember_exchange(exchange)
        return exchange

    async def delete_exchange(self, name: str, *, if_unused: bool = False) -> None:
        await self._call(
            wire.unchecked(cmd.Exchange.Delete, exchange=name, if_unused=if_unused),
            EXCHANGE_DELETE_OK,
        )
        self.connection._forget_exchange(name)

    async def bind_exchange(
        self,
        destination: str | Exchange,
        source: str | Exchange,
        routing_key: str = "",
        arguments: dict[str, Any] | None = None,
    ) -> None:
        binding = _Binding("exchange", _name(destination), _name(source), routing_key, arguments)
        await self._call(binding.method(bind=True), EXCHANGE_BIND_OK)
        self.connection._remember_binding(binding)

    async def unbind_exchange(
        self,
        destination: str | Exchange,
        source: str | Exchange,
        routing_key: str = "",
        arguments: dict[str, Any] | None = None,
    ) -> None:
        binding = _Binding("exchange", _name(destination), _name(source), routing_key, arguments)
        await self._call(binding.method(bind=False), EXCHANGE_UNBIND_OK)
        self.connection._forget_binding(binding)

    # --- queues ------------------------------------------------------------------------------

    async def declare_queue(
        self,
        name: str = "",
        *,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        passive: bool = False,
        arguments: dict[str, Any] | None = None,
    ) -> Queue:
        """queue.declare. The Queue carries the broker's message and consumer counts.

        An empty name asks the broker for one (`queue.name` has it; after a
        reconnect the queue is declared again and `queue.name` changes).
        """
        queue = Queue(self, name, durable, exclusive, auto_delete, arguments)
        ok = await self._call(queue._method(passive), QUEUE_DECLARE_OK)
        queue._update(ok)
        if not passive:
            self.connection._remember_queue(queue)
        return queue

    async def bind_queue(
        self,
        queue: str | Queue,
        exchange: str | Exchange,
        routing_key: str = "",
        arguments: dict[str, Any] | None = None,
    ) -> None:
        binding = _Binding("queue", queue, _name(exchange), routing_key, arguments)
        await self._call(binding.method(bind=True), QUEUE_BIND_OK)
        self.connection._remember_binding(binding)

    async def unbind_queue(
        self,
        queue: str | Queue,
        exchange: str | Exchange,
        routing_key: str = "",
        arguments: dict[str, Any] | None = None,
    ) -> None:
        binding = _Binding("queue", queue, _name(exchange), routing_key, arguments)
        await self._call(binding.method(bind=False), QUEUE_UNBIND_OK)
        self.connection._forget_binding(binding)

    async def purge_queue(self, queue: str | Queue) -> int:
        """Remove every ready message; returns how many."""
        ok = await self._call(wire.unchecked(cmd.Queue.Purge, queue=_name(queue)), QUEUE_PURGE_OK)
        return ok.message_count

    async def delete_queue(
        self, queue: str | Queue, *, if_unused: bool = False, if_empty: bool = False
    ) -> int:
        """Delete the queue; returns how many messages it still had."""
        name = _name(queue)
        ok = await self._call(
            wire.unchecked(cmd.Queue.Delete, queue=name, if_unused=if_unused, if_empty=if_empty),
            QUEUE_DELETE_OK,
        )
        self.connection._forget_queue(name)
        return ok.message_count

    # --- qos, get, tx, recover -----------------------------------------------------------------

    async def qos(
        self, prefetch_count: int = 0, prefetch_size: int = 0, global_: bool = False
    ) -> None:
        """basic.qos: at most `prefetch_count` unacked deliveries per consumer (per channel
        with global_); restored after a reconnect."""
        if not 0 <= prefetch_count <= 65535:
            raise ValueError(f"prefetch_count must be 0..65535, got {prefetch_count}")
        await self._call(cmd.Basic.Qos(prefetch_size, prefetch_count, global_), BASIC_QOS_OK)
        self._prefetch = (prefetch_count, prefetch_size, global_)

    async def get(self, queue: str | Queue, *, no_ack: bool = False) -> Message | None:
        """basic.get: one message, or None when the queue is empty."""
        reply = await self._call(
            wire.unchecked(cmd.Basic.Get, queue=_name(queue), no_ack=no_ack),
            BASIC_GET_OK,
            BASIC_GET_EMPTY,
        )
        if isinstance(reply, Message):
            if no_ack:
                reply._state = 2
            return reply
        return None

    def _on_get_ok(self, event: pc.GetOk) -> None:
        message = Message(
            event.body,
            event.delivery_tag,
            event.redelivered,
            event.exchange,
            event.routing_key,
            None,
            event.header,
            self,
            self._epoch,
            False,
            message_count=event.message_count,
        )
        rpc = self._rpc
        if rpc and BASIC_GET_OK in rpc[0][0]:
            _, fut = rpc.popleft()
            if not fut.done():
                fut.set_result(message)

    async def tx_select(self) -> None:
        """Put the channel in transaction mode (not with confirms: open it with confirms=False)."""
        if self.confirms:
            raise ClientError(
                "a channel in confirm mode cannot use transactions; "
                "open it with connection.channel(confirms=False)"
            )
        await self._call(cmd.Tx.Select(), TX_SELECT_OK)
        self._tx = True

    async def tx_commit(self) -> None:
        await self._call(cmd.Tx.Commit(), TX_COMMIT_OK)

    async def tx_rollback(self) -> None:
        await self._call(cmd.Tx.Rollback(), TX_ROLLBACK_OK)

    @contextlib.asynccontextmanager
    async def transaction(self) -> Any:
        """`async with channel.transaction():` commits on success, rolls back on error."""
        if not self._tx:
            await self.tx_select()
        try:
            yield self
        except BaseException:
            if self._state == _OPEN:
                await self.tx_rollback()
            raise
        await self.tx_commit()

    async def recover(self, requeue: bool = True) -> None:
        """basic.recover: redeliver this channel's unacked messages."""
        await self._call(cmd.Basic.Recover(requeue=requeue), BASIC_RECOVER_OK)

    async def close(self) -> None:
        """Close the channel (idempotent); its consumers end, pending confirms fail."""
        if self._state == _CLOSED:
            return
        conn = self.connection
        core = conn._core
        if self._state == _OPEN and core is not None:
            self._close_fut = conn._loop.create_future()
            core.close_channel(self.number)
            conn._flush_soon()
            with contextlib.suppress(TimeoutError, ConnectionClosed):
                await asyncio.wait_for(asyncio.shield(self._close_fut), 10)
        self._close(ChannelClosed(REPLY_SUCCESS, "closed by the application"))

    async def __aenter__(self) -> Channel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- publishing ---------------------------------------------------------------------------

    def _encode(
        self,
        body: bytes | str,
        exchange: str,
        routing_key: str,
        mandatory: bool,
        properties: BasicProperties | None,
    ) -> bytes:
        if isinstance(body, str):
            body = body.encode()
        elif not isinstance(body, bytes | bytearray | memoryview):
            raise TypeError(f"message body must be bytes or str, not {type(body).__name__}")
        key = (exchange, routing_key, mandatory)
        method = self._publish_frames.get(key)
        n = self.number
        if method is None:
            method = wire.encode_publish(n, exchange, routing_key, mandatory)
            if len(self._publish_frames) > 1000:
                self._publish_frames.clear()
            self._publish_frames[key] = method
        props = properties.encode() if properties is not None else EMPTY_PROPERTIES
        parts = [method, content_header_frame(n, len(body), props)]
        if body:
            parts += body_frames(n, bytes(body), self.connection.frame_max)
        return b"".join(parts)

    async def _publish_ready(self, timeout: float | None) -> None:
        """Wait until a publish can be written: channel open, not blocked, socket drained."""
        conn = self.connection
        loop = conn._loop
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            if self._state != _OPEN or not conn.is_open:
                await asyncio.wait_for(self._ready(), _left(deadline, loop))
                continue
            if conn.blocked:
                try:
                    await asyncio.wait_for(conn._unblocked.wait(), _left(deadline, loop))
                except TimeoutError:
                    raise BlockedTimeout(
                        f"the broker has blocked publishing ({conn.blocked_reason}) for "
                        f"longer than the {timeout:g} s timeout"
                    ) from None
                continue
            if not conn._writable.is_set():
                await asyncio.wait_for(conn._writable.wait(), _left(deadline, loop))
                continue
            return

    async def publish(
        self,
        body: bytes | str,
        routing_key: str = "",
        exchange: str | Exchange = "",
        *,
        properties: BasicProperties | None = None,
        mandatory: bool = False,
        timeout: float | None = None,
        **property_values: Any,
    ) -> None:
        """Publish one message.

        On a confirm channel (the default) this returns once the broker
        confirmed it, and raises MessageReturned (mandatory and unroutable),
        MessageNacked, PublishTimeout, Unconfirmed (connection lost and
        republish off), or the error with which the broker closed the channel
        (NotFound for a missing exchange, AccessRefused, ...: ChannelClosed). Properties come as `properties=BasicProperties(...)`
        or as keywords (`message_id="m1", persistent=True, headers={...}`).
        While the broker blocks publishing this waits, at most `timeout` s
        (BlockedTimeout).
        """
        exchange = _name(exchange)
        if property_values:
            properties = _properties(properties, property_values)
        frames = self._encode(body, exchange, routing_key, mandatory, properties)
        conn = self.connection
        if (
            self._state != _OPEN
            or conn._state != "open"
            or conn.blocked
            or not conn._writable.is_set()
        ):
            await self._publish_ready(timeout)
        core = conn._core
        assert core is not None
        if not self.confirms:
            core.send_publish_frames(self.number, frames)
            conn._flush_soon()
            return
        fut: asyncio.Future[None] = conn._loop.create_future()
        self._seq += 1
        tag = self._seq
        self._unconfirmed[tag] = _Pending(
            frames,
            fut,
            None,
            0,
            (
                exchange,
                routing_key,
                bytes(body) if isinstance(body, bytes | bytearray) else body.encode(),
            )
            if mandatory
            else None,
        )
        self._order.append(tag)
        core.send_publish_frames(self.number, frames)
        conn._flush_soon()
        if timeout is None:
            await fut
            return
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            raise PublishTimeout(f"no confirm within {timeout:g} s") from None

    async def publish_many(
        self,
        messages: Iterable[bytes | str | OutgoingMessage],
        routing_key: str = "",
        exchange: str | Exchange = "",
        *,
        properties: BasicProperties | None = None,
        mandatory: bool = False,
        window: int = 1000,
        timeout: float | None = None,
        **property_values: Any,
    ) -> int:
        """Publish many messages with at most `window` unconfirmed at a time.

        Confirms are pipelined rather than awaited one by one, so this runs at
        the broker's speed. Returns the number published once every one is
        confirmed; raises PublishFailed listing (index, error) for those that
        were returned, nacked or not confirmed.
        """
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        exchange = _name(exchange)
        if property_values:
            properties = _properties(properties, property_values)
        conn = self.connection
        batch = _Batch()
        count = 0
        unconfirmed = self._unconfirmed
        since_flush = 0
        for index, item in enumerate(messages):
            if isinstance(item, OutgoingMessage):
                ex = exchange if item.exchange is None else item.exchange
                rk = routing_key if item.routing_key is None else item.routing_key
                props = properties if item.properties is None else item.properties
                body = item.body
            else:
                ex, rk, props, body = exchange, routing_key, properties, item
            frames = self._encode(body, ex, rk, mandatory, props)
            if self.confirms:
                while len(self._unconfirmed) >= window:
                    self._room.clear()
                    conn._flush()
                    await self._room.wait()
                    self._check_closed()
            if (
                self._state != _OPEN
                or conn._state != "open"
                or conn.blocked
                or not conn._writable.is_set()
            ):
                conn._flush()
                await self._publish_ready(timeout)
            unconfirmed = self._unconfirmed
            core = conn._core
            assert core is not None
            if self.confirms:
                self._seq += 1
                tag = self._seq
                raw = body.encode() if isinstance(body, str) else bytes(body)
                unconfirmed[tag] = _Pending(
                    frames, None, batch, index, (ex, rk, raw) if mandatory else None
                )
                self._order.append(tag)
                batch.outstanding += 1
            core.send_publish_frames(self.number, frames)
            count += 1
            since_flush += 1
            if since_flush >= 64:
                since_flush = 0
                conn._flush()
        conn._flush()
        if self.confirms and batch.outstanding > 0:
            try:
                await asyncio.wait_for(batch.wait_all(), timeout)
            except TimeoutError:
                raise PublishTimeout(
                    f"{batch.outstanding} of {count} publishes unconfirmed after {timeout:g} s"
                ) from None
        if batch.failures:
            batch.failures.sort(key=lambda f: f[0])
            raise PublishFailed(batch.failures, count)
        return count

    def _on_confirm(self, tag: int, multiple: bool, nack: bool) -> None:
        unconfirmed = self._unconfirmed
        order = self._order
        exc = MessageNacked("the broker nacked the publish") if nack else None
        if multiple:
            while order and order[0] <= tag:
                p = unconfirmed.pop(order.popleft(), None)
                if p is not None:
                    p.settle(exc)
        else:
            p = unconfirmed.pop(tag, None)
            if p is not None:
                p.settle(exc)
            while order and order[0] not in unconfirmed:
                order.popleft()
        if not self._room.is_set():
            self._room.set()
        if self._confirm_listeners:
            for listener in self._confirm_listeners:
                listener(tag, multiple, nack)

    def publish_nowait(
        self,
        body: bytes,
        routing_key: str = "",
        exchange: str = "",
        *,
        header: bytes | None = None,
        properties: BasicProperties | None = None,
    ) -> asyncio.Future[None] | None:
        """Send one publish now and return the future of its confirm (None without confirms).

        For pipelines that forward messages (leveret.links' shovels and
        federation): nothing is awaited, yet on a confirm channel the publish
        is tracked like publish()'s, so after a reconnect it is sent again
        and its future settles with that copy's confirm (MessageNacked,
        ConnectionClosed or Unconfirmed when it fails). `header` is a content
        header payload as a received Message carries it (`message.raw_header`),
        sent on as its bytes; else `properties`. Check can_publish first (or
        await wait_publishable()): ChannelClosed or ConnectionLost otherwise.
        """
        self._check_closed()
        conn = self.connection
        core = conn._core
        if core is None or self._state != _OPEN or conn._state != "open":
            raise ConnectionLost("the connection is not open")
        n = self.number
        key = (exchange, routing_key, False)
        method = self._publish_frames.get(key)
        if method is None:
            method = wire.encode_publish(n, exchange, routing_key, False)
            if len(self._publish_frames) > 1000:
                self._publish_frames.clear()
            self._publish_frames[key] = method
        if header is not None:
            props = header[12:]  # past class id, weight and body size
        else:
            props = properties.encode() if properties is not None else EMPTY_PROPERTIES
        parts = [method, content_header_frame(n, len(body), props)]
        if body:
            parts += body_frames(n, body, conn.frame_max)
        frames = b"".join(parts)
        core.send_publish_frames(n, frames)
        conn._flush_soon()
        if not self.confirms:
            return None
        fut: asyncio.Future[None] = conn._loop.create_future()
        self._seq += 1
        self._unconfirmed[self._seq] = _Pending(frames, fut, None, 0, None)
        self._order.append(self._seq)
        return fut

    # --- the low-level publishing API (load generators, batch writers) ------------------

    def add_confirm_listener(self, listener: Any) -> None:
        """Call `listener(delivery_tag, multiple, nack)` for every confirm the broker sends,
        including those of send_encoded() publishes."""
        self._confirm_listeners.append(listener)

    def encode_publish(
        self,
        body: bytes | str,
        routing_key: str = "",
        exchange: str | Exchange = "",
        *,
        properties: BasicProperties | None = None,
        mandatory: bool = False,
    ) -> bytes:
        """A publish (method, header and body frames) encoded once, for send_encoded()."""
        return self._encode(body, _name(exchange), routing_key, mandatory, properties)

    @property
    def can_publish(self) -> bool:
        """Whether a publish can be written now: open, not blocked, socket not backed up."""
        conn = self.connection
        return (
            self._state == _OPEN
            and conn._state == "open"
            and not conn.blocked
            and conn._writable.is_set()
        )

    async def wait_publishable(self, timeout: float | None = None) -> None:
        """Wait until can_publish (BlockedTimeout if blocked longer than `timeout`)."""
        await self._publish_ready(timeout)

    def send_encoded(self, frames: bytes, count: int = 1) -> None:
        """Write `count` publishes encoded by encode_publish() (concatenated) at once.

        Nothing is awaited and, on a confirm channel, nothing is tracked per
        message: the publishes take sequence numbers and their confirms reach
        the confirm listeners only. Check can_publish first (or await
        wait_publishable()); ChannelClosed if the channel is closed.
        """
        self._check_closed()
        core = self.connection._core
        if core is None or self._state != _OPEN:
            raise ConnectionLost("the connection is not open")
        core.send_publish_frames(self.number, frames)
        if self.confirms:
            self._seq += count
        self.connection._flush_soon()

    def add_return_callback(self, callback: Any) -> None:
        """Call `callback(MessageReturned)` for returns that no awaited publish claims
        (mandatory publishes on a channel without confirms)."""
        self._return_callbacks.append(callback)

    def _on_return(self, event: pc.Return) -> None:
        message = Message(
            event.body, 0, False, event.exchange, event.routing_key, None, event.header
        )
        returned = MessageReturned(event.reply_code, event.reply_text, message)
        # The broker sends a return before the ack of the same publish, so the
        # return belongs to the oldest unconfirmed mandatory publish like it.
        unconfirmed = self._unconfirmed
        for tag in self._order:
            p = unconfirmed.get(tag)
            if p is None or p.mandatory is None or p.returned is not None:
                continue
            if p.mandatory == (event.exchange, event.routing_key, event.body):
                p.returned = returned
                return
        if self._return_callbacks:
            for callback in self._return_callbacks:
                callback(returned)
        else:
            log.warning("%s (no publish awaited it)", returned)

    # --- consuming ------------------------------------------------------------------------------

    def consume(
        self,
        queue: str | Queue,
        *,
        prefetch: int | None = None,
        no_ack: bool = False,
        exclusive: bool = False,
        consumer_tag: str | None = None,
        arguments: dict[str, Any] | None = None,
        offset: Any = None,
        on_message: Any = None,
        on_delivery: Any = None,
    ) -> Consumer:
        """A consumer on `queue`: iterate it with `async for`, or `await` it to start it.

        `prefetch` sets basic.qos for this consumer. `offset` makes it a stream
        consumer ("first", "last", "next", an offset number or a datetime);
        after a reconnect it resumes after the last message it handed out.
        With `on_message`, each message is passed to `on_message(message)` on
        the event loop as it arrives instead of being buffered for iteration
        (the callback must not block). `on_delivery` is the low-level form for
        load generators: it gets the protocol core's Deliver event (no Message
        is built) and settles with channel.ack_delivery().
        """
        consumer = Consumer(
            self, queue, prefetch, no_ack, exclusive, consumer_tag, arguments, offset
        )
        if on_message is not None:
            consumer._callback = on_message
        if on_delivery is not None:
            if offset is not None:
                raise ValueError("on_delivery is not for stream consumers (offsets are tracked)")
            consumer._raw = on_delivery
        return consumer

    def _on_deliver(self, event: pc.Deliver) -> None:
        consumer = self._consumers.get(event.consumer_tag)
        if consumer is None:
            log.debug("delivery for unknown consumer %r dropped", event.consumer_tag)
            return
        raw = consumer._raw
        if raw is not None and consumer._plain:
            raw(event)
            return
        message = Message(
            event.body,
            event.delivery_tag,
            event.redelivered,
            event.exchange,
            event.routing_key,
            event.consumer_tag,
            event.header,
            self,
            self._epoch,
            consumer.no_ack,
        )
        callback = consumer._callback
        if callback is not None and consumer._plain:
            callback(message)  # the common case of _push, without the call
        else:
            consumer._push(message)

    def ack_delivery(self, delivery_tag: int, multiple: bool = False) -> bool:
        """Ack by delivery tag (for on_delivery consumers, which get no Message).

        Nothing checks the tag: acking one twice, or one the broker does not
        know, makes the broker close the channel (406). False if the channel
        is not open (the delivery will be redelivered).
        """
        return self._settle(0, delivery_tag, multiple, False)

    def _settle(self, kind: int, delivery_tag: int, multiple: bool, requeue: bool) -> bool:
        conn = self.connection
        core = conn._core
        if self._state != _OPEN or core is None:
            return False
        if kind == 0:
            core.send_ack(self.number, delivery_tag, multiple)
        elif kind == 1:
            core.send_nack(self.number, delivery_tag, multiple, requeue)
        else:
            core.send_reject(self.number, delivery_tag, requeue)
        if multiple:
            # A cumulative ack frees many prefetch slots: let the broker know now
            # rather than after the rest of this read is processed.
            conn._flush()
        else:
            conn._flush_soon()
        return True

    # --- direct reply-to and RPC ---------------------------------------------------------------------

    async def rpc_call(
        self,
        body: bytes | str,
        routing_key: str,
        exchange: str | Exchange = "",
        *,
        timeout: float = 30.0,
        mandatory: bool = False,
        properties: BasicProperties | None = None,
        **property_values: Any,
    ) -> Message:
        """Publish a request with a correlation id and await its reply (direct reply-to).

        The responder publishes its reply to the request's `reply_to` with the
        same `correlation_id`; `serve()` is such a responder. With `mandatory`
        (on a confirm channel) a request no queue takes raises MessageReturned
        at once instead of an RPCTimeout later.
        """
        from leveret.client.rpc import rpc_call

        return await rpc_call(
            self,
            body,
            routing_key,
            _name(exchange),
            timeout,
            properties,
            property_values,
            mandatory,
        )

    def serve(self, queue: str | Queue, handler: Any, *, prefetch: int = 100) -> Any:
        """Answer RPC requests on `queue` with `handler(message) -> bytes` (sync or async).

        Returns the asyncio Task; cancel it to stop serving.
        """
        from leveret.client.rpc import serve

        return asyncio.ensure_future(serve(self, queue, handler, prefetch))


def _left(deadline: float | None, loop: asyncio.AbstractEventLoop) -> float | None:
    if deadline is None:
        return None
    return max(0.0, deadline - loop.time())


_IDEMPOTENT = (
    cmd.Exchange.Declare,
    cmd.Queue.Declare,
    cmd.Queue.Bind,
    cmd.Exchange.Bind,
    cmd.Basic.Qos,
    cmd.Confirm.Select,
)


def _idempotent(method: Any) -> bool:
    if isinstance(method, cmd.Queue.Declare):
        return bool(method.queue)  # a server-named declare would make a second queue
    return isinstance(method, _IDEMPOTENT)


def _properties(base: BasicProperties | None, values: dict[str, Any]) -> BasicProperties:
    """BasicProperties from keywords; `persistent=True` means delivery_mode 2."""
    props = BasicProperties(**(base.as_dict() if base is not None else {}))
    for key, value in values.items():
        if key == "persistent":
            props.delivery_mode = 2 if value else 1
        elif key in BasicProperties.__slots__:
            setattr(props, key, value)
        else:
            raise TypeError(f"unknown message property {key!r}")
    return props
