"""The x-message-deduplication exchange (issue 9 §2): the community plugin's interface.

The reference RabbitMQ here does not have that plugin, so these are Leveret's own
(leveret_only); the argument names and semantics follow the plugin's README.
"""

from __future__ import annotations

import signal
import time

import pika
import pika.exceptions
import pytest

from conftest import drain
from test_streams import _free_port, _start

pytestmark = pytest.mark.leveret_only
DEDUP = "x-message-deduplication"


def _pub(ch, x, ids, ttl=None):
    for i in ids:
        headers = {"x-deduplication-header": i}
        if ttl is not None:
            headers["x-cache-ttl"] = ttl
        ch.basic_publish(x, "any-key", i.encode(), pika.BasicProperties(headers=headers))


@pytest.fixture
def dedup(connection, names):
    ch = connection.channel()
    x, q = names.exchange("dd"), names.queue("dd")
    ch.exchange_declare(x, DEDUP, arguments={"x-cache-size": 100})
    ch.queue_declare(q)
    ch.queue_bind(q, x, "#")  # routed to every binding, whatever the key
    ch.confirm_delivery()
    yield ch, x, q
    ch.queue_delete(q)
    ch.exchange_delete(x)


def test_duplicates_are_confirmed_and_dropped(dedup):
    ch, x, q = dedup
    _pub(ch, x, ["a", "b", "a", "c", "b"])  # every publish confirmed (no exception)
    ch.basic_publish(x, "k", b"no id")  # messages without the header always pass
    ch.basic_publish(x, "k", b"no id")
    assert drain(ch, q) == [b"a", b"b", b"c", b"no id", b"no id"]


def test_cache_size_evicts_oldest(connection, names):
    ch = connection.channel()
    x, q = names.exchange("dd"), names.queue("dd")
    ch.exchange_declare(x, DEDUP, arguments={"x-cache-size": 2})
    ch.queue_declare(q)
    ch.queue_bind(q, x, "")
    ch.confirm_delivery()
    _pub(ch, x, ["a", "b", "c", "a"])  # "a" was evicted by "c"
    assert drain(ch, q) == [b"a", b"b", b"c", b"a"]
    ch.queue_delete(q)
    ch.exchange_delete(x)


def test_cache_ttl_header_expires(dedup):
    ch, x, q = dedup
    _pub(ch, x, ["t"], ttl=1)
    time.sleep(0.05)
    _pub(ch, x, ["t"])  # expired: routed again
    assert drain(ch, q) == [b"t", b"t"]


@pytest.mark.parametrize(
    "args,text",
    [
        ({}, "Missing or invalid argument x-cache-size"),
        ({"x-cache-size": 0}, "Invalid x-cache-size argument"),
        ({"x-cache-size": 5, "x-cache-ttl": "1h"}, "Invalid x-cache-ttl argument"),
        ({"x-cache-size": 5, "x-cache-persistence": "tape"}, "Invalid x-cache-persistence"),
    ],
)
def test_bad_arguments(connection, names, args, text):
    ch = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_declare(names.exchange("dd"), DEDUP, arguments=args)
    assert info.value.reply_code == 406
    assert text in info.value.reply_text


def test_disk_cache_survives_a_crash(tmp_path):
    data, port = str(tmp_path / "d"), _free_port()
    url = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
    args = {"x-cache-size": 1000, "x-cache-persistence": "disk"}
    proc = _start(data, port)
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.exchange_declare("results", DEDUP, durable=True, arguments=args)
        ch.queue_declare("out", durable=True)
        ch.queue_bind("out", "results", "")
        ch.confirm_delivery()
        _pub(ch, "results", ["e1", "e2"])
        conn.close()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    proc = _start(data, port)
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.confirm_delivery()
        _pub(ch, "results", ["e1", "e2", "e3"])  # a replay after the crash
        assert drain(ch, "out") == [b"e3"]  # e1 and e2 were not durable messages
        conn.close()
    finally:
        proc.terminate()
        proc.wait()
