"""Content headers: the 14 basic properties.

The broker forwards a content header as the bytes that arrived, so most
messages never have their properties decoded. `HeaderInfo` pulls out only the
few fields routing and storage need, by skipping over the others.
"""

from __future__ import annotations

import datetime
import struct
from typing import Any

from pamqp import commands
from pamqp import decode as pamqp_decode

from leveret.protocol.constants import SYNTAX_ERROR
from leveret.protocol.errors import FrameError

try:
    import cython
except ImportError:  # no Cython: the annotations below are never evaluated
    from leveret import _cython_shim as cython

_HEADER_HEAD = struct.Struct(">HHQH")  # class, weight, body size, property flags
_LONG = struct.Struct(">I")

FLAG_CONTENT_TYPE = 0x8000
FLAG_CONTENT_ENCODING = 0x4000
FLAG_HEADERS = 0x2000
FLAG_DELIVERY_MODE = 0x1000
FLAG_PRIORITY = 0x0800
FLAG_CORRELATION_ID = 0x0400
FLAG_REPLY_TO = 0x0200
FLAG_EXPIRATION = 0x0100
FLAG_MESSAGE_ID = 0x0080
FLAG_TIMESTAMP = 0x0040
FLAG_TYPE = 0x0020
FLAG_USER_ID = 0x0010
FLAG_APP_ID = 0x0008
FLAG_CLUSTER_ID = 0x0004
# The four publish_flags() tests, as C constants when compiled: against the
# module's Python ints above, each test boxed `flags` into a Python int (six
# allocations a publish).
_C_CONTENT_TYPE = cython.declare(cython.Py_ssize_t, FLAG_CONTENT_TYPE)
_C_CONTENT_ENCODING = cython.declare(cython.Py_ssize_t, FLAG_CONTENT_ENCODING)
_C_HEADERS = cython.declare(cython.Py_ssize_t, FLAG_HEADERS)
_C_DELIVERY_MODE = cython.declare(cython.Py_ssize_t, FLAG_DELIVERY_MODE)


def parse_header(payload: bytes) -> tuple[int, int, int, int, int]:
    """(class_id, weight, body_size, flags, delivery_mode) of a content header payload.

    delivery_mode is 0 when the property is absent.
    """
    try:
        class_id, weight, body_size, flags = _HEADER_HEAD.unpack_from(payload)
        delivery_mode = 0
        if flags & FLAG_DELIVERY_MODE:
            pos = 14
            if flags & FLAG_CONTENT_TYPE:
                pos += 1 + payload[pos]
            if flags & FLAG_CONTENT_ENCODING:
                pos += 1 + payload[pos]
            if flags & FLAG_HEADERS:
                pos += 4 + _LONG.unpack_from(payload, pos)[0]
            delivery_mode = payload[pos]
    except (struct.error, IndexError):
        raise FrameError(SYNTAX_ERROR, "malformed content header frame") from None
    return class_id, weight, body_size, flags, delivery_mode


def publish_flags(payload: bytes) -> cython.Py_ssize_t:
    """What basic.publish needs of a content header payload, as one integer: its
    property flags times 256 plus its delivery_mode (0 when absent). parse_header's
    two fields without a tuple, read byte by byte (compiled: C reads, a C call from
    the channel's publish path). Raises FrameError as parse_header does."""
    n: cython.Py_ssize_t = len(payload)
    pos: cython.Py_ssize_t
    flags: cython.Py_ssize_t
    mode: cython.Py_ssize_t = 0
    if n < 14:
        raise FrameError(SYNTAX_ERROR, "malformed content header frame")
    flags = payload[12] << 8 | payload[13]
    if flags & _C_DELIVERY_MODE:
        pos = 14
        if flags & _C_CONTENT_TYPE:  # a short string
            if pos >= n:
                raise FrameError(SYNTAX_ERROR, "malformed content header frame")
            pos += 1 + payload[pos]
        if flags & _C_CONTENT_ENCODING:  # a short string
            if pos >= n:
                raise FrameError(SYNTAX_ERROR, "malformed content header frame")
            pos += 1 + payload[pos]
        if flags & _C_HEADERS:
            if pos + 4 > n:
                raise FrameError(SYNTAX_ERROR, "malformed content header frame")
            pos += 4 + (
                payload[pos] << 24
                | payload[pos + 1] << 16
                | payload[pos + 2] << 8
                | payload[pos + 3]
            )
        if pos >= n:
            raise FrameError(SYNTAX_ERROR, "malformed content header frame")
        mode = payload[pos]
    return flags << 8 | mode


