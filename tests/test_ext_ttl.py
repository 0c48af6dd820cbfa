"""Message TTL (x-message-ttl, expiration) and queue TTL (x-expires)."""

from __future__ import annotations

import time

import pika
import pika.exceptions
import pytest

from conftest import drain, wait_until
from ext_helpers import Consumer, closed_with, confirm_channel, get_one, queue_exists, wait_count


def test_queue_message_ttl_expires_messages(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q, arguments={"x-message-ttl": 100})
    ch.basic_publish("", q, b"short-lived")
    # gone once the TTL has passed: declare-ok and basic.get both agree
    assert wait_count(ch, q, 0)
    method, _props, _body = ch.basic_get(q, auto_ack=True)
    assert method is None


def test_message_count_excludes_expired_head(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q)
    short = pika.BasicProperties(expiration="100")
    ch.basic_publish("", q, b"a", properties=short)
    ch.basic_publish("", q, b"b", properties=short)
    ch.basic_publish("", q, b"c")
    ch.basic_publish("", q, b"d")
    # the expired messages at the head no longer count
    assert wait_count(ch, q, 2)
    assert ch.queue_declare(q, passive=True).method.message_count == 2
    method, _props, body = ch.basic_get(q, auto_ack=True)
    assert body == b"c"
    assert method.message_count == 1
    assert drain(ch, q) == [b"d"]


def test_per_message_expiration(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"expires", properties=pika.BasicProperties(expiration="100"))
    ch.basic_publish("", q, b"stays")
    assert wait_count(ch, q, 1)
    method, props, body = ch.basic_get(q, auto_ack=True)
    assert body == b"stays"
    assert props.expiration is None


def test_expiration_property_is_delivered(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"x", properties=pika.BasicProperties(expiration="60000"))
    _m, props, body = get_one(ch, q)
    assert body == b"x"
    assert props.expiration == "60000"


def test_queue_ttl_lower_than_message_expiration_wins(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q, arguments={"x-message-ttl": 100})
    ch.basic_publish("", q, b"x", properties=pika.BasicProperties(expiration="60000"))
    assert wait_count(ch, q, 0)
    assert ch.basic_get(q, auto_ack=True)[0] is None


def test_message_expiration_lower_than_queue_ttl_wins(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q, arguments={"x-message-ttl": 60000})
    ch.basic_publish("", q, b"short", properties=pika.BasicProperties(expiration="100"))
    ch.basic_publish("", q, b"long")
    assert wait_count(ch, q, 1)
    assert drain(ch, q) == [b"long"]


def test_expired_message_behind_live_one_is_not_delivered(connection, names):
    """An expired message that is not at the head is never delivered either."""
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"first")
    ch.basic_publish("", q, b"second", properties=pika.BasicProperties(expiration="50"))
    ch.basic_publish("", q, b"third")
    time.sleep(0.3)
    assert drain(ch, q) == [b"first", b"third"]


def test_ttl_zero_without_consumer_drops(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q, arguments={"x-message-ttl": 0})
    ch.basic_publish("", q, b"nobody-listening")
    assert wait_count(ch, q, 0)
    assert ch.basic_get(q, auto_ack=True)[0] is None


def test_ttl_zero_delivers_to_ready_consumer(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q, arguments={"x-message-ttl": 0})
    cch = connection.channel()
    cch.basic_qos(prefetch_count=1)
    consumer = Consumer(cch, q)
    ch.basic_publish("", q, b"one")
    assert wait_until(connection, lambda: len(consumer.got) == 1)
    # the consumer is now at its prefetch limit: not ready, so the next one is dropped
    ch.basic_publish("", q, b"two")
    connection.process_data_events(time_limit=0.3)
    cch.basic_ack(consumer.got[0][0].delivery_tag)
    ch.basic_publish("", q, b"three")
    assert wait_until(connection, lambda: len(consumer.got) == 2)
    connection.process_data_events(time_limit=0.2)
    assert consumer.bodies == [b"one", b"three"]


def test_queue_expires_when_unused(connection, names):
    ch = connection.channel()
    q = names.queue()
    expires_ms = 200
    ch.queue_declare(q, arguments={"x-expires": expires_ms})
    assert queue_exists(connection, q)
    assert wait_queue_gone(connection, q, expires_ms)


def test_queue_expires_with_messages_in_it(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    expires_ms = 200
    ch.queue_declare(q, arguments={"x-expires": expires_ms})
    ch.basic_publish("", q, b"lost with the queue")
    assert wait_queue_gone(connection, q, expires_ms)


def wait_queue_gone(connection, q: str, expires_ms: int, timeout: float = 10.0) -> bool:
    """Wait until x-expires deleted ``q``.

    A passive declare counts as using the queue (it restarts the expiry clock on
    RabbitMQ), so poll less often than the queue's x-expires.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        connection.process_data_events(time_limit=2 * expires_ms / 1000)
        if not queue_exists(connection, q):
            return True
    return False


def _keep_using(connection, use, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        use()
        connection.process_data_events(time_limit=0.05)


def test_basic_get_resets_queue_expiry(connection, names):
    ch = connection.channel()
    q = names.queue()
    expires_ms = 600
    ch.queue_declare(q, arguments={"x-expires": expires_ms})
    _keep_using(connection, lambda: ch.basic_get(q, auto_ack=True), 1.5)
    assert queue_exists(connection, q)
    assert wait_queue_gone(connection, q, expires_ms)


def test_redeclare_resets_queue_expiry(connection, names):
    ch = connection.channel()
    q = names.queue()
    expires_ms = 600
    args = {"x-expires": expires_ms}
    ch.queue_declare(q, arguments=args)
    _keep_using(connection, lambda: ch.queue_declare(q, arguments=args), 1.5)
    assert queue_exists(connection, q)
    assert wait_queue_gone(connection, q, expires_ms)


def test_consumer_keeps_queue_alive(connection, names):
    ch = connection.channel()
    q = names.queue()
    expires_ms = 300
    ch.queue_declare(q, arguments={"x-expires": expires_ms})
    tag = ch.basic_consume(q, lambda *a: None)
    connection.process_data_events(time_limit=1.0)
    assert queue_exists(connection, q)
    ch.basic_cancel(tag)
    # the clock restarts at the cancel: the queue is still there just after it
    assert queue_exists(connection, q)
    assert wait_queue_gone(connection, q, expires_ms)


@pytest.mark.parametrize(
    ("expiration", "detail"),
    [
        ("abc", "no_integer"),
        ("-1", "{value_negative,-1}"),
        ("1.5", '{leftover_string,".5"}'),
    ],
)
def test_invalid_expiration_closes_channel(connection, names, expiration, detail):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q)
    with closed_with(406) as info:
        ch.basic_publish("", q, b"x", properties=pika.BasicProperties(expiration=expiration))
    assert info.value.reply_code == 406
    assert (
        info.value.reply_text
        == f"PRECONDITION_FAILED - invalid expiration '{expiration}': {detail}"
    )
    assert connection.is_open
