"""Helpers for the RabbitMQ-extension tests (tests/test_ext_*.py, tests/test_celery*.py)."""

from __future__ import annotations

import struct
import time

import pika
import pika.exceptions
import pytest
from pamqp import commands

from conftest import wait_until


def closed_with(code: int):
    """pytest.raises for a channel closed by the broker with ``code``."""
    return pytest.raises(pika.exceptions.ChannelClosedByBroker, match=str(code))


def confirm_channel(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    return ch


def get_one(ch, queue: str, timeout: float = 5.0, step: float = 0.02):
    """basic.get (auto-ack) until a message arrives; (method, properties, body) or Nones."""
    deadline = time.monotonic() + timeout
    while True:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is not None or time.monotonic() > deadline:
            return method, props, body
        ch.connection.process_data_events(time_limit=step)


def wait_count(ch, queue: str, count: int, timeout: float = 5.0) -> bool:
    """Wait until a passive declare of ``queue`` reports ``count`` messages."""
    return wait_until(
        ch.connection,
        lambda: ch.queue_declare(queue, passive=True).method.message_count == count,
        timeout=timeout,
    )


def queue_exists(conn, queue: str) -> bool:
    ch = conn.channel()
    try:
        ch.queue_declare(queue, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return False
    ch.close()
    return True


class Consumer:
    """Collects deliveries of a pika consumer: list of (method, properties, body)."""

    def __init__(self, ch, queue: str, auto_ack: bool = False, **kwargs) -> None:
        self.ch = ch
        self.got: list = []
        self.tag = ch.basic_consume(queue, self._on, auto_ack=auto_ack, **kwargs)

    def _on(self, ch, method, props, body) -> None:
        self.got.append((method, props, body))

    @property
    def bodies(self) -> list[bytes]:
        return [body for _m, _p, body in self.got]


# -- a field-table decoder that keeps the AMQP type tags ---------------------------
#
# pika, py-amqp and pamqp all turn every integer type into a Python int, so they can't
# tell whether x-death's ``count`` is a long ('l') or an int ('I').  These helpers
# fetch a message over a raw socket and decode its headers keeping the tags:
# every value becomes (tag, value).


def _shortstr(data: bytes, pos: int) -> tuple[str, int]:
    n = data[pos]
    return data[pos + 1 : pos + 1 + n].decode(), pos + 1 + n


_FIXED = {
    "b": ">b",
    "B": ">B",
    "s": ">h",
    "u": ">H",
    "I": ">i",
    "i": ">I",
    "l": ">q",
    "L": ">Q",
    "f": ">f",
    "d": ">d",
    "T": ">Q",
}


def _value(data: bytes, pos: int):
    tag = chr(data[pos])
    pos += 1
    if tag in _FIXED:
        fmt = _FIXED[tag]
        (v,) = struct.unpack_from(fmt, data, pos)
        return (tag, v), pos + struct.calcsize(fmt)
    if tag == "t":
        return (tag, bool(data[pos])), pos + 1
    if tag in "Sx":
        (n,) = struct.unpack_from(">I", data, pos)
        return (tag, data[pos + 4 : pos + 4 + n]), pos + 4 + n
    if tag == "D":
        scale = data[pos]
        (v,) = struct.unpack_from(">i", data, pos + 1)
        return (tag, (scale, v)), pos + 5
    if tag == "V":
        return (tag, None), pos
    if tag == "F":
        table, pos = _table(data, pos)
        return (tag, table), pos
    if tag == "A":
        (n,) = struct.unpack_from(">I", data, pos)
        end = pos + 4 + n
        pos += 4
        items = []
        while pos < end:
            item, pos = _value(data, pos)
            items.append(item)
        return (tag, items), pos
    raise AssertionError(f"unknown field type {tag!r}")


def _table(data: bytes, pos: int) -> tuple[dict, int]:
    (n,) = struct.unpack_from(">I", data, pos)
    end = pos + 4 + n
    pos += 4
    table = {}
    while pos < end:
        key, pos = _shortstr(data, pos)
        table[key], pos = _value(data, pos)
    return table, pos


def tagged_headers_of_content_header(payload: bytes) -> dict | None:
    """The headers table (tagged) of a content-header frame payload."""
    pos = 12  # class id, weight, body size
    (flags,) = struct.unpack_from(">H", payload, pos)
    pos += 2
    if flags & 0x8000:  # content-type
        _s, pos = _shortstr(payload, pos)
    if flags & 0x4000:  # content-encoding
        _s, pos = _shortstr(payload, pos)
    if not flags & 0x2000:
        return None
    table, _pos = _table(payload, pos)
    return table


def raw_get_tagged_headers(host: str, port: int, queue: str, timeout: float = 5.0):
    """basic.get one message over a raw socket; its headers with type tags (or None)."""
    from rawamqp import RawClient

    client = RawClient(host, port, timeout=timeout)
    try:
        client.handshake()
        client.open_channel(1)
        deadline = time.monotonic() + timeout
        while True:
            reply = client.rpc(
                1,
                commands.Basic.Get(queue=queue, no_ack=True),
                commands.Basic.GetOk,
                commands.Basic.GetEmpty,
            )
            if isinstance(reply, commands.Basic.GetOk):
                break
            assert isinstance(reply, commands.Basic.GetEmpty), reply
            if time.monotonic() > deadline:
                raise AssertionError(f"no message in {queue}")
            time.sleep(0.02)
        # the next frame is the content header: read its raw bytes
        while len(client.buf) < 7:
            client._recv_some(time.monotonic() + timeout)
        ftype, _ch, size = struct.unpack(">BHI", client.buf[:7])
        assert ftype == 2, ftype
        raw = client.read_bytes(7 + size + 1)
        return tagged_headers_of_content_header(raw[7 : 7 + size])
    finally:
        client.close()


def untag(value):
    """Strip the tags of a tagged value (for comparisons)."""
    tag, v = value
    if tag == "F":
        return {k: untag(x) for k, x in v.items()}
    if tag == "A":
        return [untag(x) for x in v]
    return v
