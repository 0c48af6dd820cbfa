"""The connector's own small AMQP client against a real broker (Leveret, or RabbitMQ).

It decodes every delivery a Spark task reads, so its property decoding is checked field
by field against what pika publishes.
"""

from __future__ import annotations

import decimal

import pika
import pytest

from conftest import connection_params
from leveret.spark._amqp import (
    ChannelClosed,
    Client,
    ConnectFailed,
    LoginRefused,
    decode_properties,
)


def test_every_basic_property_and_header_type_decodes(amqp_url, names):
    q = names.queue("client")
    conn = pika.BlockingConnection(connection_params(amqp_url))
    ch = conn.channel()
    ch.queue_declare(q)
    ch.confirm_delivery()
    headers = {
        "s": "text",
        "i": 7,
        "neg": -3,
        "big": 2**40,
        "b": True,
        "d": decimal.Decimal("1.25"),
        "t": {"nested": "x"},
        "a": [1, "two"],
        "bytes": b"\x00\x01",
        "x-stream-offset": 12,
    }
    props = pika.BasicProperties(
        content_type="application/json",
        content_encoding="gzip",
        headers=headers,
        delivery_mode=2,
        priority=4,
        correlation_id="corr",
        reply_to="replies",
        expiration="60000",
        message_id="mid",
        timestamp=1_700_000_000,
        type="kind",
        user_id="guest",
        app_id="app",
    )
    ch.basic_publish("", q, b"body", props)
    ch.basic_publish("", q, b"", pika.BasicProperties())
    with Client(amqp_url).connect() as c:
        c.qos(10)
        c.consume(q)
        it = c.deliveries()
        first, second = next(it), next(it)
    p = first.properties
    assert first.body == b"body" and first.routing_key == q and first.exchange == ""
    assert (p.content_type, p.content_encoding, p.delivery_mode, p.priority) == (
        "application/json",
        "gzip",
        2,
        4,
    )
    assert (p.correlation_id, p.reply_to, p.expiration, p.message_id) == (
        "corr",
        "replies",
        "60000",
        "mid",
    )
    assert (p.timestamp, p.type, p.user_id, p.app_id) == (1_700_000_000, "kind", "guest", "app")
    h = p.headers
    assert h["s"] == "text" and h["i"] == 7 and h["neg"] == -3 and h["big"] == 2**40
    assert h["b"] is True and h["d"] == decimal.Decimal("1.25")
    assert h["t"] == {"nested": "x"} and h["a"] == [1, "two"] and h["bytes"] == b"\x00\x01"
    assert h["x-stream-offset"] == 12
    assert second.body == b"" and second.properties.headers is None
    assert second.properties.timestamp is None
    conn.close()


def test_the_usual_stream_delivery_header_takes_the_fast_path():
    # flags: headers only; a table with the one long x-stream-offset = 42
    table = b"\x0fx-stream-offsetl" + (42).to_bytes(8, "big")
    payload = b"\x20\x00" + len(table).to_bytes(4, "big") + table
    assert decode_properties(payload, 0).headers == {"x-stream-offset": 42}
    assert decode_properties(b"\x00\x00", 0).headers is None


def test_errors_name_the_broker_and_the_step(amqp_url, names):
    with pytest.raises(ConnectFailed, match="cannot reach the AMQP broker at 127.0.0.1:1"):
        Client("amqp://guest:guest@127.0.0.1:1/%2F", timeout=2).connect()
    with pytest.raises(LoginRefused, match="user 'guest'"):
        Client(amqp_url.replace("guest:guest", "guest:nope"), timeout=5).connect()
    with pytest.raises(LoginRefused, match="vhost 'no-such-vhost'"):
        Client(amqp_url.rsplit("/", 1)[0] + "/no-such-vhost", timeout=5).connect()
    with Client(amqp_url).connect() as c, pytest.raises(ChannelClosed, match="404"):
        c.consume(names.queue("missing"))


def test_confirms_and_returns(amqp_url, names):
    q = names.queue("client")
    conn = pika.BlockingConnection(connection_params(amqp_url))
    conn.channel().queue_declare(q)
    with Client(amqp_url).connect() as c:
        c.confirm_select()
        for i in range(1000):
            c.publish("", q, str(i).encode())
        c.publish("", names.queue("nowhere"), b"lost", mandatory=True)
        c.wait_for_confirms(10)
        assert c.outstanding() == 0 and not c.nacked
        assert [r.reply_code for r in c.returned] == [312]
    assert conn.channel().queue_declare(q, passive=True).method.message_count == 1000
    conn.close()
