"""leveret.client recovery: the broker goes away mid-traffic and nothing is lost.

The proof: a confirmed-publish loop and an acking consume
loop run while the broker is SIGKILLed and restarted (a Leveret subprocess),
or while the server closes the client's connections (Leveret's force-close,
RabbitMQ's management API). Every message published with a confirm must be
consumed at least once, and exactly once after de-duplicating on message id.

The RabbitMQ variants run when the reference broker answers on 5673; they are
skipped otherwise (CI has no RabbitMQ).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from clienthelp import (
    RABBITMQ_URL,
    TcpProxy,
    broker_has_streams,
    close_from_leveret,
    close_from_rabbitmq,
    rabbitmq_reachable,
    run,
)
from leveret.client import BasicProperties, OutgoingMessage, Unconfirmed, connect
from leveret.client import events as ev
from serverproc import TEST_WORKERS

sys.path.insert(0, str(Path(__file__).parent / "durability"))
from durability_support import Brokers  # noqa: E402

needs_rabbitmq = pytest.mark.skipif(
    not rabbitmq_reachable(), reason="reference RabbitMQ not reachable on 127.0.0.1:5673"
)
FAST = {"reconnect_delay": 0.05, "reconnect_max_delay": 0.5}


async def wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


async def traffic_through_failures(
    url: str,
    disrupt: Callable[[list[str]], Awaitable[None]],
    *,
    n: int = 3000,
    failures: int = 2,
    durable: bool = False,
) -> dict:
    """Publish n confirmed messages and consume them with acks while `disrupt`
    (given the two connections' names) runs `failures` times at evenly spaced
    points of the publish loop."""
    token = uuid.uuid4().hex[:8]
    queue = f"i12-recovery-{token}"
    seen_events: list[ev.ClientEvent] = []
    pub = await connect(url, name=f"i12-pub-{token}", **FAST)
    con = await connect(url, name=f"i12-con-{token}", **FAST)
    for conn in (pub, con):
        conn.add_listener(seen_events.append)
    pch = await pub.channel()
    await pch.declare_queue(queue, durable=durable)
    cch = await con.channel()
    confirmed: list[int] = []
    consumed: list[int] = []
    unique: set[int] = set()
    all_ids = set(range(n))

    async def produce() -> None:
        for start in range(0, n, 50):
            batch = [
                OutgoingMessage(
                    b"%d" % i,
                    properties=BasicProperties(
                        message_id=str(i), delivery_mode=2 if durable else 1
                    ),
                )
                for i in range(start, min(n, start + 50))
            ]
            await pch.publish_many(batch, routing_key=queue, window=200)
            confirmed.extend(range(start, min(n, start + 50)))
            await asyncio.sleep(0.001)  # let the consumer and the disruptions interleave

    async def consume() -> None:
        async for message in cch.consume(queue, prefetch=100):
            i = int(message.message_id)
            consumed.append(i)
            unique.add(i)
            message.ack()
            if unique >= all_ids:
                return

    producer = asyncio.create_task(produce())
    consumer = asyncio.create_task(consume())
    try:
        for k in range(failures):
            mark = n * (k + 1) // (failures + 1)
            await wait_for(lambda mark=mark: len(confirmed) >= mark or producer.done(), 60)
            await disrupt([f"i12-pub-{token}", f"i12-con-{token}"])
            await wait_for(lambda: pub.is_open and con.is_open, 60)
        await asyncio.wait_for(producer, 90)
        await asyncio.wait_for(consumer, 90)
    finally:
        producer.cancel()
        consumer.cancel()
        try:
            await pch.delete_queue(queue)
        finally:
            await pub.close()
            await con.close()
    return {
        "confirmed": confirmed,
        "consumed": consumed,
        "events": seen_events,
        "reconnects": (pub.reconnects, con.reconnects),
    }


def check_delivery(result: dict, n: int, failures: int) -> None:
    confirmed, consumed = result["confirmed"], result["consumed"]
    assert sorted(confirmed) == list(range(n)), "every publish ended up confirmed"
    assert set(consumed) >= set(confirmed), "at least once: every confirmed message consumed"
    deduplicated = list(dict.fromkeys(consumed))
    assert sorted(deduplicated) == list(range(n)), "exactly once after message-id dedup"
    kinds = [type(e) for e in result["events"]]
    assert kinds.count(ev.ConnectionLost) >= failures
    assert kinds.count(ev.Recovered) >= failures
    assert min(result["reconnects"]) >= failures


# -- server-side close -----------------------------------------------------------------


@pytest.mark.leveret_only
def test_server_side_close_mid_traffic_leveret(leveret_embedded):
    async def disrupt(_names: list[str]) -> None:
        assert await asyncio.to_thread(close_from_leveret, leveret_embedded) >= 2

    result = run(traffic_through_failures(leveret_embedded.url, disrupt), timeout=120)
    check_delivery(result, 3000, 2)


@needs_rabbitmq
def test_server_side_close_mid_traffic_rabbitmq():
    async def disrupt(connection_names: list[str]) -> None:
        # The management API's DELETE /api/connections/{name}: RabbitMQ closes
        # each connection with 320 CONNECTION_FORCED.
        for name in connection_names:
            assert await asyncio.to_thread(close_from_rabbitmq, name) >= 1

    result = run(traffic_through_failures(RABBITMQ_URL, disrupt, n=2000), timeout=180)
    check_delivery(result, 2000, 2)


# -- broker killed with SIGKILL and restarted --------------------------------------------


@pytest.mark.leveret_only
@pytest.mark.slow
def test_sigkill_restart_mid_traffic(tmp_path):
    with Brokers(tmp_path) as brokers:
        broker = brokers.start(fsync="batch")

        async def disrupt(_names: list[str]) -> None:
            await asyncio.to_thread(broker.kill)
            await asyncio.sleep(0.3)  # the client sees the loss and starts reconnecting
            await asyncio.to_thread(broker.start)

        result = run(traffic_through_failures(broker.url, disrupt, durable=True), timeout=240)
    check_delivery(result, 3000, 2)


RABBITMQ_SCRIPT = Path(
    os.environ.get(
        "LEVERET_RABBITMQ_SCRIPT",
        Path(__file__).resolve().parents[2] / "shared" / "tools" / "rabbitmq.sh",
    )
)


@needs_rabbitmq
@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("LEVERET_RESTART_RABBITMQ"),
    reason="restarts the shared reference RabbitMQ; set LEVERET_RESTART_RABBITMQ=1 to run",
)
def test_rabbitmq_restart_mid_traffic():
    """The same proof against RabbitMQ: its node is stopped and started mid-traffic."""

    async def disrupt(_names: list[str]) -> None:
        def restart() -> None:
            subprocess.run(["bash", str(RABBITMQ_SCRIPT), "stop"], check=True, timeout=120)
            subprocess.run(["bash", str(RABBITMQ_SCRIPT), "start"], check=True, timeout=180)

        await asyncio.to_thread(restart)

    result = run(
        traffic_through_failures(RABBITMQ_URL, disrupt, n=2000, failures=1, durable=True),
        timeout=600,
    )
    check_delivery(result, 2000, 1)


# -- network problems ------------------------------------------------------------------------


def test_a_link_that_drops_as_soon_as_it_opens_is_retried(amqp_url, amqp_host_port, names):
    """The first reconnect is accepted and cut right after connection.open-ok.

    The link is gone before the recovery task resumes; it must start over, not
    die and leave the connection recovering for ever (CI saw exactly that when a
    cluster node forced a client off after a leadership transfer).
    """
    proxy = TcpProxy(*amqp_host_port)

    async def main() -> None:
        seen: list[ev.ClientEvent] = []
        conn = await connect(proxy.url(amqp_url), **FAST)
        conn.add_listener(seen.append)
        ch = await conn.channel()
        q = await ch.declare_queue(names.queue(), auto_delete=True)
        proxy.drop_after_open_ok = 1
        proxy.cut()
        await wait_for(lambda: any(isinstance(e, ev.Recovered) for e in seen), 20)
        assert proxy.drop_after_open_ok == 0
        reconnected = [e for e in seen if isinstance(e, ev.Reconnected)]
        assert len(reconnected) >= 2, seen  # the dropped link, then the one that held
        await ch.publish(b"after", q.name)
        got = await q.get()
        assert got is not None and got.body == b"after"
        got.ack()
        await conn.close()

    try:
        run(main(), timeout=60)
    finally:
        proxy.close()


def test_heartbeat_timeout_on_a_frozen_connection_recovers(amqp_url, amqp_host_port, names):
    proxy = TcpProxy(*amqp_host_port)

    async def main() -> list:
        seen: list[ev.ClientEvent] = []
        conn = await connect(proxy.url(amqp_url), heartbeat=1, **FAST)
        conn.add_listener(seen.append)
        ch = await conn.channel()
        q = await ch.declare_queue(names.queue())
        consumer = await q.consume(prefetch=10)
        await ch.publish(b"before", routing_key=q.name)
        (await consumer.get(timeout=10)).ack()
        await ch.declare_queue(q.name, passive=True)  # a round trip: the ack has arrived
        proxy.freeze()  # the peer goes silent without closing anything
        await wait_for(lambda: any(isinstance(e, ev.ConnectionLost) for e in seen), 15)
        proxy.freeze(False)
        await conn.wait_recovered(15)
        await ch.publish(b"after", routing_key=q.name)
        assert (await consumer.get(timeout=10)).body == b"after"
        await conn.close()
        return seen

    try:
        seen = run(main())
    finally:
        proxy.close()
    assert any(isinstance(e, ev.Recovered) for e in seen)


def test_unconfirmed_publishes_raise_when_republish_is_off(amqp_url, amqp_host_port, names):
    proxy = TcpProxy(*amqp_host_port)

    async def main() -> None:
        conn = await connect(proxy.url(amqp_url), republish=False, **FAST)
        seen: list[ev.ClientEvent] = []
        conn.add_listener(seen.append)
        ch = await conn.channel()
        q = await ch.declare_queue(names.queue())
        proxy.freeze()  # the publish leaves the client but never reaches the broker
        publish = asyncio.create_task(ch.publish(b"lost?", routing_key=q.name))
        await asyncio.sleep(0.2)
        proxy.cut()
        proxy.freeze(False)
        with pytest.raises(Unconfirmed):
            await asyncio.wait_for(publish, 15)
        assert any(isinstance(e, ev.PublishesFailed) for e in seen)
        await conn.wait_recovered(15)
        await ch.publish(b"later", routing_key=q.name)  # the channel works again
        await conn.close()

    try:
        run(main())
    finally:
        proxy.close()


def test_unconfirmed_publishes_are_retried_with_the_same_message_id(
    amqp_url, amqp_host_port, names
):
    proxy = TcpProxy(*amqp_host_port)

    async def main() -> None:
        conn = await connect(proxy.url(amqp_url), **FAST)
        seen: list[ev.ClientEvent] = []
        conn.add_listener(seen.append)
        ch = await conn.channel()
        q = await ch.declare_queue(names.queue())
        proxy.freeze()
        publish = asyncio.create_task(ch.publish(b"retry me", routing_key=q.name, message_id="m-7"))
        await asyncio.sleep(0.2)
        proxy.cut()
        proxy.freeze(False)
        await asyncio.wait_for(publish, 15)  # confirmed, after the retry
        assert any(isinstance(e, ev.PublishesRetried) for e in seen)
        got = await ch.get(q, no_ack=True)
        assert (got.body, got.message_id) == (b"retry me", "m-7")
        await conn.close()

    try:
        run(main())
    finally:
        proxy.close()


# -- what is restored ------------------------------------------------------------------------


def _force_close_factory(amqp_url: str, request: pytest.FixtureRequest):
    """A coroutine function that closes the client's connection from the server side."""
    if "5673" in amqp_url:

        async def close(name: str) -> None:
            assert await asyncio.to_thread(close_from_rabbitmq, name) >= 1

        return close
    if TEST_WORKERS:
        # The broker under test is the shared `leveret server --workers N`: its
        # management API (worker 0) closes a connection whichever worker holds it.
        api = request.getfixturevalue("workers_broker").api

        async def close_worker_connection(name: str) -> None:
            assert await asyncio.to_thread(close_from_rabbitmq, name, 30.0, api) >= 1

        return close_worker_connection
    broker = request.getfixturevalue("leveret_embedded")

    async def close_leveret(_name: str) -> None:
        assert await asyncio.to_thread(close_from_leveret, broker) >= 1

    return close_leveret


def test_topology_server_named_queue_qos_and_consumers_are_restored(amqp_url, names, request):
    force_close = _force_close_factory(amqp_url, request)
    name = f"i12-topology-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        seen: list[ev.ClientEvent] = []
        conn = await connect(amqp_url, name=name, **FAST)
        conn.add_listener(seen.append)
        ch = await conn.channel(prefetch=5)
        exchange = await ch.declare_exchange(names.exchange(), "topic", auto_delete=False)
        q = await ch.declare_queue(exclusive=True)  # server-named, gone with the connection
        await q.bind(exchange, "a.*")
        consumer = await q.consume()
        old_name = q.name
        await exchange.publish(b"one", "a.b")
        first = await consumer.get(timeout=10)
        first.ack()
        await force_close(name)
        await conn.wait_recovered(30)
        await asyncio.sleep(0)
        assert q.name != old_name and q.name.startswith("amq.gen-")
        renamed = [e for e in seen if isinstance(e, ev.QueueRenamed)]
        assert renamed == [ev.QueueRenamed(old_name, q.name)]
        # The binding and the consumer followed the new name; qos is back (5 unacked max).
        for i in range(8):
            await exchange.publish(b"%d" % i, "a.x")
        got = [await consumer.get(timeout=10) for _ in range(5)]
        with pytest.raises(TimeoutError):
            await consumer.get(timeout=0.5)
        for m in got:
            m.ack()
        rest = [await consumer.get(timeout=10) for _ in range(3)]
        assert sorted(m.body for m in got + rest) == [b"%d" % i for i in range(8)]
        for m in rest:
            m.ack()
        # A message delivered before the loss cannot be settled afterwards: no error.
        assert first.settled
        await exchange.delete()
        await conn.close()

    run(main(), timeout=90)


def test_acking_a_message_from_before_the_reconnect_is_a_no_op(amqp_url, names, request):
    force_close = _force_close_factory(amqp_url, request)
    name = f"i12-stale-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        conn = await connect(amqp_url, name=name, **FAST)
        ch = await conn.channel()
        q = await ch.declare_queue(names.queue())
        await ch.publish(b"x", routing_key=q.name)
        consumer = await q.consume(prefetch=1)
        stale = await consumer.get(timeout=10)
        await force_close(name)
        await conn.wait_recovered(30)
        assert stale.ack() is False  # its delivery tag died with the old connection
        again = await consumer.get(timeout=10)
        assert again.body == b"x" and again.redelivered
        assert again.ack() is True
        await conn.close()

    run(main(), timeout=90)


# -- streams -------------------------------------------------------------------------------------


def _stream_broker(request: pytest.FixtureRequest) -> tuple[str, Callable[[str], Awaitable[None]]]:
    """A broker with stream queues and a way to close a client's connection from it:
    Leveret once it has streams, else the reference RabbitMQ."""
    broker = request.getfixturevalue("leveret_embedded")
    if broker_has_streams(broker.url):

        async def close_leveret(_name: str) -> None:
            assert await asyncio.to_thread(close_from_leveret, broker) >= 1

        return broker.url, close_leveret
    if rabbitmq_reachable():

        async def close_rabbitmq(name: str) -> None:
            assert await asyncio.to_thread(close_from_rabbitmq, name) >= 1

        return RABBITMQ_URL, close_rabbitmq
    pytest.skip("no broker with stream queues (Leveret has none yet; RabbitMQ not reachable)")


def test_stream_consume_from_first_and_resume_after_reconnect(request):
    url, force_close = _stream_broker(request)
    stream = f"i12-stream-{uuid.uuid4().hex[:8]}"
    name = f"i12-stream-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        conn = await connect(url, name=name, **FAST)
        ch = await conn.channel()
        await ch.declare_queue(stream, durable=True, arguments={"x-queue-type": "stream"})
        await ch.publish_many((b"%d" % i for i in range(200)), routing_key=stream)
        consumer = ch.consume(stream, offset="first", prefetch=20)
        offsets, bodies = [], []
        async for m in consumer:
            offsets.append(m.offset)
            bodies.append(int(m.body))
            m.ack()
            if len(bodies) == 80:
                break
        assert consumer.last_offset == offsets[-1]
        await force_close(name)
        await conn.wait_recovered(30)
        async for m in consumer:
            offsets.append(m.offset)
            bodies.append(int(m.body))
            m.ack()
            if len(bodies) == 200:
                break
        assert bodies == list(range(200)), "resumed after the last offset handed out"
        assert offsets == list(range(offsets[0], offsets[0] + 200))
        await consumer.cancel()
        await ch.delete_queue(stream)
        await conn.close()

    run(main(), timeout=120)


def test_stream_offsets_of_every_kind_are_accepted(request):
    url, _ = _stream_broker(request)
    stream = f"i12-stream-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        import datetime

        async with await connect(url) as conn:
            ch = await conn.channel()
            await ch.declare_queue(stream, durable=True, arguments={"x-queue-type": "stream"})
            await ch.publish_many((b"%d" % i for i in range(10)), routing_key=stream)
            for offset, first in (
                ("first", 0),
                (5, 5),
                (300, None),  # beyond the end: waits for new messages
                (datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC), 0),
            ):
                consumer = await ch.consume(stream, offset=offset)
                if first is None:
                    with pytest.raises(TimeoutError):
                        await consumer.get(timeout=0.5)
                else:
                    m = await consumer.get(timeout=10)
                    assert int(m.body) == first
                    m.ack()
                await consumer.cancel()
            await ch.delete_queue(stream)

    run(main(), timeout=60)
