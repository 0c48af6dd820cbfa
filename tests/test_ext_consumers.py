"""Consumer extensions: single active consumer, consumer priorities, ack timeout."""

from __future__ import annotations

import pika
import pytest

from conftest import connection_params, wait_until
from ext_helpers import Consumer, confirm_channel

# --- single active consumer --------------------------------------------------------


def _sac_queue(ch, names):
    q = names.queue("sac")
    ch.queue_declare(q, arguments={"x-single-active-consumer": True})
    return q


def test_single_active_consumer_only_first_receives(connection, names):
    ch = confirm_channel(connection)
    q = _sac_queue(ch, names)
    first = Consumer(connection.channel(), q, auto_ack=True)
    second = Consumer(connection.channel(), q, auto_ack=True)
    for i in range(6):
        ch.basic_publish("", q, str(i).encode())
    assert wait_until(connection, lambda: len(first.got) == 6)
    connection.process_data_events(time_limit=0.1)
    assert first.bodies == [str(i).encode() for i in range(6)]
    assert second.got == []
    # both are registered consumers
    assert ch.queue_declare(q, passive=True).method.consumer_count == 2


def test_single_active_consumer_fails_over_on_cancel(connection, names):
    ch = confirm_channel(connection)
    q = _sac_queue(ch, names)
    first_ch = connection.channel()
    first = Consumer(first_ch, q, auto_ack=True)
    second = Consumer(connection.channel(), q, auto_ack=True)
    third = Consumer(connection.channel(), q, auto_ack=True)
    ch.basic_publish("", q, b"to-first")
    assert wait_until(connection, lambda: len(first.got) == 1)
    first_ch.basic_cancel(first.tag)
    for i in range(3):
        ch.basic_publish("", q, f"after-{i}".encode())
    assert wait_until(connection, lambda: len(second.got) == 3)
    connection.process_data_events(time_limit=0.1)
    assert second.bodies == [b"after-0", b"after-1", b"after-2"]
    assert third.got == [] and len(first.got) == 1


def test_single_active_consumer_fails_over_on_channel_close(connection, connect, names):
    ch = confirm_channel(connection)
    q = _sac_queue(ch, names)
    other = connect()
    first_ch = other.channel()
    first_ch.basic_qos(prefetch_count=10)
    first = Consumer(first_ch, q)  # manual ack: it never acks
    second_ch = connection.channel()
    second = Consumer(second_ch, q)
    for i in range(3):
        ch.basic_publish("", q, str(i).encode())
    assert wait_until(other, lambda: len(first.got) == 3)
    connection.process_data_events(time_limit=0.1)
    assert second.got == []
    first_ch.close()  # its unacked messages are requeued and go to the new active one
    assert wait_until(connection, lambda: len(second.got) == 3)
    assert second.bodies == [b"0", b"1", b"2"]
    assert all(method.redelivered for method, _p, _b in second.got)
    ch.basic_publish("", q, b"3")
    assert wait_until(connection, lambda: len(second.got) == 4)


def test_single_active_consumer_fails_over_on_connection_close(connection, connect, names):
    ch = confirm_channel(connection)
    q = _sac_queue(ch, names)
    other = connect()
    first = Consumer(other.channel(), q, auto_ack=True)
    second = Consumer(connection.channel(), q, auto_ack=True)
    ch.basic_publish("", q, b"a")
    assert wait_until(other, lambda: len(first.got) == 1)
    other.close()
    ch.basic_publish("", q, b"b")
    assert wait_until(connection, lambda: len(second.got) == 1)
    assert second.bodies == [b"b"]


def test_without_single_active_consumer_round_robin(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q)
    first = Consumer(connection.channel(), q, auto_ack=True)
    second = Consumer(connection.channel(), q, auto_ack=True)
    for i in range(4):
        ch.basic_publish("", q, str(i).encode())
    assert wait_until(connection, lambda: len(first.got) + len(second.got) == 4)
    assert first.got and second.got


# --- consumer priorities -----------------------------------------------------------


