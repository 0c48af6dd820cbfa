"""A small blocking AMQP 0-9-1 client for Spark tasks and the Spark driver.

Why not pika: a Spark task is a plain synchronous function in a Python worker, it needs
one connection, one channel, publisher confirms and a consumer loop, and it must not
add a dependency beyond what Leveret already has (pamqp). The hot frames (basic.deliver,
content header and body, confirms) are parsed in place; rare methods go through pamqp.

Every error is an `AmqpError` whose text names the broker address and the failing step,
because it ends up in a Spark stack trace far from the code that caused it.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from pamqp import commands
from pamqp.base import Frame
from pamqp.decode import field_table

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = b"\xce"
CLIENT_FRAME_MAX = 131072

_FRAME_HEAD = struct.Struct(">BHI")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_CONTENT_HEAD = struct.Struct(">HHQ")

_DELIVER = (60 << 16) | 60
_RETURN = (60 << 16) | 50
_ACK = (60 << 16) | 80
_NACK = (60 << 16) | 120
_PUBLISH_HEAD = struct.Struct(">IH")  # method index (class<<16|method), reserved-1


class AmqpError(Exception):
    """Any failure talking to the broker; the text says where and what."""


class ConnectFailed(AmqpError):
    """The broker could not be reached (refused, timed out, name not found)."""


class LoginRefused(AmqpError):
    """The broker refused the user, the password or the vhost."""


class ChannelClosed(AmqpError):
    """The broker closed the channel or the connection with a reply code."""

    def __init__(self, message: str, code: int, text: str) -> None:
        super().__init__(message)
        self.code = code
        self.text = text


class ConnectionLost(AmqpError):
    """The socket closed or timed out mid-conversation."""


class PublishFailed(AmqpError):
    """A publisher confirm was a nack, or the message came back unroutable."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    user: str
    password: str
    vhost: str

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def parse_url(url: str) -> Endpoint:
    """amqp://user:pass@host:port/vhost (RabbitMQ's URI spec: %2F is "/", empty path is "/")."""
    parsed = urlparse(url)
    if parsed.scheme != "amqp":
        raise ValueError(f"not an amqp:// URL: {url!r}")
    if not parsed.hostname:
        raise ValueError(f"no host in {url!r}")
    try:
        port = parsed.port or 5672
    except ValueError as exc:
        raise ValueError(f"bad port in {url!r}") from exc
    path = parsed.path
    vhost = unquote(path[1:]) if len(path) > 1 else "/"
    return Endpoint(
        host=parsed.hostname,
        port=port,
        user=unquote(parsed.username) if parsed.username is not None else "guest",
        password=unquote(parsed.password) if parsed.password is not None else "guest",
        vhost=vhost,
    )


class Properties:
    """Received basic properties; absent ones are None. `timestamp` is seconds (an int).

    Class attributes are the defaults, so decoding sets only what a message carries.
    """

    content_type: str | None = None
    content_encoding: str | None = None
    headers: dict[str, Any] | None = None
    delivery_mode: int | None = None
    priority: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    expiration: str | None = None
    message_id: str | None = None
    timestamp: int | None = None
    type: str | None = None
    user_id: str | None = None
    app_id: str | None = None
    cluster_id: str | None = None


# (flag bit, attribute, kind): s = shortstr, t = table, o = octet, q = u64
_PROPERTY_LAYOUT = (
    (1 << 15, "content_type", "s"),
    (1 << 14, "content_encoding", "s"),
    (1 << 13, "headers", "t"),
    (1 << 12, "delivery_mode", "o"),
    (1 << 11, "priority", "o"),
    (1 << 10, "correlation_id", "s"),
    (1 << 9, "reply_to", "s"),
    (1 << 8, "expiration", "s"),
    (1 << 7, "message_id", "s"),
    (1 << 6, "timestamp", "q"),
    (1 << 5, "type", "s"),
    (1 << 4, "user_id", "s"),
    (1 << 3, "app_id", "s"),
    (1 << 2, "cluster_id", "s"),
)
# a headers table that holds only x-stream-offset (a long): what every stream delivery
# of a message without headers carries, decoded without the generic table decoder
_OFFSET_ONLY = b"\x00\x00\x00\x19\x0fx-stream-offsetl"
_I64 = struct.Struct(">q")


