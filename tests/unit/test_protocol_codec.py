"""The hand-written hot-path codecs must agree byte for byte with pamqp."""

from __future__ import annotations

import datetime

import pytest
from pamqp import commands, frame
from pamqp.body import ContentBody as Body
from pamqp.header import ContentHeader

from leveret.protocol import methods as wire
from leveret.protocol.errors import FrameError
from leveret.protocol.frames import FrameReader, body_frames, header_frame
from leveret.protocol.properties import decode_properties, headers_table, parse_header


def _payload(method) -> bytes:
    raw = frame.marshal(method, 1)
    return raw[7:-1]


@pytest.mark.parametrize(
    "exchange,key,mandatory,immediate",
    [
        ("", "q", False, False),
        ("amq.topic", "a.b.c", True, False),
        ("x" * 127, "", True, True),
        ("amq.direct", "ключ.ü", False, True),
    ],
)
def test_decode_publish_matches_pamqp(exchange, key, mandatory, immediate):
    payload = _payload(
        commands.Basic.Publish(
            exchange=exchange, routing_key=key, mandatory=mandatory, immediate=immediate
        )
    )
    ex, rk = exchange.encode(), key.encode()
    names = bytes((len(ex),)) + ex + bytes((len(rk),)) + rk
    assert wire.decode_publish(payload) == (exchange, key, mandatory, immediate, names)


@pytest.mark.parametrize("tag,multiple", [(1, False), (2**63 - 1, True), (12345, True)])
def test_decode_ack_matches_pamqp(tag, multiple):
    payload = _payload(commands.Basic.Ack(delivery_tag=tag, multiple=multiple))
    assert wire.decode_ack(payload) == (tag, multiple)


@pytest.mark.parametrize("redelivered", [False, True])
def test_encode_deliver_matches_pamqp(redelivered):
    ours = wire.encode_deliver(
        7,
        wire.deliver_prefix("amq.ctag-abc"),
        99,
        redelivered,
        wire.short_strings("amq.direct", "rk.1"),
    )
    theirs = frame.marshal(
        commands.Basic.Deliver(
            consumer_tag="amq.ctag-abc",
            delivery_tag=99,
            redelivered=redelivered,
            exchange="amq.direct",
            routing_key="rk.1",
        ),
        7,
    )
    assert ours == theirs


@pytest.mark.parametrize("redelivered,size", [(False, 1), (True, 4096), (False, 131064)])
def test_deliver_head_matches_pamqp(redelivered, size):
    """deliver_head + body + frame end is pamqp's deliver, header and body frames."""
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    properties = commands.Basic.Properties(content_type="text/plain", priority=3)
    header = frame.marshal(ContentHeader(0, size, properties), 5)[7:-1]
    ours = (
        wire.deliver_head(
            5,
            wire.deliver_prefix("ctag.1"),
            2**40,
            redelivered,
            wire.short_strings("", "ключ"),
            header,
            size,
        )
        + body
        + b"\xce"
    )
    theirs = b"".join(
        (
            frame.marshal(
                commands.Basic.Deliver(
                    consumer_tag="ctag.1",
                    delivery_tag=2**40,
                    redelivered=redelivered,
                    exchange="",
                    routing_key="ключ",
                ),
                5,
            ),
            frame.marshal(ContentHeader(0, size, properties), 5),
            frame.marshal(Body(body), 5),
        )
    )
    assert ours == theirs


@pytest.mark.parametrize("multiple", [False, True])
@pytest.mark.parametrize("nack", [False, True])
def test_encode_confirm_matches_pamqp(multiple, nack):
    ours = wire.encode_confirm(3, 500, multiple, nack=nack)
    if nack:  # a broker's nack never asks for requeue
        method = commands.Basic.Nack(delivery_tag=500, multiple=multiple, requeue=False)
    else:
        method = commands.Basic.Ack(delivery_tag=500, multiple=multiple)
    theirs = frame.marshal(method, 3)
    assert ours == theirs


def test_truncated_publish_is_a_frame_error():
    """As RabbitMQ: 501 FRAME_ERROR "cannot decode", like pamqp-decoded methods."""
    payload = _payload(commands.Basic.Publish(exchange="ex", routing_key="key"))
    with pytest.raises(FrameError) as info:
        wire.decode_publish(payload[:8])
    assert info.value.code == 501
    assert "cannot decode Basic.Publish frame" in info.value.reply_text


def test_header_scan_finds_delivery_mode_after_headers():
    props = commands.Basic.Properties(
        content_type="text/plain",
        content_encoding="gzip",
        headers={"a": 1, "b": [1, "x"], "c": {"d": bytearray(b"\x00")}},
        delivery_mode=2,
        priority=5,
        reply_to="r",
    )
    payload = ContentHeader(0, 10, props).marshal()
    class_id, weight, size, flags, mode = parse_header(payload)
    assert (class_id, weight, size, mode) == (60, 0, 10, 2)
    assert headers_table(payload, flags) == {"a": 1, "b": [1, "x"], "c": {"d": bytearray(b"\x00")}}
    assert decode_properties(payload).priority == 5


def test_reader_splits_frames_across_arbitrary_chunks():
    frames = frame.marshal(commands.Basic.Qos(prefetch_count=10), 1) + header_frame(
        1, ContentHeader(0, 3, commands.Basic.Properties()).marshal()
    )
    frames += b"".join(body_frames(1, b"abc", 4096))
    reader = FrameReader(131072)
    got = []
    for i in range(len(frames)):
        got += list(reader.feed(frames[i : i + 1]))
    assert [(t, c) for t, c, _ in got] == [(1, 1), (2, 1), (3, 1)]
    assert got[2][2] == b"abc"


