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
