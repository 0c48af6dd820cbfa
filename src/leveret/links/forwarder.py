"""The pipe inside every shovel and federation link: consume here, publish there.

A consumer on the source channel hands each delivery to `_on_message`, which
queues it; one task publishes the queue in order on the destination channel
with `Channel.publish_nowait` and settles the source delivery by the ack mode:

- `on-confirm`: acked at the source only when the destination confirmed it
  (a nack requeues it at the source). A publish whose confirm is lost with
  the destination connection is sent again by leveret.client after it
  reconnects, so nothing is lost; a message may arrive twice.
- `on-publish`: acked as soon as it is written to the destination.
- `no-ack`: consumed with no_ack; gone from the source once delivered.

Flow control: with acks, the source's prefetch bounds everything between the
two brokers (queued here + published and unconfirmed), so a destination that
blocks publishing (connection.blocked) or reads slowly makes the source stop
delivering, and nothing is buffered without bound. With no-ack (or a prefetch
of 0) there is no such bound, so the consumer is cancelled while more than
PAUSE_AT messages wait here and started again when half of them are gone.

The forwarder fails (its `finished` future raises LinkFailed) when the source
consumer is cancelled, a channel is closed by a broker, a connection is lost
for good, or a publish cannot be confirmed; its owner closes both connections,
which requeues whatever the source had delivered and not yet been acked.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any

from leveret.client import events as ev
from leveret.client.channel import Channel, Consumer
from leveret.client.errors import ClientError, MessageNacked
from leveret.client.message import Message

log = logging.getLogger("leveret.links")

PAUSE_AT = 1000  # messages waiting here before an unbounded consumer is paused
YIELD_EVERY = 256  # publishes between two yields to the event loop

# message → (exchange, routing key, header to send) or None to drop it (acked, not sent)
Transform = Callable[[Message], "tuple[str, str, bytes | None] | None"]


class LinkFailed(Exception):
    """Why a link stopped; `str()` is the reason shown in its status."""


class Forwarder:
    def __init__(
        self,
        source: Channel,
        queue: Any,
        destination: Channel,
        transform: Transform,
        *,
        ack_mode: str = "on-confirm",
        prefetch: int = 1000,
        limit: int | None = None,
        consumer_tag: str | None = None,
        consumer_arguments: dict[str, Any] | None = None,
        on_moved: Callable[[int], None] | None = None,
    ) -> None:
        self.source = source
        self.queue = queue
        self.destination = destination
        self.transform = transform
        self.ack_mode = ack_mode
        self.prefetch = prefetch
        self.limit = limit  # src-delete-after: messages to move, then finish
        self.consumer_tag = consumer_tag
        self.consumer_arguments = consumer_arguments or {}
        self.on_moved = on_moved
        self.pending: collections.deque[Message] = collections.deque()
        self.unconfirmed = 0
        self.published = 0
        self.moved = 0
        loop = asyncio.get_running_loop()
        self.finished: asyncio.Future[None] = loop.create_future()
        self._wake = asyncio.Event()
        self._consumer: Consumer | None = None
        self._pump: asyncio.Task[None] | None = None
        self._paused = False  # pause(): the owner wants no messages now
        self._held = False  # too many waiting here (no-ack or prefetch 0): consumer cancelled
        self._unbounded = ack_mode == "no-ack" or prefetch == 0
        self._running = False

    # --- life ---------------------------------------------------------------------

    async def start(self, consume: bool = True) -> None:
        """Start publishing; with `consume` False the consumer waits for resume()."""
        self.source.connection.add_listener(self._on_source_event)
        self.destination.connection.add_listener(self._on_dest_event)
        self._pump = asyncio.ensure_future(self._run())
        self._running = True
        if consume:
            await self._consume()
        else:
            self._paused = True

    async def stop(self) -> None:
        """Stop publishing (the connections are closed by the owner)."""
        self._running = False
        self.source.connection.remove_listener(self._on_source_event)
        self.destination.connection.remove_listener(self._on_dest_event)
        await cancel_for_good(self._pump)
        if not self.finished.done():
            self.finished.set_result(None)

    def fail(self, reason: str) -> None:
        if not self.finished.done():
            self.finished.set_exception(LinkFailed(reason))
            self.finished.exception()  # retrieved by the owner, maybe later

    async def pause(self) -> None:
        """Stop consuming (a federated queue with nobody to feed); in-flight ones still go."""
        if not self._paused:
            self._paused = True
            consumer, self._consumer = self._consumer, None
            if consumer is not None:
                await consumer.cancel()

    async def resume(self) -> None:
        if self._paused and self._running:
            self._paused = False
            if self._consumer is None and not self._held:
                await self._consume()

    @property
    def paused(self) -> bool:
        return self._paused

    async def _unhold(self) -> None:
        self._held = False
        if not self._paused and self._running and self._consumer is None:
            await self._consume()

    async def _consume(self) -> None:
        ack = self.ack_mode != "no-ack"
        self._consumer = self.source.consume(
            self.queue,
            prefetch=self.prefetch if ack else None,
            no_ack=not ack,
            consumer_tag=self.consumer_tag,
            arguments=self.consumer_arguments,
            on_message=self._on_message,
        )
        await self._consumer.start()

    # --- events --------------------------------------------------------------------------

    def _on_message(self, message: Message) -> None:
        self.pending.append(message)
        self._wake.set()
        if self._unbounded and len(self.pending) > PAUSE_AT and self._consumer is not None:
            self._held = True  # resumed by the publishing loop once half are gone
            consumer, self._consumer = self._consumer, None
            asyncio.ensure_future(consumer.cancel())

    def _on_source_event(self, event: ev.ClientEvent) -> None:
        if type(event) is ev.ConnectionLost and event.recovering:
            # What the lost source connection delivered comes again: do not send it twice.
            self.pending.clear()
        self._on_event(event, self.source.number)

    def _on_dest_event(self, event: ev.ClientEvent) -> None:
        self._on_event(event, self.destination.number)

    def _on_event(self, event: ev.ClientEvent, channel: int) -> None:
        kind = type(event)
        if kind is ev.ConsumerCancelledByBroker:
            if self._consumer is not None and event.consumer_tag == self._consumer.consumer_tag:
                self.fail(f"the source cancelled the consumer (queue '{event.queue}' deleted?)")
        elif kind is ev.ChannelClosedByBroker and event.channel == channel:
            self.fail(f"a channel was closed: {event.reply_code} {event.reply_text}")
        elif kind is ev.RecoveryError:
            self.fail(f"could not restore {event.what} after reconnecting: {event.error}")
        elif kind is ev.ConnectionLost and not event.recovering:
            self.fail(f"connection lost: {event.reason}")

    # --- publishing ------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._publish_loop()
        except asyncio.CancelledError:
            raise
        except ClientError as exc:
            self.fail(str(exc))
        except Exception as exc:  # a bug must not leave the link silently stuck
            log.exception("link forwarder failed")
            self.fail(f"internal error: {exc!r}")

    async def _publish_loop(self) -> None:
        pending = self.pending
        dest = self.destination
        on_confirm = self.ack_mode == "on-confirm"
        no_ack = self.ack_mode == "no-ack"
        sent = 0
        while True:
            if not pending:
                if self._held:
                    await self._unhold()
                self._wake.clear()
                await self._wake.wait()
                continue
            if not dest.can_publish:
                await dest.wait_publishable()
                continue
            if self.limit is not None and self.published >= self.limit:
                pending.clear()  # not acked: the source requeues them when we close
                continue
            message = pending.popleft()
            out = self.transform(message)
            if out is None:  # filtered (federation's max-hops): settled, not sent
                if not no_ack:
                    message.ack()
                continue
            exchange, routing_key, header = out
            fut = dest.publish_nowait(message.body, routing_key, exchange, header=header)
            self.published += 1
            if on_confirm and fut is not None:
                self.unconfirmed += 1
                fut.add_done_callback(lambda f, m=message: self._confirmed(m, f))
            else:
                if not no_ack:
                    message.ack()
                self._count(1)
            if self._held and len(pending) < PAUSE_AT // 2:
                await self._unhold()
            sent += 1
            if sent >= YIELD_EVERY:
                sent = 0
                await asyncio.sleep(0)

    def _confirmed(self, message: Message, fut: asyncio.Future[None]) -> None:
        self.unconfirmed -= 1
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is None:
            message.ack()
            self._count(1)
        elif isinstance(exc, MessageNacked):
            message.nack(requeue=True)
        else:
            self.fail(f"a publish was not confirmed: {exc}")

    def _count(self, n: int) -> None:
        self.moved += n
        if self.on_moved is not None:
            self.on_moved(n)
        if self.limit is not None and self.moved >= self.limit and not self.finished.done():
            self.finished.set_result(None)


async def cancel_for_good(task: asyncio.Task[Any] | None) -> None:
    """Cancel `task` and wait for it to end.

    Cancelled again until it is done: on Python 3.11, asyncio.wait_for (used when
    closing connections) can swallow a cancellation that arrives as its inner call
    completes, and a link's loop would then go on retrying after its stop.
    """
    while task is not None and not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=1.0)
