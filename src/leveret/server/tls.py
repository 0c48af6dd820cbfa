"""TLS for amqps listeners: the context, and a handshake that fails in one log line.

The TLS handshake is run with loop.start_tls from an acceptor protocol rather
than by create_server(ssl=...), so that a failed handshake (a bad or missing
client certificate, an old TLS version, a plain AMQP client on the TLS port)
reaches our code: it is logged as one line naming the peer and the reason, and
the socket is dropped. Only after a good handshake does the AMQP connection
see the transport.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from typing import TYPE_CHECKING

from leveret.auth.sasl import LOGIN_FROM
from leveret.config import ServerConfig

if TYPE_CHECKING:
    from leveret.server.listener import Server

log = logging.getLogger("leveret.tls")

HANDSHAKE_TIMEOUT = 10.0


class TLSConfigError(ValueError):
    """The TLS settings cannot be used; the message names the file and the problem."""


def server_context(config: ServerConfig) -> ssl.SSLContext:
    """A server context: TLS 1.2 or newer, the broker's certificate, optional client certs."""
    if not config.tls_cert or not config.tls_key:
        raise TLSConfigError("an amqps listener needs --tls-cert and --tls-key")
    if config.tls_cert_login_from not in LOGIN_FROM:
        raise TLSConfigError(
            f"tls_cert_login_from must be one of {', '.join(LOGIN_FROM)}, "
            f"got {config.tls_cert_login_from!r}"
        )
    for path in (config.tls_cert, config.tls_key, config.tls_ca):
        if path and not os.path.isfile(path):
            raise TLSConfigError(f"cannot read {path}: no such file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.tls_cert, config.tls_key)
    except FileNotFoundError as exc:
        raise TLSConfigError(f"cannot read {exc.filename}: no such file") from None
    except (ssl.SSLError, OSError) as exc:
        raise TLSConfigError(
            f"cannot load the certificate {config.tls_cert} with the key {config.tls_key}: {exc}"
        ) from None
    if config.tls_ca:
        try:
            context.load_verify_locations(cafile=config.tls_ca)
        except FileNotFoundError:
            raise TLSConfigError(f"cannot read {config.tls_ca}: no such file") from None
        except (ssl.SSLError, OSError) as exc:
            raise TLSConfigError(f"cannot load the CA file {config.tls_ca}: {exc}") from None
    if config.tls_fail_if_no_peer_cert:
        context.verify_mode = ssl.CERT_REQUIRED
    elif config.tls_verify:
        context.verify_mode = ssl.CERT_OPTIONAL
    if context.verify_mode != ssl.CERT_NONE and not config.tls_ca:
        raise TLSConfigError("verifying client certificates (--tls-verify) needs --tls-ca")
    return context


class TLSAcceptor(asyncio.Protocol):
    """Owns a fresh TCP connection on an amqps port until its TLS handshake is done."""

    def __init__(self, server: Server, context: ssl.SSLContext) -> None:
        from leveret.server.connection import AMQPConnection

        self.server = server
        self.context = context
        self.connection = AMQPConnection(server)
        self.peer = "?"
        self._task: asyncio.Task | None = None
        # Bytes decrypted before the handshake task resumed: the client's protocol
        # header may arrive first. They go to the connection once it has its transport.
        self._early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        # No raw bytes (the ClientHello) may reach data_received before start_tls
        # takes the transport over: reading resumes in the same step as start_tls.
        transport.pause_reading()  # type: ignore[attr-defined]
        self._task = self.server.loop.create_task(self._handshake(transport))  # type: ignore[arg-type]

    async def _handshake(self, transport: asyncio.Transport) -> None:
        try:
            # The coroutine below runs synchronously up to its handshake wait, so no
            # bytes can be delivered between this resume and the takeover.
            transport.resume_reading()
            tls_transport = await self.server.loop.start_tls(
                transport,
                self,
                self.context,
                server_side=True,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT,
            )
        except (TimeoutError, ssl.SSLError, OSError, ConnectionError) as exc:
            reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
            log.warning("TLS handshake with %s failed: %s", self.peer, reason)
            transport.abort()
            return
        if tls_transport is None:
            transport.abort()
            return
        tls_transport.set_protocol(self.connection)
        self.connection.connection_made(tls_transport)
        early, self._early = self._early, []
        for data in early:
            self.connection.data_received(data)

    def data_received(self, data: bytes) -> None:
        # Decrypted application bytes, only until the handshake task hands over.
        self._early.append(data)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        elif self.connection.transport is not None:
            self.connection.connection_lost(exc)
