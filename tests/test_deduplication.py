"""The x-message-deduplication exchange: the community plugin's interface.

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
from test_streams import _broker, _free_port

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
    with _broker(data, port, signal.SIGKILL):
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.exchange_declare("results", DEDUP, durable=True, arguments=args)
        ch.queue_declare("out", durable=True)
        ch.queue_bind("out", "results", "")
        ch.confirm_delivery()
        _pub(ch, "results", ["e1", "e2"])
        conn.close()
    with _broker(data, port):
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.confirm_delivery()
        _pub(ch, "results", ["e1", "e2", "e3"])  # a replay after the crash
        assert drain(ch, "out") == [b"e3"]  # e1 and e2 were not durable messages
        conn.close()


# --- queue level: x-message-deduplication: true on queue.declare ---------------------


def _pub_q(ch, q, ids):
    for i in ids:
        props = pika.BasicProperties(headers={"x-deduplication-header": i}, delivery_mode=2)
        ch.basic_publish("", q, i.encode(), props)  # confirmed: raises if nacked


@pytest.fixture
def dq(connection, names):
    ch = connection.channel()
    q = names.queue("dq")
    ch.queue_declare(q, arguments={DEDUP: True})
    ch.confirm_delivery()
    yield ch, q
    if ch.is_open:
        ch.queue_delete(q)


def _count(ch, q) -> int:
    return ch.queue_declare(q, passive=True).method.message_count


def test_queue_drops_a_duplicate_of_a_message_it_holds(dq):
    ch, q = dq
    _pub_q(ch, q, ["a", "b", "a", "b", "c"])  # every publish confirmed (no NackError)
    ch.basic_publish("", q, b"no id")  # without the header: never a duplicate
    ch.basic_publish("", q, b"no id")
    assert drain(ch, q) == [b"a", b"b", b"c", b"no id", b"no id"]


def test_an_acked_id_may_come_again(dq):
    ch, q = dq
    _pub_q(ch, q, ["a"])
    method, _, body = ch.basic_get(q)
    assert body == b"a"
    _pub_q(ch, q, ["a"])  # still unacked: a duplicate
    assert _count(ch, q) == 0
    ch.basic_ack(method.delivery_tag)
    _pub_q(ch, q, ["a"])  # gone from the queue: accepted again
    assert _count(ch, q) == 1


def test_requeue_keeps_the_id_and_reject_forgets_it(dq):
    ch, q = dq
    _pub_q(ch, q, ["a"])
    method, _, _ = ch.basic_get(q)
    ch.basic_nack(method.delivery_tag, requeue=True)
    _pub_q(ch, q, ["a"])
    assert _count(ch, q) == 1  # the requeued one is still there; the copy was dropped
    method, _, _ = ch.basic_get(q)
    ch.basic_reject(method.delivery_tag, requeue=False)
    _pub_q(ch, q, ["a"])
    assert _count(ch, q) == 1


def test_no_ack_get_and_purge_forget_ids(dq):
    ch, q = dq
    _pub_q(ch, q, ["a", "b"])
    _, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"a"
    ch.queue_purge(q)
    _pub_q(ch, q, ["a", "b", "a"])
    assert drain(ch, q) == [b"a", b"b"]


def test_expiry_and_overflow_forget_ids(connection, names):
    ch = connection.channel()
    ch.confirm_delivery()
    q = names.queue("dq")
    ch.queue_declare(q, arguments={DEDUP: True, "x-max-length": 1})
    _pub_q(ch, q, ["a", "b"])  # "b" pushes "a" out of the head
    _pub_q(ch, q, ["a"])  # so "a" is new again, and pushes "b" out
    assert drain(ch, q) == [b"a"]
    t = names.queue("dqt")
    ch.queue_declare(t, arguments={DEDUP: True, "x-message-ttl": 50})
    _pub_q(ch, t, ["a"])
    deadline = time.monotonic() + 5
    while _count(ch, t) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _count(ch, t) == 0  # expired
    _pub_q(ch, t, ["a"])
    method, _, body = ch.basic_get(t)
    assert body == b"a"  # the expired id did not block it
    ch.queue_delete(q)
    ch.queue_delete(t)


def test_a_consumer_sees_each_id_once_while_it_is_held(dq, connection):
    ch, q = dq
    got = []
    cch = connection.channel()
    cch.basic_qos(prefetch_count=10)
    cch.basic_consume(q, lambda c, m, p, b: got.append((m.delivery_tag, b)))
    _pub_q(ch, q, ["a", "a", "b"])
    deadline = time.monotonic() + 5
    while len(got) < 2 and time.monotonic() < deadline:
        connection.process_data_events(0.05)
    _pub_q(ch, q, ["a", "b"])  # delivered, not acked: still held
    connection.process_data_events(0.2)
    assert [b for _, b in got] == [b"a", b"b"]
    for tag, _ in got:
        cch.basic_ack(tag)
    _pub_q(ch, q, ["a"])
    deadline = time.monotonic() + 5
    while len(got) < 3 and time.monotonic() < deadline:
        connection.process_data_events(0.05)
    assert [b for _, b in got] == [b"a", b"b", b"a"]
    cch.close()


@pytest.mark.parametrize("value", ["yes", 1])
def test_queue_argument_must_be_a_boolean(connection, names, value):
    q = names.queue("dq")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        connection.channel().queue_declare(q, arguments={DEDUP: value})
    assert info.value.reply_code == 406
    assert "invalid arg 'x-message-deduplication'" in info.value.reply_text
    assert "expected true or false" in info.value.reply_text


def test_a_stream_refuses_queue_deduplication(connection, names):
    q = names.queue("ds")
    args = {"x-queue-type": "stream", DEDUP: True}
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        connection.channel().queue_declare(q, durable=True, arguments=args)
    assert info.value.reply_code == 406
    assert "invalid arg 'x-message-deduplication'" in info.value.reply_text


def test_queue_ids_come_back_with_the_messages_after_a_crash(tmp_path):
    data, port = str(tmp_path / "d"), _free_port()
    url = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
    with _broker(data, port, signal.SIGKILL):
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("dq", durable=True, arguments={DEDUP: True})
        _pub_q(ch, "dq", ["a", "b"])
        conn.close()
    with _broker(data, port):
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.confirm_delivery()
        _pub_q(ch, "dq", ["a", "c", "b"])  # the replay after a crash: only "c" is new
        assert drain(ch, "dq") == [b"a", b"b", b"c"]
        conn.close()
