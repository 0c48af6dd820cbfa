"""The broker listens before its stored messages are back, and holds clients until then.

An in-process broker (real sockets, real files, aio-pika as the client) whose
recovery is held at a threading.Event: the test can then act while the broker is
provably still recovering, and release it when it chooses. Nothing is faked: the
held recovery is the store's own `recover`, run as the server runs it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import aiohttp
import pytest

from leveret.config import ServerConfig
from leveret.ctl import CtlError, call
from leveret.launcher import Node
from leveret.store.message_store import MessageStore

QUEUE = "recovering"
STORED = 600  # persistent messages left in the queue before the restart
ACKED = 10  # of those, consumed and acked first


def _config(data_dir: Path, **extra: Any) -> ServerConfig:
    # A small RAM head, so most of the queue comes back as its paged tail.
    return ServerConfig(
        host="127.0.0.1",
        port=0,
        data_dir=str(data_dir),
        queue_ram_messages=50,
        **extra,
    )


class HeldRecovery:
    """Makes MessageStore.recover wait for `release` (it runs in a worker thread)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        original = MessageStore.recover

        def held(store: MessageStore, *args: Any, **kwargs: Any) -> Any:
            self.entered.set()
            self.release.wait(60)
            return original(store, *args, **kwargs)

        monkeypatch.setattr(MessageStore, "recover", held)


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldRecovery]:
    hold = HeldRecovery(monkeypatch)
    yield hold
    hold.release.set()  # never leave a worker thread waiting


async def _fill(data_dir: Path, *, crash: bool = True, **queue_args: Any) -> None:
    """STORED persistent messages, the first ACKED of them acked; then stop. With
    `crash`, the clean-shutdown index is removed, as a SIGKILL leaves the data dir,
    so the next start scans the log."""
    server = Node(_config(data_dir))
    await server.start()
    try:
        conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{server.port}/")
        async with conn:
            # No confirms, for speed and order: the stop below writes out what was sent.
            ch = await conn.channel(publisher_confirms=False)
            await ch.declare_queue(QUEUE, durable=True, arguments=queue_args or None)
            for i in range(STORED):
                await ch.default_exchange.publish(
                    aio_pika.Message(f"m{i}".encode(), delivery_mode=2), routing_key=QUEUE
                )
            queue = await ch.get_queue(QUEUE)
            for _ in range(ACKED):
                message = await queue.get(timeout=5)
                await message.ack()
    finally:
        await server.stop()
    clean = data_dir / "msgs" / "clean.idx"
    assert clean.exists()
    if crash:
        clean.unlink()


async def _held_connections(server: Node) -> None:
    """Wait until some connection holds an operation (the broker got it, and waits)."""
    while not any(conn.publisher_pause.recovery for conn in server.connections):
        await asyncio.sleep(0.01)


async def _ctl(data_dir: Path, op: str) -> Any:
    """One request on the control socket that `leveret ctl` uses."""
    reader, writer = await asyncio.open_unix_connection(str(data_dir / "ctl.sock"))
    writer.write(json.dumps({"op": op}).encode() + b"\n")
    await writer.drain()
    reply = json.loads(await reader.readline())
    writer.close()
    return reply


async def _drain(queue: aio_pika.abc.AbstractQueue) -> list[tuple[bytes, bool]]:
    got = []
    while (message := await queue.get(fail=False, no_ack=True)) is not None:
        got.append((message.body, message.redelivered))
    return got


