"""All 14 basic properties and every field-table type survive a round trip."""

from __future__ import annotations

import asyncio
import datetime
import decimal
import struct

import aio_pika
import pika
import pika.exceptions
import pytest
from pamqp import commands, frame

from rawamqp import raw_frame

# pika cannot encode floats (UnsupportedAMQPFieldException); floats are covered
# by the aio-pika, kombu and raw byte-level tests below.
HEADERS = {
    "int_small": 7,
    "int_negative": -12345,
    "int_big": 2**40,
    "int_min64": -(2**63),
    "decimal": decimal.Decimal("12.345"),
    "true": True,
    "false": False,
    "string": "héllo wörld",
    "empty_string": "",
    "bytes": b"\x00\x01\xff binary",
    "none": None,
    "timestamp": datetime.datetime(2024, 5, 17, 12, 30, 45, tzinfo=datetime.UTC),
    "nested": {"a": 1, "b": {"c": [1, "two", decimal.Decimal("3.5")]}, "d": None},
    "array": [1, -2, "three", True, None, {"k": "v"}, [1, 2], b"raw"],
    "empty_array": [],
    "empty_table": {},
}


def _all_properties(user: str) -> pika.BasicProperties:
    return pika.BasicProperties(
        content_type="application/json",
        content_encoding="gzip",
        headers=HEADERS,
        delivery_mode=2,
        priority=7,
        correlation_id="corr-123",
        reply_to="reply.queue",
        expiration="60000",
        message_id="msg-456",
        timestamp=1700000000,
        type="order.created",
        user_id=user,
        app_id="leveret-tests",
        cluster_id="cluster-x",
    )


def _assert_headers_equal(got: dict) -> None:
    assert set(got) == set(HEADERS)
    for key, expected in HEADERS.items():
        value = got[key]
        if isinstance(expected, str):
            value = value.decode() if isinstance(value, bytes) else value
        assert value == expected, key
        if isinstance(expected, bool | decimal.Decimal | datetime.datetime | bytes | dict | list):
            assert type(value) is type(expected), key  # pika decodes 'l' as its own int subclass


def test_all_properties_round_trip_pika(connection, amqp_credentials):
    user, _password = amqp_credentials
    ch = connection.channel()
    ch.confirm_delivery()
    q = ch.queue_declare("", exclusive=True).method.queue
    sent = _all_properties(user)
    ch.basic_publish("", q, b"{}", sent)
    method, props, body = ch.basic_get(q, auto_ack=True)
    assert body == b"{}"
    for name in [
        "content_type",
        "content_encoding",
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
    ]:
        assert getattr(props, name) == getattr(sent, name), name
    _assert_headers_equal(props.headers)


def test_no_properties(connection):
    ch = connection.channel()
    ch.confirm_delivery()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"bare")
    _method, props, body = ch.basic_get(q, auto_ack=True)
    assert body == b"bare"
    for name in ["content_type", "headers", "delivery_mode", "message_id", "user_id"]:
        assert getattr(props, name) is None, name


def test_properties_delivered_to_consumer(connection, amqp_credentials):
    user, _ = amqp_credentials
    ch = connection.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    got = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(p), auto_ack=True)
    ch.basic_publish("", q, b"x", _all_properties(user))
    for _ in range(100):
        if got:
            break
        connection.process_data_events(time_limit=0.05)
    assert got[0].correlation_id == "corr-123"
    assert got[0].cluster_id == "cluster-x"
    _assert_headers_equal(got[0].headers)


def test_user_id_must_match_authenticated_user(connection):
    ch = connection.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_publish("", q, b"x", pika.BasicProperties(user_id="someone-else"))
        ch.queue_declare("", exclusive=True)
    assert info.value.reply_code == 406
    assert "user_id" in info.value.reply_text


@pytest.mark.parametrize("expiration", ["abc", "-1"])
def test_invalid_expiration_rejected(connection, expiration):
    """RabbitMQ: 406 "invalid expiration '...'" for a non-integer expiration."""
    ch = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.basic_publish(
            "", "amq.leveret-nowhere", b"x", pika.BasicProperties(expiration=expiration)
        )
        ch.queue_declare("", exclusive=True)
    assert info.value.reply_code == 406


