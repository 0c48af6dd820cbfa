"""Heartbeats under load: busy or paused connections are not dropped.

No timing is asserted: each test only checks that the connection is still
alive after several heartbeat intervals under the load it describes.
"""

from __future__ import annotations

import asyncio
import time

import aio_pika
import pytest
from pamqp import commands, heartbeat

from leveret.config import ServerConfig
from leveret.testing import EmbeddedBroker
from rawamqp import ConnectionLost, Timeout

pytestmark = pytest.mark.leveret_only


@pytest.fixture
def hb_broker():
    broker = EmbeddedBroker(ServerConfig(port=0, persistence=False, heartbeat=1)).start()
    yield broker
    broker.stop()


def test_slow_acking_consumer_at_full_speed_stays_connected(hb_broker):
    """A consumer that acks slowly while deliveries arrive as fast as the broker
    sends them, with heartbeat=1 on both sides, for several intervals."""

    async def run() -> tuple[int, bool, bool]:
        url = hb_broker.url + "?heartbeat=1"
        pub = await aio_pika.connect(url)
        con = await aio_pika.connect(url)
        pch = await pub.channel(publisher_confirms=False)
        cch = await con.channel()
        await cch.set_qos(prefetch_count=200)
        queue = await cch.declare_queue("", exclusive=True)
        stop = time.monotonic() + 5  # five heartbeat intervals

        async def publish() -> None:
            body = b"x" * 256
            while time.monotonic() < stop:
                for _ in range(200):
                    await pch.default_exchange.publish(aio_pika.Message(body), queue.name)
                await asyncio.sleep(0)

        consumed = 0
        producer = asyncio.create_task(publish())
        async with queue.iterator() as messages:
            async for message in messages:
                consumed += 1
                if consumed % 50 == 0:
                    await asyncio.sleep(0.05)  # a slow consumer
                await message.ack()
                if time.monotonic() > stop:
                    break
        await producer
        alive = (not con.is_closed, not pub.is_closed)
        await pub.close()
        await con.close()
        return consumed, *alive

    consumed, consumer_alive, publisher_alive = asyncio.run(run())
    assert consumed > 0
    assert consumer_alive and publisher_alive


def test_blocked_publisher_still_gets_heartbeats_and_is_not_dropped():
    """During a memory alarm the broker stops reading a publisher's socket.  It
    must keep sending heartbeats, and must not count the client's heartbeats,
    which it is not reading, as missed."""
    config = ServerConfig(port=0, persistence=False, heartbeat=1, memory_high_watermark=1)
    broker = EmbeddedBroker(config).start()
    try:
        from rawamqp import RawClient

        client = RawClient("127.0.0.1", broker.port, timeout=10)
        client.handshake(heartbeat=1)
        client.send_method(1, commands.Channel.Open())
        client.wait_for(commands.Channel.OpenOk)
        client.publish(1, "", "nowhere", b"blocked")  # the broker stops reading us
        heartbeats = 0
        deadline = time.monotonic() + 5  # five intervals, silent on our side
        while time.monotonic() < deadline:
            try:
                _ch, frame = client.read_frame(timeout=max(0.01, deadline - time.monotonic()))
            except ConnectionLost as exc:
                raise AssertionError("a blocked publisher was disconnected") from exc
            except Timeout:
                break  # the deadline
            assert not isinstance(frame, commands.Connection.Close), frame
            if isinstance(frame, heartbeat.Heartbeat):
                heartbeats += 1
        assert heartbeats >= 2
        client.close()
    finally:
        broker.stop()
