"""A tiny raw-socket AMQP 0-9-1 client for tests that need to misbehave.

Frames are built and cut with Leveret's own protocol core (leveret.protocol:
the frame head, the hand-written publish and content-header codecs, pamqp for
the other methods), the same code the broker and leveret.client use; bytes go
out with plain ``socket.sendall`` so tests can send anything else too. Every
read has a timeout: a test never hangs on a silent server.

    c = RawClient(host, port)
    c.handshake()                     # header, start-ok (PLAIN), tune-ok, open
    c.open_channel(1)
    c.send_method(1, commands.Queue.Declare(queue="q"))
    ch, ok = c.wait_for(commands.Queue.DeclareOk)
    c.send(b"garbage")
    close = c.expect_connection_close()   # connection.close sent by the server
"""

from __future__ import annotations

import socket
import struct
import time

from pamqp import body, commands, header, heartbeat

from leveret.protocol import constants as k
from leveret.protocol import methods as wire
from leveret.protocol.frames import FRAME_HEAD, HEARTBEAT_FRAME, body_frames
from leveret.protocol.properties import content_header_frame

PROTOCOL_HEADER = k.PROTOCOL_HEADER

FRAME_METHOD = k.FRAME_METHOD  # 1
FRAME_HEADER = k.FRAME_HEADER  # 2
FRAME_BODY = k.FRAME_BODY  # 3
FRAME_HEARTBEAT = k.FRAME_HEARTBEAT  # 8
FRAME_END = k.FRAME_END_BYTE


class ConnectionLost(Exception):
    """The server closed the socket (EOF or reset)."""


class Timeout(Exception):
    """Nothing (or not the expected thing) arrived in time."""


def raw_frame(frame_type: int, channel: int, payload: bytes, end: bytes = FRAME_END) -> bytes:
    """A frame built by hand: type, channel, size, payload, frame-end octet."""
    return FRAME_HEAD.pack(frame_type, channel, len(payload)) + payload + end


def method_payload(method) -> bytes:
    """The payload of a method frame (class id, method id, arguments)."""
    return struct.pack(">I", method.index) + method.marshal()


def method_frame(channel: int, method) -> bytes:
    if isinstance(method, commands.Basic.Publish):
        return wire.encode_publish(
            channel, method.exchange, method.routing_key, method.mandatory, method.immediate
        )
    return wire.encode_method(method, channel)


def content_frames(
    channel: int,
    payload: bytes,
    properties: commands.Basic.Properties | None = None,
    frame_max=131072,
) -> bytes:
    """Content header frame plus body frames (split to fit ``frame_max``)."""
    props = (properties or commands.Basic.Properties()).marshal()
    return content_header_frame(channel, len(payload), props) + b"".join(
        body_frames(channel, payload, frame_max)
    )


def decode_frame(frame_type: int, payload: bytes):
    """The frame as an object: a pamqp method, ContentHeader or ContentBody, or Heartbeat."""
    if frame_type == FRAME_METHOD:
        return wire.decode_method(payload)
    if frame_type == FRAME_HEADER:
        obj = header.ContentHeader()
        obj.unmarshal(payload)
        return obj
    if frame_type == FRAME_BODY:
        return body.ContentBody(payload)
    if frame_type == FRAME_HEARTBEAT:
        return heartbeat.Heartbeat()
    raise AssertionError(f"server sent a frame of unknown type {frame_type}")


def plain_response(user: str, password: str) -> str:
    return f"\0{user}\0{password}"


def amqplain_response(user: str, password: str) -> str:
    """AMQPLAIN: a field table without its length prefix.

    pamqp wants a str for a longstr (it UTF-8 encodes it), so this only works
    for short ASCII credentials, which is all the tests need.
    """
    from pamqp import encode

    return encode.field_table({"LOGIN": user, "PASSWORD": password})[4:].decode("ascii")


