"""A follower's listeners: each connection is passed byte for byte to the leader.

A byte-level proxy needs no codec: AMQP (plain or TLS: the TLS session is the
leader's), HTTP and Prometheus all pass through unchanged, so a client or a load
balancer that knows one address reaches the leader through any node. A
connection that arrives while there is no leader waits for one (up to `hold`
seconds) rather than being refused; when the leader changes every proxied
connection is closed, and clients reconnect as after any broker restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

log = logging.getLogger("leveret.cluster")

Target = Callable[[], tuple[str, int] | None]
CHUNK = 256 * 1024


class Proxy:
    def __init__(self, host: str, port: int, target: Target, hold: float, what: str) -> None:
        self.host = host
        self.port = port
        self.target = target
        self.hold = hold
        self.what = what
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()  # every client and upstream
        self._joined: set[asyncio.StreamWriter] = set()  # clients passed to a leader

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, reuse_address=True, backlog=1024, limit=CHUNK
        )

    async def stop(self) -> None:
        server, self._server = self._server, None  # waiting handlers see it and end
        if server is not None:
            server.close()
            self._abort_everything()
            await server.wait_closed()

    def drop_all(self) -> None:
        """Close the connections passed to a leader (those waiting for one stay)."""
        for writer in list(self._joined):
            writer.transport.abort()
        self._joined.clear()

    def _abort_everything(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        self._joined.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.hold
            while True:
                target = self.target()
                if target is not None:
                    try:
                        up_reader, upstream = await asyncio.wait_for(
                            asyncio.open_connection(*target, limit=CHUNK), 2
                        )
                        break
                    except (TimeoutError, OSError):
                        pass  # the leader is starting, or just went away
                if loop.time() > deadline or self._server is None or writer.is_closing():
                    if loop.time() > deadline:
                        log.info("proxy %s: no leader to pass a connection to", self.what)
                    return  # (or the proxy stopped: this node leads now)
                await asyncio.sleep(0.05)
            self._writers.add(upstream)
            self._joined.add(writer)
            to_leader = asyncio.ensure_future(_pipe(reader, upstream))
            try:
                # Once the leader's side ends, the connection is over: the leader never
                # half-closes. A client's half close is passed on and its answer awaited
                # (an HTTP client may send its request so), but a client that vanished
                # without a word is closed here once the leader gave up on it (its
                # heartbeat check), not held half closed until TCP gives up.
                await _pipe(up_reader, writer)
            finally:
                to_leader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await to_leader
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # either end went away, or the proxy is stopping
        finally:
            self._writers.discard(writer)
            self._joined.discard(writer)
            writer.close()
            if upstream is not None:
                self._writers.discard(upstream)
                upstream.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (OSError, RuntimeError, asyncio.IncompleteReadError):
        pass  # (RuntimeError: uvloop's write to a transport the other pipe aborted)
    finally:
        try:
            if not writer.is_closing() and writer.can_write_eof():
                writer.write_eof()
        except (OSError, RuntimeError):
            pass  # the other side is already closed
