"""Queue length limits (x-max-length, x-max-length-bytes, x-overflow) and priorities."""

from __future__ import annotations

import pika
import pika.exceptions
import pytest

from conftest import drain, wait_until
from ext_helpers import confirm_channel

# --- length limits ----------------------------------------------------------------


def test_max_length_drops_oldest(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q, arguments={"x-max-length": 3})
    for i in range(1, 6):
        ch.basic_publish("", q, str(i).encode())
    assert ch.queue_declare(q, passive=True).method.message_count == 3
    assert drain(ch, q) == [b"3", b"4", b"5"]


def test_max_length_explicit_drop_head(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q, arguments={"x-max-length": 2, "x-overflow": "drop-head"})
    for i in range(1, 5):
        ch.basic_publish("", q, str(i).encode())  # all confirmed (acked)
    assert drain(ch, q) == [b"3", b"4"]


def test_max_length_bytes_drops_oldest(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q, arguments={"x-max-length-bytes": 10})
    for body in (b"aaaa", b"bbbb", b"cccc", b"dddd"):
        ch.basic_publish("", q, body)
    # only bodies count: two 4-byte bodies fit in 10 bytes, three do not
    assert drain(ch, q) == [b"cccc", b"dddd"]


def test_max_length_zero_keeps_nothing(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q, arguments={"x-max-length": 0})
    ch.basic_publish("", q, b"x")
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_reject_publish_nacks_when_full(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q, arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    ch.basic_publish("", q, b"1")
    ch.basic_publish("", q, b"2")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", q, b"3")
    assert ch.is_open  # a nack, not a channel error
    assert ch.queue_declare(q, passive=True).method.message_count == 2
    # room again after one is consumed
    method, _p, body = ch.basic_get(q, auto_ack=True)
    assert body == b"1"
    ch.basic_publish("", q, b"4")
    assert drain(ch, q) == [b"2", b"4"]


def test_reject_publish_by_bytes(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q, arguments={"x-max-length-bytes": 6, "x-overflow": "reject-publish"})
    ch.basic_publish("", q, b"abcd")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", q, b"efgh")
    assert drain(ch, q) == [b"abcd"]


def test_reject_publish_without_confirms_drops_silently(connection, names):
    ch = connection.channel()
    q = names.queue()
    ch.queue_declare(q, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.basic_publish("", q, b"kept")
    ch.basic_publish("", q, b"dropped")
    # Without confirms a publish is asynchronous (RabbitMQ may not have enqueued yet).
    assert wait_until(
        connection, lambda: ch.queue_declare(q, passive=True).method.message_count == 1
    )
    assert drain(ch, q) == [b"kept"]


def test_unacked_messages_do_not_count_towards_max_length(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.basic_publish("", q, b"1")
    method, _p, _b = ch.basic_get(q, auto_ack=False)  # now unacked, not ready
    ch.basic_publish("", q, b"2")  # accepted: no nack
    assert ch.queue_declare(q, passive=True).method.message_count == 1
    ch.basic_ack(method.delivery_tag)
    assert drain(ch, q) == [b"2"]


def test_reject_publish_on_one_of_two_queues(connection, names):
    """A full queue nacks the publish; the other queue still gets the message."""
    ch = confirm_channel(connection)
    ex = names.exchange()
    ch.exchange_declare(ex, "fanout")
    full = names.queue("full")
    roomy = names.queue("roomy")
    ch.queue_declare(full, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.queue_declare(roomy)
    ch.queue_bind(full, ex)
    ch.queue_bind(roomy, ex)
    ch.basic_publish(ex, "", b"1")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish(ex, "", b"2")
    assert drain(ch, full) == [b"1"]
    assert drain(ch, roomy) == [b"1", b"2"]


# --- priorities -------------------------------------------------------------------


def _publish_priorities(ch, q, items):
    for body, priority in items:
        ch.basic_publish("", q, body, properties=pika.BasicProperties(priority=priority))


def test_higher_priority_first_fifo_within_priority(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q, arguments={"x-max-priority": 10})
    _publish_priorities(ch, q, [(b"p1", 1), (b"p5-a", 5), (b"p10", 10), (b"p5-b", 5), (b"p1-b", 1)])
    assert ch.queue_declare(q, passive=True).method.message_count == 5
    assert drain(ch, q) == [b"p10", b"p5-a", b"p5-b", b"p1", b"p1-b"]


def test_priority_above_max_counts_as_max(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q, arguments={"x-max-priority": 5})
    _publish_priorities(ch, q, [(b"four", 4), (b"max", 5), (b"huge", 200), (b"max-2", 5)])
    assert drain(ch, q) == [b"max", b"huge", b"max-2", b"four"]


def test_no_priority_is_zero(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q, arguments={"x-max-priority": 5})
    _publish_priorities(ch, q, [(b"none", None), (b"zero", 0), (b"one", 1), (b"none-2", None)])
    assert drain(ch, q) == [b"one", b"none", b"zero", b"none-2"]


def test_priority_ignored_without_max_priority(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q)
    _publish_priorities(ch, q, [(b"a", 1), (b"b", 9), (b"c", 5)])
    assert drain(ch, q) == [b"a", b"b", b"c"]


def test_priority_property_is_delivered(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q, arguments={"x-max-priority": 5})
    _publish_priorities(ch, q, [(b"x", 200)])
    _m, props, _b = ch.basic_get(q, auto_ack=True)
    assert props.priority == 200  # the property itself is not rewritten


def test_priority_order_for_consumer(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q, arguments={"x-max-priority": 3})
    _publish_priorities(ch, q, [(b"low", 1), (b"high", 3), (b"mid", 2), (b"none", None)])
    cch = connection.channel()
    cch.basic_qos(prefetch_count=1)
    got = []

    def on_message(c, method, props, body):
        got.append(body)
        c.basic_ack(method.delivery_tag)

    cch.basic_consume(q, on_message)
    assert wait_until(connection, lambda: len(got) == 4)
    assert got == [b"high", b"mid", b"low", b"none"]


def test_requeued_message_keeps_its_priority(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q, arguments={"x-max-priority": 5})
    _publish_priorities(ch, q, [(b"high", 5), (b"low", 1)])
    method, _p, body = ch.basic_get(q, auto_ack=False)
    assert body == b"high"
    _publish_priorities(ch, q, [(b"mid", 3)])
    ch.basic_nack(method.delivery_tag, requeue=True)
    assert drain(ch, q) == [b"high", b"mid", b"low"]


def test_priority_queue_with_kombu(amqp_url, names):
    import kombu

    q_name = names.queue()
    with kombu.Connection(amqp_url, connect_timeout=5) as conn:
        queue = kombu.Queue(q_name, routing_key=q_name, queue_arguments={"x-max-priority": 9})
        producer = conn.Producer()
        for body, priority in [("a", 1), ("b", 9), ("c", 4)]:
            producer.publish(
                body, routing_key=q_name, declare=[queue], priority=priority, serializer="json"
            )
        simple = conn.SimpleQueue(queue)
        got = []
        for _ in range(3):
            message = simple.get(timeout=5)
            got.append(message.payload)
            message.ack()
        simple.close()
    assert got == ["b", "c", "a"]
