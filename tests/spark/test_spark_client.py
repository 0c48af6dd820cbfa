"""The connector's AMQP side (leveret.client on a task's own loop) against a real broker.

Every delivery a Spark task reads becomes Arrow columns, so the property columns are
checked field by field against what pika (an independent encoder) publishes.
"""

from __future__ import annotations

import datetime as dt
import decimal

import pika
import pytest

from conftest import connection_params
from leveret.client import connect
from leveret.spark._client import (
    ConnectFailed,
    LoginRefused,
    TaskLoop,
    close_quietly,
    open_connection,
)
from leveret.spark.rows import BatchBuilder


def test_every_basic_property_becomes_its_column(amqp_url, names):
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
    conn.close()

    async def take_two():
        c = await connect(amqp_url)
        try:
            channel = await c.channel()
            got = []
            async for m in channel.consume(q):
                got.append(m)
                m.ack()
                if len(got) == 2:
                    return got
        finally:
            await c.close()

    with TaskLoop() as tl:
        first, second = tl.run(take_two())
    rows = BatchBuilder("p", include_headers=True)
    rows.add(12, first)
    rows.add(13, second)
    table = rows.take().to_pylist()
    one, two = table
    assert (one["partition"], one["offset"], one["body"], one["routing_key"]) == (
        "p",
        12,
        b"body",
        q,
    )
    assert one["timestamp"] == dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC)
    p = one["properties"]
    assert (p["content_type"], p["content_encoding"], p["delivery_mode"], p["priority"]) == (
        "application/json",
        "gzip",
        2,
        4,
    )
    assert (p["correlation_id"], p["reply_to"], p["expiration"], p["message_id"]) == (
        "corr",
        "replies",
        "60000",
        "mid",
    )
    assert (p["type"], p["user_id"], p["app_id"]) == ("kind", "guest", "app")
    h = dict(one["headers"])
    assert h["s"] == "text" and h["i"] == "7" and h["neg"] == "-3" and h["big"] == str(2**40)
    assert h["b"] == "true" and h["d"] == "1.25" and h["bytes"] == "\x00\x01"
    assert h["t"] == '{"nested": "x"}' and h["a"] == '[1, "two"]'
    assert "x-stream-offset" not in h  # it is the offset column
    assert two["body"] == b"" and two["headers"] is None and two["timestamp"] is None


def test_errors_name_the_broker_and_the_step(amqp_url):
    async def attempt(uri, **kwargs):
        conn = await open_connection(uri, 5, "test", **kwargs)
        await close_quietly(conn)

    with TaskLoop() as tl:
        with pytest.raises(ConnectFailed, match="cannot reach the AMQP broker at 127.0.0.1:1"):
            tl.run(attempt("amqp://guest:guest@127.0.0.1:1/%2F"))
        with pytest.raises(LoginRefused, match="user 'guest'"):
            tl.run(attempt(amqp_url.replace("guest:guest", "guest:nope")))
        with pytest.raises(LoginRefused, match="vhost 'no-such-vhost'"):
            tl.run(attempt(amqp_url.rsplit("/", 1)[0] + "/no-such-vhost"))


def test_several_hosts_in_the_uri(amqp_url):
    """A cluster's nodes in one URI: the first that answers is used."""
    host = amqp_url.split("@", 1)[1].split("/", 1)[0]
    uri = amqp_url.replace(host, f"127.0.0.1:1,{host}")

    async def which():
        conn = await open_connection(uri, 5, "test")
        try:
            return f"{conn.host}:{conn.port}"
        finally:
            await close_quietly(conn)

    with TaskLoop() as tl:
        assert tl.run(which()) == host
        with pytest.raises(ConnectFailed, match="127.0.0.1:1,127.0.0.1:2"):
            tl.run(open_connection("amqp://127.0.0.1:1,127.0.0.1:2/%2F", 2, "test"))
