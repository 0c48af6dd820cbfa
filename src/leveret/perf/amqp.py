"""A deliberately small AMQP 0-9-1 client connection, tuned for load generation.

General-purpose clients decode every frame into objects; at 100k msg/s that decoding,
not the broker, becomes the bottleneck. Here the hot frames (basic.deliver, content
header/body, publisher-confirm ack/nack) are parsed in place with `struct`, and only the
rare control methods go through pamqp.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable
from typing import Any, TypeVar

from pamqp import commands, frame
from pamqp.base import Frame

FRAME_END = 0xCE
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
MAX_FRAME = 131072

FRAME_HEADER = struct.Struct(">BHI")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
# A complete basic.ack method frame on channel 1, frame-end byte included.
_ACK_FRAME = struct.Struct(">BHIHHQBB")

_DELIVER = (60 << 16) | 60
_CONFIRM_ACK = (60 << 16) | 80
_CONFIRM_NACK = (60 << 16) | 120

F = TypeVar("F", bound=Frame)


class BrokerError(Exception):
    """The broker closed the connection or channel, or the socket went away."""


class ConnectError(BrokerError):
    """The TCP connection or the AMQP handshake failed."""


class ConfirmTracker:
    """Counts publisher confirms, tolerating out-of-order single acks.

    A set of every unconfirmed sequence number (what PerfTest keeps) costs per message;
    here only acks that arrive ahead of the contiguous watermark are remembered.
    """

    def __init__(self) -> None:
        self.low = 0  # every tag <= low is confirmed
        self.ahead: set[int] = set()
        self.confirmed = 0
        self.nacked = 0
        self.room = asyncio.Event()
        self.room.set()

    def on_confirm(self, tag: int, multiple: int, nack: bool) -> None:
        if tag <= self.low:
            return
        if multiple:
            n = tag - self.low
            if self.ahead:
                below = [t for t in self.ahead if t <= tag]
                n -= len(below)
                self.ahead.difference_update(below)
            self.low = tag
        else:
            if tag in self.ahead:
                return
            n = 1
            if tag == self.low + 1:
                self.low = tag
            else:
                self.ahead.add(tag)
        if self.ahead:
            while self.low + 1 in self.ahead:
                self.low += 1
                self.ahead.discard(self.low)
        if nack:
            self.nacked += n
        else:
            self.confirmed += n
        self.room.set()


class AMQPConnection(asyncio.Protocol):
    """One AMQP connection with a single channel (1) used for all traffic."""

    def __init__(self, label: str, on_error: Callable[[str], None] | None = None) -> None:
        self.label = label
        self.on_error = on_error
        self.transport: asyncio.Transport | None = None
        self.error: str | None = None
        self.closing = False
        self.frame_max = MAX_FRAME
        self.writable = asyncio.Event()
        self.writable.set()
        self.unblocked = asyncio.Event()
        self.unblocked.set()
        self.lost = asyncio.get_running_loop().create_future()
        self._waiters: list[tuple[type[Frame], asyncio.Future[Any]]] = []
        self._buf = b""
        # Consumer side: counters read by the stats ticker, latencies drained by it.
        self.consumed = 0
        self.latencies: list[int] = []
        self.manual_ack = False
        self.ack_every = 1
        self._unacked = 0
        self._last_tag = 0
        self._first_body = False
        # Publisher side.
        self.published = 0
        self.confirms: ConfirmTracker | None = None
        self.notes: list[str] = []

    # -- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        transport.set_write_buffer_limits(high=512 * 1024)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        self.writable.set()
        self.unblocked.set()
        if not self.closing:
            why = f"{exc}" if exc else "closed by peer"
            self._fail(f"{self.label}: connection lost ({why})")

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def data_received(self, data: bytes) -> None:
        """Parse every complete frame in `data`; hot frames never leave this loop."""
        if self._buf:
            data = self._buf + data
        n = len(data)
        off = 0
        unpack_hdr = FRAME_HEADER.unpack_from
        u32 = _U32.unpack_from
        u64 = _U64.unpack_from
        first_body = self._first_body
        lat = self.latencies
        now = 0
        consumed = 0
        last_tag = 0
        while n - off >= 8:
            ftype, channel, size = unpack_hdr(data, off)
            end = off + 7 + size
            if end >= n:
                break
            if data[end] != FRAME_END:
                self._fail(f"{self.label}: malformed frame from broker (bad frame-end byte)")
                self.abort()
                return
            if ftype == 3:
                if first_body:
                    first_body = False
                    if size >= 8:
                        if not now:
                            now = time.monotonic_ns()
                        lat.append(now - u64(data, off + 7)[0])
            elif ftype == 1:
                key = u32(data, off + 7)[0]
                if key == _DELIVER:
                    consumed += 1
                    p = off + 11
                    last_tag = u64(data, p + 1 + data[p])[0]
                elif key == _CONFIRM_ACK or key == _CONFIRM_NACK:
                    if self.confirms is not None:
                        self.confirms.on_confirm(
                            u64(data, off + 11)[0], data[off + 19] & 1, key == _CONFIRM_NACK
                        )
                else:
                    self._control(channel, data[off : end + 1])
            elif ftype == 2:
                first_body = u64(data, off + 11)[0] > 0
            off = end + 1
        self._buf = data[off:] if off < n else b""
        self._first_body = first_body
        if consumed:
            self.consumed += consumed
            if self.manual_ack:
                self._last_tag = last_tag
                self._unacked += consumed
                if self._unacked >= self.ack_every:
                    self.flush_acks()

    def flush_acks(self) -> None:
        """One cumulative (multiple=1) ack for everything delivered so far.

        Called every `ack_every` messages, and once a second by the runner so that a
        slow trickle is acknowledged too; ack_every stays below the prefetch, so the
        broker never waits on us.
        """
        if self._unacked and self.transport is not None and not self.closing:
            self.transport.write(_ACK_FRAME.pack(1, 1, 13, 60, 80, self._last_tag, 1, FRAME_END))
            self._unacked = 0

    # -- control methods ----------------------------------------------------------------

    def _control(self, channel: int, raw: bytes) -> None:
        try:
            _, _, obj = frame.unmarshal(raw)
        except Exception as exc:  # pamqp raises several types for bad frames
            self._fail(f"{self.label}: undecodable frame from broker: {exc}")
            return
        if isinstance(obj, commands.Connection.Close):
            self._send(commands.Connection.CloseOk())
            self._fail(
                f"{self.label}: broker closed connection: {obj.reply_code} {obj.reply_text}"
                + _culprit(obj.class_id, obj.method_id)
            )
            self.closing = True
            if self.transport is not None:
                self.transport.close()
            return
        if isinstance(obj, commands.Channel.Close):
            self._send(commands.Channel.CloseOk(), channel)
            self._fail(
                f"{self.label}: broker closed channel {channel}: {obj.reply_code} "
                f"{obj.reply_text}" + _culprit(obj.class_id, obj.method_id)
            )
            return
        if isinstance(obj, commands.Connection.Blocked):
            self.notes.append(f"{self.label}: connection blocked by broker ({obj.reason})")
            self.unblocked.clear()
            return
        if isinstance(obj, commands.Connection.Unblocked):
            self.unblocked.set()
            return
        if isinstance(obj, commands.Basic.Cancel):
            if not self.closing:
                self._fail(f"{self.label}: broker cancelled consumer {obj.consumer_tag}")
            return
        for i, (cls, fut) in enumerate(self._waiters):
            if isinstance(obj, cls):
                del self._waiters[i]
                if not fut.done():
                    fut.set_result(obj)
                return

    def _fail(self, message: str) -> None:
        """Record the first error, wake every waiter with it and tell the runner."""
        if self.error is None:
            self.error = message
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(BrokerError(message))
        self._waiters.clear()
        if self.confirms is not None:
            self.confirms.room.set()
        if self.on_error is not None:
            self.on_error(message)

    # -- requests -----------------------------------------------------------------------

    def _send(self, obj: Frame, channel: int = 0) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(frame.marshal(obj, channel))

    async def call(
        self, obj: Frame | None, reply: type[F], channel: int = 1, timeout: float = 30.0
    ) -> F:
        """Send `obj` (if any) and wait for a `reply` method; broker errors raise."""
        fut = self.expect(reply)
        if obj is not None:
            try:
                self._send(obj, channel)
            except BaseException:
                fut.cancel()
                raise
        return await self.wait(fut, reply, timeout)

    def expect(self, reply: type[F]) -> asyncio.Future[Any]:
        """Register interest in `reply` before sending whatever provokes it."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.error is not None:
            fut.set_exception(BrokerError(self.error))
        else:
            self._waiters.append((reply, fut))
        return fut

    async def wait(self, fut: asyncio.Future[Any], reply: type[F], timeout: float) -> F:
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise BrokerError(
                f"{self.label}: no {reply.name} from broker within {timeout:g} s"
            ) from None

    async def close(self, timeout: float = 5.0) -> None:
        """Polite connection.close; falls back to dropping the socket."""
        if self.transport is None or self.transport.is_closing():
            self.closing = True
            return
        try:
            if self.error is None:
                await self.call(
                    commands.Connection.Close(
                        reply_code=200, reply_text="leveret perf done", class_id=0, method_id=0
                    ),
                    commands.Connection.CloseOk,
                    channel=0,
                    timeout=timeout,
                )
        except BrokerError:
            pass
        finally:
            self.closing = True
            self.transport.close()

    def abort(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.abort()


def _culprit(class_id: int, method_id: int) -> str:
    if not class_id:
        return ""
    cls = commands.INDEX_MAPPING.get((class_id << 16) | method_id)
    name = cls.name if cls is not None else f"{class_id}.{method_id}"
    return f" (in reply to {name})"


async def connect(
    host: str,
    port: int,
    user: str,
    password: str,
    vhost: str,
    label: str,
    on_error: Callable[[str], None] | None = None,
    timeout: float = 10.0,
) -> AMQPConnection:
    """Open a connection plus channel 1; errors name the host/port and the failing step."""
    loop = asyncio.get_running_loop()
    try:
        _, conn = await asyncio.wait_for(
            loop.create_connection(lambda: AMQPConnection(label), host, port), timeout
        )
    except TimeoutError:
        raise ConnectError(
            f"cannot connect to {host}:{port}: timed out after {timeout:g} s"
        ) from None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConnectError(f"cannot connect to {host}:{port}: {reason}") from None
    try:
        assert conn.transport is not None
        start_fut = conn.expect(commands.Connection.Start)
        conn.transport.write(PROTOCOL_HEADER)
        start = await conn.wait(start_fut, commands.Connection.Start, timeout)
        mechanisms = start.mechanisms.split()
        if "PLAIN" not in mechanisms:
            raise ConnectError(f"{host}:{port} does not offer PLAIN auth ({start.mechanisms})")
        tune = await conn.call(
            commands.Connection.StartOk(
                client_properties={
                    "product": "leveret perf",
                    "capabilities": {
                        "publisher_confirms": True,
                        "basic.nack": True,
                        "consumer_cancel_notify": True,
                        "connection.blocked": True,
                        "authentication_failure_close": True,
                    },
                },
                mechanism="PLAIN",
                response=f"\0{user}\0{password}",
                locale="en_US",
            ),
            commands.Connection.Tune,
            0,
            timeout,
        )
        conn.frame_max = min(tune.frame_max or MAX_FRAME, MAX_FRAME)
        conn._send(
            commands.Connection.TuneOk(
                channel_max=tune.channel_max, frame_max=conn.frame_max, heartbeat=0
            )
        )
        await conn.call(
            commands.Connection.Open(virtual_host=vhost), commands.Connection.OpenOk, 0, timeout
        )
        await conn.call(commands.Channel.Open(), commands.Channel.OpenOk, 1, timeout)
    except BrokerError as exc:
        conn.abort()
        msg = str(exc)
        if "connection lost" in msg:
            msg = f"{msg}; wrong credentials or not an AMQP 0-9-1 broker?"
        raise ConnectError(f"AMQP handshake with {host}:{port} failed: {msg}") from None
    conn.on_error = on_error
    return conn
