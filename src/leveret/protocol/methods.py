"""Method payloads: decoding with pamqp, plus hand-written codecs for the hot path.

pamqp builds an object per method and walks its attributes generically, which
is fine for declares and binds but costs too much per message. The per-message
methods are therefore (de)coded here with precompiled structs, in both
directions, so that the broker and leveret.client share one codec:

    client → broker: basic.publish, basic.ack, basic.nack, basic.reject
    broker → client: basic.deliver, basic.get-ok, basic.return, basic.ack/nack (confirms)

tests/unit/test_protocol_codec.py checks them against pamqp's output.
"""

from __future__ import annotations

import struct
from typing import Any

try:
    import cython
except ImportError:  # no Cython: the annotations below are never evaluated
    from leveret import _cython_shim as cython

from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp.exceptions import UnmarshalingException

from leveret.protocol import fieldtable  # noqa: F401  (decoded numbers keep their wire type)
from leveret.protocol.constants import (
    BASIC_ACK,
    BASIC_NACK,
    BASIC_PUBLISH,
    BASIC_REJECT,
    FRAME_ERROR,
    SYNTAX_ERROR,
)
from leveret.protocol.errors import FrameError
from leveret.protocol.fieldtable import Long, Short, encode_decoded_table, encode_value

METHOD_INDEX = struct.Struct(">I")
_FRAME_HEAD = struct.Struct(">BHI")  # frame type, channel, size
_SHORT = struct.Struct(">H")
_ACK = struct.Struct(">QB")
_DELIVER_HEAD = struct.Struct(">BHIHH")  # frame type, channel, size, class, method
_DELIVER_TAIL = struct.Struct(">QB")  # delivery tag, redelivered
_END_AND_HEAD = struct.Struct(">BBHI")  # a frame's end octet, then the next frame's head
_PUBLISH_HEAD = struct.Struct(">BHIIH")  # frame type, channel, size, method, reserved
_SETTLE = struct.Struct(">BHIIQBB")  # a whole ack/nack/reject frame
_RETURN_CODE = struct.Struct(">H")
_GET_OK_COUNT = struct.Struct(">I")


def method_index(payload: bytes) -> int:
    """The class and method ids of a method frame's payload, as one number.

    A payload too short to hold them is 501 FRAME_ERROR, as RabbitMQ 3.10 answers
    (tests/test_bad_frames.py); it was once a struct.error, an internal error."""
    if len(payload) < 4:
        raise FrameError(
            FRAME_ERROR,
            f"a {len(payload)}-octet method frame is too short for its class and method ids",
        )
    return METHOD_INDEX.unpack_from(payload)[0]


def method_name(index: int) -> str:
    cls = commands.INDEX_MAPPING.get(index)
    return cls.name if cls is not None else f"method {index >> 16}.{index & 0xFFFF}"


def undecodable(name: str, exc: BaseException) -> FrameError:
    """The error for a method frame whose fields cannot be decoded (truncated, a length
    running past the frame, bad UTF-8): RabbitMQ answers 501 FRAME_ERROR "cannot
    decode", not 502, for the generic and the hand-written decoders alike, naming the
    method by its class and method ids."""
    index = _INDEX_BY_NAME.get(name, 0)
    return FrameError(
        FRAME_ERROR, f"cannot decode {name} frame: {exc}", index >> 16, index & 0xFFFF
    )


_INDEX_BY_NAME = {cls.name: index for index, cls in commands.INDEX_MAPPING.items()}


def decode_method(payload: bytes) -> Any:
    """A pamqp method object for a method frame payload.

    Raises FrameError: 501 FRAME_ERROR for a payload too short to name a method,
    502 SYNTAX_ERROR for one naming an unknown method, and 501 FRAME_ERROR
    (`undecodable`) when the named method's fields cannot be decoded; the text
    names the method so the client author knows which frame was bad.
    """
    index = method_index(payload)
    cls = commands.INDEX_MAPPING.get(index)
    if cls is None:
        raise FrameError(
            SYNTAX_ERROR, f"unknown method class {index >> 16} method {index & 0xFFFF}"
        )
    method = cls()
    try:
        method.unmarshal(payload[4:])
    except (
        struct.error,
        ValueError,
        IndexError,
        TypeError,
        UnicodeDecodeError,
        UnmarshalingException,
        KeyError,
        OverflowError,
    ) as exc:
        raise undecodable(cls.name, exc) from None
    return method


