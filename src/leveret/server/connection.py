"""One client connection: handshake, tuning, heartbeats, channel 0, write batching.

The asyncio.Protocol is the only place bytes meet the broker. Incoming bytes go
through the sans-IO FrameReader; outgoing frames are collected and written with
one transport.write per loop turn.
"""

from __future__ import annotations

import asyncio
import logging
import platform
from typing import TYPE_CHECKING, Any

from pamqp import commands as cmd
from pamqp import decode as pamqp_decode

import leveret
from leveret.protocol import methods as wire
from leveret.protocol.constants import (
    ACCESS_REFUSED,
    CHANNEL_ERROR,
    COMMAND_INVALID,
    CONNECTION_FORCED,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
    INTERNAL_ERROR,
    NOT_ALLOWED,
    PROTOCOL_HEADER,
    UNEXPECTED_FRAME,
)
from leveret.protocol.errors import AMQPError, ConnectionError_, FrameError
from leveret.protocol.frames import HEARTBEAT_FRAME, FrameReader
from leveret.server.channel import Channel

if TYPE_CHECKING:
    from leveret.server.listener import Server

log = logging.getLogger("leveret.connection")

CONNECTION_CLOSE = (10 << 16) | 50
CONNECTION_CLOSE_OK = (10 << 16) | 51
CHANNEL_OPEN = (20 << 16) | 10
OUTPUT_HIGH_WATER = 1024 * 1024  # stop delivering to a connection above this backlog
CLOSE_OK_TIMEOUT = 3.0
# After the close handshake the socket stays open, read and discarded, until the
# client's FIN or this many seconds: closing with unread input makes the kernel
# send a TCP reset, which destroys the close-ok the client has not read yet.
LINGER_TIMEOUT = 10.0

SERVER_CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": True,
}


