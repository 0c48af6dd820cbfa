"""Queues: declare (server-named, passive, exclusive, auto-delete), purge, delete, bind."""

from __future__ import annotations

import pika
import pika.exceptions
import pytest

from conftest import drain, wait_until


def _closed_with(code):
    return pytest.raises(pika.exceptions.ChannelClosedByBroker, match=str(code))


def test_server_named_queue(channel):
    ok = channel.queue_declare("", exclusive=True)
    assert ok.method.queue.startswith("amq.gen-")
    assert ok.method.message_count == 0
    assert ok.method.consumer_count == 0
    other = channel.queue_declare("", exclusive=True)
    assert other.method.queue != ok.method.queue


def test_passive_declare_missing_queue(connection, names):
    ch = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare(names.queue("missing"), passive=True)
    assert info.value.reply_code == 404
    assert info.value.reply_text.startswith("NOT_FOUND")
    assert connection.is_open


def test_declare_ok_counts(connection, names):
    ch = connection.channel()
    ch.confirm_delivery()
    q = names.queue()
    ch.queue_declare(q)
    for i in range(3):
        ch.basic_publish("", q, str(i).encode())
    consumer_ch = connection.channel()
    consumer_ch.basic_qos(prefetch_count=1)
    consumer_ch.basic_consume(q, lambda *a: None)
    # one message goes to the (prefetch 1) consumer, unacked; two stay ready
    assert wait_until(
        connection, lambda: ch.queue_declare(q, passive=True).method.message_count == 2
    )
    ok = ch.queue_declare(q, passive=True)
    assert ok.method.consumer_count == 1
    assert ok.method.queue == q
    ok = ch.queue_declare(q)  # active redeclare reports the same counts
    assert (ok.method.message_count, ok.method.consumer_count) == (2, 1)


def test_redeclare_with_different_properties(connection, names):
    ch = connection.channel()
    q = names.queue()
    ch.queue_declare(q, durable=False)
    ch.queue_declare(q, durable=False)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare(q, durable=True)
    assert info.value.reply_code == 406
    ch = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare(q, arguments={"x-max-length": 10})
    assert info.value.reply_code == 406
    ch = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare(q, auto_delete=True)
    assert info.value.reply_code == 406


def test_declare_reserved_prefix_refused(channel):
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        channel.queue_declare("amq.leveret-test")
    assert info.value.reply_code == 403


def test_exclusive_queue_locked_for_other_connections(connect, names):
    owner = connect().channel()
    q = names.queue("exclusive")
    owner.queue_declare(q, exclusive=True)
    owner.basic_publish("", q, b"mine")
    other_conn = connect()
    for action in [
        lambda ch: ch.queue_declare(q),
        lambda ch: ch.queue_declare(q, passive=True),
        lambda ch: ch.basic_consume(q, lambda *a: None),
        lambda ch: ch.basic_get(q),
        lambda ch: ch.queue_purge(q),
        lambda ch: ch.queue_delete(q),
        lambda ch: ch.queue_bind(q, "amq.fanout"),
    ]:
        ch = other_conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            action(ch)
        assert info.value.reply_code == 405
        assert info.value.reply_text.startswith("RESOURCE_LOCKED")
    assert other_conn.is_open
    # publishing to it from another connection is allowed
    pub = other_conn.channel()
    pub.confirm_delivery()
    pub.basic_publish("", q, b"theirs", mandatory=True)
    assert drain(owner, q) == [b"mine", b"theirs"]


def test_exclusive_queue_deleted_with_its_connection(connect, names):
    conn = connect()
    q = names.queue("exclusive")
    conn.channel().queue_declare(q, exclusive=True)
    conn.close()
    ch = connect().channel()
    with _closed_with(404):
        ch.queue_declare(q, passive=True)


def test_exclusive_queue_survives_channel_close(connect, names):
    conn = connect()
    ch = conn.channel()
    q = names.queue("exclusive")
    ch.queue_declare(q, exclusive=True)
    ch.close()
    conn.channel().queue_declare(q, passive=True)


def test_auto_delete_queue_deleted_after_last_consumer(connection, names):
    ch = connection.channel()
    q = names.queue("autodel")
    ch.queue_declare(q, auto_delete=True)
    ch.queue_declare(q, passive=True)  # no consumer yet: still there
    tag1 = ch.basic_consume(q, lambda *a: None)
    tag2 = ch.basic_consume(q, lambda *a: None)
    ch.basic_cancel(tag1)
    ch.queue_declare(q, passive=True)  # one consumer left
    ch.basic_cancel(tag2)
    probe = connection.channel()
    with _closed_with(404):
        probe.queue_declare(q, passive=True)


