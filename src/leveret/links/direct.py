"""Direct connections: leveret.client talking to the broker it runs in, without a socket.

`amqp://` with no host means "this broker" in a shovel or upstream URI, as in
RabbitMQ, whose links then use its in-VM "direct" Erlang client. Here the
link still goes through leveret.client (so recovery, confirms and flow
control are the same code as for a remote broker) but its transport is a pair
of in-memory ends joined to a server-side AMQPConnection: the same protocol
core on both sides, no listener needed (the broker may listen on TLS or on a
public address only), no syscalls, and no credentials to find.

Such a connection logs in as the URI's user (password checked) or, with no
user in the URI, as RabbitMQ's trusted user "none", which may use any vhost
(RabbitMQ checks the *defining* user's access when the parameter is set:
links.validation).

Flow control is a socket's: bytes written wait in the receiving end until its
protocol reads them; past HIGH_WATER the writer's protocol is paused
(pause_writing), which leveret.client and the server both honour, and reading
can be paused (the server does so for its publisher flow control).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leveret.server.listener import Server

HIGH_WATER = 1024 * 1024
LOW_WATER = 256 * 1024
CHUNK = 256 * 1024  # bytes handed to a protocol at once, as one socket read
_ids = itertools.count(1)


class DirectEnd(asyncio.Transport):
    """One end of an in-memory connection."""

    def __init__(self, loop: asyncio.AbstractEventLoop, extra: dict[str, Any]) -> None:
        super().__init__(extra)
        self._loop = loop
        self.peer: DirectEnd | None = None
        self._protocol: Any = None
        self._inbox: collections.deque[bytes] = collections.deque()
        self._inbox_size = 0
        self._reading_paused = False
        self._scheduled = False
        self._eof = False  # the peer will write no more
        self._closing = False
        self._lost = False
        self._writer_paused = False  # we paused the peer's protocol (our inbox is full)
        self._high = HIGH_WATER
        self._low = LOW_WATER

    # --- asyncio.BaseTransport --------------------------------------------------------

    def set_protocol(self, protocol: Any) -> None:
        self._protocol = protocol

    def get_protocol(self) -> Any:
        return self._protocol

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Everything written so far still reaches the peer, then it sees EOF."""
        if self._closing:
            return
        self._closing = True
        peer = self.peer
        if peer is not None and not peer._closing:
            peer._eof = True
            peer._schedule()
        self._loop.call_soon(self._connection_lost, None)

    def abort(self) -> None:
        """Both ends go at once, the peer with a reset, as a TCP RST."""
        self._closing = True
        self._inbox.clear()
        self._inbox_size = 0
        self._loop.call_soon(self._connection_lost, None)
        peer = self.peer
        if peer is not None and not peer._closing:
            peer._closing = True
            peer._inbox.clear()
            peer._inbox_size = 0
            self._loop.call_soon(
                peer._connection_lost, ConnectionResetError("direct connection aborted")
            )

    # --- reading ----------------------------------------------------------------------

    def is_reading(self) -> bool:
        return not self._reading_paused and not self._closing

    def pause_reading(self) -> None:
        self._reading_paused = True

    def resume_reading(self) -> None:
        if self._reading_paused:
            self._reading_paused = False
            self._schedule()

    # --- writing ----------------------------------------------------------------------

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._high = HIGH_WATER if high is None else high
        self._low = min(self._high, LOW_WATER if low is None else low)

    def get_write_buffer_size(self) -> int:
        return self.peer._inbox_size if self.peer is not None else 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (self._low, self._high)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        peer = self.peer
        if self._closing or peer is None or peer._closing or not data:
            return
        peer._inbox.append(bytes(data))
        peer._inbox_size += len(data)
        peer._schedule()
        if peer._inbox_size > self._high and not peer._writer_paused:
            peer._writer_paused = True
            self._protocol.pause_writing()

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def write_eof(self) -> None:
        peer = self.peer
        if peer is not None and not peer._closing:
            peer._eof = True
            peer._schedule()

    def can_write_eof(self) -> bool:
        return True

    # --- delivery to our protocol -------------------------------------------------------

    def _schedule(self) -> None:
        if not self._scheduled and not self._lost:
            self._scheduled = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        protocol = self._protocol
        while self._inbox and not self._reading_paused and not self._closing:
            parts = []
            size = 0
            while self._inbox and size < CHUNK:
                part = self._inbox.popleft()
                parts.append(part)
                size += len(part)
            self._inbox_size -= size
            self._release_writer()
            protocol.data_received(parts[0] if len(parts) == 1 else b"".join(parts))
        if self._eof and not self._inbox and not self._closing:
            self._eof = False
            if not protocol.eof_received():
                self.close()

    def _release_writer(self) -> None:
        peer = self.peer
        if self._writer_paused and self._inbox_size <= self._low and peer is not None:
            self._writer_paused = False
            if not peer._lost:
                peer._protocol.resume_writing()

    def _connection_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._closing = True
        self._protocol.connection_lost(exc)


async def open_connection(
    server: Server, protocol_factory: Any, user: str | None
) -> tuple[DirectEnd, Any]:
    """A client protocol joined to a new server connection of `server`.

    `user` None: the trusted user "none" (no password); else the login is
    checked as for any client (the URI's user and password).
    """
    from leveret.server.connection import AMQPConnection

    loop = asyncio.get_running_loop()
    number = next(_ids)
    info = {"trusted": user is None, "number": number}
    client_end = DirectEnd(loop, {"peername": ("leveret", 0), "sockname": ("direct", number)})
    server_end = DirectEnd(
        loop,
        {"peername": ("direct", number), "sockname": ("leveret", 0), "leveret_direct": info},
    )
    client_end.peer, server_end.peer = server_end, client_end
    client = protocol_factory()
    connection = AMQPConnection(server)
    client_end.set_protocol(client)
    server_end.set_protocol(connection)
    connection.connection_made(server_end)
    client.connection_made(client_end)
    return client_end, client
