"""Lossless field-table editing.

When the broker must change a message's headers (x-death, BCC) it must not
change anything else: decoding a table to Python values and encoding it again
loses the wire types (a 64-bit int becomes an 8-bit one, a double a float,
binary strings fail). So tables are split into key → raw typed value, edited,
and joined again; only the values the broker writes are encoded here.
"""

from __future__ import annotations

import datetime
import decimal
import struct
import time
from typing import Any

from pamqp import decode as pamqp_decode
from pamqp import encode as pamqp_encode

_LONG = struct.Struct(">I")
_FIXED_SIZES = {
    b"t"[0]: 1,
    b"b"[0]: 1,
    b"B"[0]: 1,
    b"s"[0]: 2,
    b"u"[0]: 2,
    b"I"[0]: 4,
    b"i"[0]: 4,
    b"f"[0]: 4,
    b"l"[0]: 8,
    b"L"[0]: 8,
    b"d"[0]: 8,
    b"T"[0]: 8,
    b"D"[0]: 5,
    b"V"[0]: 0,
}
_PREFIXED = frozenset(b"SxAF")


class Long(int):
    """An int to be written as AMQP 'l' (signed 64-bit), as RabbitMQ writes counts."""

    amqp_type = "long"


# --- numbers that remember their wire type --------------------------------------------
#
# RabbitMQ's texts name the field type a client sent ("received none but current is
# the value '5' of type 'byte'": pamqp and aio-pika send small ints as 'b', pika as
# 'I'). pamqp decodes every integer type to a plain int, so decoding is taught to
# return these int (and float) subclasses instead; they behave as ints everywhere.


class Byte(int):
    amqp_type = "byte"


class UnsignedByte(int):
    amqp_type = "unsignedbyte"


class Short(int):
    """An int to be written as AMQP 's' (signed 16-bit), as RabbitMQ writes some counts."""

    amqp_type = "short"


class UnsignedShort(int):
    amqp_type = "unsignedshort"


class SignedInt(int):
    amqp_type = "signedint"


class UnsignedInt(int):
    amqp_type = "unsignedint"


class Float(float):
    amqp_type = "float"


def _typed(decoder, kind):
    def decode(value: bytes):
        consumed, number = decoder(value)
        return consumed, kind(number)

    return decode


def _install_typed_numbers() -> None:
    if getattr(pamqp_decode, "_leveret_typed_numbers", False):
        return
    mapping = pamqp_decode.TABLE_MAPPING
    for code, kind in (
        (b"b", Byte),
        (b"B", UnsignedByte),
        (b"s", Short),
        (b"u", UnsignedShort),
        (b"I", SignedInt),
        (b"i", UnsignedInt),
        (b"l", Long),
        (b"f", Float),
    ):
        mapping[code] = _typed(mapping[code], kind)
    pamqp_decode._leveret_typed_numbers = True  # type: ignore[attr-defined]


_install_typed_numbers()

#: each typed number's wire type and payload layout
_WIRE_FORMS: dict[type, tuple[bytes, struct.Struct]] = {
    Byte: (b"b", struct.Struct(">b")),
    UnsignedByte: (b"B", struct.Struct(">B")),
    Short: (b"s", struct.Struct(">h")),
    UnsignedShort: (b"u", struct.Struct(">H")),
    SignedInt: (b"I", struct.Struct(">i")),
    UnsignedInt: (b"i", struct.Struct(">I")),
    Long: (b"l", struct.Struct(">q")),
    Float: (b"f", struct.Struct(">f")),
}


def skip_value(buf: bytes, pos: int) -> int:
    """End offset of the typed value (type octet + payload) starting at pos."""
    kind = buf[pos]
    size = _FIXED_SIZES.get(kind)
    if size is not None:
        end = pos + 1 + size
    elif kind in _PREFIXED:
        end = pos + 5 + _LONG.unpack_from(buf, pos + 1)[0]
    else:
        raise ValueError(f"unknown field type {chr(kind)!r}")
    if end > len(buf):
        raise ValueError("field value runs past the end of the table")
    return end


