"""A message as it crosses between workers: the bytes of a PUBLISH or DELIVER record.

What a queue needs of a routed message is what the store keeps of it: the exchange
and routing key (as basic.deliver carries them), the CC/BCC routing keys when the
publish had some, the content header exactly as published (the broker's rewrites
done) and the body. They are laid out as

    u8 flags (KEYS, PERSISTENT), the exchange and routing key as basic.deliver
    carries them, [KEYS: u16 n, n x (u16 length, key)], u32 header length, the
    content header, then the body.

so the receiving worker makes its `Message` without parsing the header: property
flags are at a fixed place in it, and only a message with an expiration has it
decoded (for its TTL), as at publish.

A crossing message is decoded on each worker it reaches (twice when both its
publisher and its consumer are on other workers than its queue): the module is
compiled (leveret/_build.py), and `decode` then reads the layout's integers and cuts
its parts in C (messages.pxd); Python runs the same code with struct.
"""

from __future__ import annotations

import struct

try:
    import cython
except ImportError:  # no Cython installed: the annotations below are only comments
    from leveret import _cython_shim as cython

from leveret.broker.errors import PreconditionFailed
from leveret.broker.message import Message
from leveret.broker.queue_args import parse_expiration
from leveret.protocol.properties import FLAG_EXPIRATION

KEYS = 0x01
PERSISTENT = 0x02

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")

#: a message's first byte, by its flags
_FLAG_BYTES = tuple(bytes((i,)) for i in range(4))

# The last message encoded, or decoded by the owner: a fan-out to queues of several
# workers encodes it once, and an owner that delivers a message as it takes it (a
# consumer waiting) sends the PUBLISH's bytes back as the DELIVER's.
_last: list = [None, b""]


def encode(message: Message, body: bytes | None = None) -> bytes:
    """The record bytes of `message`; `body` when the message's own is paged out."""
    if _last[0] is message:
        return _last[1]  # (a paged-out body read back is the same bytes)
    if body is None:
        body = message.body
        cache = body is not None
    else:
        cache = False
    header = message.header
    keys = message.routing_keys
    flags = PERSISTENT if message.persistent else 0
    if keys is None:
        data = b"".join(
            (
                _FLAG_BYTES[flags],
                message.exchange_and_key,
                _U32.pack(len(header)),
                header,
                body or b"",
            )
        )
    else:
        parts = [_FLAG_BYTES[flags | KEYS], message.exchange_and_key, _U16.pack(len(keys))]
        for key in keys:
            raw = key.encode()
            parts += [_U16.pack(len(raw)), raw]
        parts += [_U32.pack(len(header)), header, body or b""]
        data = b"".join(parts)
    if cache:
        _last[0] = message
        _last[1] = data
    return data


def remember(message: Message, data: bytes) -> None:
    """`data` (the record `message` was decoded from) is what `encode` gives for it:
    the owner's DELIVER of a message it delivers at once reuses the PUBLISH's bytes."""
    _last[0] = message
    _last[1] = data


#: (exchange, routing key) by their bytes as basic.deliver carries them: a stream of
#: messages mostly repeats a few, and the cached bytes are shared by their messages
_ROUTES: dict[bytes, tuple[bytes, str, str]] = {}


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


def decode(data: bytes) -> Message:
    """The `Message` of record bytes made by `encode`. Raises ValueError for bytes
    shorter than their own lengths say (checked before any read: compiled, the reads
    are not bounds-checked)."""
    length: cython.Py_ssize_t = len(data)
    flags: cython.Py_ssize_t
    n: cython.Py_ssize_t
    p: cython.Py_ssize_t
    count: cython.Py_ssize_t
    size: cython.Py_ssize_t
    hlen: cython.Py_ssize_t
    pflags: cython.Py_ssize_t
    if length < 3:
        raise ValueError("message record too short")
    flags = data[0]
    n = data[1]
    if 3 + n > length:
        raise ValueError("message record shorter than its exchange")
    p = 3 + n + data[2 + n]
    if p + 4 > length:
        raise ValueError("message record shorter than its routing key")
    route = _ROUTES.get(data[1:p])
    if route is None:
        exchange_and_key = data[1:p]
        route = (exchange_and_key, data[2 : 2 + n].decode(), data[3 + n : p].decode())
        if len(_ROUTES) > 4096:
            _ROUTES.clear()  # many routes once: keep the cache small, not complete
        _ROUTES[exchange_and_key] = route
    exchange_and_key, exchange, routing_key = route
    keys = None
    if flags & KEYS:
        count = _be16(data, p) if cython.compiled else _U16.unpack_from(data, p)[0]
        p += 2
        keys = []
        for _ in range(count):
            if p + 2 > length:
                raise ValueError("message record shorter than its routing keys")
            size = _be16(data, p) if cython.compiled else _U16.unpack_from(data, p)[0]
            if p + 2 + size > length:
                raise ValueError("message record shorter than its routing keys")
            keys.append(data[p + 2 : p + 2 + size].decode())
            p += 2 + size
        if p + 4 > length:
            raise ValueError("message record shorter than its routing keys")
    hlen = _be32(data, p) if cython.compiled else _U32.unpack_from(data, p)[0]
    p += 4
    if hlen < 14 or p + hlen > length:
        raise ValueError("message record shorter than its content header")
    header = data[p : p + hlen]
    body = data[p + hlen :]
    pflags = (header[12] << 8) | header[13]
    message = Message(
        exchange,
        routing_key,
        header,
        body,
        pflags,
        (flags & PERSISTENT) != 0,
        exchange_and_key,
    )
    if keys is not None:
        message.routing_keys = keys
    if pflags & FLAG_EXPIRATION:
        try:
            message.ttl = parse_expiration(message.properties.expiration)
        except PreconditionFailed:
            message.ttl = None
    return message