class RawClient:
    def __init__(self, host: str, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.buf = b""
        self.closed = False
        self.opened = False  # connection.open-ok received
        self.start: commands.Connection.Start | None = None
        self.tune: commands.Connection.Tune | None = None
        self.frames_seen: list = []  # every (channel, frame) read, in order

    # -- low level -----------------------------------------------------------

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_method(self, channel: int, method) -> None:
        self.send(method_frame(channel, method))

    def send_heartbeat(self) -> None:
        self.send(HEARTBEAT_FRAME)

    def publish(
        self,
        channel: int,
        exchange: str,
        routing_key: str,
        payload: bytes,
        properties: commands.Basic.Properties | None = None,
        mandatory: bool = False,
        immediate: bool = False,
        frame_max: int = 131072,
    ) -> None:
        self.send(
            wire.encode_publish(channel, exchange, routing_key, mandatory, immediate)
            + content_frames(channel, payload, properties, frame_max)
        )

    def _recv_some(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Timeout("timed out waiting for data")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except TimeoutError as exc:
            raise Timeout("timed out waiting for data") from exc
        except (ConnectionResetError, BrokenPipeError) as exc:
            self.closed = True
            raise ConnectionLost(str(exc)) from exc
        if not data:
            self.closed = True
            raise ConnectionLost("EOF")
        self.buf += data

    def read_bytes(self, n: int, timeout: float | None = None) -> bytes:
        """Exactly n raw bytes (or fewer if the server closes first)."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while len(self.buf) < n:
            try:
                self._recv_some(deadline)
            except ConnectionLost:
                break
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def read_frame(self, timeout: float | None = None):
        """Next (channel, frame object); heartbeats are returned too."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while True:
            if len(self.buf) >= 7:
                ftype, channel, size = FRAME_HEAD.unpack_from(self.buf)
                total = 7 + size + 1
                if len(self.buf) >= total:
                    raw, self.buf = self.buf[:total], self.buf[total:]
                    if raw[-1:] != FRAME_END:
                        raise AssertionError(f"server sent a bad frame end: {raw[-1:]!r}")
                    obj = decode_frame(ftype, raw[7:-1])
                    self.frames_seen.append((channel, obj))
                    return channel, obj
            self._recv_some(deadline)

    def wait_for(self, *types, channel: int | None = None, timeout: float | None = None):
        """Read frames until one is an instance of ``types`` (skipping others).

        Raises AssertionError if a connection.close arrives while waiting for
        something else, so failures show the server's reason.
        """
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while True:
            ch, obj = self.read_frame(timeout=max(0.0, deadline - time.monotonic()) or 0.001)
            if isinstance(obj, types) and (channel is None or ch == channel):
                return ch, obj
            if (
                isinstance(obj, commands.Connection.Close)
                and commands.Connection.Close not in types
            ):
                raise AssertionError(
                    f"unexpected connection.close {obj.reply_code} {obj.reply_text!r} "
                    f"while waiting for {types}"
                )

    def expect_connection_close(self, timeout: float | None = None, reply_ok: bool = True):
        """Wait for connection.close, answer close-ok, return the close method."""
        _ch, close = self.wait_for(commands.Connection.Close, timeout=timeout)
        if reply_ok:
            try:
                self.send_method(0, commands.Connection.CloseOk())
            except OSError:
                pass
        return close

    def expect_channel_close(self, channel: int, timeout: float | None = None, reply_ok=True):
        _ch, close = self.wait_for(commands.Channel.Close, channel=channel, timeout=timeout)
        if reply_ok:
            self.send_method(channel, commands.Channel.CloseOk())
        return close

    def wait_closed(self, timeout: float = 5.0) -> bool:
        """True once the server closes the socket (frames before EOF are read and kept)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._recv_some(deadline)
            except ConnectionLost:
                return True
            except Timeout:
                return False
            # discard complete frames, keep reading until EOF
            self.buf = b""

    # -- handshake -----------------------------------------------------------

    def send_protocol_header(self) -> None:
        self.send(PROTOCOL_HEADER)

    def handshake(
        self,
        user: str = "guest",
        password: str = "guest",
        vhost: str = "/",
        mechanism: str = "PLAIN",
        frame_max: int | None = None,
        channel_max: int | None = None,
        heartbeat: int | None = 0,
        open_connection: bool = True,
        capabilities: dict[str, bool] | None = None,
    ):
        """Protocol header, start-ok, tune-ok and (optionally) connection.open.

        ``None`` for a tune value means "accept what the server proposes".
        Returns the server's connection.tune.
        """
        self.send_protocol_header()
        _ch, self.start = self.wait_for(commands.Connection.Start)
        if mechanism == "AMQPLAIN":
            response = amqplain_response(user, password)
        else:
            response = plain_response(user, password)
        start_ok = commands.Connection.StartOk(
            client_properties={
                "product": "leveret-rawamqp",
                "capabilities": capabilities
                or {
                    "authentication_failure_close": True,
                    "consumer_cancel_notify": True,
                    "basic.nack": True,
                    "publisher_confirms": True,
                },
            },
            mechanism=mechanism,
            response=response,
        )
        self.send_method(0, start_ok)
        _ch, self.tune = self.wait_for(commands.Connection.Tune, commands.Connection.Close)
        if isinstance(self.tune, commands.Connection.Close):
            close, self.tune = self.tune, None
            return close
        tune_ok = commands.Connection.TuneOk(
            channel_max=self.tune.channel_max if channel_max is None else channel_max,
            frame_max=self.tune.frame_max if frame_max is None else frame_max,
            heartbeat=self.tune.heartbeat if heartbeat is None else heartbeat,
        )
        self.send_method(0, tune_ok)
        if open_connection:
            self.send_method(0, commands.Connection.Open(virtual_host=vhost))
            self.wait_for(commands.Connection.OpenOk)
            self.opened = True
        return self.tune

    def open_channel(self, channel: int = 1) -> None:
        self.send_method(channel, commands.Channel.Open())
        self.wait_for(commands.Channel.OpenOk, channel=channel)

    def rpc(self, channel: int, method, *reply_types, timeout: float | None = None):
        """Send a method and wait for one of reply_types (or a channel.close)."""
        self.send_method(channel, method)
        _ch, reply = self.wait_for(
            *reply_types, commands.Channel.Close, channel=channel, timeout=timeout
        )
        return reply

    def close(self) -> None:
        """Polite connection close when possible, then drop the socket."""
        try:
            if self.opened and not self.closed:
                self.send_method(
                    0,
                    commands.Connection.Close(
                        reply_code=200, reply_text="bye", class_id=0, method_id=0
                    ),
                )
                self.wait_for(commands.Connection.CloseOk, timeout=2)
        except (OSError, ConnectionLost, Timeout, AssertionError):
            pass
        finally:
            self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