@pytest.mark.parametrize("crash", [True, False], ids=["scan", "clean-index"])
def test_clients_wait_for_recovery_and_see_everything(
    tmp_path: Path, held: HeldRecovery, crash: bool
) -> None:
    """While recovery is held: the broker listens, a client logs in and opens a
    channel; its passive declare, publish and management call wait. Released: the
    declare counts every stored message, the new message comes after all of them."""

    async def main() -> None:
        held.release.set()  # the fill is an ordinary start
        await _fill(tmp_path, crash=crash)
        held.release.clear()
        held.entered.clear()
        server = Node(_config(tmp_path, management_port=0))
        await server.start(wait_for_recovery=False)
        try:
            assert server.recovering and server.durable_state is not None
            conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{server.port}/")
            async with conn:
                ch = await conn.channel()
                declare = asyncio.ensure_future(ch.declare_queue(QUEUE, passive=True))
                await _held_connections(server)
                publish_conn = await aio_pika.connect(
                    f"amqp://guest:guest@127.0.0.1:{server.port}/"
                )
                async with publish_conn:
                    pch = await publish_conn.channel()
                    confirm = asyncio.ensure_future(
                        pch.default_exchange.publish(
                            aio_pika.Message(b"new", delivery_mode=2), routing_key=QUEUE
                        )
                    )
                    api = f"http://127.0.0.1:{server.management.port}/api/queues/%2F/{QUEUE}"
                    auth = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}
                    async with aiohttp.ClientSession(headers=auth) as http:
                        listing = asyncio.ensure_future(http.get(api))
                        ctl = asyncio.ensure_future(_ctl(tmp_path, "list_queues"))
                        health = await http.get(
                            f"http://127.0.0.1:{server.management.port}/api/health/checks/alarms"
                        )
                        assert health.status == 200  # health checks do not wait
                        await asyncio.sleep(0.2)  # give the held operations every chance
                        assert held.entered.is_set() and server.recovering
                        assert not declare.done() and not confirm.done() and not listing.done()
                        assert not ctl.done()
                        with pytest.raises(CtlError, match="stored messages are back"):
                            await asyncio.to_thread(
                                call, str(tmp_path / "ctl.sock"), "list_queues", {}, 0.3
                            )
                        assert server.broker.vhosts["/"].queues[QUEUE].message_count == 0, (
                            "the model is still empty: only the hold keeps the counts right"
                        )
                        held.release.set()
                        queue = await asyncio.wait_for(declare, 30)
                        assert queue.declaration_result.message_count == STORED - ACKED
                        await asyncio.wait_for(confirm, 30)
                        response = await asyncio.wait_for(listing, 30)
                        assert response.status == 200
                        body = await response.json()
                        assert body["messages"] == STORED - ACKED + 1, body
                        reply = await asyncio.wait_for(ctl, 30)
                        assert reply["ok"][0]["messages"] == STORED - ACKED + 1, reply
                got = await _drain(queue)
            assert [body for body, _ in got] == [f"m{i}".encode() for i in range(ACKED, STORED)] + [
                b"new"
            ]
            assert not any(redelivered for _, redelivered in got)
            assert not server.recovering
        finally:
            held.release.set()
            await server.stop()

    asyncio.run(main())


def test_stop_during_recovery_writes_no_clean_index(tmp_path: Path, held: HeldRecovery) -> None:
    """A shutdown while the scan runs cancels it, and leaves no clean-shutdown index
    (it would describe a half-read log): the next start scans and loses nothing."""

    async def main() -> None:
        held.release.set()
        await _fill(tmp_path)
        held.release.clear()
        server = Node(_config(tmp_path))
        await server.start(wait_for_recovery=False)
        conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{server.port}/")
        ch = await conn.channel()
        declare = asyncio.ensure_future(ch.declare_queue(QUEUE, passive=True))
        await _held_connections(server)
        stopping = asyncio.ensure_future(server.stop())
        await asyncio.sleep(0.05)
        held.release.set()  # the scan starts, sees the cancel, and gives up
        await asyncio.wait_for(stopping, 30)
        assert server.recovery is not None and server.recovery.done()
        assert not server.recovery.cancelled() and server.recovery.exception() is None
        with pytest.raises((aio_pika.exceptions.AMQPError, ConnectionError)):
            await asyncio.wait_for(declare, 30)  # closed by the shutdown, not answered
        assert not os.path.exists(tmp_path / "msgs" / "clean.idx")

        again = Node(_config(tmp_path))
        await again.start()
        try:
            conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{again.port}/")
            async with conn:
                ch = await conn.channel()
                queue = await ch.declare_queue(QUEUE, passive=True)
                assert queue.declaration_result.message_count == STORED - ACKED
                got = await _drain(queue)
            assert [body for body, _ in got] == [f"m{i}".encode() for i in range(ACKED, STORED)]
        finally:
            await again.stop()

    asyncio.run(main())


def test_queue_does_not_expire_while_recovering(tmp_path: Path, held: HeldRecovery) -> None:
    """x-expires counts from the end of recovery: a queue unused for longer than
    its expiry while the broker was still reading it back is not deleted."""

    async def main() -> None:
        held.release.set()
        await _fill(tmp_path, **{"x-expires": 1000})
        held.release.clear()
        server = Node(_config(tmp_path))
        await server.start(wait_for_recovery=False)
        try:
            await asyncio.sleep(1.5)  # longer than the expiry, all of it recovering
            assert server.recovering
            assert QUEUE in server.broker.vhosts["/"].queues
            held.release.set()
            await server.wait_recovered()
            conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{server.port}/")
            async with conn:
                ch = await conn.channel()
                queue = await ch.declare_queue(QUEUE, passive=True)
                assert queue.declaration_result.message_count == STORED - ACKED
        finally:
            await server.stop()

    asyncio.run(main())