def test_auto_delete_queue_deleted_when_consumer_channel_closes(connection, names):
    ch = connection.channel()
    q = names.queue("autodel")
    ch.queue_declare(q, auto_delete=True)
    consumer = connection.channel()
    consumer.basic_consume(q, lambda *a: None)
    consumer.close()
    with _closed_with(404):
        ch.queue_declare(q, passive=True)


def test_purge(connection, names):
    ch = connection.channel()
    ch.confirm_delivery()
    q = names.queue()
    ch.queue_declare(q)
    for i in range(5):
        ch.basic_publish("", q, str(i).encode())
    assert ch.queue_purge(q).method.message_count == 5
    assert ch.queue_purge(q).method.message_count == 0
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_purge_leaves_unacked_messages(connection, names):
    ch = connection.channel()
    ch.confirm_delivery()
    q = names.queue()
    ch.queue_declare(q)
    for i in range(3):
        ch.basic_publish("", q, str(i).encode())
    method, _p, body = ch.basic_get(q)
    assert body == b"0"
    assert ch.queue_purge(q).method.message_count == 2
    ch.basic_nack(method.delivery_tag, requeue=True)
    assert drain(ch, q) == [b"0"]


def test_delete_reports_message_count(connection, names):
    ch = connection.channel()
    ch.confirm_delivery()
    q = names.queue()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"a")
    ch.basic_publish("", q, b"b")
    assert ch.queue_delete(q).method.message_count == 2
    with _closed_with(404):
        ch.queue_declare(q, passive=True)


def test_delete_missing_queue_is_ok(channel, names):
    """RabbitMQ 3.x answers delete-ok (message_count 0) for a missing queue."""
    assert channel.queue_delete(names.queue("never")).method.message_count == 0


def test_delete_if_empty(connection, names):
    ch = connection.channel()
    ch.confirm_delivery()
    q = names.queue()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"x")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_delete(q, if_empty=True)
    assert info.value.reply_code == 406
    ch = connection.channel()
    drain(ch, q)
    ch.queue_delete(q, if_empty=True)


def test_delete_if_unused(connection, names):
    ch = connection.channel()
    q = names.queue()
    ch.queue_declare(q)
    tag = ch.basic_consume(q, lambda *a: None)
    other = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        other.queue_delete(q, if_unused=True)
    assert info.value.reply_code == 406
    ch.basic_cancel(tag)
    connection.channel().queue_delete(q, if_unused=True)


def test_bind_and_unbind(connection, names):
    ch = connection.channel()
    ch.confirm_delivery()
    x = names.exchange("direct")
    ch.exchange_declare(x, "direct")
    q = names.queue()
    ch.queue_declare(q)
    ch.queue_bind(q, x, routing_key="k1")
    ch.queue_bind(q, x, routing_key="k1")  # idempotent
    ch.queue_bind(q, x, routing_key="k2")
    ch.basic_publish(x, "k1", b"1")
    ch.basic_publish(x, "k2", b"2")
    assert drain(ch, q) == [b"1", b"2"]
    ch.queue_unbind(q, x, routing_key="k1")
    ch.queue_unbind(q, x, routing_key="k-never-bound")  # RabbitMQ: unbind-ok
    ch.basic_publish(x, "k1", b"1")
    ch.basic_publish(x, "k2", b"2")
    assert drain(ch, q) == [b"2"]


def test_bind_to_missing_queue_or_exchange(connection, names):
    ch = connection.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    with _closed_with(404):
        ch.queue_bind(q, names.exchange("missing"))
    ch = connection.channel()
    with _closed_with(404):
        ch.queue_bind(names.queue("missing"), "amq.direct", routing_key="x")


def test_queue_deleted_removes_bindings(connection, names):
    ch = connection.channel()
    ch.confirm_delivery()
    x = names.exchange("fanout")
    ch.exchange_declare(x, "fanout")
    q = names.queue()
    ch.queue_declare(q)
    ch.queue_bind(q, x)
    ch.queue_delete(q)
    ch.queue_declare(q)
    ch.basic_publish(x, "", b"nothing bound")
    assert drain(ch, q) == []