def _no_validation(self: Any) -> None:
    pass


_UNCHECKED: dict[type, type] = {}


def unchecked(cls: type, *args: Any, **kwargs: Any) -> Any:
    """A method object to send, built without pamqp's name checks.

    pamqp checks exchange and queue names against a conservative pattern when a
    method is constructed; RabbitMQ, and so Leveret, accept any UTF-8 name up to
    255 bytes, so replies that echo a client's name (declare-ok, get-ok, return),
    and leveret.client's declares, must not run that check. Its field tables may
    also hold `fieldtable.Long` / `Short` values, written with exactly that type
    (RabbitMQ checks the type of some arguments, e.g. x-federation-upstream's
    `x-max-hops` must be a long); pamqp picks the smallest type for an int.
    """
    sub = _UNCHECKED.get(cls)
    if sub is None:
        sub = _UNCHECKED[cls] = type(
            cls.__name__, (cls,), {"validate": _no_validation, "marshal": _marshal_typed}
        )
    return sub(*args, **kwargs)


def _marshal_typed(self: Any) -> bytes:
    """pamqp's Frame.marshal, with tables that keep Long and Short values' types."""
    return _marshal_fields(self, _table_keeping_long_and_short)


def _table_keeping_long_and_short(value: Any) -> bytes:
    from pamqp import encode

    if value and _has_typed(value):
        return _typed_table(value)
    return encode.by_type(value, "table")


def _marshal_fields(method: Any, encode_table: Any) -> bytes:
    """pamqp's Frame.marshal, with `encode_table` writing the field tables."""
    from pamqp import encode

    byte, offset, output, in_bits = -1, 0, [], False
    for argument in method.__slots__:
        data_type = method.amqp_type(argument)
        if not in_bits and data_type == "bit":
            byte, offset, in_bits = 0, 0, True
        value = getattr(method, argument, 0)
        if in_bits:
            if data_type != "bit":
                in_bits = False
                output.append(encode.octet(byte))
            else:
                byte = encode.bit(value, byte, offset)
                offset += 1
                if offset == 8:
                    output.append(encode.octet(byte))
                    in_bits = False
                continue
        if data_type == "table":
            output.append(encode_table(value))
        else:
            output.append(encode.by_type(value, data_type))
    if in_bits:
        output.append(encode.octet(byte))
    return b"".join(output)


def encode_method_as_received(method: Any, channel: int) -> bytes:
    """A whole method frame for a method decoded from a client, as the client sent it:
    its field tables keep each value's wire type and their keys' order (fieldtable's
    encode_decoded_table), where pamqp's marshal would pick the smallest integer type
    and sort the keys. For a method read here and handled elsewhere (a connection
    handed to another worker), which must see what the client sent."""
    payload = METHOD_INDEX.pack(method.index) + _marshal_fields(method, encode_decoded_table)
    return _FRAME_HEAD.pack(1, channel, len(payload)) + payload + b"\xce"


