"""The composition root: builds one node of Leveret and runs its lifetime.

A node is the broker (`broker.Broker`, with the extensions that add to the model:
`links.register`), its store (`persistence.DurableState`, when persistence is on),
the AMQP listeners (`server.listener.Server`), the MQTT ones (`mqtt/`), the
management API, the Prometheus endpoint with its collectors, links (shovels and
federation), the `leveret ctl` socket and, when it leads a cluster, the
`cluster.node.ClusterNode`. Only this
module imports all of them; each of them gets the `Node` as a
`leveret.handle.NodeHandle` and none imports another one above it
(tests/unit/test_layering.py keeps that so).

`leveret server` (cli.py), the embedded broker of `leveret.testing` and a cluster
node that takes the lead all build their broker here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from leveret import links as links_package
from leveret.broker import definitions_json
from leveret.broker.broker import Broker
from leveret.broker.errors import InvalidValue, ModelError
from leveret.broker.ports import Extension
from leveret.config import ServerConfig
from leveret.links.manager import LinkManager
from leveret.persistence.durable_state import DurableState
from leveret.server.alarms import ResourceAlarms
from leveret.server.connection import AMQPConnection
from leveret.server.ctl_socket import SOCKET_NAME, ControlSocket
from leveret.server.listener import Server
from leveret.store.message_store import RecoveryCancelled
from leveret.workers.crossing import attach as attach_workers
from leveret.workers.limits import LimitCounts
from leveret.workers.mesh import Mesh
from leveret.workers.metadata import Metadata

if TYPE_CHECKING:
    from leveret.management.app import ManagementServer
    from leveret.management.prometheus import Collector, Metrics, PrometheusServer
    from leveret.management.workers import WorkerStats
    from leveret.mqtt.listener import MQTTListeners

log = logging.getLogger("leveret.server")

#: what every node's broker is extended with, before its stored parameters load
EXTENSIONS: tuple[Extension, ...] = (links_package.register,)


class Node:
    """One broker node: built here, and the handle (`leveret.handle.NodeHandle`) that
    management, Prometheus, links, ctl and the cluster reach it through."""

    def __init__(
        self,
        config: ServerConfig,
        loop: asyncio.AbstractEventLoop | None = None,
        mesh: Mesh | None = None,
        listen_sockets: list[list[socket.socket]] | None = None,
        wait_to_serve: bool = False,
        mqtt_sockets: list[socket.socket] | None = None,
    ) -> None:
        self.config = config
        self.loop = loop or asyncio.get_event_loop()
        self.durable_state: DurableState | None = None
        # One worker of a broker made of several (leveret.workers): its links to the
        # others. None: the broker is this process alone.
        self.mesh = mesh
        self.broker = Broker(config, extensions=EXTENSIONS)  # in memory until start()
        self.broker.mesh = mesh
        # With a mesh: the one order of metadata changes (worker 0 writes them).
        self.metadata = Metadata(lambda: self.broker, mesh) if mesh is not None else None
        self.broker.meta = self.metadata
        self.limit_counts = LimitCounts(lambda: self.broker, mesh) if mesh is not None else None
        self.broker.limit_counts = self.limit_counts
        # A worker accepts on listening sockets its supervisor made (one list per
        # effective listener); None: the listener binds its own.
        self.listener = Server(config, self.loop, self.broker, listen_sockets)
        # A cluster leader releases held confirms through the listener's batch
        # (cluster/leader.py's Tap.check); the bound method itself, not a wrapper.
        self.output_batch = self.listener.output_batch
        self.control: ControlSocket | None = None
        self.management: ManagementServer | None = None
        self.prometheus: PrometheusServer | None = None
        self.links: LinkManager | None = None
        self.cluster: Any = None  # leveret.cluster.node.ClusterNode when this node leads
        self.mqtt: MQTTListeners | None = None  # when an MQTT port is set
        # A worker's MQTT over TCP listening sockets (its supervisor's group for the
        # port); None: the MQTT listener binds its own.
        self.mqtt_sockets = mqtt_sockets
        # One of several workers: what each tells worker 0's management API,
        # Prometheus and ctl socket about its queues and connections.
        self.worker_stats: WorkerStats | None = None
        self.started_at = time.monotonic()
        # After a restart the node listens first and reads its stored messages back
        # in a worker thread (`recovery`); meanwhile connections hold client
        # operations (the listener's gate), and the management API and leveret ctl
        # wait for it.
        self.recovery: asyncio.Task[None] | None = None
        self._cancel_recovery = threading.Event()
        self._messages_back = False
        # A worker of a broker made of several, started by its supervisor: it accepts
        # no client, and holds the operations of those MQTT brings, as while it
        # recovers, until `serve()` (once every worker is recovered, linked to every
        # other and in sync with worker 0). None: it serves once it listens.
        self.serving: asyncio.Future[None] | None = (
            self.loop.create_future() if wait_to_serve else None
        )

    # --- what the handle reads of the listener ----------------------------------------

    @property
    def recovering(self) -> bool:
        return self.listener.recovering

    @property
    def connections(self) -> set[AMQPConnection]:
        return self.listener.connections

    @property
    def alarms(self) -> ResourceAlarms | None:
        return self.listener.alarms

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return self.listener.addresses

    @property
    def port(self) -> int:
        return self.listener.port

    # --- life -------------------------------------------------------------------------

    async def start(self, wait_for_recovery: bool = True) -> None:
        """Open the store's definitions, listen, then recover the stored messages.

        With `wait_for_recovery` (the default, for code that embeds the broker) this
        returns once every queue has its messages back; without it (the CLI) it
        returns as soon as the broker listens, and `recovery` finishes later.
        """
        started = self.started_at = time.monotonic()
        if self.config.persistence and self.durable_state is None:
            self._open_store()
        if self.mesh is not None:
            attach_workers(self.broker, self.mesh)  # messages to and from other workers
        # One of several workers: in sync with worker 0 before clients come; only
        # worker 0 imports a definitions file (the others take it from there).
        if self.metadata is not None:
            await self.metadata.start()
        importer = self.mesh is None or self.mesh.index == 0
        if self.config.load_definitions and importer:
            if self.recovering:
                await self._recover()  # the import must see (and may refuse) recovered queues
            self.load_definitions(self.config.load_definitions)
        if self.serving is not None:
            self.listener.recovering = True  # the gate, until serve()
            self.listener.accepting = False
        await self.listener.start()
        await self._start_mqtt()
        if self.mesh is not None:
            from leveret.management.workers import WorkerStats

            self.worker_stats = WorkerStats(self)
        if self.config.management_port is not None:
            from leveret.management.app import ManagementServer  # aiohttp: only when asked

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
        # Made before the endpoints start (it only notes the node): Prometheus' links
        # collector reads it. Started once the node is up, below.
        links = LinkManager(self)
        if self.config.prometheus_port is not None:
            from leveret.management.prometheus import PrometheusServer

            metrics = PrometheusServer(
                self.prometheus_metrics(links), self.config.host, self.config.prometheus_port
            )
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
            stats = self.worker_stats
            self.control = ControlSocket(
                lambda: self.broker,
                os.path.join(self.config.data_dir, SOCKET_NAME),
                self.wait_recovered if stats is None else stats.ctl_ready,
                None if stats is None else stats.ctl_operations(),
            )
            await self.control.start()
        if self.durable_state is not None and self.recovering and not self._messages_back:
            self.recovery = self.loop.create_task(self._recover())
        self.links = self.broker.links = links  # shovels, federation
        if self.mesh is None or self.mesh.index == 0:
            # One worker runs the broker's shovels and federation links, not each of them.
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

        mqtt = MQTTListeners(self.listener, self.mqtt_sockets)
        try:
            await mqtt.start()
        except OSError:
            self.listener.close_listeners()
            raise
        self.mqtt = self.broker.mqtt = mqtt

    def prometheus_metrics(self, links: LinkManager) -> Metrics:
        """The node's Prometheus collectors, one per package, in the order their
        families go out: RabbitMQ's first, then Leveret's own."""
        from leveret.management.prometheus import Metrics
        from leveret.management.prometheus.collectors import (
            alarms,
            cluster,
            core,
            delayed,
            global_counters,
            identity,
            process,
            store,
        )
        from leveret.management.prometheus.collectors import links as link_metrics

        collectors: list[Collector] = [
            core.CoreCollector(),
            global_counters.GlobalCollector(),
            alarms.AlarmCollector(self),
            process.ProcessCollector(),
            identity.IdentityCollector(),
        ]
        if self.cluster is not None:
            collectors.append(cluster.ClusterCollector(self.cluster))
        collectors.append(link_metrics.LinksCollector(links))
        if self.durable_state is not None:
            collectors.append(store.StoreCollector(self.durable_state))
        collectors.append(delayed.DelayedCollector())
        return Metrics(self, collectors)

    def _open_store(self) -> None:
        state = DurableState(
            self.config.data_dir,
            self.config.fsync,
            self.config.max_memory_bytes,
            self.loop,
            self.config.queue_ram_messages,
            self.config.queue_ram_bytes,
        )
        self.broker = self.listener.broker = Broker(self.config, state, EXTENSIONS)
        self.broker.mesh = self.mesh
        self.broker.meta = self.metadata
        self.broker.limit_counts = self.limit_counts
        self.durable_state = state
        state.restore_definitions(self.broker)
        self.listener.recovering = True

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
        self._messages_back = True
        if self.serving is None or self.serving.done():
            self.listener.recovery_done()

    async def serve(self) -> None:
        """A node made with `wait_to_serve`: accept clients now, and run the operations
        held meanwhile (its stored messages are back: the caller waited for them)."""
        assert self.serving is not None, "serve() is for a node made with wait_to_serve"
        if self.serving.done():
            return
        await self.listener.start_serving()
        self.serving.set_result(None)
        self.listener.recovery_done()

    async def wait_recovered(self) -> None:
        """Return once stored messages are back (at once when there was nothing to do)
        and, for a node made with `wait_to_serve`, once it serves."""
        if self.recovery is not None:
            await asyncio.shield(self.recovery)
        if self.serving is not None:
            await asyncio.shield(self.serving)

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

    async def stop(self, reason: str = "shutdown") -> None:
        """Close every client with 320 CONNECTION_FORCED, then stop listening."""
        if self.metadata is not None:
            self.metadata.stop()
        if self.links is not None:
            await self.links.stop()
        if self.recovery is not None and not self.recovery.done():
            self._cancel_recovery.set()  # the scan stops at its next segment
            await asyncio.wait([self.recovery])
        self.listener.stop_alarms()
        # Clients first: a management request can hold its server's stop for seconds, and
        # a leader stepping down should send its clients to the new leader without that wait.
        if self.mqtt is not None:
            await self.mqtt.stop()
            self.mqtt = None
        await self.listener.close(reason)
        if self.control is not None:
            await self.control.stop()
        if self.management is not None:
            await self.management.stop()
        if self.prometheus is not None:
            await self.prometheus.stop()
            self.prometheus = None
        if self.worker_stats is not None:
            await self.worker_stats.stop()
        if self.durable_state is not None:
            self.durable_state.close()
            self.durable_state = None
        log.info("Leveret stopped")
