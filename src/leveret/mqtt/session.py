"""One MQTT client connection and its session, on the broker model, as RabbitMQ maps them.

Bytes from any transport (TCP, TLS, WebSocket: mqtt/listener.py, mqtt/ws.py) go
through the sans-IO codec; this module acts on the packets. The mapping is
RabbitMQ's MQTT plugin's:

- CONNECT logs in as a broker user, in the vhost mqtt/vhosts.py picks (a user name
  "vhost:user", the port and certificate mappings, else `mqtt_vhost`). A CONNECT
  without credentials logs in as the user its verified client certificate names
  while `mqtt_ssl_cert_login` is on, else as `mqtt_default_user` while
  `mqtt_allow_anonymous` is on.
- PUBLISH goes to `mqtt_exchange` (amq.topic) with the topic as routing key
  (mqtt/topics.py), headers `x-mqtt-publish-qos` and `x-mqtt-dup`, delivery mode 2
  for QoS 1. A QoS 1 PUBLISH is acknowledged once every durable queue has it on
  disk, as a publisher confirm would be.
- Subscriptions are bindings of the client's queues, `mqtt-subscription-<id>qos0`
  (transient, auto-delete, consumed without acks) and `...qos1` (durable; auto-
  delete for a clean session, else with x-expires), consumed by this connection.
  QoS 2 is granted as QoS 1. A message whose topic starts with `$` reaches the client
  only through a subscription that names that first level (MQTT 4.7.2): the
  exchange's `#` and `*` bindings match it too, so the delivery drops it.
- The model sees this object as the consumers' DeliveryChannel (broker/ports.py).

Permissions are checked as RabbitMQ's channel would check the AMQP operations the
plugin performs: configure on a queue it declares or deletes, write on the queue
and read on the exchange (and topic read) to bind, read on the queue to consume,
write on the exchange (and topic write) to publish.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from itertools import pairwise
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from pamqp import commands as cmd

import leveret.broker.queues  # noqa: F401  (before broker.durability: compiled, it needs them loaded)
from leveret.auth.users import is_loopback
from leveret.broker.consumer import Consumer
from leveret.broker.durability import WriteBarrier
from leveret.broker.errors import ModelError
from leveret.broker.message import Message
from leveret.broker.queues.base import Queue, QueueEntry
from leveret.mqtt import packets as pk
from leveret.mqtt.codec import (
    Decoder,
    MQTTProtocolError,
    encode,
    encode_publish,
    encode_publish_311,
    encode_topic,
)
from leveret.mqtt.retained import Retained
from leveret.mqtt.topics import (
    SHARED_PREFIX,
    matches,
    to_amqp,
    to_mqtt,
    topic_filter_error,
    topic_name_error,
)
from leveret.mqtt.vhosts import pick_vhost
from leveret.protocol.constants import NOT_FOUND, RESOURCE_LOCKED
from leveret.protocol.errors import AMQPError, ChannelError
from leveret.protocol.properties import encode_header
from leveret.server.authorization import Guard
from leveret.server.connection_io import _AT_READ_END, OUTPUT_HIGH_WATER, flush_written

if TYPE_CHECKING:
    from leveret.broker.vhost import VirtualHost
    from leveret.mqtt.listener import MQTTListeners

log = logging.getLogger("leveret.mqtt")

# Before CONNECT a client may send this much (RabbitMQ 3.13's
# max_packet_size_unauthenticated); after it, the protocol's maximum.
MAX_PACKET_UNAUTHENTICATED = 65_536
MAX_PACKET_SIZE = 268_435_455
UINT32_MAX = 0xFFFFFFFF
ROUTING_KEY_CACHE = 256  # topics a connection remembers the routing key of
ALARM_POLL = 0.5  # seconds between looks at a resource alarm that blocks publishers
# The WebSocket close frame (code, reason) of a refused CONNECT, by its MQTT 3.1.1
# return code: RabbitMQ's Web MQTT sends 1002 and the refusal's name.
WS_REFUSED = {
    pk.CONNACK_BAD_PROTOCOL: (1002, "unsupported_protocol_version"),
    pk.CONNACK_ID_REJECTED: (1002, "invalid_client_id"),
    pk.CONNACK_SERVER_UNAVAILABLE: (1002, "unavailable"),
    pk.CONNACK_BAD_CREDENTIALS: (1002, "unauthenticated"),
    pk.CONNACK_NOT_AUTHORIZED: (1002, "unauthorized"),
}
# Headers the broker sets itself; never shown to MQTT 5 clients as user properties.
OWN_HEADERS = frozenset(
    {
        "x-mqtt-publish-qos",
        "x-mqtt-dup",
        "x-mqtt-retain",
        "x-mqtt-payload-format-indicator",
        "x-reply-to-topic",
        "x-correlation-id",
        "x-mqtt-user-property",
    }
)
#: the header that keeps an MQTT 5 message's user properties as published, when the AMQP
#: table would not: it holds each name once and sorts the names, while MQTT 5 subscribers
#: must get every pair in the publisher's order [MQTT-3.3.2-17, MQTT-3.3.2-18]
USER_PROPERTY_LIST = "x-mqtt-user-property"


_NONE: frozenset[Any] = frozenset()


#: `_on_connect`'s first pass: worker 0 was not asked about the limits yet
_UNASKED: Any = object()


def _uncount(broker: Any, vhost: str, user: str, answer: asyncio.Future[Any]) -> None:
    """A connection that closed while worker 0 admitted it: worker 0 counts it no more."""
    if answer.cancelled() or answer.exception() is not None or answer.result() is not None:
        return
    broker.limit_counts.closed(vhost, user)


class _Held(Exception):
    """A packet's handler waits for other workers (MQTTConnection._hold)."""


class Transport(Protocol):
    """What a connection needs of its byte stream (mqtt/listener.py, mqtt/ws.py)."""

    peer: str  # "host:port"
    peer_host: str
    local: str  # "host:port" of the listener's end
    kind: str  # "tcp", "tls", "ws"

    def write(self, data: bytes) -> None: ...

    def close(self, ws_close: tuple[int, str] | None = None) -> None:
        """`ws_close`: a WebSocket close code and reason (Web MQTT; others ignore it)."""

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


@dataclass
class SubscriptionState:
    qos: int  # granted: 0 or 1
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    identifier: int | None = None


def queue_names(client_id: str) -> tuple[str, str]:
    """RabbitMQ's subscription queues of a client id: QoS 0 and QoS 1."""
    base = f"mqtt-subscription-{client_id}qos"
    return base + "0", base + "1"


