"""MQTT over WebSockets (RabbitMQ's Web MQTT plugin): ws://HOST:PORT/ws.

Each binary WebSocket message carries MQTT bytes (a message may hold part of a
packet or several); the session is the same MQTTConnection as over TCP. The
`mqtt` subprotocol is offered, as MQTT 6.0 asks. Writes go out in order through
one sender task per connection, since aiohttp's send is a coroutine.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from aiohttp import WSMsgType, web

from leveret.mqtt.session import MQTTConnection

if TYPE_CHECKING:
    from leveret.mqtt.listener import MQTTListeners

log = logging.getLogger("leveret.mqtt")

PATH = "/ws"


class WebSocketTransport:
    """A WebSocket as a session's Transport (mqtt/session.py)."""

    kind = "ws"

    def __init__(self, ws: web.WebSocketResponse, peer: str, peer_host: str, local: str) -> None:
        self.ws = ws
        self.peer = peer
        self.peer_host = peer_host
        self.local = local
        self._out: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._sender = asyncio.ensure_future(self._send_all())
        self.closed = False
        self._close_frame = (1000, "")  # the WebSocket close code and reason
        self.readable = asyncio.Event()  # cleared while the session pauses reading
        self.readable.set()

    async def _send_all(self) -> None:
        while True:
            data = await self._out.get()
            if data is None:
                break
            try:
                await self.ws.send_bytes(data)
            except (ConnectionError, RuntimeError):
                break
        if not self.ws.closed:
            code, reason = self._close_frame
            # A close reason holds at most 123 bytes of UTF-8 (RFC 6455 5.5).
            message = reason.encode()[:123].decode("utf-8", "ignore").encode()
            await self.ws.close(code=code, message=message)

    def write(self, data: bytes) -> None:
        if not self.closed:
            self._out.put_nowait(data)

    def close(self, ws_close: tuple[int, str] | None = None) -> None:
        """`ws_close`: the close frame's code and reason (as RabbitMQ's Web MQTT sends
        them when it refuses a client: 1002 and the refusal's name); 1000 otherwise."""
        if not self.closed:
            if ws_close is not None:
                self._close_frame = ws_close
            self.closed = True
            self.readable.set()
            self._out.put_nowait(None)

    def pause_reading(self) -> None:
        """The reader loop (WebMQTT._handle) waits before its next message."""
        self.readable.clear()

    def resume_reading(self) -> None:
        self.readable.set()

    async def wait_sent(self) -> None:
        await asyncio.shield(self._sender)


class WebMQTT:
    """The aiohttp server of the Web MQTT listener."""

    def __init__(self, listeners: MQTTListeners, host: str, port: int) -> None:
        self.listeners = listeners
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        app = web.Application()
        app.router.add_get(PATH, self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await self._runner.cleanup()
            self._runner = None
            raise
        server = site._server
        if server is not None and getattr(server, "sockets", None):
            self.port = server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(protocols=("mqtt",), max_msg_size=0)
        await ws.prepare(request)
        peer = request.transport.get_extra_info("peername") if request.transport else None
        peer_host = str(peer[0]) if isinstance(peer, tuple) else ""
        peer_text = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "?"
        local = request.transport.get_extra_info("sockname") if request.transport else None
        local_text = f"{local[0]}:{local[1]}" if isinstance(local, tuple) else "?"
        transport = WebSocketTransport(ws, peer_text, peer_host, local_text)
        session = MQTTConnection(self.listeners, transport)
        try:
            async for msg in ws:
                if not transport.readable.is_set():
                    await transport.readable.wait()
                if msg.type == WSMsgType.BINARY:
                    session.receive(msg.data)
                elif msg.type == WSMsgType.TEXT:
                    # MQTT over WebSockets is binary only (MQTT 6.0).
                    log.warning("Web MQTT connection %s sent a text frame, closing", peer_text)
                    session.close()
                    break
                else:
                    break
                if transport.closed:
                    break
        finally:
            session.connection_lost()
            transport.close()
            await transport.wait_sent()
        return ws
