"""leveret perf's connections: leveret.client, plus the counters a load generator keeps.

The wire work (framing, handshake, codecs) is leveret.client's, which is the
protocol core the broker itself uses. What is here is measurement: counting
confirms without an object per publish, counting deliveries and taking a
latency sample from each body's send timestamp, and acknowledging with one
cumulative ack every `ack_every` deliveries.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable

from leveret.client import Channel, ClientError, Connection, ConnectionParameters, connect
from leveret.client import events as ev
from leveret.protocol.connection import Deliver

_STAMP = struct.Struct(">Q")


class BrokerError(Exception):
    """The broker closed the connection or channel, or the socket went away."""


class ConnectError(BrokerError):
    """The TCP connection or the AMQP handshake failed."""


class ConfirmTracker:
    """Counts publisher confirms, tolerating out-of-order single acks.

    A set of every unconfirmed sequence number (what PerfTest keeps) costs per message;
    here only acks that arrive ahead of the contiguous watermark are remembered.
    """

    def __init__(self) -> None:
        self.low = 0  # every tag <= low is confirmed
        self.ahead: set[int] = set()
        self.confirmed = 0
        self.nacked = 0
        self.room = asyncio.Event()
        self.room.set()

    def on_confirm(self, tag: int, multiple: int, nack: bool) -> None:
        if tag <= self.low:
            return
        if multiple:
            n = tag - self.low
            if self.ahead:
                below = [t for t in self.ahead if t <= tag]
                n -= len(below)
                self.ahead.difference_update(below)
            self.low = tag
        else:
            if tag in self.ahead:
                return
            n = 1
            if tag == self.low + 1:
                self.low = tag
            else:
                self.ahead.add(tag)
        if self.ahead:
            while self.low + 1 in self.ahead:
                self.low += 1
                self.ahead.discard(self.low)
        if nack:
            self.nacked += n
        else:
            self.confirmed += n
        self.room.set()


class PerfConnection:
    """One leveret.client connection with a single channel, and its counters."""

    def __init__(self, label: str, conn: Connection, on_error: Callable[[str], None] | None):
        self.label = label
        self.conn = conn
        self.on_error = on_error
        self.error: str | None = None
        self.notes: list[str] = []
        self.channel: Channel | None = None
        # Consumer side: counters read by the stats ticker, latencies drained by it.
        self.consumed = 0
        self.latencies: list[int] = []
        self.manual_ack = False
        self.ack_every = 1
        self._unacked = 0
        self._last_tag = 0
        # Publisher side.
        self.published = 0
        self.confirms: ConfirmTracker | None = None
        conn.add_listener(self._on_event)

    @property
    def frame_max(self) -> int:
        return self.conn.frame_max

    def _on_event(self, event: ev.ClientEvent) -> None:
        if isinstance(event, ev.ConnectionLost):
            self._fail(f"{self.label}: connection lost ({event.reason})")
        elif isinstance(event, ev.ChannelClosedByBroker):
            self._fail(
                f"{self.label}: broker closed channel {event.channel}: "
                f"{event.reply_code} {event.reply_text}"
            )
        elif isinstance(event, ev.ConsumerCancelledByBroker):
            self._fail(f"{self.label}: broker cancelled consumer {event.consumer_tag}")
        elif isinstance(event, ev.Blocked):
            self.notes.append(f"{self.label}: connection blocked by broker ({event.reason})")

    def _fail(self, message: str) -> None:
        if self.error is None:
            self.error = message
        if self.confirms is not None:
            self.confirms.room.set()
        if self.on_error is not None:
            self.on_error(message)

    def on_delivery(self, event: Deliver, now: Callable[[], int] = time.monotonic_ns) -> None:
        """A delivery: count it, sample its latency, ack cumulatively every ack_every.

        Takes the protocol core's Deliver event (no Message object per delivery:
        this is the generator's hot path).
        """
        self.consumed += 1
        body = event.body
        if len(body) >= 8:
            self.latencies.append(now() - _STAMP.unpack_from(body)[0])
        if self.manual_ack:
            self._last_tag = event.delivery_tag
            self._unacked += 1
            if self._unacked >= self.ack_every:
                self._unacked = 0
                self.channel.ack_delivery(event.delivery_tag, True)

    def flush_acks(self) -> None:
        """One cumulative (multiple=1) ack for everything delivered so far.

        Called every `ack_every` messages, and once a second by the runner so that a
        slow trickle is acknowledged too; ack_every stays below the prefetch, so the
        broker never waits on us.
        """
        if self._unacked and self.channel is not None:
            self._unacked = 0
            self.channel.ack_delivery(self._last_tag, True)

    async def close(self, timeout: float = 5.0) -> None:
        """Polite connection.close; falls back to dropping the socket."""
        try:
            await asyncio.wait_for(self.conn.close(timeout), timeout + 1)
        except (TimeoutError, ClientError):
            self.conn.abort()

    @property
    def closed(self) -> bool:
        return self.conn.is_closed


async def open_connection(
    host: str,
    port: int,
    user: str,
    password: str,
    vhost: str,
    label: str,
    on_error: Callable[[str], None] | None = None,
    timeout: float = 10.0,
) -> PerfConnection:
    """A connection for one perf role (no heartbeats, no recovery: a run must see failures)."""
    params = ConnectionParameters(
        hosts=((host, port),),
        username=user,
        password=password,
        vhost=vhost,
        heartbeat=0,
        connection_name=f"leveret perf {label}",
        connect_timeout=timeout,
    )
    try:
        conn = await connect(params, recovery=False, client_properties={"product": "leveret perf"})
    except ClientError as exc:
        raise ConnectError(f"AMQP handshake with {host}:{port} failed: {exc}") from None
    return PerfConnection(label, conn, on_error)
