"""A paged message whose record rots on disk after a clean stop: the broker drops
that one message with an error in its log, and delivers the rest.

In-process broker (real sockets, real files, aio-pika); the store's segment size is
made small so that the damaged record sits in an older segment, which the
clean-shutdown index does not checksum (it checks the newest one).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import aio_pika
import pytest

from leveret.config import ServerConfig
from leveret.launcher import Node
from leveret.store.message_store import MessageStore
from leveret.store.segments import list_segments

QUEUE = "rotting"
COUNT = 400
VICTIM = b"m0100-"


def test_a_corrupt_paged_record_is_dropped_and_the_rest_delivered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    defaults = dict(MessageStore.__init__.__kwdefaults__)
    monkeypatch.setattr(
        MessageStore.__init__, "__kwdefaults__", {**defaults, "segment_size": 65536}
    )
    config = ServerConfig(host="127.0.0.1", port=0, data_dir=str(tmp_path), queue_ram_messages=5)
    bodies = [b"m%04d-" % i + b"x" * 1000 for i in range(COUNT)]

    async def fill() -> None:
        server = Node(config)
        await server.start()
        try:
            conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{server.port}/")
            async with conn:
                ch = await conn.channel(publisher_confirms=False)
                await ch.declare_queue(QUEUE, durable=True)
                for body in bodies:
                    await ch.default_exchange.publish(
                        aio_pika.Message(body, delivery_mode=2), routing_key=QUEUE
                    )
        finally:
            await server.stop()

    async def drain() -> list[bytes]:
        server = Node(config)
        await server.start()
        try:
            conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{server.port}/")
            async with conn:
                ch = await conn.channel()
                queue = await ch.declare_queue(QUEUE, passive=True)
                got = []
                async with queue.iterator() as messages:
                    async for message in messages:
                        await message.ack()
                        got.append(message.body)
                        if message.body == bodies[-1]:
                            break
                assert not ch.is_closed and not conn.is_closed
                again = await queue.get(fail=False)
                assert again is None
                return got
        finally:
            await server.stop()

    asyncio.run(fill())
    msgs = tmp_path / "msgs"
    seqs = list_segments(str(msgs))
    assert len(seqs) > 3
    for seq in seqs[:-1]:
        path = msgs / f"{seq:016d}.seg"
        data = bytearray(path.read_bytes())
        at = data.find(VICTIM)
        if at >= 0:
            data[at + len(VICTIM) + 10] ^= 0xFF  # one flipped bit pattern in the body
            path.write_bytes(bytes(data))
            break
    else:
        pytest.fail("the victim message is not in an older segment")
    assert (msgs / "clean.idx").exists()
    with caplog.at_level(logging.ERROR, logger="leveret.store"):
        got = asyncio.run(drain())
    assert got == [b for b in bodies if not b.startswith(VICTIM)]
    assert any("is corrupt" in r.getMessage() and QUEUE in r.getMessage() for r in caplog.records)
