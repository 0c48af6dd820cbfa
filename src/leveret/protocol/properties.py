"""Content headers: the 14 basic properties.

The broker forwards a content header as the bytes that arrived, so most
messages never have their properties decoded. `HeaderInfo` pulls out only the
few fields routing and storage need, by skipping over the others.
"""

from __future__ import annotations

import struct
from typing import Any

from pamqp import commands
from pamqp import decode as pamqp_decode

from leveret.protocol.constants import SYNTAX_ERROR
from leveret.protocol.errors import FrameError

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