def decode_properties(payload: bytes) -> commands.Basic.Properties:
    """All basic properties of a content header payload (cold path)."""
    props = commands.Basic.Properties()
    try:
        flags = _HEADER_HEAD.unpack_from(payload)[3]
        props.unmarshal(flags, payload[14:])
    except (struct.error, ValueError, IndexError, TypeError, UnicodeDecodeError) as exc:
        raise FrameError(SYNTAX_ERROR, f"malformed content header properties: {exc}") from None
    return props


def encode_header(body_size: int, props: commands.Basic.Properties) -> bytes:
    """A content header payload (class 60) for these properties."""
    from pamqp.header import ContentHeader

    return ContentHeader(0, body_size, props).marshal()


# Property order and encoding, for walking a header without decoding it.
_PROPERTY_LAYOUT = (
    (FLAG_CONTENT_TYPE, "short"),
    (FLAG_CONTENT_ENCODING, "short"),
    (FLAG_HEADERS, "table"),
    (FLAG_DELIVERY_MODE, 1),
    (FLAG_PRIORITY, 1),
    (FLAG_CORRELATION_ID, "short"),
    (FLAG_REPLY_TO, "short"),
    (FLAG_EXPIRATION, "short"),
    (FLAG_MESSAGE_ID, "short"),
    (FLAG_TIMESTAMP, 8),
    (FLAG_TYPE, "short"),
    (FLAG_USER_ID, "short"),
    (FLAG_APP_ID, "short"),
    (FLAG_CLUSTER_ID, "short"),
)

REMOVE = object()


def split_properties(payload: bytes) -> dict[int, bytes]:
    """flag → raw encoded property value, for every property present."""
    flags = _HEADER_HEAD.unpack_from(payload)[3]
    pos = 14
    out: dict[int, bytes] = {}
    for flag, kind in _PROPERTY_LAYOUT:
        if not flags & flag:
            continue
        if kind == "short":
            end = pos + 1 + payload[pos]
        elif kind == "table":
            end = pos + 4 + _LONG.unpack_from(payload, pos)[0]
        else:
            end = pos + kind  # type: ignore[operator]
        out[flag] = bytes(payload[pos:end])
        pos = end
    return out


def rewrite_header(payload: bytes, changes: dict[int, Any]) -> bytes:
    """The header with some properties replaced (raw encoded bytes) or REMOVEd.

    Every other property keeps the exact bytes it arrived with.
    """
    body_size = _HEADER_HEAD.unpack_from(payload)[2]
    current = split_properties(payload)
    for flag, value in changes.items():
        if value is REMOVE:
            current.pop(flag, None)
        else:
            current[flag] = value
    flags = 0
    parts = []
    for flag, _kind in _PROPERTY_LAYOUT:
        if flag in current:
            flags |= flag
            parts.append(current[flag])
    return _HEADER_HEAD.pack(60, 0, body_size, flags) + b"".join(parts)


def short_string(value: str) -> bytes:
    raw = value.encode()
    if len(raw) > 255:
        raise ValueError("short string longer than 255 bytes")
    return bytes((len(raw),)) + raw


def headers_table(payload: bytes, flags: int) -> dict[str, Any] | None:
    """Just the `headers` table, for headers-exchange routing."""
    if not flags & FLAG_HEADERS:
        return None
    pos = 14
    if flags & FLAG_CONTENT_TYPE:
        pos += 1 + payload[pos]
    if flags & FLAG_CONTENT_ENCODING:
        pos += 1 + payload[pos]
    try:
        return pamqp_decode.field_table(payload[pos:])[1]
    except (struct.error, ValueError, IndexError, TypeError, UnicodeDecodeError) as exc:
        raise FrameError(SYNTAX_ERROR, f"malformed headers table: {exc}") from None


# --- typed properties, hand-coded (client hot path) ---------------------------

