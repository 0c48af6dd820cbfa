"""A follower's client-port proxy (cluster/proxy.py) on real sockets (no etcd, no nodes)."""

from __future__ import annotations

import asyncio
import contextlib

from leveret.cluster.local import free_port
from leveret.cluster.proxy import Proxy


async def _upstream(script):  # noqa: ANN001, ANN202
    """A server standing for the leader, running `script(reader, writer)` per connection."""
    server = await asyncio.start_server(script, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _released(proxy: Proxy) -> None:
    while proxy._writers or proxy._joined:
        await asyncio.sleep(0.01)


def test_the_leader_closing_ends_a_connection_whose_client_vanished() -> None:
    """A client that vanished without a word (cut off, its host gone: no FIN, no reset
    ever comes) is found out by the leader, whose heartbeat check closes its side. The
    proxy then lets go of both sides, rather than hold the client's socket half closed
    until TCP gives up on it many minutes later."""

    async def run() -> None:
        async def leader(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readexactly(5)
            writer.write(b"bye")
            writer.close()  # as a broker closes a connection that missed its heartbeats

        server, port = await _upstream(leader)
        proxy = Proxy("127.0.0.1", free_port(), lambda: ("127.0.0.1", port), 1.0, "amqp")
        await proxy.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        try:
            writer.write(b"hello")  # then silence: the client is gone as far as anyone hears
            await asyncio.wait_for(_released(proxy), 30)
            assert await asyncio.wait_for(reader.read(), 30) == b"bye"  # all, then EOF
        finally:
            writer.close()
            await proxy.stop()
            server.close()

    asyncio.run(run())


def test_a_client_that_half_closes_still_gets_the_answer() -> None:
    """A client that sends its request and shuts its sending side (an HTTP client may)
    gets the leader's whole answer, and the proxy lets go of both sides after it."""

    async def run() -> None:
        async def leader(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            request = await reader.read()  # to EOF: the client's half close passed on
            await asyncio.sleep(0.3)  # a slow answer
            writer.write(b"answer to " + request)
            writer.close()

        server, port = await _upstream(leader)
        proxy = Proxy("127.0.0.1", free_port(), lambda: ("127.0.0.1", port), 1.0, "http")
        await proxy.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        try:
            writer.write(b"GET")
            writer.write_eof()
            assert await asyncio.wait_for(reader.read(), 30) == b"answer to GET"
            await asyncio.wait_for(_released(proxy), 30)
        finally:
            with contextlib.suppress(OSError):
                writer.close()
            await proxy.stop()
            server.close()

    asyncio.run(run())