class MQTTConnection:
    """The protocol state of one client connection; see the module docstring."""

    # Slots: an instance with this many attributes would otherwise carry a dict of its
    # own (about 1.6 KB; instance dicts share their keys only up to 30 of them), a
    # third of an idle connection's memory. `__dict__` takes attributes added later.
    __slots__ = (
        "listeners",
        "server",
        "config",
        "loop",
        "transport",
        "decoder",
        "version",
        "state",
        "client_id",
        "user",
        "vhost",
        "guard",
        "clean_start",
        "session_expiry",
        "will",
        "keepalive",
        "exchange_name",
        "subscriptions",
        "_out",
        "_out_bytes",
        "_flush_handle",
        "_transport_paused",
        "consumers",
        "deliverable",
        "global_prefetch",
        "unacked_count",
        "inflight",
        "_next_id",
        "_pubacks",
        "_topic_aliases",
        "_out_aliases",
        "_alias_max_out",
        "_routing_keys",
        "_topics_out",
        "_receive_max",
        "_client_max_packet",
        "_last_read",
        "_keepalive_timer",
        "_connect_timer",
        "_flow",
        "_paused_for",
        "channels",
        "client_properties",
        "_held",
        "_alarm_timer",
        "_no_local",
        "_retain_as_published",
        "connected_at",
        "recv_oct",
        "send_oct",
        "received",
        "sent",
        "__dict__",
        "__weakref__",
    )

    def __init__(self, listeners: MQTTListeners, transport: Transport) -> None:
        self.listeners = listeners
        self.server = listeners.server
        self.config = listeners.server.config
        self.loop = listeners.server.loop
        self.transport = transport
        self.decoder = Decoder("server", max_packet_size=MAX_PACKET_UNAUTHENTICATED)
        self.version = pk.MQTT_3_1_1
        self.state = "connecting"  # connecting → open → closed
        self.client_id: str | None = None
        self.user: str | None = None
        self.vhost: VirtualHost | None = None
        self.guard: Guard | None = None
        self.clean_start = True
        self.session_expiry = 0  # seconds; MQTT 5 (3.1.1: 0 or the maximum)
        self.will: pk.Will | None = None
        self.keepalive = 0
        self.exchange_name = self.config.mqtt_exchange
        self.subscriptions: dict[str, SubscriptionState] = {}
        # Output queued in this loop turn, written at once (see _write).
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_handle: Any = None  # a call_soon handle, or _AT_READ_END
        self._transport_paused = False
        self.consumers: list[Consumer | None] = [None, None]  # by QoS
        # The model's DeliveryChannel fields (broker/ports.py).
        self.deliverable = True  # False while the socket or our output backlog is full
        self.global_prefetch = 0
        self.unacked_count = 0
        # Our QoS 1 PUBLISHes awaiting PUBACK: packet id → (queue, entry, consumer), or
        # None for a retained message (no queue behind it).
        self.inflight: dict[int, tuple[Queue, QueueEntry, Consumer] | None] = {}
        # The next packet id of a QoS 1 delivery. As RabbitMQ 3.10 numbers them: from 1,
        # moved up to a SUBSCRIBE's own id when that is higher (ids in flight skipped).
        self._next_id = 1
        # The client's QoS 1 PUBLISHes, in order: [packet id, reason code or None while
        # its queues write it]; PUBACKs go out in this order (MQTT 4.6). Made by the
        # first QoS 1 PUBLISH (an empty deque is 600 bytes a connection).
        self._pubacks: deque[list[Any]] | None = None
        self._topic_aliases: dict[int, str] = {}  # the client's, by alias
        self._out_aliases: dict[str, int] = {}  # ours to the client (MQTT 5), by topic
        self._alias_max_out = 0
        self._routing_keys: dict[str, str] = {}  # topic → routing key, recently published
        self._topics_out: dict[str, bytes] = {}  # routing key → encoded topic, delivered
        self._receive_max = 65_535
        self._client_max_packet = MAX_PACKET_SIZE
        self._last_read = time.monotonic()
        self._keepalive_timer: asyncio.TimerHandle | None = None
        self._connect_timer: asyncio.TimerHandle | None = self.loop.call_later(
            self.config.handshake_timeout, self._connect_timeout
        )
        # Queues this publisher waits for, and (below) why reading is paused: rarely
        # anything, so frozensets, replaced when they change (an empty set is 216 bytes
        # a connection; the empty frozenset is one for all).
        self._flow: frozenset[Queue] = _NONE
        # Why reading is paused: "flow" (a queue is far behind), "alarm" (a resource
        # alarm blocks publishers), "recovery" (the broker reads its messages back).
        self._paused_for: frozenset[str] = _NONE
        # What code written for AMQP connections reads of any client connection
        # (broker.inventory, the channel limit): an MQTT connection has no channels.
        self.channels: dict[int, Any] = {}
        self.client_properties: dict[str, Any] = {}
        self._held: bytearray | None = None  # bytes that arrived during recovery
        # Packets (and bytes) held while one waits for other workers (_hold).
        self._stash: list[pk.Packet] | None = None
        self._stash_bytes: bytearray | None = None
        self._retaining: Any = None  # worker 0's answer to a retained publish (a future)
        # A worker other than 0 of several (workers/limits.py): the (vhost, user) this
        # connection counts as on worker 0, and worker 0's answer while it is awaited.
        self._counted_as: tuple[str, str] | None = None
        self._admitting: tuple[asyncio.Future[Any], str, str] | None = None
        self._alarm_timer: asyncio.TimerHandle | None = None
        self._no_local = False  # whether any subscription has no_local
        # Whether this connection counts in listeners.retain_as_published.
        self._retain_as_published = False
        self.connected_at = time.time()
        self.recv_oct = 0
        self.send_oct = 0
        self.received = 0
        self.sent = 0
        listeners.connections.add(self)

    # --- bytes in and out --------------------------------------------------------

    @property
    def protocol_name(self) -> str:
        """As RabbitMQ's management API shows it: "MQTT 3.1.1", "MQTT 5-0"."""
        return {pk.MQTT_3_1: "MQTT 3.1.0", pk.MQTT_5: "MQTT 5-0"}.get(self.version, "MQTT 3.1.1")

    @property
    def peer(self) -> str:
        return self.transport.peer

    @property
    def recv_cnt(self) -> int:
        """Packets read, as Prometheus' connection_incoming_packets counts them."""
        return self.received

    @property
    def send_cnt(self) -> int:
        """Packets written (connection_outgoing_packets)."""
        return self.sent

    @property
    def name(self) -> str:
        """RabbitMQ's connection name: "peer -> local"."""
        return f"{self.transport.peer} -> {self.transport.local}"

    def info(self) -> dict[str, Any]:
        """What `leveret ctl list_mqtt_connections` shows (rabbitmqctl's info keys)."""
        return {
            "client_id": self.client_id,
            "conn_name": self.name,
            "user": self.user,
            "vhost": self.vhost.name if self.vhost is not None else None,
            "protocol": self.protocol_name,
            "clean_sess": self.clean_start,
            "keepalive": self.keepalive,
            "subscriptions": len(self.subscriptions),
        }

    def force_close(self, reason: str = "shutdown", text: str | None = None) -> None:
        """Closed by an operator: the management API's DELETE, a deleted user or vhost
        (on this worker, or through worker 0's API). An MQTT 5 client hears
        "administrative action" (0x98), as from RabbitMQ's MQTT plugin; the broker's
        own stop goes through `shutdown` (0x8B)."""
        log.info("MQTT connection %s closed: %s", self.transport.peer, text or reason)
        if self.version == pk.MQTT_5 and self.state == "open":
            code = pk.RC_ADMINISTRATIVE_ACTION
            self._send(pk.Disconnect(code, {"reason_string": text or reason}))
        self.close(send_will=self._will_on_server_close)

    def shutdown(self) -> None:
        """The broker stops: MQTT 5 clients hear why (0x8B); no will goes out."""
        if self.version == pk.MQTT_5 and self.state == "open":
            self._send(pk.Disconnect(pk.RC_SERVER_SHUTTING_DOWN))
        self.close(send_will=False)

    def receive(self, data: bytes) -> None:
        if self.state == "closed":
            return
        self.recv_oct += len(data)
        self._last_read = time.monotonic()
        if self._stash is not None:  # a packet waits for other workers (_hold)
            if self._stash_bytes is None:
                self._stash_bytes = bytearray()
            self._stash_bytes += data
            return
        if self._held is not None or self.server.recovering:
            # Stored messages are still being read back after a restart: hold
            # everything until they are (as AMQP connections hold their operations).
            if self._held is None:
                self._held = bytearray()
                self.server.held.append(self)
                self._pause("recovery")
            self._held += data
            return
        self._process(data)

    def recovery_done(self) -> None:
        """The server's recovery finished (Server._recover): run what was held."""
        held, self._held = self._held, None
        if held is None or self.state == "closed":
            return
        self._resume("recovery")
        self._process(bytes(held))

    def _pause(self, reason: str) -> None:
        if not self._paused_for:
            self.transport.pause_reading()
        self._paused_for = self._paused_for | {reason}

    def _resume(self, reason: str) -> None:
        if reason in self._paused_for:
            self._paused_for = self._paused_for - {reason}
            if not self._paused_for and self.state != "closed":
                self.transport.resume_reading()

    def _process(self, data: bytes) -> None:
        """Act on one read's packets; then write what they queued for any connection
        (this one's answers, the deliveries of its publishes to MQTT and AMQP
        consumers) once each, as an AMQP connection's read does (server/connection_io)."""
        server = self.server
        if server.read_output is not None:  # (reads do not nest; this is a guard)
            self._process_packets(data)
            return
        server.read_output = written = []
        try:
            self._process_packets(data)
        finally:
            server.read_output = None
            flush_written(written)

    def _process_packets(self, data: bytes) -> None:
        try:
            packets = self.decoder.feed(data)
        except MQTTProtocolError as exc:
            self._protocol_error(exc)
            return
        meta = self.server.broker.meta
        if meta is None or meta.making:
            self._handle_packets(packets)
            return
        # A worker of several: what this session declares and binds goes to the others.
        meta.making = True
        try:
            self._handle_packets(packets)
        finally:
            meta.making = False

    def _handle_packets(self, packets: list[pk.Packet]) -> None:
        for index, packet in enumerate(packets):
            if self.state == "closed":
                return
            self.received += 1
            try:
                self._handle(packet)
            except _Held:
                # The packet waits for other workers: the rest waits for it.
                assert self._stash is not None
                self._stash[:0] = packets[index + 1 :]
                return
            except MQTTProtocolError as exc:
                self._protocol_error(exc)
                return
            except Exception:
                # A fault of ours must not take other connections with it.
                log.exception("MQTT connection %s: internal error, closing", self.transport.peer)
                self.close(send_will=self._will_on_server_close)
                return

    def _hold(self, waits: list[Any], then: Callable[[list[Any]], None]) -> NoReturn:
        """Finish the packet being handled with `then(results)` once every future of
        `waits` is done (each result, or its exception), and hold this connection's
        later packets until then. Only in a broker of workers, where a subscription's
        bindings and the retained messages involve other workers: the client sees the
        same order of answers as from one process."""
        self._stash = []
        self._pause("hold")
        gathered = asyncio.gather(*waits, return_exceptions=True)
        gathered.add_done_callback(lambda done: self._release(then, done.result()))
        raise _Held

    def _release(self, then: Callable[[list[Any]], None], results: list[Any]) -> None:
        stash, self._stash = self._stash, None
        if self.state == "closed" or stash is None:
            return
        server = self.server
        nested = server.read_output is not None
        if not nested:
            server.read_output = written = []
        meta = server.broker.meta
        making = meta is not None and not meta.making
        if making:
            meta.making = True
        try:
            then(results)
            self._handle_packets(stash)
        finally:
            if making:
                meta.making = False
            if not nested:
                server.read_output = None
                flush_written(written)
        if self._stash is None:
            raw, self._stash_bytes = self._stash_bytes, None
            self._resume("hold")
            if raw:
                self._process(bytes(raw))

    def _send(self, packet: pk.Packet) -> None:
        if self.state == "closed":
            return
        data = encode(packet, self.version)
        self.send_oct += len(data)
        self.sent += 1
        self._write(data)

    def _write(self, data: bytes) -> None:
        """Queue bytes for the socket. Everything queued while a read is handled (of any
        connection: server.read_output) goes out when that read is done, else at the
        next loop turn: one write a connection, not one a packet (a system call each)."""
        self._out.append(data)
        self._out_bytes += len(data)
        if self._flush_handle is None:
            written = self.server.read_output
            if written is not None:
                written.append(self)
                self._flush_handle = _AT_READ_END
            else:
                self._flush_handle = self.loop.call_soon(self._flush)
        if self._out_bytes > OUTPUT_HIGH_WATER:
            self.deliverable = False  # until the flush: a queue's dispatch stops here

    def _flush(self) -> None:
        """Write what is queued (server/connection_io.flush_written calls this too)."""
        handle = self._flush_handle
        if handle is not None:
            handle.cancel()
            self._flush_handle = None
        out = self._out
        if not out:
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        self._out_bytes = 0
        self.transport.write(data)  # (may pause writing: set_writable(False))
        if not self.deliverable and not self._transport_paused and self.state == "open":
            self.deliverable = True
            self._redispatch()

    def set_writable(self, writable: bool) -> None:
        """The transport's buffer filled (False) or drained (True)."""
        self._transport_paused = not writable
        self.deliverable = (
            writable and self.state == "open" and self._out_bytes <= OUTPUT_HIGH_WATER
        )
        if self.deliverable:
            self._redispatch()

    def _protocol_error(self, exc: MQTTProtocolError) -> None:
        log.warning("MQTT connection %s: protocol error: %s", self.transport.peer, exc.text)
        # Web MQTT: RabbitMQ's close frames for a client that did not CONNECT first and
        # for a refused protocol level; 1002 and the problem for other protocol errors.
        ws_close = (1002, exc.text)
        if self.state == "connecting" and not self.decoder.connect_seen:
            ws_close = (1002, "connect_expected")
        if self.state == "connecting" and exc.reason_code == pk.RC_UNSUPPORTED_PROTOCOL_VERSION:
            ws_close = WS_REFUSED[pk.CONNACK_BAD_PROTOCOL]
            level = self.decoder.version
            if level == pk.MQTT_5:
                self.version = pk.MQTT_5
                self._send(pk.Connack(False, pk.RC_UNSUPPORTED_PROTOCOL_VERSION))
            else:
                self._send(pk.Connack(False, pk.CONNACK_BAD_PROTOCOL))
        elif self.state == "open" and self.version == pk.MQTT_5:
            self._send(pk.Disconnect(exc.reason_code, {"reason_string": exc.text}))
        self.close(send_will=self._will_on_server_close, ws_close=ws_close)

    @property
    def _will_on_server_close(self) -> bool:
        """Whether a close the broker decides (a protocol error, a takeover, an operator,
        a refused operation) publishes the will. MQTT 5: yes, as the specification says
        (3.1.2.5) and RabbitMQ 3.13 does; MQTT 3.1.1: no, as RabbitMQ 3.10, which
        publishes it only when the socket is lost or the keepalive runs out."""
        return self.version == pk.MQTT_5

    def close(self, send_will: bool = True, ws_close: tuple[int, str] | None = None) -> None:
        """End the connection (the will goes out unless the client said DISCONNECT);
        `ws_close` is the WebSocket close frame a Web MQTT client gets."""
        if self.state == "closed":
            return
        self._teardown(send_will)
        self._flush()  # what was queued before the close, the close's own answers
        self.transport.close(ws_close)

    def connection_lost(self) -> None:
        """The transport is gone (peer close, error, or our close)."""
        if self.state != "closed":
            self._teardown(send_will=True)
        self._out.clear()  # nowhere to go
        self._out_bytes = 0

    # --- packets -----------------------------------------------------------------

    def _handle(self, packet: pk.Packet) -> None:
        if self.state == "connecting":
            if not isinstance(packet, pk.Connect):
                raise MQTTProtocolError("the first packet must be CONNECT", pk.RC_PROTOCOL_ERROR)
            self._on_connect(packet)
        elif isinstance(packet, pk.Publish):
            self._on_publish(packet)
        elif isinstance(packet, pk.PubAck):
            if packet.packet_type == pk.PUBACK:
                self._on_puback(packet.packet_id)
            elif packet.packet_type == pk.PUBREL:
                # Only reachable if a client sends PUBREL unasked: we never send PUBREC.
                self._send(pk.PubAck(pk.PUBCOMP, packet.packet_id, pk.RC_PACKET_ID_NOT_FOUND))
            # PUBREC / PUBCOMP answer QoS 2 deliveries, which we never send.
        elif isinstance(packet, pk.Subscribe):
            self._on_subscribe(packet)
        elif isinstance(packet, pk.Unsubscribe):
            self._on_unsubscribe(packet)
        elif isinstance(packet, pk.PingReq):
            self._send(pk.PingResp())
        elif isinstance(packet, pk.Disconnect):
            self._on_disconnect(packet)
        elif isinstance(packet, pk.Auth):
            raise MQTTProtocolError("no extended authentication was started", pk.RC_PROTOCOL_ERROR)

    # --- CONNECT -------------------------------------------------------------------

    def _connect_timeout(self) -> None:
        self._connect_timer = None
        if self.state == "connecting":
            log.warning("MQTT connection %s: no CONNECT in time, closing", self.transport.peer)
            self.close(send_will=False)

    def _refuse(self, code_311: int, code_5: int, text: str) -> None:
        log.warning("MQTT login from %s refused: %s", self.transport.peer, text)
        if self.version == pk.MQTT_5:
            self._send(pk.Connack(False, code_5, {"reason_string": text}))
        else:
            self._send(pk.Connack(False, code_311))
        self.close(send_will=False, ws_close=WS_REFUSED.get(code_311))

    def _on_connect(self, packet: pk.Connect, admitted: Any = _UNASKED) -> None:
        """CONNECT. `admitted`: on a worker other than 0 of several, worker 0's answer
        to this connection's limits (workers/limits.py), with which the CONNECT is
        handled again."""
        self.version = packet.protocol_level
        v5 = self.version == pk.MQTT_5
        config = self.config
        props = packet.properties
        if "authentication_method" in props:
            self._refuse(0, pk.RC_BAD_AUTHENTICATION_METHOD, "extended authentication")
            return
        client_id = packet.client_id
        assigned = False
        if not client_id:
            if not packet.clean_start and not v5:
                self._refuse(pk.CONNACK_ID_REJECTED, pk.RC_CLIENT_ID_NOT_VALID, "empty client id")
                return
            client_id = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
            assigned = True

        username = packet.username
        password = packet.password
        # A verified client certificate's user name (TLS listener only); it picks the
        # vhost through mqtt_default_vhosts whether or not it logs in (RabbitMQ 3.10).
        cert_name: str | None = getattr(self.transport, "cert_name", None)
        by_certificate = False
        if username is None and password is None:
            if config.mqtt_ssl_cert_login and cert_name is not None:
                username, by_certificate = cert_name, True
            elif config.mqtt_allow_anonymous:
                username = config.mqtt_default_user
                password = config.mqtt_default_pass.encode()
        if username is None or (password is None and not by_certificate):
            self._refuse(
                pk.CONNACK_BAD_CREDENTIALS, pk.RC_BAD_USERNAME_OR_PASSWORD, "no credentials"
            )
            return
        broker = self.server.broker
        vhost_name, user, picked_by = pick_vhost(
            username,
            cert_name,
            self._local_port(),
            broker.global_parameters.values,
            config.mqtt_vhost,
        )
        if not assigned and admitted is _UNASKED:
            route = getattr(self.transport, "route", None)
            if route is not None and route(vhost_name, client_id):
                # A broker of workers: the worker of the client id's session serves
                # it, from the connection's first byte (mqtt/listener.py).
                self._handed_over()
                return
        vhost = broker.vhosts.get(vhost_name)
        if vhost is None:
            self._refuse(
                pk.CONNACK_BAD_CREDENTIALS,
                pk.RC_BAD_USERNAME_OR_PASSWORD,
                f"virtual host '{vhost_name}' does not exist (picked by {picked_by})",
            )
            return
        counts = broker.limit_counts
        refused: tuple[str, int] | None = None
        if counts is not None and counts.index != 0:
            # A worker other than 0 of several: worker 0 holds the broker's counts.
            if admitted is _UNASKED:
                if counts.limited(vhost_name, user):
                    asking = counts.admit(vhost_name, user)
                    self._admitting = (asking, vhost_name, user)
                    self._hold(
                        [asking],
                        lambda results: self._admission_answered(packet, results[0]),
                    )
                counts.opened(vhost_name, user)
                admitted = None
            else:
                self._admitting = None
                if isinstance(admitted, tuple):
                    refused = admitted  # not counted by worker 0
            self._counted_as = None if refused is not None else (vhost_name, user)
        else:
            limit = vhost.limits.get("max-connections")
            if limit is not None and self._connections_in(vhost=vhost_name) >= limit:
                refused = ("vhost", limit)
        if refused is not None and refused[0] == "vhost":
            self._refuse(
                pk.CONNACK_NOT_AUTHORIZED,
                pk.RC_QUOTA_EXCEEDED,
                f"connection limit ({refused[1]}) is reached for vhost '{vhost_name}'",
            )
            return
        if by_certificate:
            # As SASL EXTERNAL: the certificate names a user that exists; no password.
            account = broker.access.users.get(user)
        else:
            assert password is not None
            try:
                secret = password.decode("utf-8")
            except UnicodeDecodeError:
                secret = None
            account = broker.access.authenticate(user, secret) if secret is not None else None
        broker.counters.auth_attempt(account is not None)
        if account is None:
            self._refuse(
                pk.CONNACK_BAD_CREDENTIALS,
                pk.RC_BAD_USERNAME_OR_PASSWORD,
                f"authentication failed for user '{user}'"
                + (" (client certificate)" if by_certificate else ""),
            )
            return
        if counts is None or counts.index == 0:
            limit = account.limit("max-connections")
            if limit is not None and self._connections_in(user=user) >= limit:
                refused = ("user", limit)
        if refused is not None:
            self._refuse(
                pk.CONNACK_NOT_AUTHORIZED,
                pk.RC_QUOTA_EXCEEDED,
                f"connection limit ({refused[1]}) is reached for user '{user}'",
            )
            return
        if user in config.loopback_users and not is_loopback(self.transport.peer_host):
            self._refuse(
                pk.CONNACK_NOT_AUTHORIZED,
                pk.RC_NOT_AUTHORIZED,
                f"user '{user}' can only connect via localhost",
            )
            return
        perm = broker.access.permission(user, vhost_name)
        if perm is None:
            self._refuse(
                pk.CONNACK_NOT_AUTHORIZED,
                pk.RC_NOT_AUTHORIZED,
                f"access to vhost '{vhost_name}' refused for user '{user}'",
            )
            return
        topics = broker.access.topics(user, vhost_name)
        self.guard = Guard(user, vhost, perm, topics) if Guard.needed(perm, topics) else None
        self.user, self.vhost, self.client_id = user, vhost, client_id
        self.clean_start = packet.clean_start
        self.keepalive = packet.keepalive
        if v5:
            requested = props.get("session_expiry_interval", 0)
            self.session_expiry = min(
                config.mqtt_max_session_expiry if requested == UINT32_MAX else requested,
                config.mqtt_max_session_expiry,
            )
            self._receive_max = props.get("receive_maximum", 65_535)
            self._client_max_packet = props.get("maximum_packet_size", MAX_PACKET_SIZE)
            self._alias_max_out = min(
                props.get("topic_alias_maximum", 0), config.mqtt_topic_alias_maximum
            )
        else:
            self.session_expiry = 0 if packet.clean_start else config.mqtt_max_session_expiry
        self.will = packet.will
        if self.will is not None:
            error = topic_name_error(self.will.topic)
            if error is not None:
                self._refuse(pk.CONNACK_BAD_CREDENTIALS, pk.RC_TOPIC_NAME_INVALID, error)
                return
        # One connection per client id: the newest wins (MQTT 3.1.4-3).
        self.listeners.wills.cancel(client_id)
        previous = self.listeners.clients.get(client_id)
        if previous is not None and previous is not self:
            previous.taken_over()
        self.listeners.clients[client_id] = self
        self.decoder.max_packet_size = MAX_PACKET_SIZE
        try:
            session_present = self._open_session()
        except (AMQPError, ModelError) as exc:
            self.listeners.clients.pop(client_id, None)
            self._refuse(pk.CONNACK_SERVER_UNAVAILABLE, pk.RC_NOT_AUTHORIZED, str(exc))
            return
        if self._connect_timer is not None:
            self._connect_timer.cancel()
            self._connect_timer = None
        self.state = "open"
        # Counted with AMQP connections (rabbitmq_connections_opened_total, churn rates).
        self.server.broker.connections_opened += 1
        self.client_properties = {"client_id": client_id, "product": "MQTT client"}
        ack_props: dict[str, Any] = {}
        if v5:
            ack_props = {
                "maximum_qos": 1,
                "topic_alias_maximum": config.mqtt_topic_alias_maximum,
                "shared_subscription_available": 0,
                "session_expiry_interval": self.session_expiry,
                "maximum_packet_size": MAX_PACKET_SIZE,
            }
            if assigned:
                ack_props["assigned_client_identifier"] = client_id
        self._send(pk.Connack(session_present, 0, ack_props))
        if self.keepalive:
            self._keepalive_timer = self.loop.call_later(
                self.keepalive * 1.5, self._check_keepalive
            )
        log.info(
            "MQTT connection %s opened: client id '%s', user '%s', vhost '%s' (%s)",
            self.transport.peer,
            client_id,
            user,
            vhost.name,
            self.protocol_name,
        )
        self._redispatch()

    def _open_session(self) -> bool:
        """Start clean or resume the stored session; whether one was present."""
        assert self.vhost is not None and self.client_id is not None
        _, qos1 = queue_names(self.client_id)
        existing = self.vhost.queues.get(qos1)
        if self.clean_start:
            if existing is not None:
                self._require("configure", "queue", qos1)
                self.vhost.delete_queue(existing)
            return False
        if existing is None:
            return False
        # Resume: consume the QoS 1 queue and take its bindings back as subscriptions.
        self._ensure_queue(1)
        self._apply_session_expiry()
        for binding in list(existing.bindings):
            if binding.source.name == self.exchange_name:
                self.subscriptions.setdefault(to_mqtt(binding.routing_key), SubscriptionState(1))
        return True

    def _admission_answered(self, packet: pk.Connect, answer: Any) -> None:
        """Worker 0 answered a connection's limits: counted from here unless refused
        (so a CONNECT refused for another reason on its second pass releases it)."""
        if self._admitting is not None:
            _, vhost_name, user = self._admitting
            self._admitting = None
            if not isinstance(answer, tuple):
                self._counted_as = (vhost_name, user)
        self._on_connect(packet, answer)

    def _local_port(self) -> int | None:
        """The port the client connected to (mqtt_port_to_vhost_mapping's key)."""
        port = self.transport.local.rpartition(":")[2]
        return int(port) if port.isdigit() else None

    def _connections_in(self, *, vhost: str | None = None, user: str | None = None) -> int:
        """Open AMQP and MQTT connections of a vhost or user (their max-connections):
        this process's, and on worker 0 of several those the other workers hold too."""
        broker = self.server.broker
        n = len(broker.connections_of(vhost=vhost, user=user))
        counts = broker.limit_counts
        if counts is not None:
            n += counts.remote(("v", vhost) if vhost is not None else ("u", user or ""))
        return n

    def access_changed(self) -> None:
        """The user's permissions changed (broker.admin): they apply from the next packet."""
        if self.state != "open" or self.vhost is None:
            return
        access = self.server.broker.access
        user = self.user or ""
        perm = access.permission(user, self.vhost.name)
        topics = access.topics(user, self.vhost.name)
        self.guard = Guard(user, self.vhost, perm, topics) if Guard.needed(perm, topics) else None

    def _check_keepalive(self) -> None:
        self._keepalive_timer = None
        if self.state != "open":
            return
        idle = time.monotonic() - self._last_read
        limit = self.keepalive * 1.5
        if idle >= limit:
            log.warning(
                "MQTT connection %s (client id '%s'): keepalive timeout, closing",
                self.transport.peer,
                self.client_id,
            )
            if self.version == pk.MQTT_5:
                self._send(pk.Disconnect(pk.RC_KEEP_ALIVE_TIMEOUT))
            self.close()
            return
        self._keepalive_timer = self.loop.call_later(limit - idle, self._check_keepalive)

    def taken_over(self) -> None:
        """A new connection took this client id: end this one."""
        log.warning(
            "MQTT connection %s: client id '%s' connected again, closing this connection",
            self.transport.peer,
            self.client_id,
        )
        if self.version == pk.MQTT_5:
            self._send(pk.Disconnect(pk.RC_SESSION_TAKEN_OVER))
        self.close(send_will=self._will_on_server_close)

    def _on_disconnect(self, packet: pk.Disconnect) -> None:
        if "session_expiry_interval" in packet.properties:
            if self.session_expiry == 0 and packet.properties["session_expiry_interval"]:
                raise MQTTProtocolError(
                    "session expiry set at DISCONNECT after 0 at CONNECT", pk.RC_PROTOCOL_ERROR
                )
            self.session_expiry = min(
                packet.properties["session_expiry_interval"], self.config.mqtt_max_session_expiry
            )
            self._apply_session_expiry()
        self.close(send_will=packet.reason_code == pk.RC_DISCONNECT_WITH_WILL)

    def _apply_session_expiry(self) -> None:
        """MQTT 5: the session's queue expires (x-expires) `session_expiry` seconds after
        its last connection ends. A resumed session's CONNECT and a DISCONNECT may give
        a new interval: it replaces the queue's, as RabbitMQ 3.13 does, so the session
        lives as long as the client last asked. (0 needs no update: the connection's end
        deletes the queue.)"""
        if self.version != pk.MQTT_5 or not self.session_expiry:
            return
        assert self.vhost is not None and self.client_id is not None
        queue = self.vhost.queues.get(queue_names(self.client_id)[1])
        if queue is None or queue.deleted:
            return
        ttl = self.session_expiry * 1000
        if queue.arguments.get("x-expires") != ttl:
            self.vhost.update_queue_arguments(queue, {**queue.arguments, "x-expires": ttl})

    # --- permissions -------------------------------------------------------------------

    def _require(self, permission: str, kind: str, name: str) -> None:
        if self.guard is not None:
            self.guard.require(permission, kind, name)

    # --- PUBLISH from the client --------------------------------------------------------

    def _on_publish(self, packet: pk.Publish) -> None:
        v5 = self.version == pk.MQTT_5
        topic = packet.topic
        props = packet.properties
        if v5 and "topic_alias" in props:
            alias = props["topic_alias"]
            if alias > self.config.mqtt_topic_alias_maximum:
                raise MQTTProtocolError(f"topic alias {alias} too large", pk.RC_TOPIC_ALIAS_INVALID)
            if topic:
                self._topic_aliases[alias] = topic
            else:
                topic = self._topic_aliases.get(alias, "")
                if not topic:
                    raise MQTTProtocolError(f"topic alias {alias} is not set", pk.RC_PROTOCOL_ERROR)
        error = topic_name_error(topic)
        if error is not None:
            raise MQTTProtocolError(error, pk.RC_TOPIC_NAME_INVALID)
        alarms = self.server.alarms
        if alarms is not None and alarms.blocking:
            self._block_for_alarm()  # this message goes through, later ones wait
        qos = packet.qos
        if qos == 2:
            if v5:
                # MQTT 5: above the Maximum QoS the CONNACK gave (RabbitMQ 3.13).
                raise MQTTProtocolError("QoS 2 is not supported", pk.RC_QOS_NOT_SUPPORTED)
            qos = 1  # RabbitMQ 3.10 takes a QoS 2 PUBLISH as QoS 1 (answers PUBACK)
        if qos and packet.packet_id is not None:
            entry: list[Any] = [packet.packet_id, None]
            if self._pubacks is None:
                self._pubacks = deque()
            self._pubacks.append(entry)
        else:
            entry = []
        try:
            routed = self.publish(
                topic, packet.payload, qos, packet.retain, packet.dup, props, entry
            )
        except AMQPError as exc:
            self._access_refused(exc)
            return
        stored = self._retaining
        if stored is not None:
            # Worker 0 stores the retained message: PUBACK, and the client's next
            # packets, once it has it.
            self._retaining = None
            self._hold([stored], lambda results: self._retained_stored(entry, routed, results[0]))
        if entry and routed is not None:
            entry[1] = routed
        self._flush_pubacks()

    def _retained_stored(self, entry: list[Any], routed: int | None, result: Any) -> None:
        if isinstance(result, BaseException):
            log.error("MQTT retained message not stored by worker 0: %s", result)
        if entry and routed is not None:
            entry[1] = routed
        self._flush_pubacks()

    def _access_refused(self, exc: AMQPError) -> None:
        text = getattr(exc, "reply_text", str(exc))
        log.warning("MQTT connection %s: %s", self.transport.peer, text)
        if self.version == pk.MQTT_5:
            self._send(pk.Disconnect(pk.RC_NOT_AUTHORIZED, {"reason_string": text}))
        self.close(send_will=self._will_on_server_close, ws_close=(1002, "access_refused"))

    def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        dup: bool,
        props: dict[str, Any],
        ack: list[Any] | None = None,
    ) -> int | None:
        """Route a message into the exchange; the reason code for its PUBACK, or None
        while it is being written (`ack[1]` is set when the write is done)."""
        vhost = self.vhost
        assert vhost is not None
        routing_key = self._routing_keys.get(topic)
        if routing_key is None:
            if len(self._routing_keys) >= ROUTING_KEY_CACHE:
                self._routing_keys.clear()
            routing_key = self._routing_keys[topic] = to_amqp(topic)
        if self.guard is not None:
            self.guard.check_publish(self.exchange_name, routing_key)
        exchange = vhost.exchanges.get(self.exchange_name)
        if exchange is None:
            # A configuration mistake: the client cannot publish at all.
            raise ChannelError(
                NOT_FOUND, f"no exchange '{self.exchange_name}' in vhost '{vhost.name}'"
            )
        if retain:
            stored = self.listeners.retained.retain(
                vhost.name, topic, Retained(bytes(payload), qos, _retained_props(props))
            )
            if stored is not None:  # a call to worker 0 (a broker of workers)
                self._retaining = stored
        # RabbitMQ 3.10 marks no message as retained; the header exists for MQTT 5's
        # retain-as-published, so only while a subscription in the vhost asks for it.
        marked = retain and vhost.name in self.listeners.retain_as_published
        header = amqp_header(len(payload), qos, dup, marked, props)
        message = Message(
            exchange.name,
            routing_key,
            header,
            bytes(payload),
            int.from_bytes(header[12:14]),
            qos > 0,
        )
        if "message_expiry_interval" in props:
            message.ttl = props["message_expiry_interval"] * 1000
        queues = vhost.route(exchange, message)
        if self._no_local and queues:
            queues = self._drop_own(queues, topic)
        exchange.stats.publish_in += 1
        if not queues:
            return pk.RC_NO_MATCHING_SUBSCRIBERS if self.version == pk.MQTT_5 else 0
        exchange.stats.publish_out += 1
        barrier = None
        if message.persistent and vhost.hooks.active:
            if ack:
                barrier = WriteBarrier(lambda error: self._written(ack, error))
            else:
                barrier = WriteBarrier(_ignore_written)
        accepted = True
        for queue in queues:
            if not queue.enqueue(message, barrier):
                accepted = False
            if isinstance(queue, Queue) and queue.consumers_behind():
                self._throttle(queue)
        code = 0 if accepted or self.version != pk.MQTT_5 else pk.RC_QUOTA_EXCEEDED
        if barrier is not None:
            barrier.seal()  # (its callback may run now, if nothing had to be written)
            if ack:
                return None
        return code

    def _written(self, ack: list[Any], error: BaseException | None) -> None:
        if error is None:
            ack[1] = 0
        else:
            log.error("MQTT message not stored, answering with an error: %s", error)
            ack[1] = pk.RC_IMPLEMENTATION_SPECIFIC if self.version == pk.MQTT_5 else -1
        self._flush_pubacks()

    def _flush_pubacks(self) -> None:
        pubacks = self._pubacks
        while pubacks and pubacks[0][1] is not None:
            packet_id, code = pubacks.popleft()
            if code < 0:
                # MQTT 3.1.1 has no negative PUBACK: the client learns by the close.
                self.close(send_will=self._will_on_server_close)
                return
            self._send(pk.PubAck(pk.PUBACK, packet_id, code if self.version == pk.MQTT_5 else 0))

    def _drop_own(self, queues: list, topic: str) -> list:
        """No Local (MQTT 5): our own queues keep the message only if a subscription
        without no_local matches it."""
        own = {self.consumers[q].queue for q in (0, 1) if self.consumers[q] is not None}
        if not own.intersection(queues):
            return queues
        keep_own = set()
        for topic_filter, sub in self.subscriptions.items():
            if not sub.no_local and matches(topic_filter, topic):
                consumer = self.consumers[sub.qos]
                if consumer is not None:
                    keep_own.add(consumer.queue)
        return [q for q in queues if q not in own or q in keep_own]

    # --- publisher flow control --------------------------------------------------------

    def _throttle(self, queue: Queue) -> None:
        if queue in self._flow or not hasattr(queue, "throttle"):
            return
        self._flow = self._flow | {queue}
        queue.throttle(self)
        self._pause("flow")

    def resume_after_flow(self, queue: Queue) -> None:
        """broker/ports.Publisher: `queue` drained."""
        self._flow = self._flow - {queue}
        if not self._flow:
            self._resume("flow")

    def _block_for_alarm(self) -> None:
        """A memory or disk alarm is on: stop reading this publisher until it clears
        (RabbitMQ blocks MQTT publishers' sockets the same way)."""
        self._pause("alarm")
        if self._alarm_timer is None:
            self._alarm_timer = self.loop.call_later(ALARM_POLL, self._check_alarm)

    def _check_alarm(self) -> None:
        self._alarm_timer = None
        alarms = self.server.alarms
        if self.state == "closed":
            return
        if alarms is not None and alarms.blocking:
            self._alarm_timer = self.loop.call_later(ALARM_POLL, self._check_alarm)
        else:
            self._resume("alarm")

    # --- SUBSCRIBE / UNSUBSCRIBE ----------------------------------------------------------

    def _on_subscribe(self, packet: pk.Subscribe) -> None:
        v5 = self.version == pk.MQTT_5
        identifier = (packet.properties.get("subscription_identifier") or [None])[0]
        codes: list[int] = []
        retained: list[tuple[str, int]] = []
        for sub in packet.subscriptions:
            topic_filter = sub.topic_filter
            error = topic_filter_error(topic_filter)
            if error is not None:
                # MQTT 3.1.1's failure code is 0x80, MQTT 5's 0x8F; the client stays.
                log.warning("MQTT connection %s: %s", self.transport.peer, error)
                codes.append(pk.RC_TOPIC_FILTER_INVALID if v5 else pk.RC_UNSPECIFIED_ERROR)
                continue
            if v5 and topic_filter.startswith(SHARED_PREFIX):
                codes.append(pk.RC_SHARED_SUBSCRIPTIONS_NOT_SUPPORTED)
                continue
            qos = min(sub.qos, 1)
            previous = self.subscriptions.get(topic_filter)
            try:
                self._subscribe(topic_filter, qos, previous)
            except AMQPError as exc:
                if not v5:
                    self._access_refused(exc)  # RabbitMQ 3.10 closes the connection
                    return
                log.warning("MQTT connection %s: %s", self.transport.peer, exc.args[0])
                codes.append(pk.RC_NOT_AUTHORIZED)
                continue
            self.subscriptions[topic_filter] = SubscriptionState(
                qos, sub.no_local, sub.retain_as_published, sub.retain_handling, identifier
            )
            self._no_local = any(s.no_local for s in self.subscriptions.values())
            self._count_retain_as_published()
            codes.append(qos)
            if sub.retain_handling == 0 or (sub.retain_handling == 1 and previous is None):
                retained.append((topic_filter, qos))
        meta = self.server.broker.meta
        if meta is None:
            self._suback(packet.packet_id, codes, retained, None)
            return
        # A broker of workers: SUBACK once every worker routes to the new bindings,
        # with the retained messages worker 0 holds (a worker other than 0 asks it).
        store = self.listeners.retained
        assert self.vhost is not None
        waits: list[Any] = [meta.made_settled()]
        if store.remote:
            waits += [store.matching(self.vhost.name, f) for f, _qos in retained]
        self._hold(
            waits,
            lambda results: self._suback(
                packet.packet_id, codes, retained, results[1:] if store.remote else None
            ),
        )

    def _suback(
        self,
        packet_id: int,
        codes: list[int],
        retained: list[tuple[str, int]],
        found: list[Any] | None,
    ) -> None:
        """SUBACK, then the retained messages of each filter (`found`: those worker 0
        answered, one list or exception per filter; None: this worker's store)."""
        self._send(pk.Suback(packet_id, codes))
        if packet_id > self._next_id:
            self._next_id = packet_id if packet_id < 65_535 else 1
        for n, (topic_filter, qos) in enumerate(retained):
            if found is None:
                messages = self.listeners.retained.matching(self.vhost.name, topic_filter)
            elif isinstance(found[n], BaseException):
                log.warning(
                    "MQTT connection %s: retained messages of '%s' not sent: %s",
                    self.transport.peer,
                    topic_filter,
                    found[n],
                )
                continue
            else:
                messages = found[n]
            self._send_retained(topic_filter, qos, messages)

    def _subscribe(self, topic_filter: str, qos: int, previous: SubscriptionState | None) -> None:
        vhost = self.vhost
        assert vhost is not None
        queue = self._ensure_queue(qos)
        routing_key = to_amqp(topic_filter)
        self._require("write", "queue", queue.name)
        self._require("read", "exchange", self.exchange_name)
        if self.guard is not None and self.guard.topics:
            self.guard.require_topic("read", self.exchange_name, routing_key)
        exchange = vhost.get_exchange(self.exchange_name)
        vhost.bind(exchange, queue, routing_key, {})
        if previous is not None and previous.qos != qos:
            # The new subscription replaces the old one (MQTT 3.8.4), on the other queue.
            old = self.consumers[previous.qos]
            if old is not None:
                vhost.unbind(self.exchange_name, old.queue.name, True, routing_key, {})

    def _ensure_queue(self, qos: int) -> Queue:
        """This client's queue for `qos`, declared and consumed (as RabbitMQ's ensure_queue)."""
        consumer = self.consumers[qos]
        if consumer is not None:
            return consumer.queue
        vhost = self.vhost
        assert vhost is not None and self.client_id is not None
        name = queue_names(self.client_id)[qos]
        queue = vhost.queues.get(name)
        if queue is None:
            self._require("configure", "queue", name)
            if qos == 0:
                queue = vhost.declare_queue(name, durable=False, auto_delete=True)
            else:
                clean = self.session_expiry == 0
                arguments: dict[str, Any] = {}
                if not clean:
                    ttl = self.config.mqtt_subscription_ttl_ms
                    if self.version == pk.MQTT_5:
                        ttl = self.session_expiry * 1000
                    if ttl:
                        arguments["x-expires"] = ttl
                queue = vhost.declare_queue(
                    name, durable=True, auto_delete=clean, arguments=arguments
                )
        self._require("read", "queue", name)
        if queue.remote:
            # A broker of workers serves a client id over TCP on the worker its id
            # names and over TLS or WebSockets on worker 0: a client that used both
            # has its session's queues on the other worker, where this one cannot
            # consume them.
            raise ChannelError(
                RESOURCE_LOCKED,
                f"the session of client id '{self.client_id}' is held by worker "
                f"{getattr(queue, 'worker', '?')}; "
                "connect over the listener it used before",
            )
        prefetch = 0 if qos == 0 else min(self.config.mqtt_prefetch, self._receive_max)
        consumer = Consumer(
            f"mqtt-{self.client_id}-qos{qos}", self, queue, qos == 0, False, prefetch
        )
        queue.add_consumer(consumer)
        self.consumers[qos] = consumer
        if self.state == "open":
            queue.dispatch()
        return queue

    def _on_unsubscribe(self, packet: pk.Unsubscribe) -> None:
        vhost = self.vhost
        assert vhost is not None
        codes = []
        for topic_filter in packet.topic_filters:
            sub = self.subscriptions.pop(topic_filter, None)
            if sub is None:
                codes.append(pk.RC_NO_SUBSCRIPTION_EXISTED)
                continue
            consumer = self.consumers[sub.qos]
            if consumer is not None:
                routing_key = to_amqp(topic_filter)
                try:
                    self._require("write", "queue", consumer.queue.name)
                    self._require("read", "exchange", self.exchange_name)
                except AMQPError:
                    self.subscriptions[topic_filter] = sub
                    codes.append(pk.RC_NOT_AUTHORIZED)
                    continue
                vhost.unbind(self.exchange_name, consumer.queue.name, True, routing_key, {})
            codes.append(pk.RC_SUCCESS)
        self._no_local = any(s.no_local for s in self.subscriptions.values())
        self._count_retain_as_published()
        unsuback = pk.Unsuback(packet.packet_id, codes if self.version == pk.MQTT_5 else [])
        meta = self.server.broker.meta
        if meta is None:
            self._send(unsuback)
            return
        # A broker of workers: UNSUBACK once no worker routes to the bindings any more.
        self._hold([meta.made_settled()], lambda _results: self._send(unsuback))

    def _send_retained(
        self, topic_filter: str, sub_qos: int, messages: list[tuple[str, Retained]]
    ) -> None:
        for topic, message in messages:
            qos = min(sub_qos, message.qos)
            props: dict[str, Any] = {}
            if self.version == pk.MQTT_5:
                props = dict(message.properties)
                sub = self.subscriptions.get(topic_filter)
                if sub is not None and sub.identifier is not None:
                    props["subscription_identifier"] = [sub.identifier]
            packet_id = None
            if qos:
                packet_id = self._packet_id()
                self.inflight[packet_id] = None
            self._send_publish(
                pk.Publish(topic, message.payload, qos, True, False, packet_id, props)
            )

    # --- deliveries to the client (the model's DeliveryChannel) --------------------------

    def _packet_id(self) -> int:
        for _ in range(65_535):
            packet_id = self._next_id
            self._next_id = packet_id % 65_535 + 1
            if packet_id not in self.inflight:
                return packet_id
        raise MQTTProtocolError("no free packet identifier", pk.RC_RECEIVE_MAXIMUM_EXCEEDED)

    def deliver(self, consumer: Consumer, queue: Queue, entry: QueueEntry) -> None:
        message = entry.message
        body = message.body
        if body is None or entry.location is not None:
            body = queue.delivery_body(entry)
        stats = queue.stats
        if entry.redelivered:
            stats.redeliver += 1
        v5 = self.version == pk.MQTT_5
        qos = 0 if consumer.no_ack else 1
        dup = entry.redelivered
        headers = None
        if message.has_headers:
            # A message an MQTT client published (without MQTT 5 properties) has one of
            # a few headers: its QoS and DUP flag are known without decoding the table.
            plain = _PLAIN_FLAGS.get(message.header[12:])
            if plain is None:
                headers = message.headers
                published = headers.get("x-mqtt-publish-qos") if headers else None
                mqtt_dup = headers.get("x-mqtt-dup") is True if headers else False
            else:
                published, mqtt_dup = plain
                if v5:
                    headers = message.headers
            if isinstance(published, int) and published < qos:
                qos = published
            if mqtt_dup:
                dup = True
        routing_key = message.routing_key
        if routing_key[:1] == "$" and not self._subscribed_to_dollar(
            to_mqtt(routing_key), 0 if consumer.no_ack else 1
        ):
            # Routed by a binding whose filter starts with a wildcard: MQTT never
            # matches those with a `$` topic (4.7.2), so it is not the client's.
            if consumer.no_ack:
                queue.removed(entry)
            else:
                queue.settle(entry)
            return
        props: dict[str, Any] = {}
        retain = False
        if v5:
            topic = to_mqtt(routing_key)
            props, retain = self._v5_properties(message, entry, headers, topic)
        packet_id = None
        if consumer.no_ack:
            stats.deliver_no_ack += 1
            queue.removed(entry)
            dup = False
        elif qos == 0:
            # A QoS 1 subscription gets a QoS 0 message at QoS 0 and it is done at once.
            stats.deliver += 1
            stats.ack += 1
            queue.settle(entry)
        else:
            stats.deliver += 1
            packet_id = self._packet_id()
            self.inflight[packet_id] = (queue, entry, consumer)
            consumer.unacked += 1
            self.unacked_count += 1
        if v5:
            self._send_publish(pk.Publish(topic, body, qos, retain, dup, packet_id, props))
            return
        # MQTT 3.1/3.1.1: no properties, aliases or size limit; the topic is encoded once.
        if self.state == "closed":
            return
        encoded = self._topics_out.get(routing_key)
        if encoded is None:
            if len(self._topics_out) >= ROUTING_KEY_CACHE:
                self._topics_out.clear()
            encoded = self._topics_out[routing_key] = encode_topic(to_mqtt(routing_key))
        data = encode_publish_311(encoded, body, qos, False, dup, packet_id)
        self.send_oct += len(data)
        self.sent += 1
        self._write(data)

    def _subscribed_to_dollar(self, topic: str, qos: int) -> bool:
        """Whether a subscription on the `qos` queue matches a `$` topic: one whose
        filter names its first level (`$SYS/#`), since the exchange's bindings also
        match it with `#` and `+/...` (topics.matches leaves those out)."""
        return any(
            sub.qos == qos and matches(topic_filter, topic)
            for topic_filter, sub in self.subscriptions.items()
        )

    def _send_publish(self, packet: pk.Publish) -> None:
        if self.state == "closed":
            return
        new_alias = 0
        if self._alias_max_out:
            # MQTT 5 topic aliases to the client, as RabbitMQ 3.13 gives them: the first
            # topics get 1, 2, ... up to the client's maximum; later PUBLISHes of such a
            # topic carry the alias and an empty topic name.
            alias = self._out_aliases.get(packet.topic)
            if alias is not None:
                packet.properties["topic_alias"] = alias
                packet.topic = ""
            elif len(self._out_aliases) < self._alias_max_out and len(packet.topic) > 1:
                new_alias = len(self._out_aliases) + 1
                packet.properties["topic_alias"] = new_alias
        data = encode_publish(packet, self.version)
        if len(data) > self._client_max_packet:
            # Larger than the client takes (MQTT 5 3.1.2.11.4): dropped, as if delivered
            # (and an alias it carried is not taken: the client never saw it).
            log.info("MQTT message of %d bytes dropped: client takes at most %d",
                     len(data), self._client_max_packet)  # fmt: skip
            if packet.packet_id is not None:
                self._on_puback(packet.packet_id)
            return
        if new_alias:
            self._out_aliases[packet.topic] = new_alias
        self.send_oct += len(data)
        self.sent += 1
        self._write(data)

    def _v5_properties(
        self, message: Message, entry: QueueEntry, headers: dict | None, topic: str
    ) -> tuple[dict[str, Any], bool]:
        """MQTT 5 PUBLISH properties from the AMQP message (RabbitMQ 3.13's mapping)."""
        props: dict[str, Any] = {}
        amqp = message.properties
        if amqp.content_type:
            props["content_type"] = amqp.content_type
        if amqp.correlation_id:
            props["correlation_data"] = amqp.correlation_id.encode()
        if amqp.reply_to:
            props["response_topic"] = to_mqtt(amqp.reply_to)
        if entry.expires_at:
            props["message_expiry_interval"] = max(0, round(entry.expires_at - time.monotonic()))
        elif message.ttl is not None:
            props["message_expiry_interval"] = message.ttl // 1000
        retain = False
        if headers:
            user = []
            listed = headers.get(USER_PROPERTY_LIST)
            if isinstance(listed, list):
                user = [
                    (_text(pair[0]), _text(pair[1]))
                    for pair in listed
                    if isinstance(pair, list) and len(pair) == 2
                ]
            for key, value in () if listed else headers.items():
                if key in OWN_HEADERS:
                    continue
                if isinstance(value, bytes):
                    value = value.decode("utf-8", "replace")
                if isinstance(value, str | int | float) and not isinstance(value, bool):
                    user.append((key, str(value)))
            if user:
                props["user_property"] = user
            if "x-reply-to-topic" in headers:
                props["response_topic"] = to_mqtt(_text(headers["x-reply-to-topic"]))
            if "x-correlation-id" in headers:
                value = headers["x-correlation-id"]
                if isinstance(value, bytes | bytearray):
                    props["correlation_data"] = bytes(value)
                else:
                    props["correlation_data"] = str(value).encode()
            if headers.get("x-mqtt-payload-format-indicator") is not None:
                props["payload_format_indicator"] = 1
            retain = headers.get("x-mqtt-retain") is True
        ids = []
        keep_retain = False
        for topic_filter, sub in self.subscriptions.items():
            if matches(topic_filter, topic):
                if sub.identifier is not None:
                    ids.append(sub.identifier)
                keep_retain = keep_retain or sub.retain_as_published
        if ids:
            props["subscription_identifier"] = ids
        return props, retain and keep_retain

    def _on_puback(self, packet_id: int) -> None:
        if packet_id not in self.inflight:
            return  # as RabbitMQ: an unknown id (a bogus client, a downgrade) is ignored
        held = self.inflight.pop(packet_id)
        if held is None:
            return
        queue, entry, consumer = held
        consumer.unacked -= 1
        self.unacked_count -= 1
        queue.stats.ack += 1
        queue.settle(entry)
        if queue.consumers and queue.ready:
            queue.dispatch()

    def on_consumer_cancelled_by_broker(self, consumer: Consumer) -> None:
        """The queue was deleted (by an operator): the subscriptions on it are gone."""
        qos = 0 if consumer.no_ack else 1
        if self.consumers[qos] is consumer:
            self.consumers[qos] = None
            for topic_filter in [f for f, s in self.subscriptions.items() if s.qos == qos]:
                del self.subscriptions[topic_filter]
            self._count_retain_as_published()

    def _count_retain_as_published(self) -> None:
        """Keep listeners.retain_as_published (open connections per vhost with an MQTT 5
        retain-as-published subscription) up to date: only while there is one does a
        retained PUBLISH carry the `x-mqtt-retain` header its live deliveries need."""
        on = self.state == "open" and any(
            s.retain_as_published for s in self.subscriptions.values()
        )
        if on == self._retain_as_published or self.vhost is None:
            return
        self._retain_as_published = on
        counts = self.listeners.retain_as_published
        name = self.vhost.name
        counts[name] = counts.get(name, 0) + (1 if on else -1)
        if not counts[name]:
            del counts[name]

    def _redispatch(self) -> None:
        for consumer in self.consumers:
            if consumer is not None and consumer.queue.ready:
                consumer.queue.dispatch()

    # --- the end ---------------------------------------------------------------------------

    def _handed_over(self) -> None:
        """The connection went to another worker: leave without a trace here."""
        self.state = "closed"
        self.listeners.connections.discard(self)
        if self._connect_timer is not None:
            self._connect_timer.cancel()
            self._connect_timer = None
        if self._held is not None:
            self._held = None

    def _teardown(self, send_will: bool) -> None:
        meta = self.server.broker.meta
        if meta is None or meta.making:
            self._close_session(send_will)
            return
        meta.making = True  # (a worker of several: deletions and unbindings go on)
        try:
            self._close_session(send_will)
        finally:
            meta.making = False

    def _close_session(self, send_will: bool) -> None:
        was_open = self.state == "open"
        if self._counted_as is not None:  # a worker other than 0: worker 0 counted it
            counts = self.server.broker.limit_counts
            if counts is not None:
                counts.closed(*self._counted_as)
            self._counted_as = None
        if self._admitting is not None:  # gone before worker 0 answered
            asking, vhost_name, user = self._admitting
            self._admitting = None
            asking.add_done_callback(partial(_uncount, self.server.broker, vhost_name, user))
        self.state = "closed"
        self.deliverable = False
        self._count_retain_as_published()
        self.listeners.connections.discard(self)
        for timer in (self._connect_timer, self._keepalive_timer, self._alarm_timer):
            if timer is not None:
                timer.cancel()
        self._connect_timer = self._keepalive_timer = self._alarm_timer = None
        self._held = None
        for queue in self._flow:
            getattr(queue, "throttled", set()).discard(self)
        self._flow = _NONE
        if not was_open:
            return
        client_id = self.client_id
        assert client_id is not None and self.vhost is not None
        if self.listeners.clients.get(client_id) is self:
            del self.listeners.clients[client_id]
        # Deliveries not acknowledged go back to their queues, marked redelivered.
        by_queue: dict[Queue, list[QueueEntry]] = {}
        for held in self.inflight.values():
            if held is not None:
                queue, entry, consumer = held
                consumer.unacked -= 1
                by_queue.setdefault(queue, []).append(entry)
        self.inflight.clear()
        self.unacked_count = 0
        for queue, entries in by_queue.items():
            queue.return_unacked(entries)
        for consumer in self.consumers:
            if consumer is not None:
                queue = consumer.queue
                queue.remove_consumer(consumer)
                self.vhost.maybe_auto_delete(queue)
                if queue.consumers and queue.ready:
                    queue.dispatch()
        self.consumers = [None, None]
        if self.session_expiry == 0 and self.version == pk.MQTT_5:
            queue = self.vhost.queues.get(queue_names(client_id)[1])
            if queue is not None and not queue.deleted:
                self.vhost.delete_queue(queue)
        if send_will and self.will is not None:
            self._schedule_will(self.will)
        self.will = None
        log.info("MQTT connection %s closed (client id '%s')", self.transport.peer, client_id)

    def _schedule_will(self, will: pk.Will) -> None:
        delay = will.properties.get("will_delay_interval", 0) if self.version == pk.MQTT_5 else 0
        delay = min(delay, self.session_expiry) if delay else 0
        if delay:
            self.listeners.wills.schedule(
                self.client_id or "", delay, lambda: self._publish_will(will)
            )
        else:
            self._publish_will(will)

    def _publish_will(self, will: pk.Will) -> None:
        props = {k: v for k, v in will.properties.items() if k != "will_delay_interval"}
        try:
            self.publish(will.topic, will.payload, min(will.qos, 1), will.retain, False, props)
        except AMQPError as exc:
            log.warning("MQTT last will of client id '%s' not published: %s", self.client_id, exc)
        stored, self._retaining = self._retaining, None
        if stored is not None:  # a retained will, stored by worker 0
            stored.add_done_callback(_will_retained)


