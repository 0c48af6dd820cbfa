"""The blocking API: leveret.client for scripts and threads, without asyncio.

    from leveret.client.blocking import connect

    with connect("amqp://guest:guest@127.0.0.1:5672/%2F") as conn:
        ch = conn.channel()
        ch.publish(b"hello", routing_key="jobs")

Every BlockingConnection runs the asyncio client (the same objects, no second
implementation) on an event loop in a background thread of its own. Each
blocking call submits the coroutine to that loop and waits for its result.
So heartbeats, confirms, deliveries and recovery keep running while your code
runs (a slow message handler does not cost the connection, unlike pika's
BlockingConnection, which only does I/O inside its own calls).

Thread safety:
- every method of BlockingConnection, BlockingChannel, BlockingQueue and
  BlockingExchange may be called from any thread, concurrently;
- a BlockingConsumer may be iterated from any thread, but from one at a time;
- BlockingMessage.ack/nack/reject may be called from any thread (once);
- listeners added with add_listener run on the connection's loop thread and
  must not block.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterable, Iterator
from typing import Any, TypeVar

from leveret.client import connection as aio
from leveret.client.channel import Channel, OutgoingMessage
from leveret.client.consumer import Consumer
from leveret.client.declared import Exchange, Queue
from leveret.client.events import ClientEvent
from leveret.client.message import Message
from leveret.protocol.properties import BasicProperties

T = TypeVar("T")

__all__ = [
    "BasicProperties",
    "BlockingChannel",
    "BlockingConnection",
    "BlockingConsumer",
    "BlockingExchange",
    "BlockingMessage",
    "BlockingQueue",
    "OutgoingMessage",
    "connect",
]


class _LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self) -> None:
        try:
            import uvloop

            self.loop = uvloop.new_event_loop()
        except ImportError:
            self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="leveret-client-loop", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError(
                "a blocking leveret.client call was made on the client's own loop thread "
                "(from a listener?); use the asyncio API there"
            )
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()


def connect(
    url: str | list[str] = "amqp://guest:guest@127.0.0.1:5672/%2F", **options: Any
) -> BlockingConnection:
    """Open a BlockingConnection; the options are leveret.client.connect()'s."""
    return BlockingConnection(url, **options)


class BlockingConnection:
    """A leveret.client Connection driven from a background loop thread."""

    def __init__(
        self, url: str | list[str] = "amqp://guest:guest@127.0.0.1:5672/%2F", **options: Any
    ) -> None:
        self._thread = _LoopThread()
        try:
            self._conn: aio.Connection = self._thread.run(aio.connect(url, **options))
        except BaseException:
            self._thread.stop()
            raise

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self._thread.run(coro, timeout)

    @property
    def connection(self) -> aio.Connection:
        """The asyncio Connection underneath (use it only on its loop)."""
        return self._conn

    @property
    def is_open(self) -> bool:
        return self._conn.is_open

    @property
    def blocked(self) -> bool:
        return self._conn.blocked

    @property
    def heartbeat(self) -> int:
        return self._conn.heartbeat

    @property
    def reconnects(self) -> int:
        return self._conn.reconnects

    def add_listener(self, callback: Callable[[ClientEvent], Any]) -> None:
        """Call `callback(event)` on the loop thread for every ClientEvent."""
        self._thread.call_soon(self._conn.add_listener, callback)

    def channel(self, *, confirms: bool = True, prefetch: int | None = None) -> BlockingChannel:
        return BlockingChannel(
            self, self._run(self._conn.channel(confirms=confirms, prefetch=prefetch))
        )

    def wait_recovered(self, timeout: float | None = None) -> None:
        self._run(self._conn.wait_recovered(timeout))

    def close(self) -> None:
        """Close the connection and stop its loop thread (idempotent)."""
        if not self._thread.loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._run(self._conn.close())
            self._thread.stop()

    def __enter__(self) -> BlockingConnection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<leveret.client.blocking.BlockingConnection {self._conn!r}>"


class BlockingMessage:
    """A received message; attributes are those of leveret.client.Message."""

    __slots__ = ("_message", "_thread")

    def __init__(self, message: Message, thread: _LoopThread) -> None:
        self._message = message
        self._thread = thread

    def __getattr__(self, name: str) -> Any:
        return getattr(self._message, name)

    def __repr__(self) -> str:
        return repr(self._message)

    @property
    def message(self) -> Message:
        return self._message

    def ack(self, multiple: bool = False) -> bool:
        channel = self._message._take("ack")
        if channel is None:
            return False
        self._thread.call_soon(channel._settle, 0, self._message.delivery_tag, multiple, False)
        return True

    def nack(self, requeue: bool = True, multiple: bool = False) -> bool:
        channel = self._message._take("nack")
        if channel is None:
            return False
        self._thread.call_soon(channel._settle, 1, self._message.delivery_tag, multiple, requeue)
        return True

    def reject(self, requeue: bool = True) -> bool:
        channel = self._message._take("reject")
        if channel is None:
            return False
        self._thread.call_soon(channel._settle, 2, self._message.delivery_tag, False, requeue)
        return True