def decode_properties(data: bytes | memoryview, pos: int) -> Properties:
    """Basic properties from a content header payload, starting at the property flags."""
    (flags,) = _U16.unpack_from(data, pos)
    if not flags:
        return Properties()
    if flags == 0x2000 and data[pos + 2 : pos + 23] == _OFFSET_ONLY:
        # the usual stream delivery: no properties but the x-stream-offset header
        props = Properties()
        props.headers = {"x-stream-offset": _I64.unpack_from(data, pos + 23)[0]}
        return props
    pos += 2  # (bit 0, a continuation of the flags, is never set for basic: 14 properties)
    props = Properties()
    for bit, name, kind in _PROPERTY_LAYOUT:
        if not flags & bit:
            continue
        if kind == "s":
            n = data[pos]
            setattr(props, name, bytes(data[pos + 1 : pos + 1 + n]).decode("utf-8", "replace"))
            pos += 1 + n
        elif kind == "o":
            setattr(props, name, data[pos])
            pos += 1
        elif kind == "q":
            setattr(props, name, _U64.unpack_from(data, pos)[0])
            pos += 8
        else:
            if bytes(data[pos : pos + 21]) == _OFFSET_ONLY:
                props.headers = {"x-stream-offset": _I64.unpack_from(data, pos + 21)[0]}
                pos += 29
            else:
                (size,) = _U32.unpack_from(data, pos)
                _used, table = field_table(bytes(data[pos : pos + 4 + size]))
                props.headers = table
                pos += 4 + size
    return props


@dataclass(slots=True)
class Delivery:
    delivery_tag: int
    redelivered: bool
    exchange: str
    routing_key: str
    properties: Properties
    body: bytes


@dataclass(slots=True)
class Returned:
    reply_code: int
    reply_text: str
    exchange: str
    routing_key: str
    properties: Properties
    body: bytes


_NAMES: dict[bytes, str] = {}  # exchange names and routing keys repeat: decode each once


def _shortstr(buf: bytes | memoryview, pos: int) -> tuple[str, int]:
    n = buf[pos]
    pos += 1
    raw = bytes(buf[pos : pos + n])
    text = _NAMES.get(raw)
    if text is None:
        text = raw.decode("utf-8", "replace")
        if len(_NAMES) < 10000:
            _NAMES[raw] = text
    return text, pos + n


