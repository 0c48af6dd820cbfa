"""Direct reply-to: the amq.rabbitmq.reply-to pseudo-queue."""

from __future__ import annotations

import asyncio
import uuid

import pika
import pika.exceptions
import pytest

from conftest import wait_until
from ext_helpers import Consumer, closed_with

REPLY_TO = "amq.rabbitmq.reply-to"


def _start_server(conn, queue):
    """An RPC server on its own channel: replies upper-cased, to reply_to."""
    ch = conn.channel()
    ch.queue_declare(queue)
    seen = []

    def on_request(c, method, props, body):
        seen.append(props.reply_to)
        c.basic_publish(
            "",
            props.reply_to,
            body.upper(),
            properties=pika.BasicProperties(correlation_id=props.correlation_id),
        )
        c.basic_ack(method.delivery_tag)

    ch.basic_consume(queue, on_request)
    return seen


def test_rpc_over_direct_reply_to_pika(connection, connect, names):
    q = names.queue("rpc")
    server_conn = connect()
    seen = _start_server(server_conn, q)
    ch = connection.channel()
    replies = Consumer(ch, REPLY_TO, auto_ack=True)
    for word in (b"hello", b"world"):
        corr = uuid.uuid4().hex
        ch.basic_publish(
            "", q, word, properties=pika.BasicProperties(reply_to=REPLY_TO, correlation_id=corr)
        )

        def arrived(corr=corr):
            server_conn.process_data_events(time_limit=0)
            return any(p.correlation_id == corr for _m, p, _b in replies.got)

        assert wait_until(connection, arrived)
    assert replies.bodies == [b"HELLO", b"WORLD"]
    # the server saw a per-channel address, not the pseudo-queue's name
    assert all(r.startswith(REPLY_TO + ".") for r in seen)
    assert seen[0] == seen[1]
    method = replies.got[0][0]
    assert method.exchange == ""
    assert method.routing_key == seen[0]


def test_consume_reply_to_with_acks_is_refused(connection):
    ch = connection.channel()
    with closed_with(406) as info:
        ch.basic_consume(REPLY_TO, lambda *a: None, auto_ack=False)
    assert info.value.reply_text == "PRECONDITION_FAILED - reply consumer cannot acknowledge"
    assert connection.is_open


def test_publish_with_reply_to_without_consumer_is_refused(connection, names):
    q = names.queue()
    ch = connection.channel()
    ch.queue_declare(q)
    ch.confirm_delivery()
    with closed_with(406) as info:
        ch.basic_publish("", q, b"x", properties=pika.BasicProperties(reply_to=REPLY_TO))
    assert info.value.reply_text == "PRECONDITION_FAILED - fast reply consumer does not exist"
    assert connection.is_open
    check = connection.channel()
    assert check.queue_declare(q, passive=True).method.message_count == 0


def test_reply_to_other_reply_queues_is_ordinary(connection, names):
    """reply_to naming an ordinary queue needs no reply consumer."""
    q = names.queue()
    reply_q = names.queue("replies")
    ch = connection.channel()
    ch.confirm_delivery()
    ch.queue_declare(q)
    ch.queue_declare(reply_q)
    ch.basic_publish("", q, b"x", properties=pika.BasicProperties(reply_to=reply_q))
    _m, props, _b = ch.basic_get(q, auto_ack=True)
    assert props.reply_to == reply_q


def test_reply_after_caller_left_is_dropped(connection, connect, names):
    q = names.queue("rpc")
    server_ch = connection.channel()
    server_ch.queue_declare(q)
    caller = connect()
    caller_ch = caller.channel()
    Consumer(caller_ch, REPLY_TO, auto_ack=True)
    caller_ch.basic_publish("", q, b"x", properties=pika.BasicProperties(reply_to=REPLY_TO))
    method, props = None, None
    for _ in range(250):
        method, props, _b = server_ch.basic_get(q, auto_ack=True)
        if method is not None:
            break
        connection.process_data_events(time_limit=0.02)
    assert props.reply_to.startswith(REPLY_TO + ".")
    caller.close()
    server_ch.confirm_delivery()
    server_ch.basic_publish("", props.reply_to, b"nobody home")  # no error, just dropped
    assert server_ch.is_open and connection.is_open


def test_rpc_over_direct_reply_to_aio_pika(amqp_url, names):
    import aio_pika

    q_name = names.queue("rpc")

    async def main():
        server_conn = await aio_pika.connect(amqp_url, timeout=5)
        client_conn = await aio_pika.connect(amqp_url, timeout=5)
        async with server_conn, client_conn:
            server_ch = await server_conn.channel()
            queue = await server_ch.declare_queue(q_name)

            async def on_request(message: aio_pika.abc.AbstractIncomingMessage):
                async with message.process():
                    await server_ch.default_exchange.publish(
                        aio_pika.Message(
                            b"reply to " + message.body, correlation_id=message.correlation_id
                        ),
                        routing_key=message.reply_to,
                    )

            await queue.consume(on_request)

            client_ch = await client_conn.channel()
            futures: dict[str, asyncio.Future] = {}

            async def on_reply(message: aio_pika.abc.AbstractIncomingMessage):
                futures.pop(message.correlation_id).set_result(message.body)

            reply_queue = aio_pika.Queue(
                client_ch,
                REPLY_TO,
                durable=False,
                exclusive=False,
                auto_delete=False,
                arguments=None,
            )
            await reply_queue.consume(on_reply, no_ack=True)
            results = []
            for i in range(3):
                corr = str(uuid.uuid4())
                futures[corr] = asyncio.get_running_loop().create_future()
                await client_ch.default_exchange.publish(
                    aio_pika.Message(f"req{i}".encode(), reply_to=REPLY_TO, correlation_id=corr),
                    routing_key=q_name,
                )
                results.append(await asyncio.wait_for(futures[corr], 10))
            return results

    results = asyncio.run(asyncio.wait_for(main(), 30))
    assert results == [b"reply to req0", b"reply to req1", b"reply to req2"]


def test_aio_pika_reply_consumer_with_acks_is_refused(amqp_url):
    import aio_pika

    async def main():
        conn = await aio_pika.connect(amqp_url, timeout=5)
        async with conn:
            ch = await conn.channel()
            reply_queue = aio_pika.Queue(
                ch, REPLY_TO, durable=False, exclusive=False, auto_delete=False, arguments=None
            )

            async def on_reply(message):
                pass

            with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed) as info:
                await reply_queue.consume(on_reply, no_ack=False)
            return str(info.value)

    text = asyncio.run(asyncio.wait_for(main(), 20))
    assert "reply consumer cannot acknowledge" in text
