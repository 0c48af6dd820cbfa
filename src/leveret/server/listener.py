"""The AMQP listeners, and the connections they accepted.

`Server` is what an `AMQPConnection` reaches its broker through: the model, the
open connections, the read buffer they share, the resource alarms that block them
and, while stored messages are read back, the gate that holds their operations.
The node around it (store, management, Prometheus, links, ctl, cluster) is built by
`leveret.launcher`, which this package does not import.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import socket
from collections.abc import Callable
from functools import partial
from typing import Any

from leveret.broker.broker import Broker
from leveret.config import Listener, ServerConfig
from leveret.server.alarms import ResourceAlarms
from leveret.server.busy_wait import BusyWait
from leveret.server.connection import AMQPConnection
from leveret.server.connection_io import flush_written
from leveret.server.reading import SharedReadBuffer
from leveret.server.tls import TLSAcceptor, server_context

log = logging.getLogger("leveret.server")


class Server:
    def __init__(
        self,
        config: ServerConfig,
        loop: asyncio.AbstractEventLoop,
        broker: Broker,
        sockets: list[list[socket.socket]] | None = None,
    ) -> None:
        self.config = config
        # Listening sockets made by someone else, one list per effective listener (a
        # worker of a broker made of several gets its share of SO_REUSEPORT groups
        # from the supervisor, leveret.workers.sockets); None: bind them here.
        self.sockets = sockets
        self.loop = loop
        self.broker = broker
        self.alarms: ResourceAlarms | None = None
        self.connections: set[AMQPConnection] = set()
        self.read_buffer = SharedReadBuffer(config.frame_max)
        # server/busy_wait.py: after each read the loop polls instead of sleeping for
        # busy_wait_us (latency for CPU); off by default, as RabbitMQ's +sbwt none.
        self.busy_wait = BusyWait(self.loop, config.busy_wait_us) if config.busy_wait_us else None
        # While a connection's read is handled: the connections it queued output for,
        # flushed when it is done (AMQPConnection._flush_soon).
        self.read_output: list[AMQPConnection] | None = None
        self._servers: list[asyncio.base_events.Server] = []
        self.port = config.port
        # (host, port) actually bound, one per listener (ports resolved when 0)
        self.addresses: list[tuple[str, int]] = []
        self._listeners: list[Listener] = []  # those on sockets made elsewhere, as bound
        # After a restart the node listens first and reads its stored messages back
        # (leveret.launcher); meanwhile connections hold client operations here.
        self.recovering = False
        self.held: list[AMQPConnection] = []  # connections holding an operation, in order
        # A worker of a broker of several with affinity on (workers/affinity.py): where
        # connections go to the worker of their queues. None: every connection stays.
        self.handoffs: Any = None  # leveret.workers.affinity.Handoffs
        # A worker's handoff channels whatever its affinity setting: MQTT over TCP
        # sends a client to the worker that serves its client id (mqtt/listener.py).
        self.handoff_channels: Any = None
        self._adopting: set[asyncio.Task] = set()
        # False: `start` prepares the listeners on sockets made elsewhere without
        # accepting; `start_serving` accepts. Until then the kernel keeps new
        # connections in the sockets' backlog (a worker of a broker of several that
        # waits for the others: leveret.worker).
        self.accepting = True

    async def start(self) -> None:
        """Start the resource alarms, then listen on every configured address."""
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
            for n, listener in enumerate(listeners):
                if listener.kind == "amqps":
                    factory = partial(TLSAcceptor, self, context)
                else:
                    factory = partial(AMQPConnection, self)
                if self.sockets is not None:
                    await self._serve_sockets(factory, listener, self.sockets[n])
                    continue
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
            self.close_listeners()
            raise
        self.port = self.addresses[0][1]

    async def _serve_sockets(
        self,
        factory: Callable[[], asyncio.Protocol],
        listener: Listener,
        socks: list[socket.socket],
    ) -> None:
        """Accept on listening sockets made elsewhere (one per address of the listener),
        now or, when not `accepting`, from `start_serving`.

        Logged as "accepting", not "listening": the process that made the sockets says
        when the broker listens, once all of its workers accept."""
        port = listener.port
        for sock in socks:
            server = await self.loop.create_server(
                factory, sock=sock, backlog=1024, start_serving=self.accepting
            )
            self._servers.append(server)
            port = sock.getsockname()[1]
        self.addresses.append((listener.host, port))
        self._listeners.append(Listener(listener.host, port, listener.kind))
        if self.accepting:
            self._log_accepting(self._listeners[-1])

    async def start_serving(self) -> None:
        """Accept on the listeners `start` prepared without accepting."""
        if self.accepting:
            return
        self.accepting = True
        for server in self._servers:
            await server.start_serving()
        for listener in self._listeners:
            self._log_accepting(listener)

    @staticmethod
    def _log_accepting(listener: Listener) -> None:
        log.info(
            "accepting AMQP 0-9-1%s on %s",
            " over TLS" if listener.kind == "amqps" else "",
            listener,
        )

    def adopt(self, sock: socket.socket, state: bytes) -> None:
        """Serve a client connection another worker handed over with its state
        (`AMQPConnection.export_state`, pickled: the handoff channel is private to
        this broker's workers, as the mesh's links are)."""
        try:
            data = pickle.loads(state)
            if isinstance(data, dict) and "mqtt" in data:  # (mqtt/listener.py: route)
                mqtt = self.broker.mqtt
                if mqtt is None:
                    raise ValueError("an MQTT connection, and this worker serves no MQTT")
                mqtt.adopt(sock, data["mqtt"])
                return
            conn = AMQPConnection(self)
            conn.import_state(data)
        except Exception as exc:  # the client sees its connection close, and reconnects
            log.warning("cannot take a connection over from another worker: %s", exc)
            sock.close()
            return
        task = self.loop.create_task(self.loop.connect_accepted_socket(lambda: conn, sock))
        self._adopting.add(task)
        task.add_done_callback(partial(self._adopted, sock))

    def _adopted(self, sock: socket.socket, task: asyncio.Task) -> None:
        self._adopting.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("cannot serve a connection handed over: %s", task.exception())
            sock.close()

    def close_listeners(self) -> None:
        """Stop listening at once (a start that failed after these opened)."""
        for server in self._servers:
            server.close()
        self._servers.clear()

    def recovery_done(self) -> None:
        """Stored messages are back: answer the held operations, first held first."""
        self.recovering = False
        held, self.held = self.held, []
        for conn in held:  # first held, first answered
            conn.recovery_done()
        for conn in list(self.connections):
            conn.recovery_done()  # the rest only stop checking their events

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

    def stop_alarms(self) -> None:
        if self.alarms is not None:
            self.alarms.stop()

    async def close(self, reason: str = "shutdown") -> None:
        """Stop listening, close every client with 320 CONNECTION_FORCED (`reason`),
        and abort those still open two seconds later."""
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
