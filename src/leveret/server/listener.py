"""The TCP listener and the broker process's lifetime."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from leveret.broker import definitions_json
from leveret.broker.broker import Broker
from leveret.broker.errors import InvalidValue, ModelError
from leveret.config import Listener, ServerConfig
from leveret.server.alarms import ResourceAlarms
from leveret.server.busy_wait import BusyWait
from leveret.server.connection import AMQPConnection
from leveret.server.connection_io import flush_written
from leveret.server.ctl_socket import SOCKET_NAME, ControlSocket
from leveret.server.reading import SharedReadBuffer
from leveret.server.tls import TLSAcceptor, server_context
from leveret.store.message_store import RecoveryCancelled

if TYPE_CHECKING:
    from leveret.persistence.durable_state import DurableState

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
        self.read_buffer = SharedReadBuffer(config.frame_max)
        # server/busy_wait.py: after each read the loop polls instead of sleeping for
        # busy_wait_us (latency for CPU); off by default, as RabbitMQ's +sbwt none.
        self.busy_wait = BusyWait(self.loop, config.busy_wait_us) if config.busy_wait_us else None
        # While a connection's read is handled: the connections it queued output for,
        # flushed when it is done (AMQPConnection._flush_soon).
        self.read_output: list[AMQPConnection] | None = None
        self._servers: list[asyncio.base_events.Server] = []
        self.control: ControlSocket | None = None
        self.management: Any = None  # leveret.management.app.ManagementServer when running
        self.prometheus: Any = None  # leveret.management.prometheus.PrometheusServer
        self.links: Any = None  # leveret.links.manager.LinkManager once started
        self.cluster: Any = None  # leveret.cluster.node.ClusterNode when this node leads
        self.mqtt: Any = None  # leveret.mqtt.listener.MQTTListeners when an MQTT port is set
        self.port = config.port
        # (host, port) actually bound, one per listener (ports resolved when 0)
        self.addresses: list[tuple[str, int]] = []
        self.started_at = time.monotonic()
        # After a restart the broker listens first and reads its stored messages back
        # in a worker thread (`recovery`); meanwhile connections hold client
        # operations, and the management API and leveret ctl wait for it.
        self.recovering = False
        self.held: list[AMQPConnection] = []  # connections holding an operation, in order
        self.recovery: asyncio.Task[None] | None = None
        self._cancel_recovery = threading.Event()

    async def start(self, wait_for_recovery: bool = True) -> None:
        """Open the store's definitions, listen, then recover the stored messages.

        With `wait_for_recovery` (the default, for code that embeds the broker) this
        returns once every queue has its messages back; without it (the CLI) it
        returns as soon as the broker listens, and `recovery` finishes later.
        """
        started = self.started_at = time.monotonic()
        if self.config.persistence and self.durable_state is None:
            self._open_store()
        if self.config.load_definitions:
            if self.recovering:
                await self._recover()  # the import must see (and may refuse) recovered queues
            self.load_definitions(self.config.load_definitions)
        self.alarms = ResourceAlarms(
            self,
            self.config.memory_high_watermark,
            self.config.disk_free_limit if self.config.persistence else 0,
            self.config.data_dir if self.config.persistence else None,
        )
        self.alarms.start()
        listeners = self.config.effective_listeners()
        context = None
        if any(listener.kind == "amqps" for listener in listeners):
            context = server_context(self.config)  # TLSConfigError names the problem
        try:
            for listener in listeners:
                if listener.kind == "amqps":
                    factory = partial(TLSAcceptor, self, context)
                else:
                    factory = partial(AMQPConnection, self)
                server = await self.loop.create_server(
                    factory,
                    listener.host,
                    listener.port,
                    reuse_address=True,
                    backlog=1024,
                )
                self._servers.append(server)
                port = server.sockets[0].getsockname()[1]
                self.addresses.append((listener.host, port))
                log.info(
                    "Leveret listening for AMQP 0-9-1%s on %s",
                    " over TLS" if listener.kind == "amqps" else "",
                    Listener(listener.host, port, listener.kind),
                )
        except OSError:
            for server in self._servers:
                server.close()
            self._servers.clear()
            raise
        self.port = self.addresses[0][1]
        await self._start_mqtt()
        if self.config.management_port is not None:
            from leveret.management.app import ManagementServer

            management = ManagementServer(self, self.config.host, self.config.management_port)
            try:
                await management.start()
                self.management = management
            except OSError as exc:
                # AMQP clients can still work; the operator learns why the API is missing.
                log.warning(
                    "management API not started on %s:%d: %s",
                    self.config.host,
                    self.config.management_port,
                    exc.strerror or exc,
                )
        if self.config.prometheus_port is not None:
            from leveret.management.prometheus import PrometheusServer

            metrics = PrometheusServer(self, self.config.host, self.config.prometheus_port)
            try:
                await metrics.start()
                self.prometheus = metrics
            except OSError as exc:
                log.warning(
                    "Prometheus metrics not started on %s:%d: %s",
                    self.config.host,
                    self.config.prometheus_port,
                    exc.strerror or exc,
                )
        if self.config.persistence:
            self.control = ControlSocket(
                lambda: self.broker,
                os.path.join(self.config.data_dir, SOCKET_NAME),
                self.wait_recovered,
            )
            await self.control.start()
        if self.recovering:
            self.recovery = self.loop.create_task(self._recover())
        from leveret.links.manager import LinkManager

        self.links = self.broker.links = LinkManager(self)  # shovels, federation
        await self.links.start()
        log.info("Leveret started in %.3f s", time.monotonic() - started)
        if wait_for_recovery and self.recovery is not None:
            try:
                await asyncio.shield(self.recovery)
            except Exception:
                await self.stop()  # listening, but the data dir could not be read
                raise

    async def _start_mqtt(self) -> None:
        """MQTT, MQTT over TLS and Web MQTT (leveret.mqtt), when a port is configured;
        a port taken stops the start, as an AMQP one does."""
        config = self.config
        ports = (config.mqtt_port, config.web_mqtt_port, config.mqtt_tls_port)
        if all(port is None for port in ports):
            return
        from leveret.mqtt.listener import MQTTListeners

        mqtt = MQTTListeners(self)
        try:
            await mqtt.start()
        except OSError:
            for server in self._servers:
                server.close()
            self._servers.clear()
            raise
        self.mqtt = self.broker.mqtt = mqtt

    async def _recover(self) -> None:
        """Read the stored messages back in a worker thread, then let clients in."""
        state = self.durable_state
        assert state is not None
        try:
            stored = await self.loop.run_in_executor(
                None, state.messages.recover, self._cancel_recovery.is_set
            )
        except RecoveryCancelled:
            log.info("recovery stopped by the shutdown; the next start reads the log again")
            return
        state.restore_messages(self.broker, stored)
        self.recovering = False
        held, self.held = self.held, []
        for conn in held:  # first held, first answered
            conn.recovery_done()
        for conn in list(self.connections):
            conn.recovery_done()  # the rest only stop checking their events

    async def wait_recovered(self) -> None:
        """Return once stored messages are back (at once when there was nothing to do)."""
        if self.recovery is not None:
            await asyncio.shield(self.recovery)

    def output_batch(self, fn: Callable[[], None]) -> None:
        """Run `fn` and write what it queued for any connection before returning, as a
        read's output is written at the end of the read, not at the next loop turn.

        A cluster leader releases held confirms through this (cluster/leader.py's
        Tap.check): they go out in the same callback that checked its etcd lease is
        still valid, not a loop turn later, when the process may have been paused
        past the lease in between."""
        if self.read_output is not None:  # inside a read: its end writes it all
            fn()
            return
        self.read_output = written = []
        try:
            fn()
        finally:
            self.read_output = None
            flush_written(written)

    def load_definitions(self, path: str) -> None:
        """Import a RabbitMQ definitions file at boot; InvalidValue names the file and problem."""
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
            counts = definitions_json.import_definitions(self.broker, doc)
        except OSError as exc:
            raise InvalidValue(f"definitions file {path}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise InvalidValue(f"definitions file {path}: not JSON: {exc}") from None
        except ModelError as exc:
            raise InvalidValue(f"definitions file {path}: {exc}") from None
        log.info(
            "imported definitions from %s: %s",
            path,
            ", ".join(f"{n} {k}" for k, n in counts.items() if n),
        )

    def _open_store(self) -> None:
        from leveret.persistence.durable_state import DurableState

        state = DurableState(
            self.config.data_dir,
            self.config.fsync,
            self.config.max_memory_bytes,
            self.loop,
            self.config.queue_ram_messages,
            self.config.queue_ram_bytes,
        )
        self.broker = Broker(self.config, state)
        self.durable_state = state
        state.restore_definitions(self.broker)
        self.recovering = True

    async def stop(self, reason: str = "shutdown") -> None:
        """Close every client with 320 CONNECTION_FORCED, then stop listening."""
        if self.links is not None:
            await self.links.stop()
        if self.recovery is not None and not self.recovery.done():
            self._cancel_recovery.set()  # the scan stops at its next segment
            await asyncio.wait([self.recovery])
        if self.alarms is not None:
            self.alarms.stop()
        if self.control is not None:
            await self.control.stop()
        if self.management is not None:
            await self.management.stop()
        if self.prometheus is not None:
            await self.prometheus.stop()
            self.prometheus = None
        if self.mqtt is not None:
            await self.mqtt.stop()
            self.mqtt = None
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