def test_high_priority_consumer_first_then_low_when_full(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q)
    low_ch = connection.channel()
    low_ch.basic_qos(prefetch_count=10)
    low = Consumer(low_ch, q)  # default priority 0
    high_ch = connection.channel()
    high_ch.basic_qos(prefetch_count=2)
    high = Consumer(high_ch, q, arguments={"x-priority": 10})
    for i in range(5):
        ch.basic_publish("", q, str(i).encode())
    assert wait_until(connection, lambda: len(high.got) + len(low.got) == 5)
    assert high.bodies == [b"0", b"1"]
    assert low.bodies == [b"2", b"3", b"4"]
    # the high-priority consumer has room again: it gets the next messages
    high_ch.basic_ack(high.got[-1][0].delivery_tag, multiple=True)
    ch.basic_publish("", q, b"5")
    ch.basic_publish("", q, b"6")
    assert wait_until(connection, lambda: len(high.got) == 4)
    connection.process_data_events(time_limit=0.1)
    assert high.bodies[2:] == [b"5", b"6"]
    assert len(low.got) == 3


def test_consumer_priority_with_backlog(connection, names):
    """Existing messages go to the high-priority consumer as it frees capacity."""
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q)
    for i in range(4):
        ch.basic_publish("", q, str(i).encode())
    got = []

    def handler(who):
        def on_message(c, method, props, body):
            got.append((who, body))
            c.basic_ack(method.delivery_tag)

        return on_message

    high_ch = connection.channel()
    high_ch.basic_qos(prefetch_count=1)
    high_ch.basic_consume(q, handler("high"), arguments={"x-priority": 5})
    low_ch = connection.channel()
    low_ch.basic_qos(prefetch_count=1)
    low_ch.basic_consume(q, handler("low"), arguments={"x-priority": -5})
    for i in range(4, 8):
        ch.basic_publish("", q, str(i).encode())
    assert wait_until(connection, lambda: len(got) == 8)
    assert [who for who, _b in got].count("high") >= 4


def test_negative_and_positive_consumer_priorities(connection, names):
    ch = confirm_channel(connection)
    q = names.queue()
    ch.queue_declare(q)
    neg = Consumer(connection.channel(), q, auto_ack=True, arguments={"x-priority": -1})
    zero = Consumer(connection.channel(), q, auto_ack=True)
    for i in range(3):
        ch.basic_publish("", q, str(i).encode())
    assert wait_until(connection, lambda: len(zero.got) == 3)
    connection.process_data_events(time_limit=0.1)
    assert neg.got == []


# --- consumer acknowledgement timeout (Leveret config; RabbitMQ's is 30 min) ---------


@pytest.mark.leveret_only
def test_consumer_ack_timeout_closes_channel_and_redelivers():
    from leveret.testing import embedded_broker

    with embedded_broker(consumer_timeout_ms=500) as broker:
        slow_conn = pika.BlockingConnection(connection_params(broker.url))
        other_conn = pika.BlockingConnection(connection_params(broker.url))
        try:
            slow_ch = slow_conn.channel()
            assert slow_ch.channel_number == 1
            closed = []
            slow_ch._impl.add_on_close_callback(lambda _ch, reason: closed.append(reason))
            slow_ch.queue_declare("work")
            slow = Consumer(slow_ch, "work")  # never acks
            pub = confirm_channel(other_conn)
            pub.basic_publish("", "work", b"job")
            assert wait_until(slow_conn, lambda: len(slow.got) == 1)
            assert wait_until(slow_conn, lambda: bool(closed), timeout=10)
            reason = closed[0]
            assert reason.reply_code == 406
            assert reason.reply_text.startswith("PRECONDITION_FAILED")
            assert "delivery acknowledgement on channel 1 timed out" in reason.reply_text
            assert slow_conn.is_open  # only the channel is closed
            # the message went back to the queue: another consumer gets it
            taker = Consumer(other_conn.channel(), "work", auto_ack=True)
            assert wait_until(other_conn, lambda: len(taker.got) == 1)
            method, _props, body = taker.got[0]
            assert body == b"job"
            assert method.redelivered
        finally:
            for conn in (slow_conn, other_conn):
                if conn.is_open:
                    conn.close()


@pytest.mark.leveret_only
def test_consumer_ack_in_time_keeps_channel_open():
    from leveret.testing import embedded_broker

    with embedded_broker(consumer_timeout_ms=500) as broker:
        conn = pika.BlockingConnection(connection_params(broker.url))
        try:
            ch = conn.channel()
            ch.queue_declare("work")
            pub = confirm_channel(conn)
            got = []

            def on_message(c, method, props, body):
                got.append(body)
                c.basic_ack(method.delivery_tag)

            ch.basic_consume("work", on_message)
            for i in range(3):
                pub.basic_publish("", "work", str(i).encode())
                assert wait_until(conn, lambda i=i: len(got) == i + 1)
                conn.process_data_events(time_limit=0.3)
            conn.process_data_events(time_limit=0.5)
            assert ch.is_open
        finally:
            if conn.is_open:
                conn.close()
