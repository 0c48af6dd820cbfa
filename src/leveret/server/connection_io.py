"""The part of a client connection that runs for every read and every write (compiled).

AMQPConnection (server/connection.py) is the asyncio adapter around the protocol core;
almost all of it runs once a connection (login, vhost, heartbeats, closing). What runs
for every read - take the bytes, hand them to the core, route the publishes and acks
it parses, queue the deliveries that made, write everything out once - is here, in
its base class. Compiled (src/leveret/_build.py), ConnectionIO is a C type: the fields
these methods read are C fields (connection_io.pxd) instead of lookups by name, the
methods are C functions instead of interpreted Python, and a compiled Channel's
delivery reaches `write` with a C call. At S3's rate (docs/benchmarks.md#s3: a few
messages a read) those calls as interpreted Python would be about a third of the
broker's instructions a message.

Everything else a connection does stays in AMQPConnection, which this class calls
back by name (`_event`, `_flush_confirms`, `_set_writable`, ...): those run once a
connection or on the rare path. Without the compiler (or with LEVERET_PURE_PYTHON=1)
this is a plain Python base class and the same code runs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from leveret.broker.errors import ModelError
from leveret.protocol import connection as pc
from leveret.protocol.constants import BASIC_ACK, BASIC_PUBLISH, INTERNAL_ERROR
from leveret.protocol.errors import AMQPError, ConnectionError_
from leveret.protocol.events import Publish  # a C type when compiled (events.pxd)
from leveret.server.amqp_errors import amqp_error
from leveret.store import replica

log = logging.getLogger("leveret.connection")

OUTPUT_HIGH_WATER = 1024 * 1024  # stop delivering to a connection above this backlog

_Ack = pc.Ack
_CLOSED = pc.CLOSED


class _AtReadEnd:
    """The pending flush of a connection whose output waits for the end of the read
    being handled (ConnectionIO._flush_soon); cancelling it is forgetting it."""

    __slots__ = ()

    def cancel(self) -> None:
        pass


_AT_READ_END = _AtReadEnd()


def flush_written(written: list[Any]) -> None:
    """Flush each connection a read (or an output batch, listener.Server.output_batch)
    queued output for, once (a flush done in the meantime, e.g. before a close, left
    nothing to do)."""
    for conn in written:
        if conn._flush_handle is _AT_READ_END:
            try:
                conn._flush()
            except Exception:  # one connection's failure is not the others'
                log.exception("flushing connection %s failed", conn.peer)


class ConnectionIO:
    """Reads in, writes out: the per-read half of AMQPConnection (see the module's
    docstring). It has no __init__: AMQPConnection sets every field."""

    # --- input (hot path) -----------------------------------------------------
    #
    # The kernel writes into the server's shared read buffer, behind the bytes the
    # core had not parsed yet (server/reading.py); the core gets one copy of both.

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._read_buffer.place(self.core.pending, self._sizer.offer)

    def buffer_updated(self, nbytes: int) -> None:
        self._last_recv = self.loop.time()
        self.recv_oct += nbytes
        self.recv_cnt += 1
        if self.state == "closed":
            return
        self._received(self.core.receive_after_pending(self._read_buffer.take(nbytes)))
        self._sizer.update(nbytes, self.core.contents_parsed)

    def data_received(self, data: bytes) -> None:
        """Bytes handed over as they are (the TLS listener's first bytes)."""
        self._last_recv = self.loop.time()
        self.recv_oct += len(data)
        self.recv_cnt += 1
        if self.state == "closed":
            return
        self._received(self.core.receive_data(data))

    def _received(self, events: Iterator[Any]) -> None:
        """Handle one read's events; then write what it queued for any connection."""
        server = self.server
        outer = server.read_output is None  # (reads do not nest; this is a guard)
        if outer:
            server.read_output = written = []
        try:
            if self._gated:  # the broker is still reading its stored messages back
                events = self._until_recovered(events)
            self._process(events)
            # The store's writer thread is far behind (persistent messages, or
            # transient ones a long queue pages out): read no more until it catches
            # up. Once a read, not once a message: this read's publishes are routed.
            vhost = self.vhost
            if vhost is not None and vhost.hooks.disk_backlogged():
                self.pause_for_disk()
        finally:
            if outer:
                server.read_output = None
                flush_written(written)
                if self._busy_wait is not None:  # --busy-wait-us: poll, not sleep, a while
                    self._busy_wait.arm()

    def _process(self, events: Iterator[Any]) -> None:
        """Act on the events one by one, in order (the core's contract)."""
        channels = self.channels
        try:
            for event in events:
                kind = type(event)
                if kind is Publish:  # the hot path
                    pub = event  # (compiled: a C type, connection_io.pxd)
                    ch = channels.get(pub.channel)
                    if ch is not None and not ch.closing:
                        try:
                            ch.on_publish(pub)
                        except (AMQPError, ModelError) as exc:
                            self._channel_exception(ch, exc, BASIC_PUBLISH)
                elif kind is _Ack:
                    ch = channels.get(event.channel)
                    if ch is not None and not ch.closing:
                        try:
                            ch.ack(event.delivery_tag, event.multiple)
                        except (AMQPError, ModelError) as exc:
                            self._channel_exception(ch, exc, BASIC_ACK)
                else:
                    if replica.TAP is None:
                        self._event(event)
                    else:
                        self._event_replicated(event)
                    # A method that waits for another worker's answer holds the rest
                    # (AMQPConnection.hold); `_gated` is False on a one-process broker
                    # once it has recovered.
                    if self._gated and self._holding(events):
                        break
                if self.state == "closed":
                    break
        except AMQPError as exc:
            events.close()
            self.close_with_error(exc)
        except ModelError as exc:
            events.close()
            self.close_with_error(amqp_error(exc))
        except Exception:
            events.close()
            log.exception("internal error on connection %s", self.peer)
            self.close_with_error(
                ConnectionError_(INTERNAL_ERROR, "internal error; see the broker log")
            )
        if self.core.state == _CLOSED and self.state != "closed":
            self._linger()  # the close handshake is over (or the stream was unusable)
        elif self._out and self._flush_handle is None:
            self._flush_soon()

    # --- output -------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Queue bytes for the socket; everything queued in one loop turn is one write."""
        self._out.append(data)
        self._out_bytes += len(data)
        if self._flush_handle is None:
            self._flush_soon()
        if self._out_bytes > OUTPUT_HIGH_WATER and self.writable:
            self._set_writable(False)

    def write_parts(self, parts: tuple[bytes, ...], size: int) -> None:
        """Like write() for several pieces; they are joined once, at flush time."""
        self._out.extend(parts)
        self._out_bytes += size
        if self._flush_handle is None:
            self._flush_soon()
        if self._out_bytes > OUTPUT_HIGH_WATER and self.writable:
            self._set_writable(False)

    def write_large(self, head: bytes, body: bytes, size: int) -> None:
        """Like write_parts() for the frames before a large body and the body: the
        body is written as it is (writev), not copied into the loop turn's join."""
        out = self._out
        out.append(head)
        out.append(body)
        out.append(b"\xce")
        self._out_large = True
        self._out_bytes += size
        if self._flush_handle is None:
            self._flush_soon()
        if self._out_bytes > OUTPUT_HIGH_WATER and self.writable:
            self._set_writable(False)

    def _flush_soon(self) -> None:
        """Output is queued and no flush is due yet: flush it when the read being
        handled is done, or, outside a read (timers, the store's callbacks), at the
        next loop turn.

        At the end of the read, not at the next turn: a delivery to a consumer leaves
        in the same loop callback as the publish that made it (S3's latency,
        docs/benchmarks.md#s3: one loop turn and one scheduled callback less a read).
        Everything one read queued for a connection is still one write."""
        written = self.server.read_output
        if written is not None:
            written.append(self)
            self._flush_handle = _AT_READ_END
        else:
            self._flush_handle = self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self._hold and self._hold_for_followers():
            return
        if self._confirm_channels:
            self._flush_confirms()
        out = self._out
        if out and self.transport is not None and self.state != "closed":
            self.send_cnt += 1
            if self._out_large:
                # Large bodies were queued as they are: one writev, no copy of them
                # into a joined buffer.
                self._out_large = False
                self.send_oct += sum(map(len, out))
                self.transport.writelines(out)
            else:
                data = out[0] if len(out) == 1 else b"".join(out)
                self.send_oct += len(data)
                self.transport.write(data)
            out.clear()
            self._out_bytes = 0
            self._last_send = self.loop.time()
            if not self.writable and not self._transport_paused:
                self._set_writable(True)