_CONTENT_HEADER_FRAME = struct.Struct(">BHIHHQ")  # type, channel, size, class, weight, body
_TIMESTAMP = struct.Struct(">Q")
# a headers table holding only x-stream-offset (a long), as stream deliveries of
# messages without headers carry it: size 25, key, type 'l', then the 8-byte value
_OFFSET_ONLY_TABLE = b"\x00\x00\x00\x19\x0fx-stream-offsetl"
_OFFSET = struct.Struct(">q")
_SHORT_FIELDS = {
    "content_type": FLAG_CONTENT_TYPE,
    "content_encoding": FLAG_CONTENT_ENCODING,
    "correlation_id": FLAG_CORRELATION_ID,
    "reply_to": FLAG_REPLY_TO,
    "expiration": FLAG_EXPIRATION,
    "message_id": FLAG_MESSAGE_ID,
    "type": FLAG_TYPE,
    "user_id": FLAG_USER_ID,
    "app_id": FLAG_APP_ID,
    "cluster_id": FLAG_CLUSTER_ID,
}
_PROPERTY_NAMES = (
    "content_type",
    "content_encoding",
    "headers",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)


def _short(value: str, name: str) -> bytes:
    raw = value.encode()
    if len(raw) > 255:
        raise ValueError(f"property {name} is longer than 255 bytes of UTF-8")
    return bytes((len(raw),)) + raw


class BasicProperties:
    """The 14 basic properties of a message, None meaning absent.

    `timestamp` is a timezone-aware datetime (an int or naive datetime is taken
    as seconds / UTC when encoding). Encoding and decoding are written by hand
    rather than through pamqp: a publish with a few properties set costs one
    pass over the set fields.
    """

    __slots__ = _PROPERTY_NAMES

    def __init__(
        self,
        content_type: str | None = None,
        content_encoding: str | None = None,
        headers: dict[str, Any] | None = None,
        delivery_mode: int | None = None,
        priority: int | None = None,
        correlation_id: str | None = None,
        reply_to: str | None = None,
        expiration: str | None = None,
        message_id: str | None = None,
        timestamp: Any = None,
        type: str | None = None,  # noqa: A002 - the spec's name
        user_id: str | None = None,
        app_id: str | None = None,
        cluster_id: str | None = None,
    ) -> None:
        self.content_type = content_type
        self.content_encoding = content_encoding
        self.headers = headers
        self.delivery_mode = delivery_mode
        self.priority = priority
        self.correlation_id = correlation_id
        self.reply_to = reply_to
        self.expiration = expiration
        self.message_id = message_id
        self.timestamp = timestamp
        self.type = type
        self.user_id = user_id
        self.app_id = app_id
        self.cluster_id = cluster_id

    def __repr__(self) -> str:
        set_ = ", ".join(
            f"{name}={getattr(self, name)!r}"
            for name in _PROPERTY_NAMES
            if getattr(self, name) is not None
        )
        return f"BasicProperties({set_})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BasicProperties):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in _PROPERTY_NAMES)

    def as_dict(self) -> dict[str, Any]:
        """The properties that are set."""
        return {n: getattr(self, n) for n in _PROPERTY_NAMES if getattr(self, n) is not None}

    def encode(self) -> bytes:
        """Property flags and property list, as they follow the body size in a header."""
        flags = 0
        parts: list[bytes] = []
        if self.content_type is not None:
            flags |= FLAG_CONTENT_TYPE
            parts.append(_short(self.content_type, "content_type"))
        if self.content_encoding is not None:
            flags |= FLAG_CONTENT_ENCODING
            parts.append(_short(self.content_encoding, "content_encoding"))
        if self.headers is not None:
            from pamqp import encode as pamqp_encode

            flags |= FLAG_HEADERS
            try:
                parts.append(pamqp_encode.field_table(self.headers))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"cannot encode headers {self.headers!r}: {exc}") from None
        if self.delivery_mode is not None:
            flags |= FLAG_DELIVERY_MODE
            parts.append(_octet(self.delivery_mode, "delivery_mode"))
        if self.priority is not None:
            flags |= FLAG_PRIORITY
            parts.append(_octet(self.priority, "priority"))
        for name in ("correlation_id", "reply_to", "expiration", "message_id"):
            value = getattr(self, name)
            if value is not None:
                flags |= _SHORT_FIELDS[name]
                parts.append(_short(value, name))
        if self.timestamp is not None:
            flags |= FLAG_TIMESTAMP
            parts.append(_TIMESTAMP.pack(_seconds(self.timestamp)))
        for name in ("type", "user_id", "app_id", "cluster_id"):
            value = getattr(self, name)
            if value is not None:
                flags |= _SHORT_FIELDS[name]
                parts.append(_short(value, name))
        return flags.to_bytes(2, "big") + b"".join(parts)

    @classmethod
    def decode(cls, payload: bytes) -> BasicProperties:
        """The properties of a content header payload (class, weight, size, flags, list)."""
        props = cls()
        try:
            flags = _HEADER_HEAD.unpack_from(payload)[3]
            if not flags:
                return props
            pos = 14
            for name, flag in (
                ("content_type", FLAG_CONTENT_TYPE),
                ("content_encoding", FLAG_CONTENT_ENCODING),
            ):
                if flags & flag:
                    n = payload[pos]
                    setattr(props, name, payload[pos + 1 : pos + 1 + n].decode())
                    pos += 1 + n
            if flags & FLAG_HEADERS:
                if payload[pos : pos + 21] == _OFFSET_ONLY_TABLE:
                    # a stream delivery of a message without headers of its own:
                    # {x-stream-offset: long}, without the generic table decoder
                    props.headers = {"x-stream-offset": _OFFSET.unpack_from(payload, pos + 21)[0]}
                    pos += 29
                else:
                    size, props.headers = pamqp_decode.field_table(payload[pos:])
                    pos += size
            if flags & FLAG_DELIVERY_MODE:
                props.delivery_mode = payload[pos]
                pos += 1
            if flags & FLAG_PRIORITY:
                props.priority = payload[pos]
                pos += 1
            for name in ("correlation_id", "reply_to", "expiration", "message_id"):
                if flags & _SHORT_FIELDS[name]:
                    n = payload[pos]
                    setattr(props, name, payload[pos + 1 : pos + 1 + n].decode())
                    pos += 1 + n
            if flags & FLAG_TIMESTAMP:
                seconds = _TIMESTAMP.unpack_from(payload, pos)[0]
                props.timestamp = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
                pos += 8
            for name in ("type", "user_id", "app_id", "cluster_id"):
                if flags & _SHORT_FIELDS[name]:
                    n = payload[pos]
                    setattr(props, name, payload[pos + 1 : pos + 1 + n].decode())
                    pos += 1 + n
        except (struct.error, ValueError, IndexError, TypeError, UnicodeDecodeError) as exc:
            raise FrameError(SYNTAX_ERROR, f"malformed content header properties: {exc}") from None
        return props


