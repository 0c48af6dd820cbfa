"""A sans-IO AMQP 0-9-1 connection, for either end of the wire.

Like h11 for HTTP (and h2's `data_to_send`), this module never touches a
socket or a clock: bytes go in through `receive_data()`, which returns
events; methods such as `send_method()` or `send_publish()` queue bytes that
`data_to_send()` hands back for the caller to write. The same state machine
serves the client role (leveret.client, `leveret perf`, the tests' raw
helpers) and the server role, so the two ends cannot disagree about framing,
the handshake, tuning, the channel lifecycle or content assembly.

What the core decides itself, because the spec leaves no choice:
- the handshake steps and their order, tuning (the smaller non-zero limit),
  the protocol header;
- answering a peer's connection.close and channel.close with close-ok, and
  dropping frames on a channel (or connection) that is being closed until
  its close-ok arrives (spec 2.3.5.2);
- assembling a content method, its header and its body frames into one event,
  and splitting outgoing bodies to fit frame_max.

What it leaves to its caller, as events: authentication and vhost choice
(server), every other method. Protocol violations by the peer are returned as
a `ProtocolError` event after connection.close has been queued; nothing after
the bad frame is processed.

Hot frames (publish, deliver, ack, nack, content) are decoded with the
hand-written codecs in protocol.methods and protocol.properties; everything
else goes through pamqp.

This module holds the `Connection` and `_Channel` classes (C types when compiled,
laid out by connection.pxd), the parser and content assembly, and the sending of
methods and messages: what runs per frame and per message. What runs once per
connection or per channel is plain Python beside it, as functions of a
`Connection` that its methods call: `handshake.py` (protocol header, start to
open-ok, credentials, tuning) and `lifecycle.py` (channel open and close, the
close handshakes, protocol errors, channel 0 after the handshake). `states.py`
names the roles, states and limits all three share; this module re-exports them,
and `parse_credentials`, so callers import everything from here.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Any

try:
    import cython
except ImportError:  # no Cython installed: the annotations below are only comments
    from leveret import _cython_shim as cython

from leveret.protocol import handshake, lifecycle
from leveret.protocol import methods as wire
from leveret.protocol.constants import (
    BASIC_ACK,
    BASIC_DELIVER,
    BASIC_GET_OK,
    BASIC_NACK,
    BASIC_PUBLISH,
    BASIC_RETURN,
    CHANNEL_CLOSE,
    CHANNEL_ERROR,
    CHANNEL_OPEN,
    CLASS_BASIC,
    COMMAND_INVALID,
    FRAME_BODY,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
    PRECONDITION_FAILED,
    REPLY_SUCCESS,
    UNEXPECTED_FRAME,
)
from leveret.protocol.errors import AMQPError, ChannelError, ConnectionError_, FrameError

# The events receive_data() returns live in protocol/events.py; re-exported here
# (callers import them from either module).
from leveret.protocol.events import (  # noqa: F401
    Ack,
    BadProtocolHeader,
    ChannelClosed,
    ChannelCloseOk,
    ChannelOpened,
    ChannelProtocolError,
    ConnectionBlocked,
    ConnectionClosed,
    ConnectionCloseOk,
    ConnectionOpened,
    ConnectionUnblocked,
    Deliver,
    Event,
    GetOk,
    MethodReceived,
    Nack,
    OpenRequested,
    ProtocolError,
    Publish,
    Return,
    StartOkReceived,
)
from leveret.protocol.frames import (
    FRAME_HEAD,
    HEARTBEAT_FRAME,
    KNOWN_FRAME_TYPES,
    FrameReader,
    body_frames,
    header_frame,
)
from leveret.protocol.handshake import parse_credentials  # noqa: F401 (re-exported)
from leveret.protocol.properties import content_header_frame, parse_header

# The roles, states and limits; re-exported (callers use pc.CLIENT, pc.CLOSED, ...).
from leveret.protocol.states import (  # noqa: F401
    AUTHENTICATING,
    AWAITING_HEADER,
    AWAITING_OPEN,
    AWAITING_OPEN_OK,
    AWAITING_START,
    AWAITING_START_OK,
    AWAITING_TUNE,
    AWAITING_TUNE_OK,
    CH_CLOSING,
    CH_OPEN,
    CH_OPENING,
    CLIENT,
    CLOSED,
    CLOSING,
    DEFAULT_CHANNEL_MAX,
    DEFAULT_FRAME_MAX,
    LOGIN_REFUSED,
    MAX_BODY_SIZE,
    NEW,
    OPEN,
    OPENING,
    SERVER,
    UsageError,
)

_FRAME_HEAD = FRAME_HEAD
_U32 = struct.Struct(">I")
_ACK_ARGS = struct.Struct(">QB")  # delivery tag, bits
# A content header frame's head and fixed start: type, channel, size, class, weight, body size.
_HEADER_FRAME = struct.Struct(">BHIHHQ")
# basic.deliver after the consumer tag: delivery tag, redelivered, length of the exchange name.
_DELIVER_MIDDLE = struct.Struct(">QBB")
_METHOD_HEAD = struct.Struct(">BHII")  # type, channel, size, method id
FRAME_END = 0xCE


# Compiled, the parser reads a frame's integer fields straight out of the buffer with
# these instead of struct's unpack_from: each unpack is a call that builds a tuple and
# a Python int per field, four a message (about a tenth of a publish's instructions).
# Python runs the struct versions (`if cython.compiled` below) and never calls these.
@cython.cfunc
@cython.inline
@cython.exceptval(check=False)
def _be16(buf: bytes, i: cython.Py_ssize_t) -> cython.Py_ssize_t:
    return (buf[i] << 8) | buf[i + 1]


@cython.cfunc
@cython.inline
@cython.exceptval(check=False)
def _be32(buf: bytes, i: cython.Py_ssize_t) -> cython.Py_ssize_t:
    return (
        (cython.cast(cython.Py_ssize_t, buf[i]) << 24)
        | (buf[i + 1] << 16)
        | (buf[i + 2] << 8)
        | buf[i + 3]
    )


@cython.cfunc
@cython.inline
@cython.exceptval(check=False)
def _be64(buf: bytes, i: cython.Py_ssize_t) -> cython.ulonglong:
    return (cython.cast(cython.ulonglong, _be32(buf, i)) << 32) | cython.cast(
        cython.ulonglong, _be32(buf, i + 4)
    )


@cython.cfunc
@cython.inline
def _cut(buf: bytes, start: cython.Py_ssize_t, end: cython.Py_ssize_t) -> bytes:
    """`buf[start:end]`. Compiled, one copy out of the buffer: Cython slices a bytes
    object through a slice object and the generic sequence protocol, about four
    times the instructions (three slices a message: header, body, names)."""
    if not cython.compiled:
        return buf[start:end]
    return cython.cast(cython.p_char, buf)[start:end]


# The hot loops' constants as C values when compiled (cython.declare; plain ints in
# Python): comparing a C int with a module global would box the int every time.
_C_FRAME_END = cython.declare(cython.int, 0xCE)
_C_FRAME_METHOD = cython.declare(cython.int, 1)
_C_FRAME_HEADER = cython.declare(cython.int, 2)
_C_FRAME_BODY = cython.declare(cython.int, 3)
_C_CLASS_BASIC = cython.declare(cython.int, 60)
_C_BASIC_PUBLISH = cython.declare(cython.Py_ssize_t, 0x003C0028)
_C_BASIC_DELIVER = cython.declare(cython.Py_ssize_t, 0x003C003C)
_C_BASIC_ACK = cython.declare(cython.Py_ssize_t, 0x003C0050)
_C_CH_OPEN = cython.declare(cython.int, 2)


# --- per-channel state ----------------------------------------------------------


class _Channel:
    """Lifecycle and content-assembly state of one channel number."""

    __slots__ = ("number", "state", "content", "header", "body_left", "parts")

    def __init__(self, number: int, state: int) -> None:
        self.number = number
        self.state = state
        # Content being assembled: (method id, decoded method fields) until the
        # body is complete; then header payload and body parts.
        self.content: tuple[int, tuple] | None = None
        self.header: bytes | None = None
        self.body_left = 0
        self.parts: list[bytes] = []


def _content_event(channel: int, index: int, fields: tuple, header: bytes, body: bytes) -> Event:
    if index == BASIC_DELIVER:
        return Deliver(channel, *fields, header, body)
    if index == BASIC_PUBLISH:
        return Publish(channel, *fields, header, body)
    if index == BASIC_GET_OK:
        return GetOk(channel, *fields, header, body)
    return Return(channel, *fields, header, body)


_CONTENT_DECODERS = {
    BASIC_DELIVER: wire.decode_deliver,
    BASIC_GET_OK: wire.decode_get_ok,
    BASIC_RETURN: wire.decode_return,
    BASIC_PUBLISH: wire.decode_publish,
}
_CLIENT_CONTENT = frozenset({BASIC_DELIVER, BASIC_GET_OK, BASIC_RETURN})


class Connection:
    """One AMQP connection's protocol state, either role; no I/O.

    Client role::

        conn = Connection(CLIENT, username="guest", password="guest", vhost="/")
        conn.initiate()                 # queues the protocol header
        sock.sendall(conn.data_to_send())
        for event in conn.receive_data(sock.recv(65536)): ...   # until ConnectionOpened

    Server role::

        conn = Connection(SERVER, server_properties={...}, mechanisms="PLAIN")
        events = conn.receive_data(data)  # StartOkReceived → accept_login(...)
                                          # OpenRequested → accept_open()
    """

    def __init__(
        self,
        role: str,
        *,
        username: str = "guest",
        password: str = "guest",
        vhost: str = "/",
        client_properties: dict[str, Any] | None = None,
        server_properties: dict[str, Any] | None = None,
        mechanisms: str = "PLAIN AMQPLAIN",
        locale: str = "en_US",
        frame_max: int = DEFAULT_FRAME_MAX,
        channel_max: int = DEFAULT_CHANNEL_MAX,
        heartbeat: int | None = None,
        max_body_size: int = MAX_BODY_SIZE,
    ) -> None:
        if role not in (CLIENT, SERVER):
            raise ValueError(f"role must be {CLIENT!r} or {SERVER!r}, not {role!r}")
        if frame_max and frame_max < FRAME_MIN_SIZE:
            raise ValueError(f"frame_max must be 0 or at least {FRAME_MIN_SIZE}, got {frame_max}")
        if not 0 <= channel_max <= 65535:
            raise ValueError(f"channel_max must be 0..65535, got {channel_max}")
        if heartbeat is not None and not 0 <= heartbeat <= 65535:
            raise ValueError(f"heartbeat must be 0..65535 seconds, got {heartbeat}")
        self.role = role
        self.client = role == CLIENT
        self.state = NEW if self.client else AWAITING_HEADER
        self.username = username
        self.password = password
        self.vhost = vhost
        self.client_properties = dict(client_properties or {})
        self.server_properties = dict(server_properties or {})
        self.mechanisms = mechanisms
        self.locale = locale
        # What we offer (server) or ask for (client); replaced by the tuned values.
        self.frame_max = frame_max or DEFAULT_FRAME_MAX
        self.channel_max = channel_max or 65535
        self.heartbeat = heartbeat if heartbeat is not None else 60
        self._wanted_heartbeat = heartbeat
        self.max_body_size = max_body_size
        self.reader = FrameReader(self.frame_max)  # holds frame_max for incoming frames
        self._buf = b""
        self._header_buf = b""
        # Content messages the last receive_data() call took on its fast path (a
        # whole method, header and body at once): the caller may size its reads by it.
        self.contents_parsed = 0
        self._channels: dict[int, _Channel] = {}
        self._out: list[bytes] = []
        self._deferred: list[bytes] = []
        self._events: list[Event] = []
        self._next_channel = 1
        # Server role: called with the number before a channel.open is accepted; it
        # may raise a ConnectionError_ to refuse it (a broker's per-user max-channels).
        self.channel_guard: Callable[[int], None] | None = None

    # --- output -----------------------------------------------------------------

    def data_to_send(self) -> bytes:
        """Everything queued since the last call, as one byte string."""
        out = self._out
        if not out:
            return b""
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        return data

    @property
    def output(self) -> list[bytes]:
        """The queue data_to_send() drains. A caller that writes frames of its own
        (a broker's deliveries) may append whole frames here, so that they and
        the core's frames leave in one order."""
        return self._out

    @property
    def has_data_to_send(self) -> bool:
        return bool(self._out)

    def _method(self, channel: int, method: Any) -> None:
        self._out.append(wire.encode_method(method, channel))

    def _reply(self, channel: int, method: Any) -> None:
        """An answer the core gives by itself (close-ok, open-ok): queued once the
        caller has taken the event it answers, so the caller's replies to earlier
        events go out first."""
        self._deferred.append(wire.encode_method(method, channel))

    def _release_replies(self) -> None:
        self._out += self._deferred
        self._deferred.clear()

    # --- state queries ------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self.state == OPEN

    def channel_is_open(self, number: int) -> bool:
        ch = self._channels.get(number)
        return ch is not None and ch.state == CH_OPEN

    def channel_state(self, number: int) -> str:
        ch = self._channels.get(number)
        if ch is None:
            return "closed"
        return {CH_OPENING: "opening", CH_OPEN: "open", CH_CLOSING: "closing"}[ch.state]

    @property
    def open_channels(self) -> list[int]:
        return [n for n, ch in self._channels.items() if ch.state == CH_OPEN]

    # --- moving an open connection to another process -------------------------------

    def export_state(self) -> dict[str, Any]:
        """Server role, an open connection between frames: what another process's core
        needs to continue it without a handshake (`import_state`). The unparsed input
        (`pending`) is the caller's to carry. Raises ValueError for a state that
        cannot move: not open, a channel opening or closing, content half assembled."""
        if self.client or self.state != OPEN:
            raise ValueError(f"only an open server connection moves, not one in {self.state!r}")
        channels = []
        for number, ch in self._channels.items():
            if ch.state != CH_OPEN or ch.content is not None:
                raise ValueError(f"channel {number} is between states")
            channels.append(number)
        return {
            "frame_max": self.frame_max,
            "channel_max": self.channel_max,
            "heartbeat": self.heartbeat,
            "username": self.username,
            "vhost": self.vhost,
            "client_properties": self.client_properties,
            "channels": channels,
        }

    def import_state(self, state: dict[str, Any]) -> None:
        """Server role, a new core: become the open connection `state` describes
        (from `export_state` in another process)."""
        if self.client or self.state != AWAITING_HEADER:
            raise ValueError("only a new server connection takes a state")
        self.frame_max = state["frame_max"]
        self.channel_max = state["channel_max"]
        self.heartbeat = state["heartbeat"]
        self.reader.frame_max = self.frame_max
        self.username = state["username"]
        self.vhost = state["vhost"]
        self.client_properties = dict(state["client_properties"])
        for number in state["channels"]:
            self._channels[number] = _Channel(number, CH_OPEN)
        self.state = OPEN

    # --- handshake (handshake.py) --------------------------------------------------------

    def initiate(self) -> None:
        """Client role: queue the protocol header; the server answers with connection.start."""
        handshake.initiate(self)

    def accept_login(self) -> None:
        """Server role: the credentials of StartOkReceived are good; queue connection.tune."""
        handshake.accept_login(self)

    def refuse_login(self) -> None:
        """Server role: the credentials of StartOkReceived are refused. Everything
        the client sends from now on is ignored, as a broker that makes a failed
        login wait ignores it; close() then sends the 403 (to a client that asked
        for one), or the caller just drops the connection."""
        handshake.refuse_login(self)

    def accept_open(self) -> None:
        """Server role: the vhost of OpenRequested is fine; queue open-ok."""
        handshake.accept_open(self)

    # --- input --------------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray | memoryview) -> Iterator[Event]:
        """Feed bytes from the peer; iterate the result for the events they complete.

        Take the events in order, and act on each before taking the next: the
        replies the core queues itself (open-ok, close-ok) are queued as their
        event is taken, so they keep their place among your own replies. Iterate
        to the end before feeding more bytes.

        Frames are cut out of one buffer in place. A content method whose
        header and single body frame are already in the buffer (almost every
        delivery or publish) becomes its event in one step, and confirms and
        acks are decoded inline; everything else goes frame by frame.
        """
        if self.state == CLOSED:
            return iter(())
        if type(data) is not bytes:  # the parser indexes bytes (typed so when compiled)
            data = bytes(data)
        self._buf = self._buf + data if self._buf else data
        return self._parse()

    @property
    def pending(self) -> bytes:
        """Received bytes not parsed yet: the start of a frame whose rest has not come."""
        return self._buf

    def receive_after_pending(self, data: bytes | bytearray | memoryview) -> Iterator[Event]:
        """Like receive_data(), for a caller that put `pending` in front of its new
        bytes itself (it reads into one buffer behind them): `data` replaces it."""
        self._buf = b""
        return self.receive_data(data)

    def _parse(self) -> Iterator[Event]:
        # Compiled (leveret._build), the annotated locals are C integers: the loop's
        # arithmetic and comparisons cost no Python objects.
        buf: bytes
        n: cython.Py_ssize_t
        pos: cython.Py_ssize_t
        end: cython.Py_ssize_t
        size: cython.Py_ssize_t
        done: cython.Py_ssize_t
        frame_max: cython.Py_ssize_t
        contents: cython.Py_ssize_t
        frame_type: cython.int
        number: cython.int
        index: cython.Py_ssize_t
        fast_content: cython.Py_ssize_t
        ch: _Channel | None  # compiled: C fields (connection.pxd)
        events = self._events
        events.clear()
        buf = self._buf
        if self.state == AWAITING_HEADER:
            self._buf = b""
            buf = handshake.check_protocol_header(self, buf)
            if events:
                yield from events
                events.clear()
            if not buf or self.state == CLOSED:
                return
            self._buf = buf
        n = len(buf)
        pos = 0
        if not cython.compiled:  # (compiled, fields are read in place: _be16, _be32)
            head = _FRAME_HEAD.unpack_from
            u32 = _U32.unpack_from
        channels = self._channels
        fast_content = _C_BASIC_DELIVER if self.client else _C_BASIC_PUBLISH
        frame_max = self.reader.frame_max
        contents = 0
        try:
            while n - pos >= 8:
                if cython.compiled:  # head's three fields, read in place
                    frame_type = buf[pos]
                    number = _be16(buf, pos + 1)
                    size = _be32(buf, pos + 3)
                else:
                    frame_type, number, size = head(buf, pos)
                end = pos + 7 + size
                if size + 8 > frame_max:
                    raise FrameError(
                        FRAME_ERROR,
                        f"frame of {size + 8} bytes on channel {number} "
                        f"exceeds the negotiated frame_max of {frame_max}",
                    )
                if end >= n:
                    break
                if buf[end] != _C_FRAME_END:
                    raise FrameError(
                        FRAME_ERROR,
                        f"bad frame end octet 0x{buf[end]:02x} (expected 0xce) on channel {number}",
                    )
                if frame_type == _C_FRAME_METHOD and number and size >= 4:
                    ch = channels.get(number)
                    if ch is not None and ch.state == CH_OPEN and ch.content is None:
                        index = _be32(buf, pos + 7) if cython.compiled else u32(buf, pos + 7)[0]
                        if index == fast_content:
                            done = pos
                            if index == _C_BASIC_DELIVER:
                                done = self._deliveries(buf, pos, n)
                            if done == pos:
                                done = self._whole_content(
                                    buf, pos, end, n, number, index, frame_max
                                )
                                if done < 0:
                                    break  # wait for the rest of the message
                            if done:
                                pos = done
                                contents += 1
                                yield from events
                                events.clear()
                                continue
                        elif index == _C_BASIC_ACK and size >= 13 and self.state == OPEN:
                            # (A shorter ack takes the general path, which reports it.)
                            tag, bits = _ACK_ARGS.unpack_from(buf, pos + 11)
                            pos = end + 1
                            yield Ack(number, tag, bits & 1 == 1)
                            continue
                payload = buf[pos + 7 : end]
                pos = end + 1
                self._frame(frame_type, number, payload)
                if events:
                    yield from events
                    events.clear()
                if self._deferred:
                    self._release_replies()
                if self.state == CLOSED:
                    break
        except AMQPError as exc:
            lifecycle.protocol_error(self, exc)
            yield from events
            events.clear()
        finally:
            self.contents_parsed = contents
            self._buf = buf[pos:] if pos < n else b""
            if self._deferred:
                self._release_replies()

    def _deliveries(self, buf: bytes, pos: cython.Py_ssize_t, n: cython.Py_ssize_t) -> int:
        """Client role: a run of consecutive whole deliveries (method, header, one
        body frame each) from `pos`, in one tight loop; returns the position after
        the last one taken (`pos` itself if the first is not such a delivery)."""
        end: cython.Py_ssize_t
        hpos: cython.Py_ssize_t
        hend: cython.Py_ssize_t
        bpos: cython.Py_ssize_t
        bend: cython.Py_ssize_t
        after: cython.Py_ssize_t
        p: cython.Py_ssize_t
        q: cython.Py_ssize_t
        r: cython.Py_ssize_t
        msize: cython.Py_ssize_t
        hsize: cython.Py_ssize_t
        bsize: cython.Py_ssize_t
        body_size: cython.ulonglong  # a peer may send any 64-bit size
        frame_max: cython.Py_ssize_t
        max_body: cython.Py_ssize_t
        mtype: cython.int
        htype: cython.int
        btype: cython.int
        number: cython.int
        hnum: cython.int
        bnum: cython.int
        class_id: cython.int
        index: cython.Py_ssize_t
        k2: cython.Py_ssize_t
        redelivered: cython.int
        delivery_tag: cython.ulonglong
        ch: _Channel | None  # compiled: C fields (connection.pxd)
        append = self._events.append
        method_head = _METHOD_HEAD.unpack_from
        header_head = _HEADER_FRAME.unpack_from
        frame_head = _FRAME_HEAD.unpack_from
        middle = _DELIVER_MIDDLE.unpack_from
        frame_max = self.reader.frame_max
        max_body = self.max_body_size
        channels = self._channels
        if self.state != OPEN:
            return pos
        while n - pos >= 11:
            if cython.compiled:  # _METHOD_HEAD's fields, read in place
                mtype = buf[pos]
                number = _be16(buf, pos + 1)
                msize = _be32(buf, pos + 3)
                index = _be32(buf, pos + 7)
            else:
                mtype, number, msize, index = method_head(buf, pos)
            end = pos + 7 + msize
            if (
                mtype != _C_FRAME_METHOD
                or index != _C_BASIC_DELIVER
                or msize + 8 > frame_max
                or end >= n
                or buf[end] != _C_FRAME_END
            ):
                break
            ch = channels.get(number)
            if ch is None or ch.state != CH_OPEN or ch.content is not None:
                break
            hpos = end + 1
            if n - hpos < 20:
                break
            if cython.compiled:
                htype = buf[hpos]
                hnum = _be16(buf, hpos + 1)
                hsize = _be32(buf, hpos + 3)
                class_id = _be16(buf, hpos + 7)
                body_size = _be64(buf, hpos + 11)
            else:
                htype, hnum, hsize, class_id, _weight, body_size = header_head(buf, hpos)
            hend = hpos + 7 + hsize
            if (
                htype != _C_FRAME_HEADER
                or hnum != number
                or hsize < 14
                or class_id != _C_CLASS_BASIC
                or hsize + 8 > frame_max
                or body_size > max_body
                or hend >= n
                or buf[hend] != _C_FRAME_END
            ):
                break
            if body_size:
                bpos = hend + 1
                if n - bpos < 7:
                    break
                if cython.compiled:
                    btype = buf[bpos]
                    bnum = _be16(buf, bpos + 1)
                    bsize = _be32(buf, bpos + 3)
                else:
                    btype, bnum, bsize = frame_head(buf, bpos)
                bend = bpos + 7 + bsize
                if (
                    btype != _C_FRAME_BODY
                    or bnum != number
                    or bsize != body_size
                    or bsize + 8 > frame_max
                    or bend >= n
                    or buf[bend] != _C_FRAME_END
                ):
                    break
                body = _cut(buf, bpos + 7, bend)
                after = bend + 1
            else:
                body = b""
                after = hend + 1
            p = pos + 11
            k = buf[p]
            q = p + 1 + k
            if q + 11 > end:
                break
            if cython.compiled:
                delivery_tag = _be64(buf, q)
                redelivered = buf[q + 8]
                k2 = buf[q + 9]
            else:
                delivery_tag, redelivered, k2 = middle(buf, q)
            r = q + 10 + k2
            if r >= end or r + 1 + buf[r] != end:
                break
            try:
                append(
                    Deliver(
                        number,
                        buf[p + 1 : q].decode(),
                        delivery_tag,
                        redelivered == 1,
                        buf[q + 10 : r].decode(),
                        buf[r + 1 : end].decode(),
                        _cut(buf, hpos + 7, hend),
                        body,
                    )
                )
            except UnicodeDecodeError:
                break
            pos = after
        return pos

    def _whole_content(
        self,
        buf: bytes,
        pos: cython.Py_ssize_t,
        end: cython.Py_ssize_t,
        n: cython.Py_ssize_t,
        number: cython.int,
        index: cython.Py_ssize_t,
        frame_max: cython.Py_ssize_t,
    ) -> int:
        """The fast path for a content method at `pos`: if its header and one body
        frame follow in the buffer, emit the event and return the position after
        them; -1 if they are not all here yet; 0 to take the frame-by-frame path
        (several body frames, or anything unusual, which that path reports).

        `frame_max` is the reader's, passed in by the read's loop, which already has
        it: reading it here was a lookup by name for every message."""
        hpos: cython.Py_ssize_t
        hend: cython.Py_ssize_t
        bpos: cython.Py_ssize_t
        bend: cython.Py_ssize_t
        after: cython.Py_ssize_t
        p: cython.Py_ssize_t
        q: cython.Py_ssize_t
        r: cython.Py_ssize_t
        k: cython.Py_ssize_t
        k3: cython.Py_ssize_t
        hsize: cython.Py_ssize_t
        bsize: cython.Py_ssize_t
        body_size: cython.ulonglong  # a peer may send any 64-bit size
        htype: cython.int
        btype: cython.int
        hnum: cython.int
        bnum: cython.int
        class_id: cython.int
        bits: cython.int
        hpos = end + 1
        if n - hpos < 20:
            # Too short for a header frame (head, class, weight, size, flags, end).
            if n - hpos < 7:
                return -1
            htype, hnum, hsize = _FRAME_HEAD.unpack_from(buf, hpos)
            return -1 if htype == _C_FRAME_HEADER and hnum == number and hsize >= 14 else 0
        if cython.compiled:  # _HEADER_FRAME's fields (not the weight), read in place
            htype = buf[hpos]
            hnum = _be16(buf, hpos + 1)
            hsize = _be32(buf, hpos + 3)
            class_id = _be16(buf, hpos + 7)
            body_size = _be64(buf, hpos + 11)
        else:
            htype, hnum, hsize, class_id, _weight, body_size = _HEADER_FRAME.unpack_from(buf, hpos)
        hend = hpos + 7 + hsize
        if (
            htype != _C_FRAME_HEADER
            or hnum != number
            or hsize < 14
            or class_id != _C_CLASS_BASIC
            or hsize + 8 > frame_max
            or body_size > self.max_body_size
            or self.state != OPEN
        ):
            return 0
        if hend >= n:
            return -1
        if buf[hend] != _C_FRAME_END:
            return 0
        if body_size:
            bpos = hend + 1
            if n - bpos < 7:
                return -1
            if cython.compiled:
                btype = buf[bpos]
                bnum = _be16(buf, bpos + 1)
                bsize = _be32(buf, bpos + 3)
            else:
                btype, bnum, bsize = _FRAME_HEAD.unpack_from(buf, bpos)
            bend = bpos + 7 + bsize
            if (
                btype != _C_FRAME_BODY
                or bnum != number
                or bsize != body_size
                or bsize + 8 > frame_max
            ):
                return 0
            if bend >= n:
                return -1
            if buf[bend] != _C_FRAME_END:
                return 0
            body = _cut(buf, bpos + 7, bend)
            after = bend + 1
        else:
            body = b""
            after = hend + 1
        if index == _C_BASIC_DELIVER:
            # Inline basic.deliver: consumer tag, delivery tag, redelivered, exchange, key.
            p = pos + 11
            k = buf[p]
            q = p + 1 + k
            if q + 11 > end:
                return 0
            delivery_tag, redelivered, k2 = _DELIVER_MIDDLE.unpack_from(buf, q)
            r = q + 10 + k2
            if r >= end:
                return 0
            k3 = buf[r]
            if r + 1 + k3 != end:
                return 0  # the frame-by-frame path reports a malformed frame
            try:
                self._events.append(
                    Deliver(
                        number,
                        buf[p + 1 : q].decode(),
                        delivery_tag,
                        redelivered == 1,
                        buf[q + 10 : r].decode(),
                        buf[r + 1 : end].decode(),
                        _cut(buf, hpos + 7, hend),
                        body,
                    )
                )
            except UnicodeDecodeError:
                return 0
        else:
            # Inline basic.publish (methods.decode_publish, without the call): reserved
            # short, exchange, routing key, bits.
            p = pos + 13
            q = p + 1 + buf[p]
            if q >= end:
                return 0
            r = q + 1 + buf[q]
            if r >= end:
                return 0  # the frame-by-frame path reports a malformed frame
            bits = buf[r]
            try:
                self._events.append(
                    Publish(
                        number,
                        buf[p + 1 : q].decode(),
                        buf[q + 1 : r].decode(),
                        bits & 1 == 1,
                        bits & 2 == 2,
                        _cut(buf, p, r),
                        _cut(buf, hpos + 7, hend),
                        body,
                    )
                )
            except UnicodeDecodeError:
                return 0
        return after

    def _frame(self, frame_type: int, number: int, payload: bytes) -> None:
        """One frame, the general way."""
        if frame_type not in KNOWN_FRAME_TYPES:
            raise FrameError(FRAME_ERROR, f"unknown frame type {frame_type}")
        if number:
            ch = self._channels.get(number)
            if ch is not None and ch.state == CH_OPEN and self.state == OPEN:
                try:
                    if frame_type == FRAME_METHOD:
                        self._channel_method(ch, payload)
                    elif frame_type == FRAME_BODY:
                        self._body(ch, payload)
                    elif frame_type == FRAME_HEADER:
                        self._header(ch, payload)
                    else:
                        raise ConnectionError_(
                            UNEXPECTED_FRAME,
                            f"heartbeat frame on channel {number}; must be 0",
                        )
                except ChannelError as exc:
                    if exc.is_connection_error:
                        raise
                    self.close_channel_with_error(number, exc)
                    self._events.append(ChannelProtocolError(number, exc))
            else:
                lifecycle.frame_for_other_channel(self, frame_type, number, payload, ch)
        elif frame_type == FRAME_METHOD:
            lifecycle.connection_method(self, payload)
        elif frame_type != FRAME_HEARTBEAT:
            raise ConnectionError_(
                UNEXPECTED_FRAME, f"content frame (type {frame_type}) on channel 0"
            )

    def _channel_method(self, ch: _Channel, payload: bytes) -> None:
        index = wire.method_index(payload)
        if ch.content is not None:
            waiting = ch.content[0]  # RabbitMQ names the content method (basic.publish)
            raise ConnectionError_(
                UNEXPECTED_FRAME,
                f"expected content header for class 60, got method "
                f"{wire.method_name(index)} on channel {ch.number} instead",
                waiting >> 16,
                waiting & 0xFFFF,
            )
        if self.client:
            if index == BASIC_DELIVER or index == BASIC_GET_OK or index == BASIC_RETURN:
                ch.content = (index, _CONTENT_DECODERS[index](payload))
                ch.header = None
                return
            if index == BASIC_ACK:
                self._events.append(Ack(ch.number, *wire.decode_ack(payload)))
                return
        else:
            if index == BASIC_PUBLISH:
                ch.content = (index, wire.decode_publish(payload))
                ch.header = None
                return
            if index == BASIC_ACK:
                self._events.append(Ack(ch.number, *wire.decode_ack(payload)))
                return
            if index in _CLIENT_CONTENT:
                raise ConnectionError_(
                    COMMAND_INVALID,
                    f"method {wire.method_name(index)} is not valid from a client on channel "
                    f"{ch.number}",
                    index >> 16,
                    index & 0xFFFF,
                )
        if index == BASIC_NACK:
            self._events.append(Nack(ch.number, *wire.decode_nack(payload)))
            return
        method = wire.decode_method(payload)
        if index == CHANNEL_CLOSE:
            lifecycle.channel_closed_by_peer(self, ch, method)
        elif index == CHANNEL_OPEN:
            raise ConnectionError_(
                CHANNEL_ERROR,
                "second 'channel.open' seen",
                20,
                10,  # RabbitMQ's text
            )
        else:
            self._events.append(MethodReceived(ch.number, method))

    def _header(self, ch: _Channel, payload: bytes) -> None:
        if ch.content is None or ch.header is not None:
            raise ConnectionError_(
                UNEXPECTED_FRAME,
                f"content header on channel {ch.number} without a preceding content method",
            )
        class_id, _weight, body_size, _flags, _mode = parse_header(payload)
        if class_id != CLASS_BASIC:
            raise ConnectionError_(
                UNEXPECTED_FRAME,
                f"content header for class {class_id} does not match method class 60",
            )
        if body_size > self.max_body_size:
            ch.content = None
            raise ChannelError(
                PRECONDITION_FAILED,
                f"message size {body_size} is larger than configured max size {self.max_body_size}",
                CLASS_BASIC,
                40,
            )
        if body_size == 0:
            index, fields = ch.content
            ch.content = None
            self._events.append(_content_event(ch.number, index, fields, payload, b""))
        else:
            ch.header = payload
            ch.body_left = body_size
            ch.parts = []

    def _body(self, ch: _Channel, payload: bytes) -> None:
        header = ch.header
        if header is None:
            raise ConnectionError_(
                UNEXPECTED_FRAME,
                f"content body frame on channel {ch.number} without a content header",
            )
        left = ch.body_left - len(payload)
        if left > 0:
            ch.body_left = left
            ch.parts.append(payload)
            return
        if left < 0:
            raise ConnectionError_(
                FRAME_ERROR, "content body frames exceed the body size in the content header"
            )
        parts = ch.parts
        if parts:
            parts.append(payload)
            payload = b"".join(parts)
            ch.parts = []
        index, fields = ch.content  # type: ignore[misc]
        ch.content = None
        ch.header = None
        self._events.append(_content_event(ch.number, index, fields, header, payload))

    # --- channels and closing (lifecycle.py) -----------------------------------------------

    def open_channel(self, number: int | None = None) -> int:
        """Client role: queue channel.open; ChannelOpened follows. Returns the number."""
        return lifecycle.open_channel(self, number)

    def _add_channel(self, number: int, state: int) -> None:
        """A new channel's record, for lifecycle.py. Made here: lifecycle.py cannot
        import this module (it imports lifecycle.py), and the compiled parser takes
        only this module's `_Channel`, a C type, out of `_channels`."""
        self._channels[number] = _Channel(number, state)

    def close_channel(
        self,
        number: int,
        code: int = REPLY_SUCCESS,
        text: str = "",
        class_id: int = 0,
        method_id: int = 0,
    ) -> None:
        """Queue channel.close; ChannelCloseOk follows. Frames until then are dropped."""
        lifecycle.close_channel(self, number, code, text, class_id, method_id)

    def close_channel_with_error(self, number: int, exc: AMQPError) -> None:
        lifecycle.close_channel(self, number, exc.code, exc.reply_text, exc.class_id, exc.method_id)

    def close(
        self, code: int = REPLY_SUCCESS, text: str = "", class_id: int = 0, method_id: int = 0
    ) -> None:
        """Queue connection.close; ConnectionCloseOk follows.

        Before the handshake finished there is nobody to wait for: the state is
        CLOSED at once and the caller should drop the connection after writing.
        """
        lifecycle.close(self, code, text, class_id, method_id)

    # --- sending on channels ------------------------------------------------------------------

    def _check_open(self, number: int) -> None:
        ch = self._channels.get(number)
        if ch is None or ch.state != CH_OPEN or self.state != OPEN:
            if self.state != OPEN:
                raise UsageError(f"connection is {self.state}")
            state = "closed" if ch is None else self.channel_state(number)
            raise UsageError(f"channel {number} is {state}")

    def send_method(self, channel: int, method: Any) -> None:
        """Queue a method (a pamqp object) on an open channel, or on channel 0."""
        if channel:
            self._check_open(channel)
        elif self.state in (CLOSING, CLOSED):
            raise UsageError(f"connection is {self.state}")
        self._method(channel, method)

    def send_publish(
        self,
        channel: int,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: bytes,
        mandatory: bool = False,
        immediate: bool = False,
    ) -> None:
        """Queue basic.publish with its content.

        `properties` is BasicProperties.encode() output (flags and list), or
        protocol.properties.EMPTY_PROPERTIES.
        """
        self._check_open(channel)
        out = self._out
        out.append(wire.encode_publish(channel, exchange, routing_key, mandatory, immediate))
        out.append(content_header_frame(channel, len(body), properties))
        if body:
            out += body_frames(channel, body, self.frame_max)

    def send_publish_frames(self, channel: int, frames: bytes) -> None:
        """Queue pre-encoded publish frames (method, header, body) as they are.

        For callers that encode a message once and send it many times (`leveret
        perf`, republishing after a reconnect); the channel must be open.
        """
        self._check_open(channel)
        self._out.append(frames)

    def send_content(self, channel: int, method: Any, header: bytes, body: bytes) -> None:
        """Queue a content method (a pamqp object or a whole encoded method frame),
        a content header (a header payload, as Deliver.header) and the body."""
        self._check_open(channel)
        out = self._out
        out.append(method if isinstance(method, bytes) else wire.encode_method(method, channel))
        out.append(header_frame(channel, header))
        if body:
            out += body_frames(channel, body, self.frame_max)

    def send_ack(self, channel: int, delivery_tag: int, multiple: bool = False) -> None:
        self._check_open(channel)
        self._out.append(wire.encode_ack(channel, delivery_tag, multiple))

    def send_nack(
        self, channel: int, delivery_tag: int, multiple: bool = False, requeue: bool = True
    ) -> None:
        self._check_open(channel)
        self._out.append(wire.encode_nack(channel, delivery_tag, multiple, requeue))

    def send_reject(self, channel: int, delivery_tag: int, requeue: bool = True) -> None:
        self._check_open(channel)
        self._out.append(wire.encode_reject(channel, delivery_tag, requeue))

    def send_heartbeat(self) -> None:
        if self.state not in (CLOSED, NEW, AWAITING_HEADER):
            self._out.append(HEARTBEAT_FRAME)