class AMQPConnection(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.broker = server.broker
        config = server.config
        self.config = config
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.reader = FrameReader(config.frame_max)
        self.state = "header"  # header → start-ok → tune-ok → open → opened → closing → closed
        self._header_buf = b""
        self.channels: dict[int, Channel] = {}
        self.frame_max = config.frame_max
        self.channel_max = config.channel_max
        self.heartbeat = 0
        self.client_properties: dict[str, Any] = {}
        self.capabilities: dict[str, Any] = {}
        self.user: str | None = None
        self.vhost: Any = None
        self.exclusive_queues: set = set()
        self.writable = True
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_handle: asyncio.Handle | None = None
        self._transport_paused = False
        self._confirm_channels: set[Channel] = set()
        self._last_recv = 0.0
        self._last_send = 0.0
        self._timers: list[asyncio.TimerHandle] = []
        self._heartbeat_timer: asyncio.TimerHandle | None = None
        self._tick_due = 0.0  # when the heartbeat tick should run next
        self._flow_queues: set | None = set()  # queues this connection is paused for
        self._reading_paused = False
        self.alarm_reason: str | None = None  # set while a resource alarm is on
        self._told_blocked = False
        self._blocked_by_alarm = False
        self._waiting_for_disk = False

    # --- asyncio.Protocol ---------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        transport.set_write_buffer_limits(high=OUTPUT_HIGH_WATER)  # type: ignore[attr-defined]
        self._last_recv = self._last_send = self.loop.time()
        self._timers.append(
            self.loop.call_later(self.config.handshake_timeout, self._handshake_timeout)
        )
        self.server.connections.add(self)
        log.debug("accepting AMQP connection %s", self.peer)

    def data_received(self, data: bytes) -> None:
        self._last_recv = self.loop.time()
        if self.state == "header":
            data = self._check_protocol_header(data)
            if not data:
                return
        if self.state == "closed":
            return
        try:
            for frame_type, channel, payload in self.reader.feed(data):
                if channel:
                    ch = self.channels.get(channel)
                    if ch is not None and not ch.closing and self.state == "opened":
                        ch.handle_frame(frame_type, payload)  # the hot path
                    else:
                        self._frame_for_unopened_channel(frame_type, channel, payload, ch)
                elif frame_type == FRAME_METHOD:
                    self._connection_method(payload)
                elif frame_type != FRAME_HEARTBEAT:
                    raise ConnectionError_(
                        UNEXPECTED_FRAME, f"content frame (type {frame_type}) on channel 0"
                    )
                if self.state == "closed":
                    return
        except FrameError as exc:
            self.close_with_error(exc, drop=True)
        except AMQPError as exc:
            self.close_with_error(exc)
        except Exception:
            log.exception("internal error on connection %s", self.peer)
            self.close_with_error(
                ConnectionError_(INTERNAL_ERROR, "internal error; see the broker log")
            )

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state not in ("closing", "closed") and self.state != "header":
            if exc is not None:
                log.info("client %s closed the connection abruptly: %s", self.peer, exc)
            else:
                log.info("client %s closed the TCP connection without connection.close", self.peer)
        self.state = "closed"
        if self._flow_queues:
            for queue in self._flow_queues:
                queue.throttled.discard(self)
        self._flow_queues = None
        for timer in self._timers:
            timer.cancel()
        if self._heartbeat_timer is not None:
            self._heartbeat_timer.cancel()
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self._teardown()
        self.server.connections.discard(self)

    def pause_writing(self) -> None:
        self._transport_paused = True
        self._set_writable(False)

    def resume_writing(self) -> None:
        self._transport_paused = False
        self._set_writable(self._out_bytes < OUTPUT_HIGH_WATER)

    # --- resource alarms ----------------------------------------------------

    def alarm_raised(self, reason: str) -> None:
        if self.state != "opened":
            return
        self.alarm_reason = reason
        if self.capabilities.get("connection.blocked") and not self._told_blocked:
            self._told_blocked = True
            self.send_method(0, cmd.Connection.Blocked(reason))

    def alarm_cleared(self) -> None:
        self.alarm_reason = None
        if self._told_blocked:
            self._told_blocked = False
            self.send_method(0, cmd.Connection.Unblocked())
        if self._blocked_by_alarm:
            self._blocked_by_alarm = False
            self._resume_reading()

    def publishing_while_alarmed(self) -> None:
        """A publish arrived during an alarm: stop reading this connection (RabbitMQ's block)."""
        if not self._blocked_by_alarm:
            self._blocked_by_alarm = True
            log.info("connection %s blocked: %s", self.peer, self.alarm_reason)
            self._pause_reading()

    # --- publisher flow control ---------------------------------------------

    def maybe_throttle(self, queue: Any) -> None:
        """Stop reading from this publisher until `queue`'s consumers catch up.

        A connection that consumes is never paused: its own acks may be what
        drains the queue.
        """
        flow = self._flow_queues
        if flow is None or queue in flow:
            return
        if any(ch.consumers for ch in self.channels.values()):
            return
        flow.add(queue)
        queue.throttle(self)

    def pause_for_disk(self) -> None:
        if not self._waiting_for_disk and self.vhost is not None:
            self._waiting_for_disk = True
            self.vhost.hooks.wait_for_disk(self)
            self._pause_reading()

    def resume_after_disk(self) -> None:
        self._waiting_for_disk = False
        self._resume_reading()

    def pause_for_flow(self, queue: Any) -> None:
        self._pause_reading()

    def resume_after_flow(self, queue: Any) -> None:
        if self._flow_queues is None:
            return
        self._flow_queues.discard(queue)
        if not self._flow_queues and not self._blocked_by_alarm:
            self._resume_reading()

    def _pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._flow_queues or self._blocked_by_alarm or self._waiting_for_disk:
            return
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self._last_recv = self.loop.time()  # silence while paused was ours, not theirs
            if not self.transport.is_closing():
                self.transport.resume_reading()

    # --- output -------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Queue bytes for the socket; everything queued in one loop turn is one write."""
        self._out.append(data)
        self._out_bytes += len(data)
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self._flush)
        if self._out_bytes > OUTPUT_HIGH_WATER and self.writable:
            self._set_writable(False)

    def write_parts(self, parts: tuple[bytes, ...], size: int) -> None:
        """Like write() for several pieces; they are joined once, at flush time."""
        self._out.extend(parts)
        self._out_bytes += size
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self._flush)
        if self._out_bytes > OUTPUT_HIGH_WATER and self.writable:
            self._set_writable(False)

    def confirms_due(self, channel: Channel) -> None:
        self._confirm_channels.add(channel)
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        if self._confirm_channels:
            channels = self._confirm_channels
            self._confirm_channels = set()
            for channel in channels:
                channel.flush_confirms()
        if self._out and self.transport is not None and self.state != "closed":
            out = self._out
            self._out = []
            self._out_bytes = 0
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))
            self._last_send = self.loop.time()
            if not self.writable and not self._transport_paused:
                self._set_writable(True)

    def _set_writable(self, writable: bool) -> None:
        if self.writable == writable:
            return
        self.writable = writable
        for channel in list(self.channels.values()):
            channel.update_deliverable()

    def send_method(self, channel: int, method: Any) -> None:
        self.write(wire.encode_method(method, channel))

    # --- handshake ----------------------------------------------------------

    def _check_protocol_header(self, data: bytes) -> bytes:
        buf = self._header_buf + data
        if len(buf) < 8:
            if PROTOCOL_HEADER.startswith(buf):
                self._header_buf = buf
                return b""
        if buf[:8] != PROTOCOL_HEADER:
            # Spec 4.2.2: answer with the version we speak, then close.
            log.info("client %s sent an unsupported protocol header %r", self.peer, buf[:8])
            self.write(PROTOCOL_HEADER)
            self._linger()
            return b""
        self._header_buf = b""
        self.state = "start-ok"
        self.send_method(
            0,
            cmd.Connection.Start(
                version_major=0,
                version_minor=9,
                server_properties={
                    "product": "Leveret",
                    "version": leveret.__version__,
                    "platform": f"Python {platform.python_version()}",
                    "information": "A RabbitMQ-compatible AMQP 0-9-1 broker written in Python",
                    "capabilities": SERVER_CAPABILITIES,
                    "cluster_name": "leveret",
                },
                mechanisms="PLAIN AMQPLAIN",
                locales="en_US",
            ),
        )
        return buf[8:]

    def _handshake_timeout(self) -> None:
        if self.state in ("header", "start-ok", "tune-ok", "open") and self.transport:
            log.warning(
                "closing connection %s: handshake not finished within %.1f s",
                self.peer,
                self.config.handshake_timeout,
            )
            self.state = "closed"
            self.transport.close()

    def _connection_method(self, payload: bytes) -> None:
        index = wire.method_index(payload)
        state = self.state
        if state == "closing":
            if index in (CONNECTION_CLOSE, CONNECTION_CLOSE_OK):
                if index == CONNECTION_CLOSE:
                    self.send_method(0, cmd.Connection.CloseOk())
                self._linger()  # close() already tore the channels down
            return
        method = wire.decode_method(payload)
        expected = {
            "start-ok": cmd.Connection.StartOk,
            "tune-ok": cmd.Connection.TuneOk,
            "open": cmd.Connection.Open,
        }.get(state)
        if expected is not None and not isinstance(method, expected | cmd.Connection.Close):
            raise ConnectionError_(
                COMMAND_INVALID,
                f"expected {expected.name}, got {method.name} during the handshake",
                index >> 16,
                index & 0xFFFF,
            )
        if isinstance(method, cmd.Connection.StartOk):
            self._on_start_ok(method)
        elif isinstance(method, cmd.Connection.TuneOk):
            self._on_tune_ok(method)
        elif isinstance(method, cmd.Connection.Open):
            self._on_open(method)
        elif isinstance(method, cmd.Connection.Close):
            self._flush()  # publisher confirms already due go out before close-ok
            self._teardown()  # no deliveries after close-ok: requeue, drop consumers
            self.send_method(0, cmd.Connection.CloseOk())
            self._linger()
        elif isinstance(method, cmd.Connection.CloseOk):
            self._linger()
        elif isinstance(method, cmd.Connection.UpdateSecret):
            self.send_method(0, cmd.Connection.UpdateSecretOk())
        elif isinstance(method, cmd.Connection.Blocked | cmd.Connection.Unblocked):
            pass  # informational from a client; nothing to do
        else:
            raise ConnectionError_(
                CHANNEL_ERROR if index >> 16 != 10 else COMMAND_INVALID,
                f"method {method.name} is not valid on channel 0",
                index >> 16,
                index & 0xFFFF,
            )

    def _on_start_ok(self, m: cmd.Connection.StartOk) -> None:
        self.client_properties = dict(m.client_properties or {})
        caps = self.client_properties.get("capabilities") or {}
        self.capabilities = dict(caps) if isinstance(caps, dict) else {}
        mechanism = m.mechanism
        username = password = None
        response = m.response
        if isinstance(response, str):
            response = response.encode("utf-8", "surrogateescape")
        if mechanism == "PLAIN":
            parts = response.split(b"\x00")
            if len(parts) == 3:
                username, password = (
                    parts[1].decode(errors="replace"),
                    parts[2].decode(errors="replace"),
                )
        elif mechanism == "AMQPLAIN":
            try:
                table = pamqp_decode.field_table(len(response).to_bytes(4, "big") + response)[1]
                username, password = str(table.get("LOGIN")), str(table.get("PASSWORD"))
            except Exception:
                username = None
        else:
            raise ConnectionError_(
                ACCESS_REFUSED,
                f"unsupported authentication mechanism '{mechanism}'; supported: PLAIN AMQPLAIN",
                10,
                11,
            )
        if username is None or not self.broker.authenticate(username, password or ""):
            log.warning(
                "authentication of user %r from %s failed (mechanism %s)",
                username,
                self.peer,
                mechanism,
            )
            raise ConnectionError_(
                ACCESS_REFUSED,
                f"Login was refused using authentication mechanism {mechanism}. "
                "For details see the broker logfile.",
                10,
                11,
            )
        self.user = username
        self.state = "tune-ok"
        self.send_method(
            0,
            cmd.Connection.Tune(
                channel_max=self.config.channel_max,
                frame_max=self.config.frame_max,
                heartbeat=self.config.heartbeat,
            ),
        )

    def _on_tune_ok(self, m: cmd.Connection.TuneOk) -> None:
        server = self.config
        channel_max = m.channel_max or server.channel_max
        frame_max = m.frame_max or server.frame_max
        if channel_max > server.channel_max:
            raise ConnectionError_(
                NOT_ALLOWED,
                f"negotiated channel_max = {channel_max} is "
                f"higher than the maximum allowed value ({server.channel_max})",
                10,
                31,
            )
        if frame_max > server.frame_max:
            raise ConnectionError_(
                NOT_ALLOWED,
                f"negotiated frame_max = {frame_max} is higher "
                f"than the maximum allowed value ({server.frame_max})",
                10,
                31,
            )
        if frame_max < FRAME_MIN_SIZE:
            raise ConnectionError_(
                NOT_ALLOWED,
                f"negotiated frame_max = {frame_max} is lower "
                f"than the minimum allowed value ({FRAME_MIN_SIZE})",
                10,
                31,
            )
        self.channel_max = channel_max
        self.frame_max = frame_max
        self.reader.frame_max = frame_max
        self.heartbeat = m.heartbeat
        self.state = "open"

    def _on_open(self, m: cmd.Connection.Open) -> None:
        vhost = self.broker.vhosts.get(m.virtual_host)
        if vhost is None:
            raise ConnectionError_(NOT_ALLOWED, f"vhost '{m.virtual_host}' not found", 10, 40)
        self.vhost = vhost
        self.state = "opened"
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        self.send_method(0, cmd.Connection.OpenOk())
        alarms = self.server.alarms
        if alarms is not None and alarms.blocking:
            self.alarm_raised(alarms.reason)
        if self.heartbeat:
            self._tick_due = self.loop.time() + self.heartbeat / 2
            self._heartbeat_timer = self.loop.call_later(self.heartbeat / 2, self._heartbeat_tick)
        log.info("connection %s opened: user '%s', vhost '%s'", self.peer, self.user, vhost.name)

    # --- heartbeats ---------------------------------------------------------

    def _heartbeat_tick(self) -> None:
        if self.state not in ("opened", "closing") or self.transport is None:
            return
        now = self.loop.time()
        if self._reading_paused:
            self._last_recv = now  # we are not reading, so we cannot hear heartbeats
        late = now - self._tick_due > self.heartbeat / 2
        self._tick_due = now + self.heartbeat / 2
        if late:
            # The loop itself stalled (a long fsync, GC, a burst of work): the
            # client's frames may be sitting unread in the socket.  Judge only
            # after the loop has had a turn to read them.
            self._last_recv = max(self._last_recv, now - self.heartbeat)
        if now - self._last_recv > 2 * self.heartbeat:
            log.warning("missed heartbeats from client %s, timeout: %ds", self.peer, self.heartbeat)
            self.state = "closed"
            self.transport.abort()
            return
        if now - self._last_send >= self.heartbeat / 2:
            self.write(HEARTBEAT_FRAME)
        self._heartbeat_timer = self.loop.call_later(self.heartbeat / 2, self._heartbeat_tick)

    # --- channels -----------------------------------------------------------

    def _frame_for_unopened_channel(
        self, frame_type: int, number: int, payload: bytes, channel: Channel | None
    ) -> None:
        if self.state == "closing":
            return  # after connection.close everything but close/close-ok is dropped
        if self.state != "opened":
            raise ConnectionError_(
                UNEXPECTED_FRAME if frame_type != FRAME_METHOD else COMMAND_INVALID,
                f"frame on channel {number} before the connection was opened",
            )
        if channel is not None:  # closing: waiting for channel.close-ok
            channel.handle_while_closing(frame_type, payload)
            return
        if frame_type == FRAME_METHOD and wire.method_index(payload) == CHANNEL_OPEN:
            if number > self.channel_max:
                raise ConnectionError_(
                    NOT_ALLOWED,
                    f"channel {number} is above the negotiated channel_max ({self.channel_max})",
                    20,
                    10,
                )
            channel = Channel(self, number)
            self.channels[number] = channel
            self.send_method(number, cmd.Channel.OpenOk())
            return
        if frame_type == FRAME_METHOD:
            index = wire.method_index(payload)
            if index == (20 << 16) | 41:  # stray close-ok for a channel already gone
                return
            raise ConnectionError_(
                CHANNEL_ERROR,
                f"expected 'channel.open' on channel {number}, got {wire.method_name(index)}",
                index >> 16,
                index & 0xFFFF,
            )
        raise ConnectionError_(
            CHANNEL_ERROR, f"content frame on channel {number}, which is not open"
        )

    def release_channel(self, number: int) -> None:
        self.channels.pop(number, None)

    def log_channel_error(self, number: int, exc: AMQPError) -> None:
        log.info(
            "channel error on connection %s, channel %d: %s", self.peer, number, exc.reply_text
        )

    # --- closing ------------------------------------------------------------

    def close_with_error(self, exc: AMQPError, drop: bool = False) -> None:
        """Connection exception: send connection.close; `drop` when the stream is unusable."""
        if self.state in ("closing", "closed"):
            return
        log.warning("closing connection %s: %s", self.peer, exc.reply_text)
        self.close(exc.code, exc.reply_text, exc.class_id, exc.method_id)
        if drop or self.state == "header":
            self._linger()

    def close(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        """Start the server side of the close handshake."""
        if self.state in ("closing", "closed") or self.transport is None:
            return
        handshake_done = self.state == "opened"
        self.state = "closing"
        self.send_method(0, cmd.Connection.Close(code, text[:255], class_id, method_id))
        self._flush()
        self._teardown()
        if handshake_done:
            self._timers.append(self.loop.call_later(CLOSE_OK_TIMEOUT, self._linger))
        else:
            self._linger()

    def force_close(self, reason: str = "shutdown") -> None:
        self.close(
            CONNECTION_FORCED,
            f"CONNECTION_FORCED - broker forced connection closure with reason '{reason}'",
        )

    def _linger(self) -> None:
        """End the connection without a TCP reset.

        Sends what is buffered and a FIN, then keeps reading (and discarding, as
        state "closed" makes data_received do) until the client's FIN, when
        eof_received lets the transport close, or LINGER_TIMEOUT.  A client may
        legally go on writing after its connection.close (amqplib does, for
        publishes buffered on other channels); closing the socket on unread data
        would reset the connection and lose the close-ok it is waiting for.
        """
        transport = self.transport
        if transport is None or self.state == "closed":
            return
        self._flush()
        self.state = "closed"
        if transport.is_closing():
            return
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        if transport.can_write_eof():
            transport.write_eof()
        timer = self.loop.call_later(LINGER_TIMEOUT, transport.close)
        self._timers.append(timer)

    def eof_received(self) -> bool:
        """The client's FIN: let asyncio close the transport (after our buffered writes)."""
        return False

    def _teardown(self) -> None:
        """Requeue unacked messages, drop consumers and exclusive queues. Idempotent."""
        channels = list(self.channels.values())
        self.channels.clear()
        for channel in channels:
            channel.cleanup()
        if self.exclusive_queues:
            queues = list(self.exclusive_queues)
            self.exclusive_queues.clear()
            for queue in queues:
                queue.vhost.delete_queue(queue)