def split_table(buf: bytes, pos: int = 0) -> dict[str, bytes]:
    """A table (with its 4-byte length) as key → raw typed value, in wire order."""
    size = _LONG.unpack_from(buf, pos)[0]
    pos += 4
    end = pos + size
    items: dict[str, bytes] = {}
    while pos < end:
        n = buf[pos]
        key = bytes(buf[pos + 1 : pos + 1 + n]).decode(errors="replace")
        value_end = skip_value(buf, pos + 1 + n)
        items[key] = bytes(buf[pos + 1 + n : value_end])
        pos = value_end
    return items


def split_array(raw: bytes) -> list[bytes]:
    """An 'A' typed value as a list of raw typed elements."""
    size = _LONG.unpack_from(raw, 1)[0]
    pos, end = 5, 5 + size
    out = []
    while pos < end:
        value_end = skip_value(raw, pos)
        out.append(raw[pos:value_end])
        pos = value_end
    return out


def join_table(items: dict[str, bytes]) -> bytes:
    body = b"".join(bytes((len(k.encode()),)) + k.encode() + v for k, v in items.items())
    return _LONG.pack(len(body)) + body


def join_array(elements: list[bytes]) -> bytes:
    body = b"".join(elements)
    return b"A" + _LONG.pack(len(body)) + body


def decode_value(raw: bytes) -> Any:
    return pamqp_decode.embedded_value(raw)[1]


def encode_value(value: Any) -> bytes:
    """A typed value, with the types RabbitMQ itself uses for what it writes."""
    if isinstance(value, bool):
        return b"t" + (b"\x01" if value else b"\x00")
    if isinstance(value, Long):
        return b"l" + struct.pack(">q", value)
    if isinstance(value, Short):
        return b"s" + struct.pack(">h", value)
    if isinstance(value, int):
        if -(2**31) <= value < 2**31:
            return b"I" + struct.pack(">i", value)
        return b"l" + struct.pack(">q", value)
    if isinstance(value, str):
        raw = value.encode()
        return b"S" + _LONG.pack(len(raw)) + raw
    if isinstance(value, bytes | bytearray):
        return b"S" + _LONG.pack(len(value)) + bytes(value)
    if isinstance(value, datetime.datetime):
        return b"T" + struct.pack(">Q", int(value.timestamp()))
    if isinstance(value, float):
        return b"d" + struct.pack(">d", value)
    if isinstance(value, list):
        return join_array([encode_value(v) for v in value])
    if isinstance(value, dict):
        return b"F" + join_table({k: encode_value(v) for k, v in value.items()})
    if value is None:
        return b"V"
    raise TypeError(f"cannot encode {type(value).__name__} in a field table")


# --- a decoded table, encoded as it arrived ---------------------------------------------
#
# A method a client sent is sometimes encoded again to be read by another part of the
# broker (a connection handed to another worker takes the method that decided it along).
# pamqp's encoder picks the smallest integer type for an int, writes a float as 'f' and
# sorts the keys, so the reader would see other types than the client sent (and RabbitMQ
# names the sent type in its error texts). These write each decoded value back with the
# type it was decoded from, keys in the order they came.


def encode_decoded_value(value: Any) -> bytes:
    """A value decoded from a field table, as the typed value it was decoded from."""
    form = _WIRE_FORMS.get(type(value))
    if form is not None:
        return form[0] + form[1].pack(value)
    if isinstance(value, bool):
        return b"t" + (b"\x01" if value else b"\x00")
    if isinstance(value, float):  # only 'd' decodes to a plain float
        return b"d" + struct.pack(">d", value)
    if isinstance(value, dict):
        return b"F" + encode_decoded_table(value)
    if isinstance(value, list):
        return join_array([encode_decoded_value(v) for v in value])
    if isinstance(value, bytearray):
        return b"x" + _LONG.pack(len(value)) + bytes(value)
    if isinstance(value, decimal.Decimal):
        return b"D" + pamqp_encode.decimal(value)
    if isinstance(value, datetime.datetime | time.struct_time):
        return b"T" + pamqp_encode.timestamp(value)
    return encode_value(value)  # str, bytes (a longstr that is not UTF-8), None, int


def encode_decoded_table(table: dict[str, Any] | None) -> bytes:
    """A decoded field table (with its 4-byte length), each value with its own type,
    keys in their order."""
    if not table:
        return b"\x00\x00\x00\x00"
    return join_table({k: encode_decoded_value(v) for k, v in table.items()})
