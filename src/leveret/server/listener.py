"""The TCP listener and the broker process's lifetime."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from leveret.broker.broker import Broker
from leveret.config import Listener, ServerConfig
from leveret.server.alarms import ResourceAlarms
from leveret.server.connection import AMQPConnection

if TYPE_CHECKING:
    from leveret.store.durable_state import DurableState

log = logging.getLogger("leveret.server")


class Server:
    def __init__(
        self,
        config: ServerConfig,
        loop: asyncio.AbstractEventLoop | None = None,
        broker: Broker | None = None,
    ) -> None:
        self.config = config
        self.loop = loop or asyncio.get_event_loop()
        self.durable_state: DurableState | None = None
        self.alarms: ResourceAlarms | None = None
        self.broker = broker or Broker(config)
        self.connections: set[AMQPConnection] = set()
        self._servers: list[asyncio.base_events.Server] = []
        self.port = config.port
        # (host, port) actually bound, one per listener (ports resolved when 0)
        self.addresses: list[tuple[str, int]] = []

    async def start(self) -> None:
        started = time.monotonic()
        if self.config.persistence and self.durable_state is None:
            self._open_store()
        self.alarms = ResourceAlarms(
            self,
            self.config.memory_high_watermark,
            self.config.disk_free_limit if self.config.persistence else 0,
            self.config.data_dir if self.config.persistence else None,
        )
        self.alarms.start()
        try:
            for listener in self.config.effective_listeners():
                server = await self.loop.create_server(
                    lambda: AMQPConnection(self),
                    listener.host,
                    listener.port,
                    reuse_address=True,
                    backlog=1024,
                )
                self._servers.append(server)
                port = server.sockets[0].getsockname()[1]
                self.addresses.append((listener.host, port))
                log.info(
                    "Leveret listening for AMQP 0-9-1 on %s",
                    Listener(listener.host, port, listener.kind),
                )
        except OSError:
            for server in self._servers:
                server.close()
            self._servers.clear()
            raise
        self.port = self.addresses[0][1]
        log.info("Leveret started in %.3f s", time.monotonic() - started)

    def _open_store(self) -> None:
        from leveret.store.durable_state import DurableState

        state = DurableState(
            self.config.data_dir, self.config.fsync, self.config.max_memory_bytes, self.loop
        )
        self.broker = Broker(self.config, state)
        self.durable_state = state
        state.restore(self.broker)

    async def stop(self, reason: str = "shutdown") -> None:
        """Close every client with 320 CONNECTION_FORCED, then stop listening."""
        if self.alarms is not None:
            self.alarms.stop()
        for server in self._servers:
            server.close()
        for conn in list(self.connections):
            conn.force_close(reason)
        deadline = self.loop.time() + 2.0
        while self.connections and self.loop.time() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
        if self.durable_state is not None:
            self.durable_state.close()
            self.durable_state = None
        log.info("Leveret stopped")