class _ThreadedConsumer(Consumer):
    """A Consumer whose buffer a user thread drains (deque ops are atomic; a
    condition variable wakes the thread only when it sleeps)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._cv = threading.Condition()
        self._sleeping = False

    def _wake(self) -> None:
        # Under the lock: the consumer thread checks the buffer and starts
        # waiting while holding it, so no wake-up falls in between.
        with self._cv:
            if self._sleeping:
                self._cv.notify_all()

    def _end(self, error: BaseException | None) -> None:
        with self._cv:
            super()._end(error)
            self._cv.notify_all()


class BlockingConsumer:
    """An iterator of BlockingMessage; `next_message(timeout)` waits at most `timeout` s."""

    def __init__(self, conn: BlockingConnection, consumer: _ThreadedConsumer) -> None:
        self._conn = conn
        self._consumer = consumer

    @property
    def consumer_tag(self) -> str:
        return self._consumer.consumer_tag

    @property
    def last_offset(self) -> int | None:
        return self._consumer.last_offset

    def __iter__(self) -> Iterator[BlockingMessage]:
        return self

    def __next__(self) -> BlockingMessage:
        return self.next_message()

    def next_message(self, timeout: float | None = None) -> BlockingMessage:
        """The next message; TimeoutError after `timeout` s, StopIteration once cancelled."""
        c = self._consumer
        buffer = c._buffer
        if not buffer:
            with c._cv:
                while not buffer:
                    if c._error is not None:
                        raise c._error
                    if c._done:
                        raise StopIteration
                    c._sleeping = True
                    try:
                        if not c._cv.wait(timeout):
                            raise TimeoutError(f"no message within {timeout:g} s")
                    finally:
                        c._sleeping = False
        try:
            message = buffer.popleft()
        except IndexError:  # cleared by a reconnect in between
            return self.next_message(timeout)
        if c.offset is not None:
            c._handed_out(message)
        return BlockingMessage(message, self._conn._thread)

    def cancel(self) -> None:
        self._conn._run(self._consumer.cancel())

    def __enter__(self) -> BlockingConsumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.cancel()


class BlockingChannel:
    """A leveret.client Channel with blocking methods (same names and arguments)."""

    def __init__(self, conn: BlockingConnection, channel: Channel) -> None:
        self._conn = conn
        self._channel = channel

    def __repr__(self) -> str:
        return repr(self._channel)

    @property
    def channel(self) -> Channel:
        """The asyncio Channel underneath (use it only on its loop)."""
        return self._channel

    @property
    def number(self) -> int:
        return self._channel.number

    @property
    def is_open(self) -> bool:
        return self._channel.is_open

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self._conn._run(coro, timeout)

    # exchanges
    def declare_exchange(self, name: str, type: str = "direct", **kwargs: Any) -> BlockingExchange:  # noqa: A002
        return BlockingExchange(
            self, self._run(self._channel.declare_exchange(name, type, **kwargs))
        )

    def delete_exchange(self, name: str, *, if_unused: bool = False) -> None:
        self._run(self._channel.delete_exchange(name, if_unused=if_unused))

    def bind_exchange(
        self,
        destination: Any,
        source: Any,
        routing_key: str = "",
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self._run(
            self._channel.bind_exchange(
                _unwrap(destination), _unwrap(source), routing_key, arguments
            )
        )

    def unbind_exchange(
        self,
        destination: Any,
        source: Any,
        routing_key: str = "",
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self._run(
            self._channel.unbind_exchange(
                _unwrap(destination), _unwrap(source), routing_key, arguments
            )
        )

    # queues
    def declare_queue(self, name: str = "", **kwargs: Any) -> BlockingQueue:
        return BlockingQueue(self, self._run(self._channel.declare_queue(name, **kwargs)))

    def bind_queue(
        self,
        queue: Any,
        exchange: Any,
        routing_key: str = "",
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self._run(
            self._channel.bind_queue(_unwrap(queue), _unwrap(exchange), routing_key, arguments)
        )

    def unbind_queue(
        self,
        queue: Any,
        exchange: Any,
        routing_key: str = "",
        arguments: dict[str, Any] | None = None,
    ) -> None:
        self._run(
            self._channel.unbind_queue(_unwrap(queue), _unwrap(exchange), routing_key, arguments)
        )

    def purge_queue(self, queue: Any) -> int:
        return self._run(self._channel.purge_queue(_unwrap(queue)))

    def delete_queue(self, queue: Any, *, if_unused: bool = False, if_empty: bool = False) -> int:
        return self._run(
            self._channel.delete_queue(_unwrap(queue), if_unused=if_unused, if_empty=if_empty)
        )

    # publishing
    def publish(
        self, body: bytes | str, routing_key: str = "", exchange: Any = "", **kwargs: Any
    ) -> None:
        """As Channel.publish: returns once confirmed (on a confirm channel)."""
        self._run(self._channel.publish(body, routing_key, _unwrap(exchange), **kwargs))

    def publish_many(
        self,
        messages: Iterable[bytes | str | OutgoingMessage],
        routing_key: str = "",
        exchange: Any = "",
        **kwargs: Any,
    ) -> int:
        return self._run(
            self._channel.publish_many(messages, routing_key, _unwrap(exchange), **kwargs)
        )

    # consuming
    def consume(
        self,
        queue: Any,
        *,
        prefetch: int | None = None,
        no_ack: bool = False,
        exclusive: bool = False,
        consumer_tag: str | None = None,
        arguments: dict[str, Any] | None = None,
        offset: Any = None,
    ) -> BlockingConsumer:
        """Start consuming; iterate the result (`for message in ch.consume("q")`)."""
        consumer = _ThreadedConsumer(
            self._channel,
            _unwrap(queue),
            prefetch,
            no_ack,
            exclusive,
            consumer_tag,
            arguments,
            offset,
        )
        self._run(consumer.start())
        return BlockingConsumer(self._conn, consumer)

    def get(self, queue: Any, *, no_ack: bool = False) -> BlockingMessage | None:
        message = self._run(self._channel.get(_unwrap(queue), no_ack=no_ack))
        return None if message is None else BlockingMessage(message, self._conn._thread)

    def qos(self, prefetch_count: int = 0, prefetch_size: int = 0, global_: bool = False) -> None:
        self._run(self._channel.qos(prefetch_count, prefetch_size, global_))

    def recover(self, requeue: bool = True) -> None:
        self._run(self._channel.recover(requeue))

    # transactions
    def tx_select(self) -> None:
        self._run(self._channel.tx_select())

    def tx_commit(self) -> None:
        self._run(self._channel.tx_commit())

    def tx_rollback(self) -> None:
        self._run(self._channel.tx_rollback())

    @contextlib.contextmanager
    def transaction(self) -> Iterator[BlockingChannel]:
        """Commits on success, rolls back on error."""
        if not self._channel._tx:
            self.tx_select()
        try:
            yield self
        except BaseException:
            if self._channel.is_open:
                self.tx_rollback()
            raise
        self.tx_commit()

    # RPC
    def rpc_call(
        self,
        body: bytes | str,
        routing_key: str,
        exchange: Any = "",
        *,
        timeout: float = 30.0,
        **kwargs: Any,
    ) -> BlockingMessage:
        reply = self._run(
            self._channel.rpc_call(body, routing_key, _unwrap(exchange), timeout=timeout, **kwargs)
        )
        return BlockingMessage(reply, self._conn._thread)

    def serve(
        self, queue: Any, handler: Callable[[Message], Any], *, prefetch: int = 100
    ) -> Callable[[], None]:
        """Answer RPC requests with `handler(message) -> bytes`, run on the loop thread.

        Returns a function that stops serving. The handler gets the asyncio
        Message and must not block for long (it holds up the connection).
        """

        async def start() -> asyncio.Future[Any]:
            return self._channel.serve(_unwrap(queue), handler, prefetch=prefetch)

        task = self._run(start())
        return lambda: self._conn._thread.call_soon(task.cancel)

    def close(self) -> None:
        self._run(self._channel.close())

    def __enter__(self) -> BlockingChannel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class BlockingQueue:
    """A declared queue: name (follows renames on recovery), message_count, consumer_count."""

    def __init__(self, channel: BlockingChannel, queue: Queue) -> None:
        self._channel = channel
        self.queue = queue

    def __getattr__(self, name: str) -> Any:
        return getattr(self.queue, name)

    def __repr__(self) -> str:
        return repr(self.queue)

    def consume(self, **kwargs: Any) -> BlockingConsumer:
        return self._channel.consume(self.queue, **kwargs)

    def get(self, *, no_ack: bool = False) -> BlockingMessage | None:
        return self._channel.get(self.queue, no_ack=no_ack)

    def bind(
        self, exchange: Any, routing_key: str = "", arguments: dict[str, Any] | None = None
    ) -> None:
        self._channel.bind_queue(self.queue, exchange, routing_key, arguments)

    def unbind(
        self, exchange: Any, routing_key: str = "", arguments: dict[str, Any] | None = None
    ) -> None:
        self._channel.unbind_queue(self.queue, exchange, routing_key, arguments)

    def purge(self) -> int:
        return self._channel.purge_queue(self.queue)

    def delete(self, *, if_unused: bool = False, if_empty: bool = False) -> int:
        return self._channel.delete_queue(self.queue, if_unused=if_unused, if_empty=if_empty)


class BlockingExchange:
    def __init__(self, channel: BlockingChannel, exchange: Exchange) -> None:
        self._channel = channel
        self.exchange = exchange

    def __getattr__(self, name: str) -> Any:
        return getattr(self.exchange, name)

    def __repr__(self) -> str:
        return repr(self.exchange)

    def publish(self, body: bytes | str, routing_key: str = "", **kwargs: Any) -> None:
        self._channel.publish(body, routing_key, self.exchange, **kwargs)

    def delete(self, *, if_unused: bool = False) -> None:
        self._channel.delete_exchange(self.exchange.name, if_unused=if_unused)


def _unwrap(obj: Any) -> Any:
    if isinstance(obj, BlockingQueue):
        return obj.queue
    if isinstance(obj, BlockingExchange):
        return obj.exchange
    return obj
