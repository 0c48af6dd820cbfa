"""Publisher confirms and transactions."""

from __future__ import annotations

import asyncio

import aio_pika
import pika
import pika.exceptions
import pytest
from pamqp import commands

from conftest import drain

# -- publisher confirms -----------------------------------------------------------


def test_pika_confirm_delivery(connection):
    ch = connection.channel()
    ch.confirm_delivery()
    q = ch.queue_declare("", exclusive=True).method.queue
    for i in range(20):
        ch.basic_publish("", q, str(i).encode())  # raises unless acked
    assert ch.queue_declare(q, passive=True).method.message_count == 20


def test_confirm_unroutable_is_still_acked(connection, names):
    ch = connection.channel()
    ch.confirm_delivery()
    ch.basic_publish("amq.direct", names.queue("nobody"), b"dropped")  # no exception


def test_confirm_nack_on_reject_publish_overflow(connection, names):
    """A full queue with x-overflow=reject-publish nacks the publish."""
    ch = connection.channel()
    ch.confirm_delivery()
    q = names.queue("bounded")
    ch.queue_declare(q, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.basic_publish("", q, b"fits")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", q, b"overflow")
    assert drain(ch, q) == [b"fits"]


def test_raw_confirm_tags(raw):
    client = raw()
    client.handshake()
    client.open_channel(1)
    ok = client.rpc(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
    assert isinstance(ok, commands.Confirm.SelectOk)
    q = client.rpc(1, commands.Queue.Declare(queue="", exclusive=True), commands.Queue.DeclareOk)
    for i in range(5):
        client.publish(1, "", q.queue, str(i).encode())
    confirmed: set[int] = set()
    while len(confirmed) < 5:
        _ch, ack = client.wait_for(commands.Basic.Ack, channel=1)
        if ack.multiple:
            confirmed.update(range(1, ack.delivery_tag + 1))
        else:
            confirmed.add(ack.delivery_tag)
    assert confirmed == {1, 2, 3, 4, 5}


def test_raw_confirm_return_precedes_ack(raw):
    client = raw()
    client.handshake()
    client.open_channel(1)
    client.rpc(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
    client.publish(1, "amq.direct", "leveret-nobody-bound", b"x", mandatory=True)
    _ch, first = client.wait_for(commands.Basic.Return, commands.Basic.Ack, channel=1)
    assert isinstance(first, commands.Basic.Return)
    _ch, ack = client.wait_for(commands.Basic.Ack, channel=1)
    assert ack.delivery_tag == 1


def test_confirm_select_nowait_twice_is_fine(raw):
    client = raw()
    client.handshake()
    client.open_channel(1)
    client.rpc(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
    client.rpc(1, commands.Confirm.Select(), commands.Confirm.SelectOk)


def test_aio_pika_publisher_confirms(amqp_url):
    async def main():
        conn = await aio_pika.connect(amqp_url, timeout=5)
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            q = await ch.declare_queue("", exclusive=True)
            results = []
            for i in range(10):
                confirmation = await ch.default_exchange.publish(
                    aio_pika.Message(str(i).encode()), routing_key=q.name
                )
                results.append(confirmation)
            declared = await ch.declare_queue(q.name, passive=True)
            return results, declared.declaration_result.message_count

    results, count = asyncio.run(asyncio.wait_for(main(), 20))
    assert all(type(r).__name__ == "Ack" for r in results)
    assert count == 10


def test_aio_pika_confirm_mandatory_unroutable(amqp_url):
    async def main():
        conn = await aio_pika.connect(amqp_url, timeout=5)
        async with conn:
            ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
            exchange = await ch.get_exchange("amq.direct")
            with pytest.raises(aio_pika.exceptions.DeliveryError) as info:
                await exchange.publish(
                    aio_pika.Message(b"x"), routing_key="leveret-nobody-bound", mandatory=True
                )
            return info.value

    err = asyncio.run(asyncio.wait_for(main(), 20))
    assert err.message is not None


# -- transactions -----------------------------------------------------------------


def test_tx_commit_publishes(connect):
    conn = connect()
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.tx_select()
    ch.basic_publish("", q, b"a")
    ch.basic_publish("", q, b"b")
    observer = conn.channel()
    assert observer.queue_declare(q, passive=True).method.message_count == 0
    ch.tx_commit()
    assert observer.queue_declare(q, passive=True).method.message_count == 2
    assert drain(observer, q) == [b"a", b"b"]


def test_tx_rollback_discards_publishes(connect):
    conn = connect()
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.tx_select()
    ch.basic_publish("", q, b"lost")
    ch.tx_rollback()
    ch.basic_publish("", q, b"kept")
    ch.tx_commit()
    assert drain(conn.channel(), q) == [b"kept"]


def test_tx_acks_rolled_back(connect):
    conn = connect()
    setup = conn.channel()
    q = setup.queue_declare("", exclusive=True).method.queue
    setup.confirm_delivery()
    setup.basic_publish("", q, b"m")
    ch = conn.channel()
    ch.tx_select()
    method, _props, body = ch.basic_get(q)
    assert body == b"m"
    ch.basic_ack(method.delivery_tag)
    ch.tx_rollback()
    # the ack was rolled back: the message is still unacked on ch
    assert setup.queue_declare(q, passive=True).method.message_count == 0
    ch.close()  # ... so closing the channel requeues it
    method, _props, body = setup.basic_get(q, auto_ack=True)
    assert (body, method.redelivered) == (b"m", True)


def test_tx_acks_committed(connect):
    conn = connect()
    setup = conn.channel()
    q = setup.queue_declare("", exclusive=True).method.queue
    setup.confirm_delivery()
    setup.basic_publish("", q, b"m")
    ch = conn.channel()
    ch.tx_select()
    method, _props, _body = ch.basic_get(q)
    ch.basic_ack(method.delivery_tag)
    ch.tx_commit()
    ch.close()
    assert setup.basic_get(q)[0] is None


def test_tx_rollback_then_ack_again(connect):
    conn = connect()
    setup = conn.channel()
    q = setup.queue_declare("", exclusive=True).method.queue
    setup.confirm_delivery()
    setup.basic_publish("", q, b"m")
    ch = conn.channel()
    ch.tx_select()
    method, _props, _body = ch.basic_get(q)
    ch.basic_ack(method.delivery_tag)
    ch.tx_rollback()
    ch.basic_ack(method.delivery_tag)  # the tag is still valid after rollback
    ch.tx_commit()
    ch.close()
    assert setup.basic_get(q)[0] is None


def test_tx_nack_requeue_committed(connect):
    conn = connect()
    setup = conn.channel()
    q = setup.queue_declare("", exclusive=True).method.queue
    setup.confirm_delivery()
    setup.basic_publish("", q, b"m")
    ch = conn.channel()
    ch.tx_select()
    method, _props, _body = ch.basic_get(q)
    ch.basic_nack(method.delivery_tag, requeue=True)
    assert setup.basic_get(q)[0] is None  # not requeued before commit
    ch.tx_commit()
    method, _props, body = setup.basic_get(q, auto_ack=True)
    assert (body, method.redelivered) == (b"m", True)


def test_tx_publish_to_many_queues_atomic_on_commit(connect):
    conn = connect()
    ch = conn.channel()
    qs = [ch.queue_declare("", exclusive=True).method.queue for _ in range(3)]
    ch.tx_select()
    for q in qs:
        ch.basic_publish("", q, q.encode())
    ch.tx_commit()
    for q in qs:
        assert drain(ch, q) == [q.encode()]


@pytest.mark.parametrize("method", ["commit", "rollback"])
def test_tx_without_select(connection, method):
    ch = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        getattr(ch, f"tx_{method}")()
    assert info.value.reply_code == 406
    assert "not transactional" in info.value.reply_text


def test_confirm_select_on_tx_channel(connection):
    ch = connection.channel()
    ch.tx_select()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.confirm_delivery()
    assert info.value.reply_code == 406
    assert info.value.reply_text.startswith("PRECONDITION_FAILED")
    assert connection.is_open


def test_tx_select_on_confirm_channel(connection):
    ch = connection.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.tx_select()
    assert info.value.reply_code == 406
    assert connection.is_open


def test_raw_tx_mode_switch_errors(raw):
    client = raw()
    client.handshake()
    client.open_channel(1)
    client.open_channel(2)
    client.rpc(1, commands.Tx.Select(), commands.Tx.SelectOk)
    close = client.rpc(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
    assert isinstance(close, commands.Channel.Close)
    assert (close.reply_code, close.class_id, close.method_id) == (406, 85, 10)
    client.send_method(1, commands.Channel.CloseOk())
    client.rpc(2, commands.Confirm.Select(), commands.Confirm.SelectOk)
    close = client.rpc(2, commands.Tx.Select(), commands.Tx.SelectOk)
    assert isinstance(close, commands.Channel.Close)
    assert (close.reply_code, close.class_id, close.method_id) == (406, 90, 10)