def _will_retained(stored: asyncio.Future[Any]) -> None:
    if not stored.cancelled() and stored.exception() is not None:
        log.error("MQTT retained last will not stored by worker 0: %s", stored.exception())


def _ignore_written(error: BaseException | None) -> None:
    if error is not None:
        log.error("MQTT QoS 1 message not stored: %s", error)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _retained_props(props: dict[str, Any]) -> dict[str, Any]:
    """What a retained message keeps of its PUBLISH properties (not the alias)."""
    return {k: v for k, v in props.items() if k not in ("topic_alias", "subscription_identifier")}


_CLASS_AND_WEIGHT = b"\x00\x3c\x00\x00"


def amqp_header(size: int, qos: int, dup: bool, retain: bool, props: dict[str, Any]) -> bytes:
    """The AMQP content header of an MQTT message: RabbitMQ 3.10's headers and delivery
    mode, and MQTT 5's properties as RabbitMQ 3.13 maps them."""
    if not props:
        tail = _PLAIN_HEADERS.get((qos, dup, retain))
        if tail is None:
            tail = _encode_amqp_header(0, qos, dup, retain, {})[12:]
        return _CLASS_AND_WEIGHT + size.to_bytes(8, "big") + tail
    return _encode_amqp_header(size, qos, dup, retain, props)