def _has_typed(value: Any) -> bool:
    if isinstance(value, Long | Short):
        return True
    if isinstance(value, dict):
        return any(_has_typed(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_typed(v) for v in value)
    return False


def _typed_table(table: dict[str, Any]) -> bytes:
    from pamqp import encode

    body = b"".join(encode.short_string(k) + _typed_value(v) for k, v in sorted(table.items()))
    return len(body).to_bytes(4, "big") + body


def _typed_value(value: Any) -> bytes:
    from pamqp import encode

    if isinstance(value, Long | Short):
        return encode_value(value)
    if isinstance(value, dict):
        return b"F" + _typed_table(value)
    if isinstance(value, list):
        body = b"".join(_typed_value(v) for v in value)
        return b"A" + len(body).to_bytes(4, "big") + body
    return encode.encode_table_value(value)


def encode_method(method: Any, channel: int) -> bytes:
    """A whole method frame for a pamqp method object (cold path)."""
    return pamqp_frame.marshal(method, channel)


# --- hot path ---------------------------------------------------------------


def decode_publish(payload: bytes, start: int = 0) -> tuple[str, str, bool, bool, bytes]:
    """basic.publish → (exchange, routing_key, mandatory, immediate, names) without pamqp.

    `start` is where the payload begins in `payload` (a frame buffer, say).
    `names` is the exchange and routing key as the two short strings that
    arrived: a basic.deliver carries them again, so they are kept, not re-encoded.
    """
    try:
        pos = start + 6  # method index (4) + reserved short (2)
        n = payload[pos]
        exchange = payload[pos + 1 : pos + 1 + n].decode()
        end = pos + 2 + n + payload[pos + 1 + n]
        routing_key = payload[pos + 2 + n : end].decode()
        bits = payload[end]
    except (IndexError, UnicodeDecodeError) as exc:
        raise undecodable("Basic.Publish", exc) from None
    return exchange, routing_key, bool(bits & 1), bool(bits & 2), payload[pos:end]


def decode_ack(payload: bytes) -> tuple[int, bool]:
    """basic.ack → (delivery_tag, multiple)."""
    try:
        tag, bits = _ACK.unpack_from(payload, 4)
    except struct.error as exc:
        raise undecodable("Basic.Ack", exc) from None
    return tag, bool(bits & 1)


def deliver_prefix(consumer_tag: str) -> bytes:
    """The part of a basic.deliver payload after class/method that never changes."""
    tag = consumer_tag.encode()
    return bytes((len(tag),)) + tag


def encode_deliver(
    channel: int,
    ctag_prefix: bytes,
    delivery_tag: int,
    redelivered: bool,
    exchange_and_key: bytes,
) -> bytes:
    """A whole basic.deliver frame.

    `ctag_prefix` comes from deliver_prefix(); `exchange_and_key` is the
    exchange and routing key as two short strings, encoded once per message.
    """
    size = 4 + len(ctag_prefix) + 9 + len(exchange_and_key)
    return b"".join(
        (
            _DELIVER_HEAD.pack(1, channel, size, 60, 60),
            ctag_prefix,
            _DELIVER_TAIL.pack(delivery_tag, redelivered),
            exchange_and_key,
            b"\xce",
        )
    )


def deliver_head(
    channel: int,
    ctag_prefix: bytes,
    delivery_tag: int,
    redelivered: bool,
    exchange_and_key: bytes,
    header: bytes,
    body_size: int,
) -> bytes:
    """Every byte of a one-body-frame delivery before its body: the basic.deliver
    frame, the content header frame (`header` is its payload) and the body frame's
    head. The body and a frame-end octet follow. One join, for the hot path."""
    return b"".join(
        (
            _DELIVER_HEAD.pack(1, channel, 13 + len(ctag_prefix) + len(exchange_and_key), 60, 60),
            ctag_prefix,
            _DELIVER_TAIL.pack(delivery_tag, redelivered),
            exchange_and_key,
            _END_AND_HEAD.pack(0xCE, 2, channel, len(header)),
            header,
            _END_AND_HEAD.pack(0xCE, 3, channel, body_size),
        )
    )


def deliver_frames(
    channel: cython.Py_ssize_t,
    ctag_prefix: bytes,
    delivery_tag: cython.ulonglong,
    redelivered: cython.bint,
    exchange_and_key: bytes,
    header: bytes,
    body: bytes,
) -> bytes:
    """A whole delivery whose body fits one frame, as one bytes object: the
    basic.deliver frame, the content header frame (`header` is its payload), the
    body frame with `body` and its frame-end octet. The hot path of every small
    message: compiled, the frames are written straight into the new object, one
    allocation and no join; in Python it is one join (as deliver_head, plus body)."""
    if not cython.compiled:
        return b"".join(
            (
                _DELIVER_HEAD.pack(
                    1, channel, 13 + len(ctag_prefix) + len(exchange_and_key), 60, 60
                ),
                ctag_prefix,
                _DELIVER_TAIL.pack(delivery_tag, redelivered),
                exchange_and_key,
                _END_AND_HEAD.pack(0xCE, 2, channel, len(header)),
                header,
                _END_AND_HEAD.pack(0xCE, 3, channel, len(body)),
                body,
                b"\xce",
            )
        )
    # Compiled only (the names below come from methods.pxd's cimports).
    np: cython.Py_ssize_t = len(ctag_prefix)
    ne: cython.Py_ssize_t = len(exchange_and_key)
    nh: cython.Py_ssize_t = len(header)
    nb: cython.Py_ssize_t = len(body)
    msize: cython.Py_ssize_t = 13 + np + ne
    out: bytes = PyBytes_FromStringAndSize(cython.NULL, 7 + msize + 8 + nh + 8 + nb + 1)  # noqa: F821
    p: cython.p_uchar = cython.cast(cython.p_uchar, PyBytes_AS_STRING(out))  # noqa: F821
    p[0] = 1  # method frame: type, channel, size, class 60, method 60
    p[1] = (channel >> 8) & 0xFF
    p[2] = channel & 0xFF
    p[3] = (msize >> 24) & 0xFF
    p[4] = (msize >> 16) & 0xFF
    p[5] = (msize >> 8) & 0xFF
    p[6] = msize & 0xFF
    p[7] = 0
    p[8] = 60
    p[9] = 0
    p[10] = 60
    memcpy(p + 11, PyBytes_AS_STRING(ctag_prefix), np)  # noqa: F821
    q: cython.Py_ssize_t = 11 + np
    k: cython.int
    for k in range(8):
        p[q + k] = (delivery_tag >> (56 - 8 * k)) & 0xFF
    p[q + 8] = 1 if redelivered else 0
    q += 9
    memcpy(p + q, PyBytes_AS_STRING(exchange_and_key), ne)  # noqa: F821
    q += ne
    p[q] = 0xCE  # then the header frame: type 2, channel, size, payload
    p[q + 1] = 2
    p[q + 2] = (channel >> 8) & 0xFF
    p[q + 3] = channel & 0xFF
    p[q + 4] = (nh >> 24) & 0xFF
    p[q + 5] = (nh >> 16) & 0xFF
    p[q + 6] = (nh >> 8) & 0xFF
    p[q + 7] = nh & 0xFF
    q += 8
    memcpy(p + q, PyBytes_AS_STRING(header), nh)  # noqa: F821
    q += nh
    p[q] = 0xCE  # then the body frame: type 3, channel, size, body, frame end
    p[q + 1] = 3
    p[q + 2] = (channel >> 8) & 0xFF
    p[q + 3] = channel & 0xFF
    p[q + 4] = (nb >> 24) & 0xFF
    p[q + 5] = (nb >> 16) & 0xFF
    p[q + 6] = (nb >> 8) & 0xFF
    p[q + 7] = nb & 0xFF
    q += 8
    memcpy(p + q, PyBytes_AS_STRING(body), nb)  # noqa: F821
    p[q + nb] = 0xCE
    return out


def short_strings(*values: str) -> bytes:
    """Several AMQP short strings back to back."""
    out = bytearray()
    for value in values:
        raw = value.encode()
        out.append(len(raw))
        out += raw
    return bytes(out)


def encode_confirm(channel: int, delivery_tag: int, multiple: bool, nack: bool = False) -> bytes:
    """basic.ack or basic.nack from the broker to a publisher in confirm mode."""
    if nack:
        return struct.pack(">BHIHHQBB", 1, channel, 13, 60, 120, delivery_tag, multiple, 0xCE)
    return struct.pack(">BHIHHQBB", 1, channel, 13, 60, 80, delivery_tag, multiple, 0xCE)


# --- hot path, client side ---------------------------------------------------


def encode_publish(
    channel: int, exchange: str, routing_key: str, mandatory: bool = False, immediate: bool = False
) -> bytes:
    """A whole basic.publish method frame.

    Raises ValueError for a name over 255 bytes (a short string cannot hold it).
    """
    ex = exchange.encode()
    rk = routing_key.encode()
    if len(ex) > 255 or len(rk) > 255:
        raise ValueError(
            "exchange name and routing key must each be at most 255 bytes of UTF-8 "
            f"(got {len(ex)} and {len(rk)})"
        )
    args = b"".join(
        (bytes((len(ex),)), ex, bytes((len(rk),)), rk, bytes((mandatory | immediate << 1,)))
    )
    return _PUBLISH_HEAD.pack(1, channel, 6 + len(args), BASIC_PUBLISH, 0) + args + b"\xce"


def decode_deliver(payload: bytes, start: int = 0) -> tuple[str, int, bool, str, str]:
    """basic.deliver → (consumer_tag, delivery_tag, redelivered, exchange, routing_key).

    `start` is where the payload begins in `payload` (a frame buffer, say).
    """
    try:
        n = payload[start + 4]
        consumer_tag = payload[start + 5 : start + 5 + n].decode()
        pos = start + 5 + n
        delivery_tag, redelivered = _DELIVER_TAIL.unpack_from(payload, pos)
        pos += 9
        n = payload[pos]
        exchange = payload[pos + 1 : pos + 1 + n].decode()
        pos += 1 + n
        n = payload[pos]
        routing_key = payload[pos + 1 : pos + 1 + n].decode()
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise undecodable("Basic.Deliver", exc) from None
    return consumer_tag, delivery_tag, bool(redelivered), exchange, routing_key


def decode_get_ok(payload: bytes) -> tuple[int, bool, str, str, int]:
    """basic.get-ok → (delivery_tag, redelivered, exchange, routing_key, message_count)."""
    try:
        delivery_tag, redelivered = _DELIVER_TAIL.unpack_from(payload, 4)
        pos = 13
        n = payload[pos]
        exchange = payload[pos + 1 : pos + 1 + n].decode()
        pos += 1 + n
        n = payload[pos]
        routing_key = payload[pos + 1 : pos + 1 + n].decode()
        pos += 1 + n
        message_count = _GET_OK_COUNT.unpack_from(payload, pos)[0]
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise undecodable("Basic.GetOk", exc) from None
    return delivery_tag, bool(redelivered), exchange, routing_key, message_count


def decode_return(payload: bytes) -> tuple[int, str, str, str]:
    """basic.return → (reply_code, reply_text, exchange, routing_key)."""
    try:
        code = _RETURN_CODE.unpack_from(payload, 4)[0]
        pos = 6
        values = []
        for _ in range(3):
            n = payload[pos]
            values.append(payload[pos + 1 : pos + 1 + n].decode(errors="replace"))
            pos += 1 + n
    except (IndexError, struct.error) as exc:
        raise undecodable("Basic.Return", exc) from None
    return code, values[0], values[1], values[2]


def decode_nack(payload: bytes) -> tuple[int, bool, bool]:
    """basic.nack → (delivery_tag, multiple, requeue)."""
    try:
        tag, bits = _ACK.unpack_from(payload, 4)
    except struct.error as exc:
        raise undecodable("Basic.Nack", exc) from None
    return tag, bool(bits & 1), bool(bits & 2)


def encode_ack(channel: int, delivery_tag: int, multiple: bool = False) -> bytes:
    """A whole basic.ack frame (a consumer's ack, or a broker's confirm)."""
    return _SETTLE.pack(1, channel, 13, BASIC_ACK, delivery_tag, multiple, 0xCE)


def encode_nack(
    channel: int, delivery_tag: int, multiple: bool = False, requeue: bool = True
) -> bytes:
    return _SETTLE.pack(1, channel, 13, BASIC_NACK, delivery_tag, multiple | requeue << 1, 0xCE)


def encode_reject(channel: int, delivery_tag: int, requeue: bool = True) -> bytes:
    return _SETTLE.pack(1, channel, 13, BASIC_REJECT, delivery_tag, requeue, 0xCE)