class Client:
    """One connection with one channel (number 1). Not thread-safe; one per task."""

    def __init__(self, url: str, timeout: float = 10.0, label: str = "leveret-spark") -> None:
        self.endpoint = parse_url(url)
        self.timeout = timeout
        self.label = label
        self.sock: socket.socket | None = None
        # immutable, so payload views handed out stay valid while more data arrives
        self._buf = b""
        self._pos = 0
        self.frame_max = CLIENT_FRAME_MAX
        self._pending_deliveries: list[Delivery] = []  # arrived while awaiting a reply
        self.cancelled = False  # the broker sent basic.cancel
        self._reply_consumer = False  # consuming amq.rabbitmq.reply-to already
        # publisher confirms
        self.confirming = False
        self.next_seq = 1
        self.confirmed_upto = 0  # every seq <= this is acked
        self._acked_ahead: set[int] = set()
        self.nacked: list[int] = []
        self.returned: list[Returned] = []
        self._out: list[bytes] = []

    # ----------------------------------------------------------------- connection
    def connect(self) -> Client:
        ep = self.endpoint
        try:
            self.sock = socket.create_connection((ep.host, ep.port), timeout=self.timeout)
        except TimeoutError:
            raise ConnectFailed(
                f"cannot reach the AMQP broker at {ep.address}: timed out after {self.timeout:g} s"
            ) from None
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise ConnectFailed(f"cannot reach the AMQP broker at {ep.address}: {reason}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self._handshake()
        except BaseException:
            self.abort()
            raise
        return self

    def _handshake(self) -> None:
        ep = self.endpoint
        assert self.sock is not None
        self.sock.sendall(PROTOCOL_HEADER)
        try:
            start = self._expect(commands.Connection.Start, 0, "connection.start")
        except ConnectionLost:
            raise ConnectFailed(
                f"{ep.address} closed the connection before connection.start: "
                "not an AMQP 0-9-1 broker?"
            ) from None
        if "PLAIN" not in start.mechanisms.split():
            raise LoginRefused(f"{ep.address} does not offer PLAIN login ({start.mechanisms})")
        self.send_method(
            commands.Connection.StartOk(
                client_properties={
                    "product": self.label,
                    "capabilities": {
                        "publisher_confirms": True,
                        "basic.nack": True,
                        "consumer_cancel_notify": True,
                        "authentication_failure_close": True,
                    },
                },
                mechanism="PLAIN",
                response=f"\0{ep.user}\0{ep.password}",
                locale="en_US",
            ),
            channel=0,
        )
        try:
            tune = self._expect(commands.Connection.Tune, 0, "login")
        except ChannelClosed as exc:
            raise LoginRefused(
                f"{ep.address} refused the login of user {ep.user!r}: {exc.code} {exc.text}"
            ) from None
        except ConnectionLost:
            raise LoginRefused(
                f"{ep.address} closed the connection after the login of user {ep.user!r}: "
                "wrong user or password?"
            ) from None
        self.frame_max = min(tune.frame_max or CLIENT_FRAME_MAX, CLIENT_FRAME_MAX)
        self.send_method(
            commands.Connection.TuneOk(
                channel_max=tune.channel_max, frame_max=self.frame_max, heartbeat=0
            ),
            channel=0,
        )
        try:
            self.call(
                commands.Connection.Open(virtual_host=ep.vhost), commands.Connection.OpenOk, 0
            )
        except ChannelClosed as exc:
            raise LoginRefused(
                f"{ep.address} refused vhost {ep.vhost!r} to user {ep.user!r}: {exc.code} {exc.text}"
            ) from None
        self.call(commands.Channel.Open(), commands.Channel.OpenOk, 1)

    def connect_patiently(self, patience: float) -> Client:
        """Connect, retrying a refused or unreachable broker for up to `patience` seconds.

        For tasks: a broker that restarts (or fails over) while a query runs costs a task a
        short wait instead of its retries. The driver connects once, to fail fast.
        """
        deadline = time.monotonic() + patience
        delay = 0.1
        while True:
            try:
                return self.connect()
            except ConnectFailed:
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def close(self) -> None:
        """Polite close; never raises (the task is over either way)."""
        if self.sock is None:
            return
        try:
            self.flush()
            self.send_method(commands.Connection.Close(reply_code=200, reply_text="bye"), 0)
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                ch, kind, payload = self._read_frame()
                if kind == FRAME_METHOD and _U32.unpack_from(payload)[0] == (10 << 16) | 51:
                    break
        except Exception:
            pass
        self.abort()

    def abort(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- frames
    def _fill(self, need: int) -> None:
        """Make at least `need` unread bytes available in the buffer."""
        assert self.sock is not None
        while len(self._buf) - self._pos < need:
            try:
                chunk = self.sock.recv(262144)
            except TimeoutError:
                raise ConnectionLost(
                    f"no data from {self.endpoint.address} for {self.timeout:g} s"
                ) from None
            except OSError as exc:
                raise ConnectionLost(
                    f"connection to {self.endpoint.address} lost: {exc.strerror or exc}"
                ) from None
            if not chunk:
                raise ConnectionLost(f"{self.endpoint.address} closed the connection")
            self._append(chunk)

    def _append(self, chunk: bytes) -> None:
        self._buf = self._buf[self._pos :] + chunk if self._pos < len(self._buf) else chunk
        self._pos = 0

    def _read_frame(self) -> tuple[int, int, memoryview]:
        """(channel, frame type, payload); the payload view is valid until the next read."""
        if len(self._buf) - self._pos < 7:
            self._fill(7)
        kind, channel, size = _FRAME_HEAD.unpack_from(self._buf, self._pos)
        if len(self._buf) - self._pos < 8 + size:
            self._fill(8 + size)
        start = self._pos + 7
        end = start + size
        if self._buf[end] != 0xCE:
            raise ConnectionLost(f"bad frame end from {self.endpoint.address}")
        self._pos = end + 1
        return channel, kind, memoryview(self._buf)[start:end]

    def send_method(self, method: Frame, channel: int = 1) -> None:
        payload = _U32.pack(method.index) + method.marshal()
        self._send(_FRAME_HEAD.pack(FRAME_METHOD, channel, len(payload)) + payload + FRAME_END)

    def _send(self, data: bytes) -> None:
        assert self.sock is not None
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise ConnectionLost(
                f"connection to {self.endpoint.address} lost: {exc.strerror or exc}"
            ) from None

    def _method(self, payload: bytes | memoryview) -> Frame:
        index = _U32.unpack_from(payload)[0]
        cls = commands.INDEX_MAPPING.get(index)
        if cls is None:
            raise ConnectionLost(f"unknown method {index >> 16}.{index & 0xFFFF} from broker")
        method = cls()
        method.unmarshal(bytes(payload[4:]))
        return method

    def _closed(self, method: Frame, channel: int, step: str) -> ChannelClosed:
        """Turn a connection.close/channel.close into an exception (answering it first)."""
        code, text = method.reply_code, method.reply_text
        where = "connection" if channel == 0 else "channel"
        try:
            if channel == 0:
                self.send_method(commands.Connection.CloseOk(), 0)
            else:
                self.send_method(commands.Channel.CloseOk(), channel)
        except AmqpError:
            pass
        return ChannelClosed(
            f"{self.endpoint.address} closed the {where} during {step}: {code} {text}", code, text
        )

    def _expect(self, reply: type[Frame], channel: int, step: str) -> Any:
        """Read frames until `reply` arrives; content frames met meanwhile are handled."""
        while True:
            ch, kind, payload = self._read_frame()
            if kind != FRAME_METHOD:
                if kind == FRAME_HEARTBEAT:
                    continue
                raise ConnectionLost(f"unexpected frame type {kind} from {self.endpoint.address}")
            index = _U32.unpack_from(payload)[0]
            if index in (_ACK, _NACK):
                self._on_confirm(index, payload)
                continue
            if index == _RETURN:
                self._read_returned(payload)
                continue
            if index == _DELIVER:
                # a delivery while we wait for a reply: keep it for the consumer loop
                self._pending_deliveries.append(self._read_delivery(payload))
                continue
            method = self._method(payload)
            if isinstance(method, commands.Connection.Close):
                raise self._closed(method, 0, step)
            if isinstance(method, commands.Channel.Close):
                raise self._closed(method, ch, step)
            if isinstance(method, reply):
                return method
            # anything else (e.g. basic.cancel from the broker) is noted and ignored here
            self._other(method)

    def _other(self, method: Frame) -> None:
        if isinstance(method, commands.Basic.Cancel):
            self.cancelled = True

    def call(self, method: Frame, reply: type[Frame], channel: int = 1) -> Any:
        self.send_method(method, channel)
        return self._expect(reply, channel, method.name)

    # ----------------------------------------------------------------- content
    def _read_content(self) -> tuple[Properties, bytes]:
        ch, kind, payload = self._read_frame()
        if kind != FRAME_HEADER:
            raise ConnectionLost(f"expected a content header from {self.endpoint.address}")
        _cls, _weight, size = _CONTENT_HEAD.unpack_from(payload)
        props = decode_properties(payload, 12)
        if size == 0:
            return props, b""
        if len(self._buf) - self._pos >= size + 8 and self._buf[self._pos] == FRAME_BODY:
            # the common case: the whole body in one frame that is already buffered
            (n,) = _U32.unpack_from(self._buf, self._pos + 3)
            if n == size:
                start = self._pos + 7
                if self._buf[start + n] != 0xCE:
                    raise ConnectionLost(f"bad frame end from {self.endpoint.address}")
                self._pos = start + n + 1
                return props, self._buf[start : start + n]
        parts = []
        got = 0
        while got < size:
            ch, kind, payload = self._read_frame()
            if kind != FRAME_BODY:
                raise ConnectionLost(f"expected a content body from {self.endpoint.address}")
            parts.append(bytes(payload))
            got += len(payload)
        return props, parts[0] if len(parts) == 1 else b"".join(parts)

    def _read_delivery(self, payload: bytes | memoryview) -> Delivery:
        pos = 4
        n = payload[pos]
        pos += 1 + n  # consumer tag
        (tag,) = _U64.unpack_from(payload, pos)
        pos += 8
        redelivered = bool(payload[pos] & 1)
        pos += 1
        exchange, pos = _shortstr(payload, pos)
        routing_key, pos = _shortstr(payload, pos)
        props, body = self._read_content()
        return Delivery(tag, redelivered, exchange, routing_key, props, body)

    def _read_returned(self, payload: bytes | memoryview) -> None:
        method = self._method(payload)
        props, body = self._read_content()
        self.returned.append(
            Returned(
                method.reply_code,
                method.reply_text,
                method.exchange,
                method.routing_key,
                props,
                body,
            )
        )

    # ----------------------------------------------------------------- confirms / publish
    def confirm_select(self) -> None:
        self.call(commands.Confirm.Select(), commands.Confirm.SelectOk)
        self.confirming = True

    def _on_confirm(self, index: int, payload: bytes | memoryview) -> None:
        (tag,) = _U64.unpack_from(payload, 4)
        multiple = bool(payload[12] & 1)
        if index == _NACK:
            low = self.confirmed_upto + 1 if multiple else tag
            self.nacked.extend(range(low, tag + 1))
        if multiple:
            if tag > self.confirmed_upto:
                self.confirmed_upto = tag
                self._acked_ahead = {t for t in self._acked_ahead if t > tag}
        elif tag == self.confirmed_upto + 1:
            self.confirmed_upto = tag
        elif tag > self.confirmed_upto:
            self._acked_ahead.add(tag)
        while self._acked_ahead and self.confirmed_upto + 1 in self._acked_ahead:
            self.confirmed_upto += 1
            self._acked_ahead.discard(self.confirmed_upto)

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: commands.Basic.Properties | None = None,
        mandatory: bool = False,
    ) -> int:
        """Queue one message for sending (call `flush`); returns its confirm sequence number."""
        ex = exchange.encode()
        rk = routing_key.encode()
        if len(ex) > 255 or len(rk) > 255:
            raise ValueError("exchange and routing key must be at most 255 bytes")
        method = (
            _PUBLISH_HEAD.pack((60 << 16) | 40, 0)
            + bytes((len(ex),))
            + ex
            + bytes((len(rk),))
            + rk
            + (b"\x01" if mandatory else b"\x00")
        )
        out = self._out
        out.append(_FRAME_HEAD.pack(FRAME_METHOD, 1, len(method)) + method + FRAME_END)
        props = properties or commands.Basic.Properties()
        flags_and_values = props.marshal()
        head = _CONTENT_HEAD.pack(60, 0, len(body)) + flags_and_values
        out.append(_FRAME_HEAD.pack(FRAME_HEADER, 1, len(head)) + head + FRAME_END)
        limit = self.frame_max - 8
        for i in range(0, len(body), limit):
            chunk = body[i : i + limit]
            out.append(_FRAME_HEAD.pack(FRAME_BODY, 1, len(chunk)) + chunk + FRAME_END)
        seq = self.next_seq
        if self.confirming:
            self.next_seq += 1
        if len(out) > 256:
            self.flush()
        return seq

    def flush(self) -> None:
        if self._out:
            data = b"".join(self._out)
            self._out.clear()
            self._send(data)

    def poll_confirms(self) -> None:
        """Read whatever confirms are already waiting, without blocking."""
        assert self.sock is not None
        self.sock.setblocking(False)
        try:
            try:
                chunk = self.sock.recv(262144)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                raise ConnectionLost(
                    f"connection to {self.endpoint.address} lost: {exc.strerror or exc}"
                ) from None
            if not chunk:
                raise ConnectionLost(f"{self.endpoint.address} closed the connection")
            self._append(chunk)
        finally:
            self.sock.settimeout(self.timeout)
        while self._complete_frame_buffered():
            self._dispatch_async(*self._read_frame())

    def _complete_frame_buffered(self) -> bool:
        avail = len(self._buf) - self._pos
        if avail < 7:
            return False
        size = _U32.unpack_from(self._buf, self._pos + 3)[0]
        return avail >= size + 8

    def _dispatch_async(self, ch: int, kind: int, payload: memoryview) -> None:
        """A frame that arrived while publishing: a confirm, a return, or a close."""
        if kind == FRAME_HEARTBEAT:
            return
        if kind != FRAME_METHOD:
            raise ConnectionLost(f"unexpected frame type {kind} from {self.endpoint.address}")
        index = _U32.unpack_from(payload)[0]
        if index in (_ACK, _NACK):
            self._on_confirm(index, payload)
            return
        if index == _RETURN:
            # a return's content frames may not be buffered yet; _read_content blocks for them
            self._read_returned(payload)
            return
        method = self._method(payload)
        if isinstance(method, commands.Connection.Close):
            raise self._closed(method, 0, "publishing")
        if isinstance(method, commands.Channel.Close):
            raise self._closed(method, ch, "publishing")
        self._other(method)

    def read_one(self) -> None:
        """Block for one frame while publishing (a confirm, most likely) and handle it."""
        self._dispatch_async(*self._read_frame())

    def outstanding(self) -> int:
        return self.next_seq - 1 - self.confirmed_upto

    def wait_for_confirms(self, timeout: float | None = None) -> None:
        """Block until every published message is confirmed; raise on nack or timeout."""
        self.flush()
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while self.confirmed_upto < self.next_seq - 1:
            if time.monotonic() > deadline:
                raise ConnectionLost(
                    f"{self.outstanding()} publisher confirms from {self.endpoint.address} "
                    f"did not arrive within {timeout if timeout is not None else self.timeout:g} s"
                )
            self._dispatch_async(*self._read_frame())
        if self.nacked:
            raise PublishFailed(
                f"{self.endpoint.address} nacked {len(self.nacked)} published message(s)"
            )

    # ----------------------------------------------------------------- consuming
    def qos(self, prefetch: int) -> None:
        self.call(commands.Basic.Qos(prefetch_count=prefetch), commands.Basic.QosOk)

    def consume(
        self, queue: str, arguments: dict | None = None, no_ack: bool = False, tag: str = ""
    ) -> str:
        ok = self.call(
            commands.Basic.Consume(
                queue=queue, consumer_tag=tag, no_ack=no_ack, arguments=arguments or {}
            ),
            commands.Basic.ConsumeOk,
        )
        return ok.consumer_tag

    def deliveries(self) -> Iterator[Delivery]:
        """Deliveries as they arrive; raises ConnectionLost after `timeout` s of silence."""
        pending = self._pending_deliveries
        while pending:
            yield pending.pop(0)
        while True:
            ch, kind, payload = self._read_frame()
            if kind == FRAME_METHOD and _U32.unpack_from(payload)[0] == _DELIVER:
                yield self._read_delivery(payload)
                continue
            self._dispatch_async(ch, kind, payload)
            if self.cancelled:
                raise ChannelClosed(
                    f"{self.endpoint.address} cancelled the consumer", 0, "basic.cancel"
                )

    def deliveries_or_returns(self) -> Iterator[Delivery | None]:
        """Like `deliveries`, but yields None whenever a published message came back."""
        pending = self._pending_deliveries
        while True:
            while pending:
                yield pending.pop(0)
            if self.returned:
                self.returned.pop(0)
                yield None
                continue
            ch, kind, payload = self._read_frame()
            if kind == FRAME_METHOD and _U32.unpack_from(payload)[0] == _DELIVER:
                yield self._read_delivery(payload)
                continue
            self._dispatch_async(ch, kind, payload)

    def ack(self, delivery_tag: int, multiple: bool = False) -> None:
        payload = _U32.pack((60 << 16) | 80) + _U64.pack(delivery_tag) + bytes((int(multiple),))
        self._send(_FRAME_HEAD.pack(FRAME_METHOD, 1, len(payload)) + payload + FRAME_END)
