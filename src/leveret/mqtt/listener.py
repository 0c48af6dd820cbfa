"""The MQTT listeners (TCP, TLS, WebSocket) and what their connections share.

`MQTTListeners(server)` (the AMQP listeners' `Server`, whose broker, alarms and
recovery gate MQTT connections share) is started by the launcher when any MQTT
port is configured. It owns the client-id registry (one connection per client id), the
retained-message store and the delayed wills; each connection is an
`MQTTConnection` (mqtt/session.py) behind a small transport adapter.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import socket
from typing import TYPE_CHECKING, Any

from leveret.mqtt.retained import RetainedOnWorker0, RetainedStore, serve_retained
from leveret.mqtt.session import MQTTConnection, queue_names
from leveret.mqtt.will import PendingWills

if TYPE_CHECKING:
    from leveret.server.listener import Server

log = logging.getLogger("leveret.mqtt")


class MQTTProtocol(asyncio.Protocol):
    """An asyncio transport as a session's Transport (mqtt/session.py).

    `first`: bytes another worker read from the socket before handing it over
    (`RoutedMQTTProtocol`), handled before anything read here."""

    def __init__(self, listeners: MQTTListeners, kind: str = "tcp", first: bytes = b"") -> None:
        self.listeners = listeners
        self.kind = kind
        self.first = first
        self.transport: asyncio.Transport | None = None
        self.session: MQTTConnection | None = None
        self.peer = "?"
        self.peer_host = ""
        self.local = "?"
        # The user name a verified client certificate gives (TLS only): what
        # mqtt_ssl_cert_login logs in as and mqtt_default_vhosts is keyed by.
        self.cert_name: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # (uvloop's is not a subclass)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.peer_host = str(peer[0])
            self.peer = f"{peer[0]}:{peer[1]}"
        local = transport.get_extra_info("sockname")
        if isinstance(local, tuple):
            self.local = f"{local[0]}:{local[1]}"
        if self.kind == "tls":
            from leveret.auth.sasl import certificate_login_name

            # Empty unless the certificate was verified against tls_ca (verify on).
            self.cert_name = certificate_login_name(
                transport.get_extra_info("peercert"),
                self.listeners.server.config.tls_cert_login_from,
            )
        self.session = MQTTConnection(self.listeners, self)
        if self.first:
            first, self.first = self.first, b""
            self.session.receive(first)

    def data_received(self, data: bytes) -> None:
        if self.session is not None:
            self.session.receive(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.session is not None:
            self.session.connection_lost()
        self.transport = None

    def pause_writing(self) -> None:
        if self.session is not None:
            self.session.set_writable(False)

    def resume_writing(self) -> None:
        if self.session is not None:
            self.session.set_writable(True)

    # --- the session's Transport --------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self, ws_close: tuple[int, str] | None = None) -> None:
        if self.transport is not None:
            self.transport.close()

    def pause_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()


class RoutedMQTTProtocol(MQTTProtocol):
    """MQTT over TCP on a worker of several: a client is served by the worker of its
    client id (`MQTTListeners.home_of`), so that one worker sees every connection of a
    client id in a vhost (the newest takes over, MQTT 3.1.4-3), its will and its
    session, whose queues it owns. Until the session is open it keeps what it read; the session's
    CONNECT asks `route`, which hands the socket and those bytes to the home worker
    over the handoff channel, where they are read again from the start."""

    def __init__(self, listeners: MQTTListeners, kind: str = "tcp") -> None:
        super().__init__(listeners, kind)
        self.read: bytearray | None = bytearray()

    def data_received(self, data: bytes) -> None:
        read = self.read
        if read is not None:
            if self.session is not None and self.session.state != "connecting":
                self.read = None  # past CONNECT (a client id the broker assigned)
            else:
                read += data
        super().data_received(data)

    def route(self, vhost: str, client_id: str) -> bool:
        """Hand the connection to the worker of `client_id` in `vhost`: True once handed
        (this side then drops its descriptor, without a FIN); False to serve it here."""
        read, self.read = self.read, None
        listeners = self.listeners
        home = listeners.home_of(vhost, client_id)
        channels = listeners.server.handoff_channels
        if read is None or home is None or channels is None or self.transport is None:
            return False
        if home == channels.mesh.index:
            return False
        if not channels.can_send(home):
            log.warning(
                "MQTT connection %s (client id '%s') served here: worker %d is not linked",
                self.peer,
                client_id,
                home,
            )
            return False
        state = pickle.dumps({"mqtt": bytes(read)}, pickle.HIGHEST_PROTOCOL)
        try:
            channels.send(home, self.transport.get_extra_info("socket"), state)
        except Exception as exc:
            log.warning("MQTT connection %s served here: %s", self.peer, exc)
            return False
        log.info(
            "MQTT connection %s (client id '%s') handed to worker %d", self.peer, client_id, home
        )
        transport, self.transport = self.transport, None
        transport.abort()  # our descriptor only: no FIN
        return True


class MQTTListeners:
    """Every MQTT listener of one broker, and the state their connections share."""

    def __init__(self, server: Server, sockets: list[socket.socket] | None = None) -> None:
        self.server = server
        # A worker's MQTT over TCP listening sockets (its supervisor's SO_REUSEPORT
        # group); None: bind the port here.
        self.sockets = sockets
        config = server.config
        self.connections: set[MQTTConnection] = set()
        self.clients: dict[str, MQTTConnection] = {}  # client id → its connection
        # vhost → open connections with a retain-as-published subscription (MQTT 5)
        self.retain_as_published: dict[str, int] = {}
        self.wills = PendingWills(server.loop)
        directory = config.data_dir if config.persistence else None
        # In a broker of workers, worker 0 holds the retained messages for all.
        mesh = server.broker.mesh
        self.retained: Any
        if mesh is not None and mesh.index != 0:
            self.retained = RetainedOnWorker0(mesh)
        else:
            self.retained = RetainedStore(directory)
            if mesh is not None:
                serve_retained(mesh, self.retained)
        self._servers: list[asyncio.base_events.Server] = []
        self._adopting: set[asyncio.Task] = set()
        self.web: Any = None  # leveret.mqtt.ws.WebMQTT
        self.addresses: dict[str, tuple[str, int]] = {}  # "mqtt", "mqtts", "web-mqtt"

    @property
    def port(self) -> int | None:
        return self.addresses.get("mqtt", (None, None))[1]

    def open_connections(self) -> list[MQTTConnection]:
        """Connections past CONNECT, by name (the management API, leveret ctl)."""
        return sorted((c for c in self.connections if c.state == "open"), key=lambda c: c.name)

    async def start(self) -> None:
        """Listen on every configured port; OSError (a port taken) stops them all."""
        config = self.server.config
        try:
            if config.mqtt_port is not None:
                await self._listen("mqtt", config.mqtt_port, None)
            if config.mqtt_ssl_cert_login:
                self._check_cert_login()
            if config.mqtt_tls_port is not None and config.tls_cert:
                from leveret.server.tls import server_context

                await self._listen("mqtts", config.mqtt_tls_port, server_context(config))
            if config.web_mqtt_port is not None:
                from leveret.mqtt.ws import WebMQTT

                web = WebMQTT(self, config.host, config.web_mqtt_port)
                await web.start()
                self.web = web
                self.addresses["web-mqtt"] = (config.host, web.port)
                log.info("Leveret listening for MQTT over WebSockets on ws://%s:%d/ws",
                         config.host, web.port)  # fmt: skip
        except BaseException:
            await self.stop()
            raise

    def _check_cert_login(self) -> None:
        """mqtt_ssl_cert_login reads verified client certificates on the TLS listener:
        without that listener or without verification it could never apply."""
        from leveret.server.tls import TLSConfigError

        config = self.server.config
        if config.mqtt_tls_port is None or not config.tls_cert:
            raise TLSConfigError(
                "mqtt_ssl_cert_login needs the MQTT TLS listener (tls_cert, tls_key, mqtt_tls_port)"
            )
        if not (config.tls_verify or config.tls_fail_if_no_peer_cert) or not config.tls_ca:
            raise TLSConfigError(
                "mqtt_ssl_cert_login needs verified client certificates (tls_verify and tls_ca)"
            )

    def home_of(self, vhost: str, client_id: str) -> int | None:
        """The worker that serves `client_id` of `vhost` in a broker of workers (None on
        one process): the one its session's QoS 1 queue is placed on, as any named
        queue is, so that `leveret reshard` moves the queue to the worker of the id."""
        mesh = self.server.broker.mesh
        return None if mesh is None else mesh.owner_of(vhost, queue_names(client_id)[1])

    def adopt(self, sock: socket.socket, read: bytes) -> None:
        """Serve an MQTT connection another worker handed over (`RoutedMQTTProtocol`),
        starting with the bytes it read."""
        protocol = MQTTProtocol(self, "tcp", read)
        task = self.server.loop.create_task(
            self.server.loop.connect_accepted_socket(lambda: protocol, sock)
        )
        self._adopting.add(task)
        task.add_done_callback(lambda t: self._adopted(sock, t))

    def _adopted(self, sock: socket.socket, task: asyncio.Task) -> None:
        self._adopting.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("cannot serve an MQTT connection handed over: %s", task.exception())
            sock.close()

    async def _listen(self, kind: str, port: int, ssl: Any) -> None:
        host = self.server.config.host
        if self.sockets is not None and ssl is None:
            for sock in self.sockets:
                server = await self.server.loop.create_server(
                    lambda: RoutedMQTTProtocol(self), sock=sock, backlog=1024
                )
                self._servers.append(server)
                port = sock.getsockname()[1]
            self.addresses[kind] = (host, port)
            mesh = self.server.broker.mesh
            log.info(
                "%s MQTT on %s:%d",
                "Leveret listening for" if mesh is None or mesh.index == 0 else "accepting",
                host,
                port,
            )
            return
        server = await self.server.loop.create_server(
            lambda: MQTTProtocol(self, "tls" if ssl else "tcp"),
            host,
            port,
            reuse_address=True,
            backlog=1024,
            ssl=ssl,
        )
        self._servers.append(server)
        bound = server.sockets[0].getsockname()[1]
        self.addresses[kind] = (host, bound)
        log.info("Leveret listening for MQTT%s on %s:%d", " over TLS" if ssl else "", host, bound)

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        self.wills.cancel_all()
        for conn in list(self.connections):
            conn.shutdown()
        if self.web is not None:
            await self.web.stop()
            self.web = None
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
        self.retained.close()
