"""The asyncio connection: sockets, heartbeats, fail-over and recovery.

The wire protocol is leveret.protocol.connection (sans-IO); this module only
moves its bytes and reacts to its events. One `Connection` object lives as
long as the user holds it; underneath, each TCP connection ("link") gets a
fresh protocol core. When a link dies without the user asking, the client
reconnects with backoff and restores, in order: channels (same numbers,
confirm and tx mode), the exchanges, queues (server-named ones get new names,
which their Queue objects take) and bindings it declared, then per channel
qos and consumers, then publishes whose confirms had not arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import platform
import time
from collections.abc import Callable
from typing import Any

import leveret
from leveret.client import events as ev
from leveret.client.channel import Channel
from leveret.client.declared import Exchange, Queue, _Binding
from leveret.client.errors import (
    AuthenticationError,
    ChannelClosed,
    ClientError,
    ConnectError,
    ConnectionClosed,
    ConnectionLost,
)
from leveret.client.url import ConnectionParameters, parse_urls
from leveret.protocol import connection as pc
from leveret.protocol.constants import (
    ACCESS_REFUSED,
    CONNECTION_FORCED,
    INTERNAL_ERROR,
    NOT_ALLOWED,
    REPLY_SUCCESS,
)

log = logging.getLogger("leveret.client")

CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
}

# Connection states.
CONNECTING = "connecting"
OPEN = "open"
RECOVERING = "recovering"
CLOSING = "closing"
CLOSED = "closed"

# Codes after which reconnecting makes sense: the broker went down or an
# operator closed us. Anything else is a bug or a refusal that would repeat.
RECOVERABLE_CODES = frozenset({0, CONNECTION_FORCED, INTERNAL_ERROR})


class _Link(asyncio.Protocol):
    """One TCP (or TLS) connection and its protocol core."""

    def __init__(self, conn: Connection, core: pc.Connection, host: str, port: int) -> None:
        self.conn = conn
        self.core = core
        self.host = host
        self.port = port
        self.transport: asyncio.Transport | None = None
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.dead = False
        self.finished = False  # the AMQP connection ended: write what is queued, close
        self.abort_reason: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=1024 * 1024)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.conn._on_data(self, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.dead = True
        if not self.gone.done():
            self.gone.set_result(None)
        self.conn._on_link_lost(self, exc)

    def pause_writing(self) -> None:
        self.conn._writable.clear()

    def resume_writing(self) -> None:
        self.conn._writable.set()


class Connection:
    """An AMQP connection that outlives its TCP connections (when recovery is on).

    Use `await connect(url)` rather than the constructor. Methods are
    coroutines to be awaited on the loop the connection was opened on; for
    other threads use leveret.client.blocking.
    """

    def __init__(
        self,
        params: ConnectionParameters,
        *,
        recovery: bool = True,
        reconnect_delay: float = 0.2,
        reconnect_max_delay: float = 5.0,
        reconnect_attempts: int | None = None,
        republish: bool = True,
        client_properties: dict[str, Any] | None = None,
    ) -> None:
        if reconnect_delay <= 0 or reconnect_max_delay < reconnect_delay:
            raise ValueError("need 0 < reconnect_delay <= reconnect_max_delay")
        if reconnect_attempts is not None and reconnect_attempts < 1:
            raise ValueError("reconnect_attempts must be None (forever) or >= 1")
        self.params = params
        self.recovery = recovery
        self.republish = republish
        self.reconnect_delay = reconnect_delay
        self.reconnect_max_delay = reconnect_max_delay
        self.reconnect_attempts = reconnect_attempts
        self._extra_properties = dict(client_properties or {})
        self._loop = asyncio.get_running_loop()
        self._state = CONNECTING
        self._link: _Link | None = None
        self._core: pc.Connection | None = None
        self._channels: dict[int, Channel] = {}
        self._close_exc: ConnectionClosed | None = None
        self._ready = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._unblocked = asyncio.Event()
        self._unblocked.set()
        self.blocked_reason: str | None = None
        self._flush_handle: asyncio.Handle | None = None
        self._heartbeat_handle: asyncio.TimerHandle | None = None
        self._last_recv = 0.0
        self._last_send = 0.0
        self._recovery_task: asyncio.Task[None] | None = None
        self._listeners: list[Callable[[ev.ClientEvent], Any]] = []
        # What recovery re-declares, in declaration order.
        self._exchanges: dict[str, Exchange] = {}
        self._queues: dict[int, Queue] = {}
        self._bindings: list[_Binding] = []
        self.server_properties: dict[str, Any] = {}
        self.host: str | None = None
        self.port: int | None = None
        self.reconnects = 0

    def __repr__(self) -> str:
        where = f"{self.host}:{self.port}" if self.host else "?"
        return f"<leveret.client.Connection {where} {self._state}>"

    # --- public API -------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self._state == OPEN

    @property
    def is_closed(self) -> bool:
        return self._state == CLOSED

    @property
    def blocked(self) -> bool:
        """True while the broker has blocked publishing (connection.blocked)."""
        return not self._unblocked.is_set()

    @property
    def heartbeat(self) -> int:
        """The negotiated heartbeat interval in seconds (0: none)."""
        return self._core.heartbeat if self._core is not None else 0

    @property
    def frame_max(self) -> int:
        return self._core.frame_max if self._core is not None else self.params.frame_max

    def add_listener(self, callback: Callable[[ev.ClientEvent], Any]) -> None:
        """Call `callback(event)` for every ClientEvent (see leveret.client.events)."""
        self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[ev.ClientEvent], Any]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(callback)

    async def channel(self, *, confirms: bool = True, prefetch: int | None = None) -> Channel:
        """Open a channel.

        `confirms` (the default) puts it in publisher-confirm mode: awaiting
        publish() then means the broker has the message. `prefetch` sets
        basic.qos for its consumers.
        """
        await self._wait_ready()
        assert self._core is not None
        try:
            number = self._core.open_channel()
        except pc.UsageError as exc:
            raise ClientError(str(exc)) from None
        channel = Channel(self, number, confirms)
        self._channels[number] = channel
        self._flush_soon()
        try:
            await channel._opened_now()
            if prefetch is not None:
                await channel.qos(prefetch)
        except BaseException:
            self._channels.pop(number, None)
            raise
        return channel

    async def close(self, timeout: float = 5.0) -> None:
        """Close politely (connection.close, wait for close-ok); idempotent."""
        if self._state == CLOSED:
            return
        self._state = CLOSING
        if self._recovery_task is not None:
            self._recovery_task.cancel()
            self._recovery_task = None
        link, core = self._link, self._core
        exc = ConnectionClosed(REPLY_SUCCESS, "closed by the application")
        if link is not None and core is not None and not link.dead:
            with contextlib.suppress(pc.UsageError):
                core.close(REPLY_SUCCESS, "closed by the application")
            self._flush()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(link.gone), timeout)
            if link.transport is not None:
                link.transport.close()
        self._finish(exc)

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def wait_unblocked(self, timeout: float | None = None) -> None:
        """Wait until the broker no longer blocks publishing."""
        await asyncio.wait_for(self._unblocked.wait(), timeout)

    async def wait_recovered(self, timeout: float | None = None) -> None:
        """Wait until the connection is open (at once if it is)."""
        await asyncio.wait_for(self._wait_ready(), timeout)

    def abort(self) -> None:
        """Drop the TCP connection without a close handshake (recovery follows, if on)."""
        if self._link is not None and self._link.transport is not None:
            self._link.transport.abort()

    # --- opening -------------------------------------------------------------------

    def _client_properties(self) -> dict[str, Any]:
        props = {
            "product": "leveret.client",
            "version": leveret.__version__,
            "platform": f"Python {platform.python_version()}",
            "information": "https://github.com/ (Leveret's asyncio/blocking AMQP 0-9-1 client)",
            "capabilities": dict(CAPABILITIES),
        }
        if self.params.connection_name:
            props["connection_name"] = self.params.connection_name
        props.update(self._extra_properties)
        return props

    async def _open_link(self) -> None:
        """Try every host once, in order; raise ConnectError naming each failure."""
        failures = []
        for host, port in self.params.hosts:
            try:
                await self._handshake(host, port)
                return
            except AuthenticationError:
                raise
            except ConnectError as exc:
                failures.append(str(exc))
        if len(failures) == 1:
            raise ConnectError(failures[0])
        raise ConnectError("cannot connect to any broker: " + "; ".join(failures))

    async def _handshake(self, host: str, port: int) -> None:
        p = self.params
        core = pc.Connection(
            pc.CLIENT,
            username=p.username,
            password=p.password,
            vhost=p.vhost,
            client_properties=self._client_properties(),
            frame_max=p.frame_max,
            channel_max=p.channel_max,
            heartbeat=p.heartbeat,
        )
        link = _Link(self, core, host, port)
        ctx, sni = p.ssl_for(host)
        where = f"{host}:{port}"
        try:
            if p.connector is not None:
                opening = p.connector(lambda: link, host, port)
            else:
                opening = self._loop.create_connection(
                    lambda: link, host, port, ssl=ctx, server_hostname=sni
                )
            await asyncio.wait_for(opening, p.connect_timeout)
        except TimeoutError:
            raise ConnectError(
                f"cannot connect to {where}: timed out after {p.connect_timeout:g} s"
            ) from None
        except OSError as exc:
            raise ConnectError(f"cannot connect to {where}: {exc.strerror or exc}") from None
        self._link, self._core = link, core
        self._last_recv = self._last_send = self._loop.time()
        core.initiate()
        self._flush()
        try:
            await asyncio.wait_for(asyncio.shield(link.opened), p.connect_timeout)
        except TimeoutError:
            raise ConnectError(
                f"{where}: no AMQP handshake within {p.connect_timeout:g} s"
            ) from None
        except ConnectError:
            raise
        finally:
            if not link.opened.done() or link.opened.exception() is not None:
                if link.transport is not None:
                    link.transport.abort()
                self._link = self._core = None
        self.host, self.port = host, port
        self.server_properties = core.server_properties
        if core.heartbeat:
            self._heartbeat_handle = self._loop.call_later(core.heartbeat / 2, self._heartbeat)

    def _handshake_failed(self, link: _Link, reason: str, code: int = 0) -> None:
        if link.opened.done():
            return
        where = f"{link.host}:{link.port}"
        exc: ConnectError
        if code == ACCESS_REFUSED:
            exc = AuthenticationError(
                f"{where} refused the login of user {self.params.username!r}: {reason}"
            )
        elif code == NOT_ALLOWED:
            exc = AuthenticationError(f"{where} refused vhost {self.params.vhost!r}: {reason}")
        elif link.core.state == pc.AWAITING_OPEN_OK or link.core.state == pc.AWAITING_TUNE:
            exc = ConnectError(
                f"{where} closed the connection during the handshake ({reason}); "
                "wrong credentials or vhost?"
            )
        else:
            exc = ConnectError(f"{where}: {reason}")
        link.opened.set_exception(exc)
        link.opened.exception()  # mark retrieved: _handshake may have timed out already

    # --- bytes in, bytes out ---------------------------------------------------------

    def _on_data(self, link: _Link, data: bytes) -> None:
        if link is not self._link:
            return
        self._last_recv = self._loop.time()
        events = link.core.receive_data(data)
        channels = self._channels
        for event in events:
            kind = type(event)
            if kind is pc.Deliver:
                ch = channels.get(event.channel)
                if ch is not None:
                    ch._on_deliver(event)
            elif kind is pc.Ack:
                ch = channels.get(event.channel)
                if ch is not None:
                    ch._on_confirm(event.delivery_tag, event.multiple, False)
            else:
                self._on_event(link, event)
        if link.finished:
            # The connection is over: say the last word (close-ok) and hang up.
            transport = link.transport
            if transport is not None and not link.dead:
                data = link.core.data_to_send()
                if data:
                    transport.write(data)
                transport.close()
        elif link.core.has_data_to_send:
            self._flush()

    def _on_event(self, link: _Link, event: pc.Event) -> None:
        kind = type(event)
        channel = getattr(event, "channel", None)
        ch = self._channels.get(channel) if channel else None
        if kind is pc.Nack:
            if ch is not None:
                ch._on_confirm(event.delivery_tag, event.multiple, True)  # type: ignore[attr-defined]
        elif kind is pc.MethodReceived:
            if ch is not None:
                ch._on_method(event.method)  # type: ignore[attr-defined]
        elif kind is pc.GetOk:
            if ch is not None:
                ch._on_get_ok(event)  # type: ignore[arg-type]
        elif kind is pc.Return:
            if ch is not None:
                ch._on_return(event)  # type: ignore[arg-type]
        elif kind is pc.ChannelOpened:
            if ch is not None:
                ch._on_open_ok()
        elif kind is pc.ChannelClosed:
            if ch is not None:
                e: Any = event
                ch._on_broker_close(
                    ChannelClosed.from_reply(e.reply_code, e.reply_text, e.class_id, e.method_id)
                )
        elif kind is pc.ChannelCloseOk:
            if ch is not None:
                ch._on_close_ok()
        elif kind is pc.ConnectionOpened:
            if not link.opened.done():
                link.opened.set_result(None)
        elif kind is pc.ConnectionBlocked:
            reason = event.reason  # type: ignore[attr-defined]
            self.blocked_reason = reason
            self._unblocked.clear()
            log.warning("broker %s:%s blocked publishing: %s", self.host, self.port, reason)
            self._emit(ev.Blocked(reason))
        elif kind is pc.ConnectionUnblocked:
            self.blocked_reason = None
            self._unblocked.set()
            log.info("broker %s:%s unblocked publishing", self.host, self.port)
            self._emit(ev.Unblocked())
        elif kind is pc.ConnectionClosed:
            e = event
            if not link.opened.done():
                self._handshake_failed(link, f"{e.reply_code} {e.reply_text}", e.reply_code)
            else:
                self._link_failed(
                    link, ConnectionClosed(e.reply_code, e.reply_text, e.class_id, e.method_id)
                )
            link.finished = True  # close-ok is queued next; _on_data writes it and closes
        elif kind is pc.ConnectionCloseOk:
            link.finished = True
        elif kind is pc.ProtocolError:
            err = event.error  # type: ignore[attr-defined]
            log.error("broker %s:%s broke the protocol: %s", self.host, self.port, err.reply_text)
            if not link.opened.done():
                self._handshake_failed(link, err.reply_text)
            else:
                self._link_failed(link, ConnectionClosed(err.code, err.reply_text))
            link.finished = True

    def _flush_soon(self) -> None:
        """Write what the core queued, once per loop turn (many frames, one write)."""
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        link = self._link
        if link is None or link.transport is None or link.dead:
            return
        data = link.core.data_to_send()
        if data:
            link.transport.write(data)
            self._last_send = self._loop.time()

    def _heartbeat(self) -> None:
        self._heartbeat_handle = None
        link, core = self._link, self._core
        if link is None or core is None or link.dead or not core.heartbeat:
            return
        now = self._loop.time()
        if now - self._last_recv > 2 * core.heartbeat:
            log.warning(
                "no data from %s:%s for %.0f s (heartbeat %d s): connection is dead",
                link.host,
                link.port,
                now - self._last_recv,
                core.heartbeat,
            )
            link.abort_reason = (
                f"missed heartbeats (nothing heard for {now - self._last_recv:.0f} s)"
            )
            if link.transport is not None:
                link.transport.abort()
            return
        if now - self._last_send >= core.heartbeat / 2:
            core.send_heartbeat()
            self._flush()
        self._heartbeat_handle = self._loop.call_later(core.heartbeat / 2, self._heartbeat)

    # --- losing a link ---------------------------------------------------------------

    def _on_link_lost(self, link: _Link, exc: Exception | None) -> None:
        if not link.opened.done():
            reason = str(exc) if exc else "closed by the broker"
            self._handshake_failed(link, f"connection lost during the handshake: {reason}")
        if link is not self._link:
            return
        reason = link.abort_reason or (f"{exc}" if exc else "closed by the broker")
        self._link_failed(link, ConnectionLost(reason))

    def _link_failed(self, link: _Link, exc: ConnectionClosed) -> None:
        """The current link is gone (or going): recover, or close for good."""
        if link is not self._link:
            return
        self._link = None
        self._core = None
        if self._heartbeat_handle is not None:
            self._heartbeat_handle.cancel()
            self._heartbeat_handle = None
        self._writable.set()
        self._unblocked.set()
        if self._state in (CLOSING, CLOSED):
            return
        recover = self.recovery and exc.reply_code in RECOVERABLE_CODES
        if self._state == CONNECTING:
            recover = False
        lost = exc if isinstance(exc, ConnectionLost) else ConnectionLost(str(exc))
        if self._state == RECOVERING:
            # Lost again while restoring: the recovery task notices and starts over.
            for channel in list(self._channels.values()):
                channel._on_link_lost(lost)
            return
        log.warning(
            "connection to %s:%s failed: %s%s",
            link.host,
            link.port,
            exc,
            "; reconnecting" if recover else "",
        )
        self._emit(ev.ConnectionLost(str(exc), recover))
        if not recover:
            self._finish(exc)
            return
        self._state = RECOVERING
        self._ready.clear()
        for channel in list(self._channels.values()):
            channel._on_link_lost(lost)
        self._recovery_task = self._loop.create_task(self._recover())

    def _finish(self, exc: ConnectionClosed) -> None:
        """Closed for good: every waiter wakes with `exc`."""
        self._state = CLOSED
        self._close_exc = exc
        self._link = None
        self._core = None
        if self._heartbeat_handle is not None:
            self._heartbeat_handle.cancel()
            self._heartbeat_handle = None
        self._ready.set()
        self._unblocked.set()
        self._writable.set()
        for channel in list(self._channels.values()):
            channel._on_connection_closed(exc)
        self._channels.clear()

    async def _wait_ready(self) -> None:
        while True:
            if self._state == OPEN:
                return
            if self._state == CLOSED:
                assert self._close_exc is not None
                raise self._close_exc
            if self._state == CLOSING:
                raise ConnectionClosed(REPLY_SUCCESS, "the connection is closing")
            await self._ready.wait()

    # --- recovery ---------------------------------------------------------------------

    async def _recover(self) -> None:
        started = time.monotonic()
        delay = self.reconnect_delay
        attempt = 0
        try:
            while True:
                attempt += 1
                try:
                    await self._open_link()
                except AuthenticationError as exc:
                    log.error("reconnect refused, giving up: %s", exc)
                    self._emit(ev.RecoveryError("login", str(exc)))
                    self._finish(ConnectionClosed(ACCESS_REFUSED, str(exc)))
                    return
                except ConnectError as exc:
                    if self.reconnect_attempts is not None and attempt >= self.reconnect_attempts:
                        log.error("giving up after %d reconnect attempts: %s", attempt, exc)
                        self._finish(ConnectionLost(f"gave up reconnecting: {exc}"))
                        return
                    log.warning(
                        "reconnect attempt %d failed (%s); next in %.1f s", attempt, exc, delay
                    )
                    self._emit(ev.ReconnectFailed(attempt, str(exc), delay))
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.reconnect_max_delay)
                    continue
                log.info("reconnected to %s:%s (attempt %d)", self.host, self.port, attempt)
                self._emit(ev.Reconnected(self.host or "", self.port or 0, attempt))
                try:
                    counts = await self._restore()
                except (ConnectionClosed, ChannelClosed, pc.UsageError, TimeoutError) as exc:
                    if self._link is not None and self._link.transport is not None:
                        self._link.transport.abort()
                        self._link = self._core = None
                    log.warning("connection lost again while restoring (%s); retrying", exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.reconnect_max_delay)
                    continue
                break
        except asyncio.CancelledError:
            return
        except Exception as exc:
            # A bug here must not leave the connection RECOVERING for ever, with
            # every caller waiting on it: close for good, and say why.
            log.exception("recovery failed")
            if self._link is not None and self._link.transport is not None:
                self._link.transport.abort()
            self._finish(ConnectionLost(f"recovery failed: {exc!r}"))
            return
        finally:
            self._recovery_task = None
        self.reconnects += 1
        self._state = OPEN
        self._ready.set()
        seconds = time.monotonic() - started
        log.info(
            "recovered in %.2f s: %d channels, %d queues, %d consumers",
            seconds,
            counts[0],
            counts[1],
            counts[2],
        )
        self._emit(ev.Recovered(seconds, *counts))
        for channel in list(self._channels.values()):
            channel._after_recovery()

    def _live_core(self) -> pc.Connection:
        """The current link's protocol state, or ConnectionLost if the link is gone.

        Recovery awaits between its steps, and the new link can go in any of
        those gaps (a broker that accepts and then forces the connection
        closed, as a cluster node handing leadership over does): the step
        raises, and recovery starts over.
        """
        if self._core is None:
            raise ConnectionLost("the connection was lost again while recovering")
        return self._core

    async def _restore(self) -> tuple[int, int, int]:
        self._live_core()
        channels = sorted(self._channels.values(), key=lambda c: c.number)
        for channel in channels:
            await channel._reopen()
        # Topology on a channel of its own, so that one failed declare (which
        # closes the channel) cannot take a user channel down with it.
        tmp = await self._recovery_channel()
        for exchange in list(self._exchanges.values()):
            tmp = await self._restore_step(
                tmp, f"exchange {exchange.name!r}", exchange._redeclare(tmp)
            )
        for queue in list(self._queues.values()):
            old = queue.name
            tmp = await self._restore_step(tmp, f"queue {old!r}", queue._redeclare(tmp))
            if queue.name != old:
                log.info("server-named queue %r is now %r", old, queue.name)
                self._emit(ev.QueueRenamed(old, queue.name))
        for binding in list(self._bindings):
            tmp = await self._restore_step(tmp, binding.describe(), binding.redeclare(tmp))
        if tmp is not None and tmp._is_open:
            await tmp.close()
        consumers = 0
        for channel in channels:
            if channel._is_open:
                consumers += await channel._restore_state()
        return len(channels), len(self._queues), consumers

    async def _recovery_channel(self) -> Channel:
        number = self._live_core().open_channel()
        channel = Channel(self, number, confirms=False, internal=True)
        self._channels[number] = channel
        self._flush_soon()
        await channel._opened_now()
        return channel

    async def _restore_step(self, tmp: Channel, what: str, step: Any) -> Channel:
        try:
            await asyncio.wait_for(step, 30)
        except ChannelClosed as exc:
            log.error("could not restore %s: %s", what, exc)
            self._emit(ev.RecoveryError(what, str(exc)))
            return await self._recovery_channel()
        return tmp

    # --- topology registry (what recovery restores) -------------------------------------

    def _remember_exchange(self, exchange: Exchange) -> None:
        self._exchanges.pop(exchange.name, None)
        self._exchanges[exchange.name] = exchange

    def _forget_exchange(self, name: str) -> None:
        self._exchanges.pop(name, None)
        self._bindings = [b for b in self._bindings if not b.involves_exchange(name)]

    def _remember_queue(self, queue: Queue) -> None:
        for key, known in list(self._queues.items()):
            if known.name == queue.name and not queue.server_named:
                del self._queues[key]
        self._queues[id(queue)] = queue

    def _forget_queue(self, name: str) -> None:
        for key, known in list(self._queues.items()):
            if known.name == name:
                del self._queues[key]
        self._bindings = [b for b in self._bindings if b.queue_name() != name]

    def _remember_binding(self, binding: _Binding) -> None:
        if binding not in self._bindings:
            self._bindings.append(binding)

    def _forget_binding(self, binding: _Binding) -> None:
        self._bindings = [b for b in self._bindings if b != binding]

    # --- events ------------------------------------------------------------------------

    def _emit(self, event: ev.ClientEvent) -> None:
        for callback in list(self._listeners):
            try:
                callback(event)
            except Exception:
                log.exception("connection event listener %r failed", callback)

    def _send_method(self, number: int, method: Any) -> None:
        """Queue a method on the current link; UsageError if there is none."""
        core = self._core
        if core is None:
            raise pc.UsageError("connection is not open")
        core.send_method(number, method)
        self._flush_soon()

    @staticmethod
    def _noop(*_: object) -> None:
        return None


async def connect(
    url: str | list[str] | ConnectionParameters = "amqp://guest:guest@127.0.0.1:5672/%2F",
    *,
    name: str | None = None,
    heartbeat: int | None = None,
    ssl_context: Any = None,
    connect_timeout: float | None = None,
    recovery: bool = True,
    reconnect_delay: float = 0.2,
    reconnect_max_delay: float = 5.0,
    reconnect_attempts: int | None = None,
    republish: bool = True,
    client_properties: dict[str, Any] | None = None,
) -> Connection:
    """Open a connection.

    `url` is an amqp:// or amqps:// URL (several hosts may be given comma
    separated, or several URLs as a list; they are tried in order), or
    ConnectionParameters. `name`
    shows up as the connection name in the broker's management UI.
    `heartbeat` overrides the broker's suggestion (0 disables). `ssl_context`
    replaces the context built from the URL's TLS options.

    With `recovery` (the default) a lost connection is re-established in the
    background (`reconnect_delay` doubling up to `reconnect_max_delay`,
    `reconnect_attempts` times or forever) and everything declared through it
    is restored; unconfirmed publishes are sent again (`republish`) or raised
    as Unconfirmed. The first connect does not retry: a bad URL, an unreachable
    broker or a refused login raise at once (InvalidURL, ConnectError,
    AuthenticationError).
    """
    base = url if isinstance(url, ConnectionParameters) else parse_urls(url)
    params = base.with_options(
        connection_name=name,
        heartbeat=heartbeat,
        ssl_context=ssl_context,
        connect_timeout=connect_timeout,
    )
    conn = Connection(
        params,
        recovery=recovery,
        reconnect_delay=reconnect_delay,
        reconnect_max_delay=reconnect_max_delay,
        reconnect_attempts=reconnect_attempts,
        republish=republish,
        client_properties=client_properties,
    )
    await conn._open_link()
    conn._state = OPEN
    conn._ready.set()
    log.info(
        "connected to %s:%s (vhost %r%s)",
        conn.host,
        conn.port,
        params.vhost,
        f", name {name!r}" if name else "",
    )
    return conn