def test_body_frames_respect_frame_max():
    parts = body_frames(1, b"x" * 10000, 4096)
    reader = FrameReader(4096)
    chunks = [payload for _, _, payload in reader.feed(b"".join(bytes(p) for p in parts))]
    assert [len(c) for c in chunks] == [4088, 4088, 1824]


@pytest.mark.parametrize(
    "data,fragment",
    [
        (b"\x01\x00\x01\x00\x00\x00\x00\xff", "frame end"),
        (b"\x09\x00\x00\x00\x00\x00\x00\xce", "unknown frame type"),
        (b"\x01\x00\x01\x00\x10\x00\x00", "exceeds"),
    ],
)
def test_reader_rejects_broken_framing(data, fragment):
    with pytest.raises(FrameError) as info:
        list(FrameReader(4096).feed(data))
    assert info.value.code == 501
    assert fragment in info.value.reply_text


def test_garbage_method_is_a_syntax_error():
    payload = _payload(commands.Queue.Declare(queue="q", arguments={"x": 1}))
    broken = payload[:-6] + b"\xff\xff\xff\xff\x00\x00"
    with pytest.raises(FrameError) as info:
        wire.decode_method(broken)
    assert info.value.code == 501  # RabbitMQ: FRAME_ERROR - cannot decode
    assert "Queue.Declare" in info.value.reply_text


# -- client-side hot codecs ------------------------------------------------------------------


@pytest.mark.parametrize("mandatory,immediate", [(False, False), (True, False), (True, True)])
def test_encode_publish_matches_pamqp(mandatory, immediate):
    ours = wire.encode_publish(3, "amq.topic", "ключ.a", mandatory, immediate)
    theirs = frame.marshal(
        commands.Basic.Publish(
            exchange="amq.topic", routing_key="ключ.a", mandatory=mandatory, immediate=immediate
        ),
        3,
    )
    assert ours == theirs


def test_encode_publish_refuses_long_names():
    with pytest.raises(ValueError, match="255 bytes"):
        wire.encode_publish(1, "x" * 256, "")


def test_decode_deliver_get_ok_return_match_pamqp():
    d = _payload(commands.Basic.Deliver("ctag-ü", 2**40, True, "ex", "r.k"))
    assert wire.decode_deliver(d) == ("ctag-ü", 2**40, True, "ex", "r.k")
    g = _payload(commands.Basic.GetOk(5, False, "", "q", 123456))
    assert wire.decode_get_ok(g) == (5, False, "", "q", 123456)
    r = _payload(commands.Basic.Return(312, "NO_ROUTE", "ex", "rk"))
    assert wire.decode_return(r) == (312, "NO_ROUTE", "ex", "rk")
    n = _payload(commands.Basic.Nack(9, True, False))
    assert wire.decode_nack(n) == (9, True, False)


def test_decode_deliver_rejects_a_truncated_frame():
    d = _payload(commands.Basic.Deliver("ctag", 1, False, "ex", "rk"))
    with pytest.raises(FrameError):
        wire.decode_deliver(d[:-3])


@pytest.mark.parametrize("multiple,requeue", [(False, False), (True, True), (True, False)])
def test_settle_frames_match_pamqp(multiple, requeue):
    assert wire.encode_ack(2, 77, multiple) == frame.marshal(commands.Basic.Ack(77, multiple), 2)
    assert wire.encode_nack(2, 77, multiple, requeue) == frame.marshal(
        commands.Basic.Nack(77, multiple, requeue), 2
    )
    assert wire.encode_reject(2, 77, requeue) == frame.marshal(
        commands.Basic.Reject(77, requeue), 2
    )


PROPERTY_CASES = [
    {},
    {"delivery_mode": 2},
    {"content_type": "application/json", "message_id": "m-1", "priority": 9},
    {
        "content_type": "text/plain",
        "content_encoding": "utf-8",
        "headers": {"a": 1, "b": "two", "nested": {"x": [1, 2]}},
        "delivery_mode": 1,
        "priority": 0,
        "correlation_id": "c",
        "reply_to": "amq.rabbitmq.reply-to",
        "expiration": "60000",
        "message_id": "id",
        "timestamp": datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.UTC),
        "type": "t",
        "user_id": "guest",
        "app_id": "app",
    },
]


@pytest.mark.parametrize("props", PROPERTY_CASES)
def test_basic_properties_match_pamqp(props):
    from leveret.protocol.properties import BasicProperties, content_header_frame

    ours = content_header_frame(4, 10, BasicProperties(**props).encode())
    pamqp_props = {("message_type" if k == "type" else k): v for k, v in props.items()}
    theirs = frame.marshal(ContentHeader(0, 10, commands.Basic.Properties(**pamqp_props)), 4)
    assert ours == theirs
    decoded = BasicProperties.decode(theirs[7:-1])
    assert decoded.as_dict() == props


def test_basic_properties_refuse_bad_values():
    from leveret.protocol.properties import BasicProperties

    with pytest.raises(ValueError, match="delivery_mode"):
        BasicProperties(delivery_mode=300).encode()
    with pytest.raises(ValueError, match="message_id"):
        BasicProperties(message_id="x" * 256).encode()
    with pytest.raises(ValueError, match="timestamp"):
        BasicProperties(timestamp="yesterday").encode()