def test_all_properties_round_trip_aio_pika(amqp_url, amqp_credentials):
    user, _ = amqp_credentials

    async def main():
        conn = await aio_pika.connect(amqp_url, timeout=5)
        async with conn:
            ch = await conn.channel()
            q = await ch.declare_queue("", exclusive=True)
            msg = aio_pika.Message(
                b"payload",
                content_type="text/plain",
                content_encoding="utf-8",
                headers={"n": 1, "s": "str", "f": 1.5, "l": [1, 2], "t": {"x": True}},
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                priority=3,
                correlation_id="c1",
                reply_to="r1",
                expiration=30,
                message_id="m1",
                timestamp=datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
                type="t1",
                user_id=user,
                app_id="a1",
            )
            await ch.default_exchange.publish(msg, routing_key=q.name)
            incoming = await q.get(timeout=5, fail=True)
            await incoming.ack()
            return incoming

    m = asyncio.run(asyncio.wait_for(main(), 20))
    assert m.body == b"payload"
    assert m.content_type == "text/plain"
    assert m.content_encoding == "utf-8"
    assert m.headers["n"] == 1
    assert m.headers["s"] == "str"
    assert m.headers["f"] == 1.5
    assert list(m.headers["l"]) == [1, 2]
    assert m.headers["t"] == {"x": True}
    assert m.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert m.priority == 3
    assert (m.correlation_id, m.reply_to, m.message_id, m.type) == ("c1", "r1", "m1", "t1")
    assert m.user_id == user
    assert m.app_id == "a1"
    assert m.timestamp.replace(tzinfo=datetime.UTC) == datetime.datetime(
        2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC
    )


def _field(name: str, type_code: bytes, value: bytes) -> bytes:
    return bytes([len(name)]) + name.encode() + type_code + value


# Every field type letter RabbitMQ knows, encoded by hand.
RAW_FIELDS = [
    _field("bool", b"t", b"\x01"),
    _field("i8", b"b", struct.pack(">b", -5)),
    _field("u8", b"B", struct.pack(">B", 250)),
    _field("i16", b"s", struct.pack(">h", -300)),
    _field("u16", b"u", struct.pack(">H", 60000)),
    _field("i32", b"I", struct.pack(">i", -70000)),
    _field("u32", b"i", struct.pack(">I", 4000000000)),
    _field("i64", b"l", struct.pack(">q", -(2**40))),
    _field("f32", b"f", struct.pack(">f", 1.5)),
    _field("f64", b"d", struct.pack(">d", 2.25)),
    _field("dec", b"D", b"\x02" + struct.pack(">i", 12345)),
    _field("str", b"S", struct.pack(">I", 5) + b"hello"),
    _field("arr", b"A", struct.pack(">I", 7) + b"I" + struct.pack(">i", 1) + b"t\x00"),
    _field("ts", b"T", struct.pack(">Q", 1700000000)),
    _field("tbl", b"F", struct.pack(">I", 7) + b"\x01kI" + struct.pack(">i", 9)),
    _field("void", b"V", b""),
    _field("bytes", b"x", struct.pack(">I", 3) + b"\x00\x01\x02"),
]


def test_content_header_bytes_pass_through_unchanged(raw):
    """RabbitMQ forwards the content header exactly as published: no field type
    is widened or re-encoded (so e.g. a 'u' short-uint stays a 'u')."""
    table = b"".join(RAW_FIELDS)
    flags = 1 << 13  # headers only
    header_payload = (
        struct.pack(">HHQ", 60, 0, 3)
        + struct.pack(">H", flags)
        + struct.pack(">I", len(table))
        + table
    )
    client = raw()
    client.handshake()
    client.open_channel(1)
    ok = client.rpc(1, commands.Queue.Declare(queue="", exclusive=True), commands.Queue.DeclareOk)
    client.send(
        frame.marshal(commands.Basic.Publish(exchange="", routing_key=ok.queue), 1)
        + raw_frame(2, 1, header_payload)
        + raw_frame(3, 1, b"abc")
    )
    client.send_method(1, commands.Basic.Get(queue=ok.queue, no_ack=True))
    client.wait_for(commands.Basic.GetOk, channel=1)
    head = client.read_bytes(7)
    ftype, channel, size = struct.unpack(">BHI", head)
    assert (ftype, channel) == (2, 1)
    payload = client.read_bytes(size + 1)
    assert payload[-1:] == b"\xce"
    assert payload[:-1] == header_payload
    _ch, content = client.read_frame()
    assert content.value == b"abc"