def _encode_amqp_header(
    size: int, qos: int, dup: bool, retain: bool, props: dict[str, Any]
) -> bytes:
    headers: dict[str, Any] = {}
    user = props.get("user_property", ())
    for key, value in user:
        headers.setdefault(key, value)  # a repeated name: the first value, as RabbitMQ 3.13
    if any(a[0] >= b[0] for a, b in pairwise(user)):  # a name repeats or comes early
        headers[USER_PROPERTY_LIST] = [[key, value] for key, value in user]
    headers["x-mqtt-publish-qos"] = qos
    headers["x-mqtt-dup"] = dup
    if retain:
        headers["x-mqtt-retain"] = True
    fields: dict[str, Any] = {"delivery_mode": 2 if qos else 1}
    content_type = props.get("content_type")
    if content_type is not None and len(content_type.encode()) <= 255:
        fields["content_type"] = content_type
    correlation = props.get("correlation_data")
    if correlation is not None:
        try:
            text = correlation.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None and len(correlation) <= 255:
            fields["correlation_id"] = text
        else:
            headers["x-correlation-id"] = bytearray(correlation)  # an AMQP byte array
    if "response_topic" in props:
        headers["x-reply-to-topic"] = to_amqp(props["response_topic"])
    if "message_expiry_interval" in props:
        fields["expiration"] = str(props["message_expiry_interval"] * 1000)
    if props.get("payload_format_indicator"):
        headers["x-mqtt-payload-format-indicator"] = 1
    return encode_header(size, cmd.Basic.Properties(headers=headers, **fields))


# Content headers of messages without MQTT 5 properties, by (qos, dup, retain), less
# the body size: class 60, weight 0, then the size, then these bytes.
_PLAIN_HEADERS: dict[tuple[int, bool, bool], bytes] = {
    (qos, dup, retain): _encode_amqp_header(0, qos, dup, retain, {})[12:]
    for qos in (0, 1)
    for dup in (False, True)
    for retain in (False, True)
}
# ...and back: the published QoS and DUP flag of a message with one of those headers.
_PLAIN_FLAGS: dict[bytes, tuple[int, bool]] = {
    tail: (qos, dup) for (qos, dup, _), tail in _PLAIN_HEADERS.items()
}