def test_default_binding_of_every_queue(connection, names):
    ch = connection.channel()
    ch.confirm_delivery()
    q = names.queue()
    ch.queue_declare(q)
    ch.basic_publish("", q, b"by name", mandatory=True)
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("", q + ".nope", b"no such queue", mandatory=True)
    assert drain(ch, q) == [b"by name"]


def test_fifo_order(connection, names):
    ch = connection.channel()
    ch.confirm_delivery()
    q = names.queue()
    ch.queue_declare(q)
    bodies = [str(i).encode() for i in range(50)]
    for b in bodies:
        ch.basic_publish("", q, b)
    assert drain(ch, q) == bodies


def test_queue_with_no_name_uses_last_declared(connection):
    """An empty queue name means the channel's last declared queue; RabbitMQ
    answers 404 "no previously declared queue" when there is none."""
    ch = connection.channel()
    with _closed_with(404):
        ch.basic_get("")
    ch = connection.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.confirm_delivery()
    ch.basic_publish("", q, b"x")
    method, _props, body = ch.basic_get("", auto_ack=True)
    assert body == b"x"


# Unbinding is idempotent in RabbitMQ 3.10.8: each of these answers unbind-ok
# (checked with the same pika calls against the reference broker).  aio-pika's
# RPC.close() unbinds its reply queue after the queue was auto-deleted.


def test_unbind_missing_queue_is_ok(connection, names):
    ch = connection.channel()
    ch.queue_unbind(names.queue("gone"), "amq.direct", "k")
    assert ch.is_open


def test_unbind_from_missing_exchange_is_ok(connection, names):
    ch = connection.channel()
    q = names.queue()
    ch.queue_declare(q)
    ch.queue_unbind(q, names.exchange("gone"), "k")
    ch.queue_unbind(names.queue("gone"), names.exchange("gone"), "k")
    assert ch.is_open
    ch.queue_delete(q)


def test_exchange_unbind_missing_ends_is_ok(connection, names):
    ch = connection.channel()
    ch.exchange_unbind(destination=names.exchange("gone"), source="amq.direct", routing_key="k")
    ch.exchange_unbind(destination="amq.fanout", source=names.exchange("gone"), routing_key="k")
    assert ch.is_open


def test_unbind_after_auto_delete_queue_went(connection, names):
    """The aio-pika RPC teardown: cancel, the auto-delete queue goes, then unbind."""
    ch = connection.channel()
    x = names.exchange()
    ch.exchange_declare(x, "direct")
    q = ch.queue_declare("", auto_delete=True).method.queue
    ch.queue_bind(q, x, "k")
    tag = ch.basic_consume(q, lambda *a: None)
    ch.basic_cancel(tag)
    with _closed_with(404):
        connection.channel().queue_declare(q, passive=True)
    ch.queue_unbind(q, x, "k")
    assert ch.is_open
    ch.exchange_delete(x)


def test_unbind_default_exchange_still_refused(connection, names):
    ch = connection.channel()
    q = names.queue()
    ch.queue_declare(q)
    with _closed_with(403) as info:
        ch.queue_unbind(q, "", q)
    assert "operation not permitted on the default exchange" in info.value.reply_text
    ch2 = connection.channel()
    with _closed_with(403):
        ch2.exchange_unbind(destination="amq.fanout", source="", routing_key="k")
    connection.channel().queue_delete(q)


def test_delete_ok_comes_before_the_cancel_notification(raw, names):
    """Order pinned against RabbitMQ 3.10.8: queue.delete-ok, then basic.cancel."""
    from pamqp import commands as c

    client = raw()
    client.handshake()
    client.send_method(1, c.Channel.Open())
    client.wait_for(c.Channel.OpenOk)
    q = names.queue()
    client.send_method(1, c.Queue.Declare(queue=q))
    client.wait_for(c.Queue.DeclareOk)
    client.publish(1, "", q, b"m")
    client.send_method(1, c.Basic.Consume(queue=q, consumer_tag="t1"))
    client.wait_for(c.Basic.ConsumeOk)
    client.wait_for(c.Basic.Deliver)
    client.send_method(1, c.Queue.Delete(queue=q))
    _ch, first = client.wait_for(c.Queue.DeleteOk, c.Basic.Cancel)
    _ch, second = client.wait_for(c.Queue.DeleteOk, c.Basic.Cancel)
    assert isinstance(first, c.Queue.DeleteOk)
    assert first.message_count == 0  # the one message is unacked, not ready
    assert isinstance(second, c.Basic.Cancel)
    assert second.consumer_tag == "t1"
