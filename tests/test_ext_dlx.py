"""Dead-lettering: x-dead-letter-exchange / -routing-key and the x-death header."""

from __future__ import annotations

import datetime
import time

import pika
import pytest

from conftest import drain
from ext_helpers import (
    confirm_channel,
    get_one,
    raw_get_tagged_headers,
    untag,
    wait_count,
)


def _dlx_setup(ch, names, **source_args):
    """A fanout DLX with one queue behind it, and a source queue dead-lettering to it."""
    dlx = names.exchange("dlx")
    dlq = names.queue("dlq")
    ch.exchange_declare(dlx, "fanout")
    ch.queue_declare(dlq)
    ch.queue_bind(dlq, dlx)
    q = names.queue("src")
    ch.queue_declare(q, arguments={"x-dead-letter-exchange": dlx, **source_args})
    return q, dlx, dlq


def _get_message(ch, queue):
    method, props, body = get_one(ch, queue)
    assert method is not None, f"nothing arrived in {queue}"
    return method, props, body


def _get_unacked(ch, q):
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        method, props, body = ch.basic_get(q, auto_ack=False)
        if method is not None:
            return method, props, body
        ch.connection.process_data_events(time_limit=0.02)
    raise AssertionError(f"nothing arrived in {q}")


def test_reject_dead_letters_with_original_routing_key(connection, names):
    ch = confirm_channel(connection)
    q, dlx, dlq = _dlx_setup(ch, names)
    props = pika.BasicProperties(
        content_type="text/plain", message_id="m-1", headers={"app": "kept"}
    )
    ch.basic_publish("", q, b"bad", properties=props)
    method, _p, _b = _get_unacked(ch, q)
    ch.basic_reject(method.delivery_tag, requeue=False)

    method, props, body = _get_message(ch, dlq)
    assert body == b"bad"
    assert method.exchange == dlx
    assert method.routing_key == q  # the original routing key is kept
    assert props.content_type == "text/plain"
    assert props.message_id == "m-1"
    headers = props.headers
    assert headers["app"] == "kept"
    (death,) = headers["x-death"]
    assert death["count"] == 1
    assert death["reason"] == "rejected"
    assert death["queue"] == q
    assert death["exchange"] == ""
    assert death["routing-keys"] == [q]
    assert isinstance(death["time"], datetime.datetime)
    assert "original-expiration" not in death
    assert headers["x-first-death-reason"] == "rejected"
    assert headers["x-first-death-queue"] == q
    assert headers["x-first-death-exchange"] == ""
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_nack_dead_letters_with_routing_key_override(connection, names):
    ch = confirm_channel(connection)
    dlx = names.exchange("dlx")
    dlq = names.queue("dlq")
    ch.exchange_declare(dlx, "direct")
    ch.queue_declare(dlq)
    ch.queue_bind(dlq, dlx, routing_key="dead")
    q = names.queue("src")
    ch.queue_declare(
        q, arguments={"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "dead"}
    )
    ch.basic_publish("", q, b"a")
    ch.basic_publish("", q, b"b")
    m1, _p, _b = _get_unacked(ch, q)
    m2, _p, _b = _get_unacked(ch, q)
    ch.basic_nack(m2.delivery_tag, multiple=True, requeue=False)

    bodies = []
    for _ in range(2):
        method, props, body = _get_message(ch, dlq)
        assert method.routing_key == "dead"
        (death,) = props.headers["x-death"]
        assert death["reason"] == "rejected"
        assert death["routing-keys"] == [q]  # x-death keeps the original keys
        bodies.append(body)
    assert bodies == [b"a", b"b"]


def test_requeue_does_not_dead_letter(connection, names):
    ch = confirm_channel(connection)
    q, _dlx, dlq = _dlx_setup(ch, names)
    ch.basic_publish("", q, b"again")
    method, _p, _b = _get_unacked(ch, q)
    ch.basic_nack(method.delivery_tag, requeue=True)
    method, _p, body = _get_message(ch, q)
    assert body == b"again" and method.redelivered
    assert ch.queue_declare(dlq, passive=True).method.message_count == 0


def test_ack_does_not_dead_letter(connection, names):
    ch = confirm_channel(connection)
    q, _dlx, dlq = _dlx_setup(ch, names)
    ch.basic_publish("", q, b"fine")
    method, _p, _b = _get_unacked(ch, q)
    ch.basic_ack(method.delivery_tag)
    connection.process_data_events(time_limit=0.1)
    assert ch.queue_declare(dlq, passive=True).method.message_count == 0


def test_consumer_reject_dead_letters(connection, names):
    ch = confirm_channel(connection)
    q, _dlx, dlq = _dlx_setup(ch, names)
    cch = connection.channel()

    def on_message(c, method, props, body):
        c.basic_reject(method.delivery_tag, requeue=False)

    cch.basic_consume(q, on_message)
    ch.basic_publish("", q, b"refused")
    _m, props, body = _get_message(ch, dlq)
    assert body == b"refused"
    assert props.headers["x-death"][0]["reason"] == "rejected"


def test_expired_message_dead_letters(connection, names):
    ch = confirm_channel(connection)
    q, dlx, dlq = _dlx_setup(ch, names, **{"x-message-ttl": 100})
    ch.basic_publish("", q, b"late", properties=pika.BasicProperties(priority=3))
    method, props, body = _get_message(ch, dlq)
    assert body == b"late"
    assert props.priority == 3
    (death,) = props.headers["x-death"]
    assert death["reason"] == "expired"
    assert death["queue"] == q
    assert death["count"] == 1
    assert "original-expiration" not in death  # only the queue's TTL applied
    assert props.headers["x-first-death-reason"] == "expired"


def test_per_message_expiration_dead_letters_with_original_expiration(connection, names):
    ch = confirm_channel(connection)
    q, _dlx, dlq = _dlx_setup(ch, names)
    ch.basic_publish("", q, b"late", properties=pika.BasicProperties(expiration="100"))
    _m, props, body = _get_message(ch, dlq)
    assert body == b"late"
    # the expiration property is removed (or the message would expire again) ...
    assert props.expiration is None
    (death,) = props.headers["x-death"]
    assert death["reason"] == "expired"
    # ... and kept in the x-death entry
    assert death["original-expiration"] == "100"


def test_rejected_message_keeps_original_expiration(connection, names):
    ch = confirm_channel(connection)
    q, _dlx, dlq = _dlx_setup(ch, names)
    ch.basic_publish("", q, b"x", properties=pika.BasicProperties(expiration="60000"))
    method, _p, _b = _get_unacked(ch, q)
    ch.basic_reject(method.delivery_tag, requeue=False)
    _m, props, _b = _get_message(ch, dlq)
    assert props.expiration is None
    assert props.headers["x-death"][0]["original-expiration"] == "60000"


def test_max_length_drop_head_dead_letters_oldest(connection, names):
    ch = confirm_channel(connection)
    q, _dlx, dlq = _dlx_setup(ch, names, **{"x-max-length": 2})
    for body in (b"1", b"2", b"3", b"4"):
        ch.basic_publish("", q, body)
    assert drain(ch, q) == [b"3", b"4"]
    assert wait_count(ch, dlq, 2)
    deaths = []
    for _ in range(2):
        _m, props, body = _get_message(ch, dlq)
        deaths.append((body, props.headers["x-death"][0]["reason"]))
    assert deaths == [(b"1", "maxlen"), (b"2", "maxlen")]


def test_reject_publish_dlx_nacks_and_dead_letters(connection, names):
    ch = confirm_channel(connection)
    q, _dlx, dlq = _dlx_setup(ch, names, **{"x-max-length": 1, "x-overflow": "reject-publish-dlx"})
    ch.basic_publish("", q, b"fits")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", q, b"turned away")
    assert drain(ch, q) == [b"fits"]
    _m, props, body = _get_message(ch, dlq)
    assert body == b"turned away"
    (death,) = props.headers["x-death"]
    assert death["reason"] == "maxlen"
    assert death["queue"] == q


def test_reject_publish_does_not_dead_letter(connection, names):
    ch = confirm_channel(connection)
    q, _dlx, dlq = _dlx_setup(ch, names, **{"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.basic_publish("", q, b"fits")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", q, b"turned away")
    connection.process_data_events(time_limit=0.1)
    assert ch.queue_declare(dlq, passive=True).method.message_count == 0


def test_x_death_routing_keys_include_cc(connection, names):
    ch = confirm_channel(connection)
    ex = names.exchange("src-ex")
    ch.exchange_declare(ex, "direct")
    q, _dlx, dlq = _dlx_setup(ch, names)
    ch.queue_bind(q, ex, routing_key="main")
    props = pika.BasicProperties(headers={"CC": ["copy"]})
    ch.basic_publish(ex, "main", b"x", properties=props)
    method, _p, _b = _get_unacked(ch, q)
    ch.basic_reject(method.delivery_tag, requeue=False)
    _m, props, _b = _get_message(ch, dlq)
    (death,) = props.headers["x-death"]
    assert death["exchange"] == ex
    assert death["routing-keys"] == ["main", "copy"]
    assert props.headers["x-first-death-exchange"] == ex


def test_dead_letter_to_original_keys_routes_by_cc_too(connection, names):
    """Without x-dead-letter-routing-key the message is routed by all its keys, CC included."""
    ch = confirm_channel(connection)
    ex = names.exchange("src-ex")
    ch.exchange_declare(ex, "direct")
    dlx = names.exchange("dlx")
    ch.exchange_declare(dlx, "direct")
    by_cc = names.queue("by-cc")
    ch.queue_declare(by_cc)
    ch.queue_bind(by_cc, dlx, routing_key="copy")
    q = names.queue("src")
    ch.queue_declare(q, arguments={"x-dead-letter-exchange": dlx})
    ch.queue_bind(q, ex, routing_key="main")
    ch.basic_publish(ex, "main", b"x", properties=pika.BasicProperties(headers={"CC": ["copy"]}))
    method, _p, _b = _get_unacked(ch, q)
    ch.basic_reject(method.delivery_tag, requeue=False)
    method, _props, body = _get_message(ch, by_cc)
    assert body == b"x"


def test_x_death_is_newest_first_and_a_repeat_moves_to_front(connection, names):
    """a --(reject)--> b --(reject)--> a --(reject)--> b: x-death keeps one entry per queue."""
    ch = confirm_channel(connection)
    a = names.queue("a")
    b = names.queue("b")
    ch.queue_declare(a, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": b})
    ch.queue_declare(b, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": a})
    ch.basic_publish("", a, b"ping-pong")

    def bounce(src):
        method, props, _body = _get_unacked(ch, src)
        ch.basic_reject(method.delivery_tag, requeue=False)
        return props.headers

    assert bounce(a) is None
    headers = bounce(b)
    assert [(d["queue"], d["reason"], d["count"]) for d in headers["x-death"]] == [
        (a, "rejected", 1)
    ]
    headers = bounce(a)
    assert [(d["queue"], d["reason"], d["count"]) for d in headers["x-death"]] == [
        (b, "rejected", 1),
        (a, "rejected", 1),
    ]
    assert headers["x-death"][0]["routing-keys"] == [b]
    assert headers["x-death"][1]["routing-keys"] == [a]
    headers = bounce(b)
    # the repeated (a, rejected) entry was incremented and moved to the front
    assert [(d["queue"], d["reason"], d["count"]) for d in headers["x-death"]] == [
        (a, "rejected", 2),
        (b, "rejected", 1),
    ]
    # the first death never changes
    assert headers["x-first-death-queue"] == a
    assert headers["x-first-death-reason"] == "rejected"
    assert headers["x-first-death-exchange"] == ""
    method, props, _body = _get_unacked(ch, a)
    assert [(d["queue"], d["count"]) for d in props.headers["x-death"]] == [(b, 2), (a, 2)]
    ch.basic_ack(method.delivery_tag)


def test_same_queue_different_reasons_are_separate_entries(connection, names):
    """work --(reject)--> retry --(expire)--> work: the retry-with-delay pattern."""
    ch = confirm_channel(connection)
    work = names.queue("work")
    retry = names.queue("retry")
    ch.queue_declare(
        work, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": retry}
    )
    ch.queue_declare(
        retry,
        arguments={
            "x-message-ttl": 50,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": work,
        },
    )
    ch.basic_publish("", work, b"job")
    for attempt in (1, 2, 3):
        method, props, _b = _get_unacked(ch, work)
        if attempt == 1:
            assert props.headers is None
        else:
            deaths = props.headers["x-death"]
            assert [(d["queue"], d["reason"], d["count"]) for d in deaths] == [
                (retry, "expired", attempt - 1),
                (work, "rejected", attempt - 1),
            ]
            assert deaths[0]["routing-keys"] == [retry]
            assert deaths[0]["exchange"] == ""
            assert deaths[1]["routing-keys"] == [work]
            assert props.headers["x-first-death-reason"] == "rejected"
            assert props.headers["x-first-death-queue"] == work
        ch.basic_reject(method.delivery_tag, requeue=False)
    method, props, _b = _get_unacked(ch, work)
    assert props.headers["x-death"][0]["count"] == 3
    ch.basic_ack(method.delivery_tag)


def test_x_death_field_types(connection, names, amqp_host_port):
    """count is a long ('l'), time a timestamp ('T'), routing-keys an array of longstr."""
    ch = confirm_channel(connection)
    q, _dlx, dlq = _dlx_setup(ch, names, **{"x-message-ttl": 60000})
    ch.basic_publish("", q, b"x", properties=pika.BasicProperties(expiration="50"))
    assert wait_count(ch, dlq, 1)
    headers = raw_get_tagged_headers(*amqp_host_port, dlq)
    tag, deaths = headers["x-death"]
    assert tag == "A"
    ((entry_tag, entry),) = deaths
    assert entry_tag == "F"
    assert entry["count"][0] == "l"
    assert entry["count"][1] == 1
    assert entry["time"][0] == "T"
    assert entry["reason"] == ("S", b"expired")
    assert entry["queue"] == ("S", q.encode())
    assert entry["exchange"] == ("S", b"")
    assert entry["original-expiration"] == ("S", b"50")
    assert entry["routing-keys"] == ("A", [("S", q.encode())])
    assert untag(headers["x-first-death-reason"]) == b"expired"
    assert headers["x-first-death-queue"] == ("S", q.encode())
    assert headers["x-first-death-exchange"] == ("S", b"")


def test_expiry_cycle_to_itself_drops_message(connection, names):
    """A queue dead-lettering expired messages to itself: the cycle is cut, the message dropped."""
    ch = confirm_channel(connection)
    q = names.queue("self")
    watch = names.queue("watch")
    ch.queue_declare(watch)
    ch.queue_declare(
        q,
        arguments={
            "x-message-ttl": 50,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": q,
        },
    )
    ch.basic_publish("", q, b"round and round")
    assert wait_count(ch, q, 0)
    # stays gone: it is not going round in circles
    for _ in range(5):
        connection.process_data_events(time_limit=0.1)
        assert ch.queue_declare(q, passive=True).method.message_count == 0
    assert ch.basic_get(q, auto_ack=True)[0] is None


def test_rejection_cycle_to_itself_goes_round(connection, names):
    ch = confirm_channel(connection)
    q = names.queue("self")
    ch.queue_declare(q, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": q})
    ch.basic_publish("", q, b"again and again")
    counts = []
    for _ in range(3):
        method, props, body = _get_unacked(ch, q)
        assert body == b"again and again"
        counts.append(props.headers and props.headers["x-death"][0]["count"])
        ch.basic_reject(method.delivery_tag, requeue=False)
    assert counts == [None, 1, 2]
    method, props, _b = _get_unacked(ch, q)
    assert props.headers["x-death"][0]["reason"] == "rejected"
    assert props.headers["x-death"][0]["queue"] == q
    ch.basic_ack(method.delivery_tag)


def test_missing_dead_letter_exchange_drops_silently(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q, arguments={"x-dead-letter-exchange": names.exchange("never-declared")})
    ch.basic_publish("", q, b"x")
    method, _p, _b = _get_unacked(ch, q)
    ch.basic_reject(method.delivery_tag, requeue=False)
    connection.process_data_events(time_limit=0.1)
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    assert connection.is_open and ch.is_open


@pytest.mark.leveret_only
def test_x_last_death_headers(connection, names):
    """Leveret writes x-last-death-* (as RabbitMQ 3.13 does; 3.10 does not)."""
    ch = confirm_channel(connection)
    work = names.queue("work")
    retry = names.queue("retry")
    ch.queue_declare(
        work, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": retry}
    )
    ch.queue_declare(
        retry,
        arguments={
            "x-message-ttl": 50,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": work,
        },
    )
    ch.basic_publish("", work, b"job")
    method, _p, _b = _get_unacked(ch, work)
    ch.basic_reject(method.delivery_tag, requeue=False)
    method, props, _b = _get_unacked(ch, work)
    headers = props.headers
    assert headers["x-first-death-reason"] == "rejected"
    assert headers["x-first-death-queue"] == work
    assert headers["x-last-death-reason"] == "expired"
    assert headers["x-last-death-queue"] == retry
    assert headers["x-last-death-exchange"] == ""
    ch.basic_ack(method.delivery_tag)


def test_dead_letter_with_aio_pika(amqp_url, names):
    import asyncio

    import aio_pika

    async def main():
        conn = await aio_pika.connect(amqp_url, timeout=5)
        async with conn:
            ch = await conn.channel()
            dlx = await ch.declare_exchange(names.exchange("dlx"), aio_pika.ExchangeType.FANOUT)
            dlq = await ch.declare_queue(names.queue("dlq"))
            await dlq.bind(dlx)
            q = await ch.declare_queue(
                names.queue("src"), arguments={"x-dead-letter-exchange": dlx.name}
            )
            await ch.default_exchange.publish(aio_pika.Message(b"aio"), q.name)
            message = None
            for _ in range(250):
                message = await q.get(no_ack=False, fail=False)
                if message:
                    break
                await asyncio.sleep(0.02)
            await message.reject(requeue=False)
            for _ in range(250):
                dead = await dlq.get(no_ack=True, fail=False)
                if dead:
                    return dead
                await asyncio.sleep(0.02)
            raise AssertionError("not dead-lettered")

    dead = asyncio.run(asyncio.wait_for(main(), 20))
    assert dead.body == b"aio"
    (death,) = dead.headers["x-death"]
    assert death["reason"] == "rejected"
    assert death["count"] == 1
    assert dead.headers["x-first-death-reason"] == "rejected"