def stream_offset(payload: bytes) -> int | None:
    """The `x-stream-offset` header of a content header payload (a stream delivery's
    offset), or None; reads only the headers table, and that without decoding it
    when it holds nothing else (the usual stream delivery)."""
    try:
        flags = _HEADER_HEAD.unpack_from(payload)[3]
        if not flags & FLAG_HEADERS:
            return None
        pos = 14
        if flags & FLAG_CONTENT_TYPE:
            pos += 1 + payload[pos]
        if flags & FLAG_CONTENT_ENCODING:
            pos += 1 + payload[pos]
        if payload[pos : pos + 21] == _OFFSET_ONLY_TABLE:
            return _OFFSET.unpack_from(payload, pos + 21)[0]
    except (struct.error, IndexError):
        raise FrameError(SYNTAX_ERROR, "malformed content header properties") from None
    value = (BasicProperties.decode(payload).headers or {}).get("x-stream-offset")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _octet(value: int, name: str) -> bytes:
    if not 0 <= value <= 255:
        raise ValueError(f"property {name} must be 0..255, got {value}")
    return bytes((value,))


def _seconds(value: Any) -> int:
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        return int(value.timestamp())
    if isinstance(value, int | float):
        return int(value)
    raise ValueError(f"property timestamp must be a datetime or seconds, got {value!r}")


EMPTY_PROPERTIES = b"\x00\x00"


def content_header_frame(channel: int, body_size: int, encoded_properties: bytes) -> bytes:
    """A whole content header frame (class 60) from BasicProperties.encode() output."""
    return (
        _CONTENT_HEADER_FRAME.pack(2, channel, 12 + len(encoded_properties), 60, 0, body_size)
        + encoded_properties
        + b"\xce"
    )
