"""Sender-selected distribution: the CC and BCC headers."""

from __future__ import annotations

import pika
import pytest

from conftest import drain
from ext_helpers import closed_with, confirm_channel, get_one


def _direct_with_queues(ch, names, keys, kind="direct"):
    ex = names.exchange()
    ch.exchange_declare(ex, kind)
    queues = {}
    for key in keys:
        q = names.queue(key.replace("*", "star").replace("#", "hash"))
        ch.queue_declare(q)
        ch.queue_bind(q, ex, routing_key=key)
        queues[key] = q
    return ex, queues


def test_cc_routes_to_extra_keys_and_stays(connection, names):
    ch = confirm_channel(connection)
    ex, qs = _direct_with_queues(ch, names, ["a", "b", "c", "d"])
    headers = {"CC": ["b", "c"], "other": "x"}
    ch.basic_publish(ex, "a", b"m", properties=pika.BasicProperties(headers=headers))
    for key in ("a", "b", "c"):
        method, props, body = get_one(ch, qs[key])
        assert body == b"m"
        assert method.routing_key == "a"  # delivered with the publish's routing key
        assert props.headers["CC"] == ["b", "c"]
        assert props.headers["other"] == "x"
    assert drain(ch, qs["d"]) == []


def test_bcc_routes_and_is_removed(connection, names):
    ch = confirm_channel(connection)
    ex, qs = _direct_with_queues(ch, names, ["a", "b", "c"])
    headers = {"BCC": ["b"], "CC": ["c"]}
    ch.basic_publish(ex, "a", b"m", properties=pika.BasicProperties(headers=headers))
    for key in ("a", "b", "c"):
        _method, props, body = get_one(ch, qs[key])
        assert body == b"m"
        assert "BCC" not in props.headers
        assert props.headers["CC"] == ["c"]


def test_bcc_only_header_removed_entirely(connection, names):
    ch = confirm_channel(connection)
    ex, qs = _direct_with_queues(ch, names, ["a", "b"])
    ch.basic_publish(ex, "a", b"m", properties=pika.BasicProperties(headers={"BCC": ["b"]}))
    for key in ("a", "b"):
        _method, props, body = get_one(ch, qs[key])
        assert body == b"m"
        assert not props.headers  # an empty table (or none) remains


def test_cc_on_default_exchange(connection, names):
    ch = confirm_channel(connection)
    q1, q2 = names.queue(), names.queue()
    ch.queue_declare(q1)
    ch.queue_declare(q2)
    ch.basic_publish("", q1, b"m", properties=pika.BasicProperties(headers={"CC": [q2]}))
    assert drain(ch, q1) == [b"m"]
    assert drain(ch, q2) == [b"m"]


def test_cc_with_topic_exchange(connection, names):
    ch = confirm_channel(connection)
    ex, qs = _direct_with_queues(ch, names, ["orders.*", "audit.#"], kind="topic")
    props = pika.BasicProperties(headers={"CC": ["audit.orders.created"]})
    ch.basic_publish(ex, "orders.created", b"m", properties=props)
    assert drain(ch, qs["orders.*"]) == [b"m"]
    assert drain(ch, qs["audit.#"]) == [b"m"]


def test_cc_duplicate_keys_deliver_once(connection, names):
    ch = confirm_channel(connection)
    ex, qs = _direct_with_queues(ch, names, ["a", "b"])
    ch.queue_bind(qs["a"], ex, routing_key="b")  # queue a is bound by both keys
    props = pika.BasicProperties(headers={"CC": ["a", "b"], "BCC": ["b"]})
    ch.basic_publish(ex, "a", b"m", properties=props)
    assert drain(ch, qs["a"]) == [b"m"]
    assert drain(ch, qs["b"]) == [b"m"]


def test_cc_makes_mandatory_message_routable(connection, names):
    ch = confirm_channel(connection)
    ex, qs = _direct_with_queues(ch, names, ["b"])
    props = pika.BasicProperties(headers={"CC": ["b"]})
    ch.basic_publish(ex, "nowhere", b"m", properties=props, mandatory=True)  # no UnroutableError
    assert drain(ch, qs["b"]) == [b"m"]


@pytest.mark.parametrize("header", ["CC", "BCC"])
def test_non_array_cc_is_refused(connection, names, header):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q)
    with closed_with(406) as info:
        ch.basic_publish("", q, b"m", properties=pika.BasicProperties(headers={header: q}))
    assert info.value.reply_text == (
        f'PRECONDITION_FAILED - invalid message: {{unacceptable_type_in_header,"{header}",longstr}}'
    )
    assert connection.is_open
    assert connection.channel().queue_declare(q, passive=True).method.message_count == 0


def test_cc_with_kombu(amqp_url, names):
    import kombu

    ex_name = names.exchange()
    qa, qb = names.queue("a"), names.queue("b")
    with kombu.Connection(amqp_url, connect_timeout=5) as conn:
        exchange = kombu.Exchange(ex_name, "direct", durable=False)
        queue_a = kombu.Queue(qa, exchange, routing_key="a", durable=False)
        queue_b = kombu.Queue(qb, exchange, routing_key="b", durable=False)
        producer = conn.Producer()
        producer.publish(
            {"n": 1},
            exchange=exchange,
            routing_key="a",
            headers={"CC": ["b"], "BCC": []},
            declare=[queue_a, queue_b],
            serializer="json",
        )
        got = {}
        for name, queue in (("a", queue_a), ("b", queue_b)):
            simple = conn.SimpleQueue(queue)
            message = simple.get(timeout=5)
            got[name] = (message.payload, message.headers)
            message.ack()
            simple.close()
    assert got["a"][0] == got["b"][0] == {"n": 1}
    assert got["b"][1]["CC"] == ["b"]
    assert "BCC" not in got["b"][1]
