"""leveret.client's asyncio API against a real broker.

Runs against Leveret by default and against any broker with LEVERET_TEST_URL
(e.g. the reference RabbitMQ): every behaviour here is RabbitMQ's too.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from clienthelp import TcpProxy, free_port, run
from leveret.client import (
    AuthenticationError,
    BasicProperties,
    ChannelClosed,
    ClientError,
    ConnectError,
    ConsumerCancelled,
    MessageNacked,
    MessageReturned,
    MessageStateError,
    NotFound,
    OutgoingMessage,
    PreconditionFailed,
    PublishFailed,
    connect,
)


def with_password(url: str, password: str) -> str:
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    return f"{scheme}://{creds.split(':')[0]}:{password}@{host}"


# -- connecting ---------------------------------------------------------------------


def test_declare_queue_returns_message_and_consumer_counts(amqp_url, names):
    async def main():
        async with await connect(amqp_url, name="i12-counts") as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(names.queue())
            assert (q.message_count, q.consumer_count) == (0, 0)
            for i in range(3):
                await ch.publish(b"m%d" % i, routing_key=q.name)
            again = await ch.declare_queue(q.name, passive=True)
            assert again.message_count == 3
            consumer = await q.consume(prefetch=1)
            again = await ch.declare_queue(q.name, passive=True)
            assert again.consumer_count == 1
            await consumer.cancel()

    run(main())


def test_wrong_password_is_a_clear_error_without_retries(amqp_url, amqp_host_port):
    proxy = TcpProxy(*amqp_host_port)
    try:
        url = proxy.url(with_password(amqp_url, "not-the-password"))

        async def main():
            with pytest.raises(AuthenticationError, match="refused the login of user 'guest'"):
                await connect(url, reconnect_attempts=5)

        run(main())
        assert proxy.accepted == 1  # one attempt: retrying a refused login cannot help
    finally:
        proxy.close()


def test_unreachable_broker_names_host_and_port():
    port = free_port()

    async def main():
        with pytest.raises(ConnectError, match=f"127.0.0.1:{port}"):
            await connect(f"amqp://guest:guest@127.0.0.1:{port}/%2F")

    run(main())


def test_fail_over_to_the_next_host(amqp_url, amqp_host_port):
    dead = free_port()
    host, port = amqp_host_port
    url = amqp_url.replace(f"{host}:{port}", f"127.0.0.1:{dead},{host}:{port}")

    async def main():
        async with await connect(url) as conn:
            assert (conn.host, conn.port) == (host, port)

    run(main())


def test_unknown_vhost_is_refused(amqp_url):
    url = amqp_url.rsplit("/", 1)[0] + "/no-such-vhost-i12"

    async def main():
        with pytest.raises(AuthenticationError, match="vhost 'no-such-vhost-i12'"):
            await connect(url)

    run(main())


def test_heartbeats_flow_while_idle(amqp_url, names):
    async def main():
        async with await connect(amqp_url, heartbeat=1) as conn:
            assert conn.heartbeat == 1
            ch = await conn.channel()
            # Idle for several heartbeat intervals: the broker would drop a silent client.
            await asyncio.sleep(3.5)
            q = await ch.declare_queue(names.queue())
            assert q.name
            assert conn.is_open and conn.reconnects == 0

    run(main())


# -- channels and errors ---------------------------------------------------------------


def test_broker_closing_a_channel_raises_typed_error_and_connection_lives_on(amqp_url, names):
    async def main():
        async with await connect(amqp_url) as conn:
            ch = await conn.channel()
            missing = names.queue("missing")
            with pytest.raises(NotFound) as info:
                await ch.declare_queue(missing, passive=True)
            err = info.value
            assert err.reply_code == 404 and missing in err.reply_text
            assert (err.class_id, err.method_id) == (50, 10)
            assert not ch.is_open
            # Publishing on the channel the broker closed raises the same error.
            with pytest.raises(NotFound):
                await ch.publish(b"x", routing_key="anything")
            # ...and the connection carries on.
            other = await conn.channel()
            q = await other.declare_queue(names.queue())
            await other.publish(b"still fine", routing_key=q.name)
            assert (await other.get(q, no_ack=True)).body == b"still fine"

    run(main())


def test_publishing_on_a_closed_channel(amqp_url):
    async def main():
        async with await connect(amqp_url) as conn:
            ch = await conn.channel()
            await ch.close()
            with pytest.raises(ChannelClosed, match="closed by the application"):
                await ch.publish(b"x", routing_key="q")
            with pytest.raises(ChannelClosed):
                await ch.publish_many([b"x"], routing_key="q")
            await ch.close()  # idempotent

    run(main())


def test_redeclare_with_other_arguments_is_precondition_failed(amqp_url, names):
    async def main():
        async with await connect(amqp_url) as conn:
            ch = await conn.channel()
            name = names.queue()
            await ch.declare_queue(name, arguments={"x-max-length": 10})
            with pytest.raises(PreconditionFailed) as info:
                await ch.declare_queue(name, arguments={"x-max-length": 20})
            assert info.value.reply_code == 406

    run(main())


def test_publish_to_missing_exchange_raises_on_the_publish(amqp_url, names, amqp_vhost):
    """On a confirm channel the publish itself raises NotFound with the broker's 404
    (not Unconfirmed later); the connection carries on."""

    async def main():
        async with await connect(amqp_url) as conn:
            ch = await conn.channel()
            missing = names.exchange("missing")
            with pytest.raises(NotFound) as info:
                await ch.publish(b"x", exchange=missing, routing_key="k")
            err = info.value
            assert err.reply_code == 404
            assert err.reply_text == f"NOT_FOUND - no exchange '{missing}' in vhost '{amqp_vhost}'"
            assert (err.class_id, err.method_id) == (60, 40)
            # publish_many: every publish the channel had not confirmed fails with it.
            ch2 = await conn.channel()
            q = await ch2.declare_queue(names.queue())
            with pytest.raises(PublishFailed) as failed:
                await ch2.publish_many([b"a", b"b"], exchange=missing, routing_key="k")
            assert failed.value.failures
            assert all(isinstance(e, NotFound) for _i, e in failed.value.failures)
            ch3 = await conn.channel()
            await ch3.publish(b"fine", routing_key=q.name)
            assert (await ch3.get(q, no_ack=True)).body == b"fine"

    run(main())


def test_blocking_publish_to_missing_exchange_raises_not_found(amqp_url, names):
    from leveret.client import blocking

    with blocking.connect(amqp_url) as conn:
        ch = conn.channel()
        with pytest.raises(NotFound) as info:
            ch.publish(b"x", exchange=names.exchange("missing"), routing_key="k")
        assert info.value.reply_code == 404


# -- publishing ---------------------------------------------------------------------------


def test_mandatory_unroutable_publish_raises_message_returned(amqp_url, names):
    async def main():
        async with await connect(amqp_url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(names.queue())
            with pytest.raises(MessageReturned) as info:
                await ch.publish(b"lost", routing_key=names.queue("nowhere"), mandatory=True)
            assert info.value.reply_code == 312
            assert info.value.message.body == b"lost"
            await ch.publish(b"routed", routing_key=q.name, mandatory=True)
            with pytest.raises(PublishFailed) as many:
                await ch.publish_many(
                    [
                        OutgoingMessage(b"a", routing_key=q.name),
                        OutgoingMessage(b"b", routing_key="i12-nowhere"),
                        OutgoingMessage(b"c", routing_key=q.name),
                    ],
                    mandatory=True,
                )
            assert [i for i, _ in many.value.failures] == [1]
            assert isinstance(many.value.failures[0][1], MessageReturned)
            await asyncio.sleep(0)
            assert (await ch.declare_queue(q.name, passive=True)).message_count == 3

    run(main())


def test_nacked_publish_raises_message_nacked(amqp_url, names):
    async def main():
        async with await connect(amqp_url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(
                names.queue(), arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
            )
            await ch.publish(b"fits", routing_key=q.name)
            with pytest.raises(MessageNacked):
                await ch.publish(b"does not fit", routing_key=q.name)

    run(main())


def test_properties_round_trip(amqp_url, names):
    async def main():
        async with await connect(amqp_url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(names.queue())
            props = BasicProperties(
                content_type="application/json",
                headers={"k": "v", "n": 7},
                priority=3,
                correlation_id="c-1",
                message_id="m-1",
                type="kind",
                app_id="tests",
            )
            await ch.publish(b"{}", routing_key=q.name, properties=props, persistent=True)
            msg = await ch.get(q, no_ack=True)
            got = msg.properties
            assert got.delivery_mode == 2
            for name, value in props.as_dict().items():
                assert getattr(got, name) == value, name
            with pytest.raises(TypeError, match="unknown message property"):
                await ch.publish(b"x", routing_key=q.name, colour="red")

    run(main())


def test_message_bigger_than_frame_max_is_split(amqp_url, names):
    body = bytes(range(256)) * 1000  # 256,000 bytes; frame_max 4096 → 63 body frames

    async def main():
        async with await connect(amqp_url + "?frame_max=4096") as conn:
            assert conn.frame_max == 4096
            ch = await conn.channel()
            q = await ch.declare_queue(names.queue())
            await ch.publish(body, routing_key=q.name)
            msg = await ch.get(q, no_ack=True)
            assert msg.body == body

    run(main())


def test_publish_many_confirms_everything(amqp_url, names):
    async def main():
        async with await connect(amqp_url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(names.queue())
            n = await ch.publish_many(
                (b"%d" % i for i in range(3000)), routing_key=q.name, window=100
            )
            assert n == 3000
            assert (await ch.declare_queue(q.name, passive=True)).message_count == 3000
            with pytest.raises(ValueError, match="window"):
                await ch.publish_many([b"x"], routing_key=q.name, window=0)

    run(main())


def test_publish_many_returns_only_after_the_last_confirm(amqp_url, names):
    """With a small window every confirm drains the count to zero between windows;
    publish_many must still wait for the confirm of its last message, not return
    as soon as the count has once touched zero."""

    async def main():
        async with await connect(amqp_url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(names.queue(), durable=True)
            confirmed: list[int] = []
            ch.add_confirm_listener(lambda tag, multiple, nack: confirmed.append(tag))
            for window in (1, 3):
                confirmed.clear()
                n = await ch.publish_many(
                    [b"m"] * 10, routing_key=q.name, window=window, delivery_mode=2
                )
                assert n == 10
                assert confirmed and confirmed[-1] == max(confirmed)
                assert max(confirmed) % 10 == 0  # the confirm of the tenth publish
            await ch.delete_queue(q.name)

    run(main())


def test_publish_without_confirms(amqp_url, names):
    async def main():
        async with await connect(amqp_url) as conn:
            ch = await conn.channel(confirms=False)
            q = await ch.declare_queue(names.queue())
            await ch.publish_many([b"a", b"b"], routing_key=q.name)
            await ch.publish(b"c", routing_key=q.name)
            bodies = []
            async for m in q.consume(no_ack=True):
                bodies.append(m.body)
                if len(bodies) == 3:
                    break
            assert bodies == [b"a", b"b", b"c"]

    run(main())


# -- consuming ------------------------------------------------------------------------------


def test_consume_ack_nack_reject(amqp_url, names):
    async def main():
        async with await connect(amqp_url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(names.queue())
            await ch.publish_many([b"ack", b"nack", b"reject", b"drop"], routing_key=q.name)
            seen = []
            consumer = q.consume(prefetch=10)
            async for m in consumer:
                seen.append((m.body, m.redelivered))
                if m.body == b"ack":
                    m.ack()
                elif m.body == b"nack" and not m.redelivered:
                    m.nack(requeue=True)
                elif m.body == b"reject" and not m.redelivered:
                    m.reject(requeue=True)
                elif m.body == b"drop":
                    m.nack(requeue=False)
                else:
                    m.ack()
                if len(seen) == 6:
                    break
            await consumer.cancel()
            assert sorted(seen) == sorted(
                [
                    (b"ack", False),
                    (b"nack", False),
                    (b"reject", False),
                    (b"drop", False),
                    (b"nack", True),
                    (b"reject", True),
                ]
            )
            assert (await ch.declare_queue(q.name, passive=True)).message_count == 0

    run(main())


def test_acking_twice_is_an_error(amqp_url, names):
    async def main():
        async with await connect(amqp_url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(names.queue())
            await ch.publish(b"once", routing_key=q.name)
            msg = await ch.get(q)
            msg.ack()
            with pytest.raises(MessageStateError, match="already acknowledged"):
                msg.ack()
            with pytest.raises(MessageStateError):
                msg.reject()
            await ch.publish(b"auto", routing_key=q.name)
            auto = await ch.get(q, no_ack=True)
            with pytest.raises(MessageStateError, match="no_ack"):
                auto.ack()
            # The channel is fine: no double ack reached the broker (it would close it with 406).
            await ch.publish(b"after", routing_key=q.name)
            assert (await ch.get(q, no_ack=True)).body == b"after"

    run(main())


def test_cancelling_a_consumer_with_messages_in_flight_loses_nothing(amqp_url, names):
    async def main():
        async with await connect(amqp_url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(names.queue())
            await ch.publish_many((b"%03d" % i for i in range(100)), routing_key=q.name)
            consumer = q.consume(prefetch=50)
            taken = []
            async for m in consumer:
                taken.append(m.body)
                m.ack()
                if len(taken) == 10:
                    break
            # Up to 40 more are on their way or buffered, unacked: cancel hands them back.
            await consumer.cancel()
            with pytest.raises(StopAsyncIteration):
                await consumer.__anext__()
            rest = []
            for _ in range(200):
                m = await ch.get(q)
                if m is None:
                    break
                rest.append(m.body)
                m.ack()
            assert sorted(taken + rest) == [b"%03d" % i for i in range(100)]

    run(main())


def test_broker_cancel_notification_ends_the_iterator(amqp_url, names):
    async def main():
        async with await connect(amqp_url) as conn:
            ch = await conn.channel()
            other = await conn.channel()
            q = await ch.declare_queue(names.queue())
            consumer = await q.consume()
            await other.delete_queue(q.name)
            with pytest.raises(ConsumerCancelled):
                await consumer.get(timeout=10)

    run(main())


def test_get_and_qos(amqp_url, names):
    async def main():
        async with await connect(amqp_url) as conn:
            ch = await conn.channel(prefetch=2)
            q = await ch.declare_queue(names.queue())
            assert await q.get() is None
            await ch.publish_many([b"1", b"2", b"3"], routing_key=q.name)
            m = await q.get()
            assert (m.body, m.message_count) == (b"1", 2)
            m.ack()
            consumer = await q.consume()
            first = await consumer.get(timeout=5)
            second = await consumer.get(timeout=5)
            assert [first.body, second.body] == [b"2", b"3"]
            first.ack()
            second.ack()
            with pytest.raises(ValueError):
                await ch.qos(70000)

    run(main())


# -- exchanges, bindings, transactions -------------------------------------------------------


def test_exchanges_and_bindings(amqp_url, names):
    async def main():
        async with await connect(amqp_url) as conn:
            ch = await conn.channel()
            src = await ch.declare_exchange(names.exchange(), "topic")
            dst = await ch.declare_exchange(names.exchange(), "fanout")
            await ch.bind_exchange(dst, src, "a.#")
            q = await ch.declare_queue(names.queue())
            await q.bind(dst)
            await src.publish(b"via e2e", "a.b")
            await src.publish(b"not bound", "b.a")
            assert (await q.get(no_ack=True)).body == b"via e2e"
            assert await q.get(no_ack=True) is None
            await ch.unbind_exchange(dst, src, "a.#")
            await src.publish(b"unbound now", "a.b")
            assert await q.get(no_ack=True) is None
            await q.unbind(dst)
            await dst.delete()
            await src.delete()

    run(main())


def test_transactions(amqp_url, names):
    async def main():
        async with await connect(amqp_url) as conn:
            confirm_ch = await conn.channel()
            with pytest.raises(ClientError, match="confirm mode"):
                await confirm_ch.tx_select()
            ch = await conn.channel(confirms=False)
            q = await ch.declare_queue(names.queue())
            await ch.tx_select()
            await ch.publish(b"rolled back", routing_key=q.name)
            await ch.tx_rollback()
            async with ch.transaction():
                await ch.publish(b"committed", routing_key=q.name)
            with contextlib.suppress(RuntimeError):
                async with ch.transaction():
                    await ch.publish(b"also rolled back", routing_key=q.name)
                    raise RuntimeError("abort")
            assert (await q.get(no_ack=True)).body == b"committed"
            assert await q.get(no_ack=True) is None

    run(main())


def test_server_named_queue(amqp_url):
    async def main():
        async with await connect(amqp_url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(exclusive=True)
            assert q.name.startswith("amq.gen-") and q.server_named
            await ch.publish(b"x", routing_key=q.name)
            assert (await q.get(no_ack=True)).body == b"x"

    run(main())


# -- RPC over direct reply-to ----------------------------------------------------------------


def test_rpc_over_direct_reply_to(amqp_url, names):
    async def main():
        async with await connect(amqp_url) as conn:
            server_ch = await conn.channel()
            q = await server_ch.declare_queue(names.queue())

            async def double(request):
                return str(int(request.body) * 2).encode()

            server = server_ch.serve(q, double)
            client_ch = await conn.channel()
            replies = await asyncio.gather(
                *(client_ch.rpc_call(str(i), routing_key=q.name, timeout=10) for i in range(20))
            )
            assert [int(r.body) for r in replies] == [2 * i for i in range(20)]
            server.cancel()

    run(main())


def test_rpc_timeout(amqp_url, names):
    from leveret.client import RPCTimeout

    async def main():
        async with await connect(amqp_url) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(names.queue())  # nobody answers
            with pytest.raises(RPCTimeout):
                await ch.rpc_call(b"hello?", routing_key=q.name, timeout=0.5)

    run(main())


# -- connection.blocked ---------------------------------------------------------------------


@pytest.mark.leveret_only
def test_publishing_waits_while_blocked_with_a_timeout(leveret_embedded):
    from leveret.client import BlockedTimeout
    from leveret.client import events as ev

    broker = leveret_embedded

    def set_memory_limit(limit: int) -> None:
        def apply() -> None:
            broker.server.alarms.memory_limit = limit
            broker.server.alarms.check()

        broker.call(apply)

    async def main() -> None:
        seen: list = []
        async with await connect(broker.url) as conn:
            conn.add_listener(seen.append)
            ch = await conn.channel()
            q = await ch.declare_queue("i12-blocked")
            await asyncio.to_thread(set_memory_limit, 1)  # any RSS is over the limit
            await asyncio.wait_for(_until(lambda: conn.blocked), 10)
            assert conn.blocked_reason == "low on memory"
            with pytest.raises(BlockedTimeout, match="low on memory"):
                await ch.publish(b"held", routing_key=q.name, timeout=0.3)
            waiting = asyncio.create_task(ch.publish(b"waits", routing_key=q.name))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            await asyncio.to_thread(set_memory_limit, 0)
            await asyncio.wait_for(waiting, 10)
            assert not conn.blocked
            assert (await q.get(no_ack=True)).body == b"waits"
        assert [type(e) for e in seen] == [ev.Blocked, ev.Unblocked]

    run(main())


async def _until(predicate) -> None:
    while not predicate():
        await asyncio.sleep(0.01)
