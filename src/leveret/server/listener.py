"""The TCP listener and the broker process's lifetime."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from leveret.broker.broker import Broker
from leveret.config import ServerConfig
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
        self._server: asyncio.base_events.Server | None = None
        self.port = config.port

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
        self._server = await self.loop.create_server(
            lambda: AMQPConnection(self),
            self.config.host,
            self.config.port,
            reuse_address=True,
            backlog=1024,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        log.info(
            "Leveret listening for AMQP 0-9-1 on %s:%d (started in %.3f s)",
            self.config.host,
            self.port,
            time.monotonic() - started,
        )

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
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.force_close(reason)
        deadline = self.loop.time() + 2.0
        while self.connections and self.loop.time() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        if self.durable_state is not None:
            self.durable_state.close()
            self.durable_state = None
        log.info("Leveret stopped")
