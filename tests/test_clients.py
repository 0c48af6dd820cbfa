"""End-to-end through other client stacks: pika's asyncio adapter, aio-pika, kombu."""

from __future__ import annotations

import asyncio

import aio_pika
import kombu
import pika
import pytest
from pika.adapters.asyncio_connection import AsyncioConnection

from conftest import connection_params


def test_pika_asyncio_adapter_publish_consume(amqp_url):
    """Callback-style pika on an asyncio loop: declare, consume, publish, ack, close."""
    loop = asyncio.new_event_loop()
    state: dict = {"received": [], "error": None}
    done = loop.create_future()

    def fail(exc):
        if not done.done():
            done.set_exception(exc if isinstance(exc, BaseException) else RuntimeError(exc))

    def on_open(conn):
        conn.channel(on_open_callback=on_channel)

    def on_channel(ch):
        state["channel"] = ch
        ch.add_on_close_callback(lambda _ch, reason: fail(reason) if not done.done() else None)
        ch.confirm_delivery(
            ack_nack_callback=lambda frame: state.setdefault("acks", []).append(frame)
        )
        ch.queue_declare("", exclusive=True, callback=on_declared)

    def on_declared(frame):
        q = frame.method.queue
        state["channel"].basic_qos(prefetch_count=5)
        state["channel"].basic_consume(q, on_message)
        for i in range(3):
            state["channel"].basic_publish("", q, f"m{i}".encode())

    def on_message(ch, method, props, body):
        state["received"].append(body)
        ch.basic_ack(method.delivery_tag)
        if len(state["received"]) == 3 and not done.done():
            done.set_result(None)

    conn = AsyncioConnection(
        connection_params(amqp_url),
        on_open_callback=on_open,
        on_open_error_callback=lambda _c, err: fail(err),
        custom_ioloop=loop,
    )
    try:
        loop.run_until_complete(asyncio.wait_for(done, 10))
        closed = loop.create_future()
        conn.add_on_close_callback(lambda _c, _r: closed.done() or closed.set_result(None))
        conn.close()
        loop.run_until_complete(asyncio.wait_for(closed, 10))
    finally:
        loop.close()
    assert state["received"] == [b"m0", b"m1", b"m2"]
    assert len(state["acks"]) >= 1


def test_aio_pika_consume_and_qos(amqp_url):
    async def main():
        conn = await aio_pika.connect_robust(amqp_url, timeout=5)
        async with conn:
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=2)
            q = await ch.declare_queue("", exclusive=True)
            for i in range(5):
                await ch.default_exchange.publish(aio_pika.Message(f"{i}".encode()), q.name)
            got = []
            async with q.iterator() as it:
                async for message in it:
                    async with message.process():
                        got.append(message.body)
                    if len(got) == 5:
                        break
            return got

    got = asyncio.run(asyncio.wait_for(main(), 20))
    assert got == [b"0", b"1", b"2", b"3", b"4"]


def test_aio_pika_topic_exchange_and_server_cancel(amqp_url, names):
    x = names.exchange("aio-topic")

    async def main():
        conn = await aio_pika.connect(amqp_url, timeout=5)
        async with conn:
            ch = await conn.channel()
            exchange = await ch.declare_exchange(x, aio_pika.ExchangeType.TOPIC)
            q = await ch.declare_queue("", exclusive=True)
            await q.bind(exchange, routing_key="a.*")
            await exchange.publish(aio_pika.Message(b"hit"), routing_key="a.b")
            await exchange.publish(aio_pika.Message(b"miss"), routing_key="b.a")
            message = await q.get(timeout=5)
            await message.ack()
            empty = await q.get(timeout=5, fail=False)
            # a consumer on a queue deleted by someone else is cancelled by the server
            victim = await ch.declare_queue(names.queue("aio-victim"))
            cancelled: asyncio.Queue = asyncio.Queue()
            underlay = await ch.get_underlay_channel()
            underlay.on_consumer_cancel_callbacks.add(cancelled.put)

            async def ignore(message):
                pass

            tag = await victim.consume(ignore)
            ch2 = await conn.channel()
            await ch2.queue_delete(victim.name)
            frame = await asyncio.wait_for(cancelled.get(), 5)
            assert frame.consumer_tag == tag
            return message.body, empty

    body, empty = asyncio.run(asyncio.wait_for(main(), 20))
    assert body == b"hit"
    assert empty is None


@pytest.mark.parametrize("login_method", ["PLAIN", "AMQPLAIN"])
def test_kombu_round_trip(amqp_url, names, login_method):
    queue_name = names.queue("kombu")
    exchange = kombu.Exchange(names.exchange("kombu"), type="direct", durable=False)
    queue = kombu.Queue(queue_name, exchange, routing_key="job", durable=False)
    with kombu.Connection(amqp_url, login_method=login_method, connect_timeout=5) as conn:
        producer = conn.Producer(serializer="json")
        producer.publish(
            {"n": 1, "f": 2.5, "items": [1, 2]},
            exchange=exchange,
            routing_key="job",
            declare=[queue],
            headers={"float": 1.25, "nested": {"ok": True}},
            retry=False,
        )
        received = []

        def on_message(body, message):
            received.append((body, message.headers))
            message.ack()

        with conn.Consumer(queue, callbacks=[on_message], accept=["json"]):
            for _ in range(50):
                if received:
                    break
                try:
                    conn.drain_events(timeout=0.1)
                except TimeoutError:
                    pass
    body, headers = received[0]
    assert body == {"n": 1, "f": 2.5, "items": [1, 2]}
    assert headers["float"] == 1.25
    assert headers["nested"] == {"ok": True}


def test_kombu_simple_queue(amqp_url, names):
    with kombu.Connection(amqp_url, connect_timeout=5) as conn:
        name = names.queue("simple")
        names.exchanges.append(name)  # SimpleQueue declares an exchange of the same name
        q = conn.SimpleQueue(name)
        q.put({"hello": "world"})
        message = q.get(block=True, timeout=5)
        message.ack()
        assert message.payload == {"hello": "world"}
        q.close()


def test_pika_blocking_consume_generator(connection):
    ch = connection.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    for i in range(3):
        ch.basic_publish("", q, str(i).encode(), pika.BasicProperties(message_id=str(i)))
    got = []
    for method, props, body in ch.consume(q, inactivity_timeout=5):
        assert method is not None, "timed out"
        got.append((props.message_id, body))
        ch.basic_ack(method.delivery_tag)
        if len(got) == 3:
            break
    ch.cancel()
    assert got == [("0", b"0"), ("1", b"1"), ("2", b"2")]
