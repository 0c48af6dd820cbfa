"""One client connection: the asyncio adapter around the protocol core.

The AMQP state machine (protocol header, handshake, tuning, channel lifecycle,
content assembly, the close handshakes) is leveret.protocol.connection, the
same sans-IO core leveret.client uses; this class moves bytes between it and
the socket and turns its events into broker work: credentials and vhosts,
publishes, acks and channel methods, and everything with a clock or a socket
(handshake timeout, heartbeats, write batching, flow control, lingering close).
Outgoing frames are collected in the core's output queue, in order with the
core's own replies, and written with one transport.write per loop turn.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import platform
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from pamqp import commands as cmd

import leveret
from leveret.auth.sasl import certificate_login_name
from leveret.auth.users import is_loopback
from leveret.broker.errors import ModelError
from leveret.broker.stats import MessageStats, connection_counts, rates_between
from leveret.protocol import connection as pc
from leveret.protocol import methods as wire
from leveret.protocol.constants import (
    ACCESS_REFUSED,
    BASIC_NACK,
    BASIC_QOS,
    CLASS_BASIC,
    CLASS_CONNECTION,
    CLASS_QUEUE,
    COMMAND_INVALID,
    CONNECTION_FORCED,
    INTERNAL_ERROR,
    NOT_ALLOWED,
)
from leveret.protocol.errors import AMQPError, ChannelError, ConnectionError_
from leveret.protocol.frames import HEARTBEAT_FRAME
from leveret.server.amqp_errors import amqp_error
from leveret.server.authorization import Guard
from leveret.server.channel import Channel
from leveret.server.connection_io import OUTPUT_HIGH_WATER, ConnectionIO
from leveret.server.publisher_pause import PublisherPause
from leveret.server.publishing import MAX_MESSAGE_SIZE
from leveret.server.reading import ReadSizer
from leveret.store import replica

if TYPE_CHECKING:
    from leveret.broker.vhost import Vhost
    from leveret.server.listener import Server

log = logging.getLogger("leveret.connection")

CLOSE_OK_TIMEOUT = 3.0
# After the close handshake the socket stays open, read and discarded, until the
# client's FIN or this many seconds: closing with unread input makes the kernel
# send a TCP reset, which destroys the close-ok the client has not read yet.
LINGER_TIMEOUT = 10.0
MECHANISMS = ("PLAIN", "AMQPLAIN")

# What waits while the broker recovers: anything that reads or changes a queue's
# messages. Logging in, channels, qos, confirm and tx mode, and exchanges go ahead
# (clients such as aio-pika open a channel with confirm.select and wait for it).
_AFTER_RECOVERY = (pc.Publish, pc.Ack, pc.Nack)


def _waits_for_recovery(event: pc.Event) -> bool:
    kind = type(event)
    if kind is pc.MethodReceived:
        index = event.method.index  # type: ignore[attr-defined]
        return bool(event.channel) and (  # type: ignore[attr-defined]
            index >> 16 == CLASS_QUEUE or (index >> 16 == CLASS_BASIC and index != BASIC_QOS)
        )
    return kind in _AFTER_RECOVERY


def _confirms(ch: Channel | None) -> bool:
    """Whether channel `ch` confirms its publishes (not in a transaction): then
    `cannot_move` waits until each one it handled here reached its queues."""
    return ch is not None and ch.confirm_mode and ch.tx is None


def _replay(event: pc.Event, rest: Iterator[pc.Event]) -> Iterator[pc.Event]:
    yield event
    yield from rest


SERVER_CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": True,
}


def _limit_reached(kind: str, limit: int, vhost: str, user: str) -> ConnectionError_:
    """connection.open refused by a vhost's or a user's max-connections (RabbitMQ's text)."""
    if kind == "vhost":
        text = (
            f"access to vhost '{vhost}' refused for user '{user}': "
            f"connection limit ({limit}) is reached"
        )
    else:
        text = f"connection refused for user '{user}': user connection limit ({limit}) is reached"
    return ConnectionError_(NOT_ALLOWED, text, 10, 40)


class AMQPConnection(ConnectionIO, asyncio.BufferedProtocol):
    """One client connection (see the module's docstring); its per-read and output
    methods are ConnectionIO's (server/connection_io.py, compiled)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.broker = server.broker
        config = server.config
        self.config = config
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.core = pc.Connection(
            pc.SERVER,
            server_properties={
                "product": "Leveret",
                "version": leveret.__version__,
                "platform": f"Python {platform.python_version()}",
                "information": "A RabbitMQ-compatible AMQP 0-9-1 broker written in Python",
                "capabilities": SERVER_CAPABILITIES,
                "cluster_name": server.broker.cluster_name,
            },
            mechanisms=" ".join(MECHANISMS),
            frame_max=config.frame_max,
            channel_max=config.channel_max,
            heartbeat=config.heartbeat,
            max_body_size=MAX_MESSAGE_SIZE,
        )
        # header → start-ok → tune-ok → open → opened → closing → closed (what the
        # rest of the broker reads; the protocol state proper is self.core.state)
        self.state = "header"
        self.channels: dict[int, Channel] = {}
        # broker.stats: counts of this connection's closed channels (open ones keep
        # their own), bytes in and out, and the sampler's last reading and rates.
        self.stats = MessageStats()
        self.recv_oct = 0
        self.send_oct = 0
        # Socket reads and writes, as RabbitMQ's recv_cnt/send_cnt (management API).
        self.recv_cnt = 0
        self.send_cnt = 0
        self.connected_at = time.time()
        self.stats_rates: tuple[float, ...] | None = None
        self._stats_last: tuple[int, ...] | None = None
        self._octets_last = (0, 0)
        self.octet_rates = (0.0, 0.0)
        self.client_properties: dict[str, Any] = {}
        self.capabilities: dict[str, Any] = {}
        self.user: str | None = None
        self.peer_cn: str | None = None  # CN of a verified client certificate
        self.impersonator = False  # the user's tag: may set any user_id
        self.vhost: Any = None
        self.guard: Guard | None = None  # permission checks; None: may do anything
        self.exclusive_queues: set = set()
        self.writable = True
        self._out = self.core.output  # one queue for our frames and the core's
        self._out_bytes = 0
        self._out_large = False  # a large body is queued: flush with writelines
        self._hold = 0  # a cluster leader's output waits for this stream position
        self._hold_waiting = False
        # ... and for these changes (hold_output_until); `_hold` is -1 while only they hold
        self._held_changes: list[asyncio.Future[Any]] = []
        self._sizer = ReadSizer()
        self._read_buffer = server.read_buffer
        # server/busy_wait.py: None unless --busy-wait-us; each read arms it
        self._busy_wait = server.busy_wait
        self._flush_handle: asyncio.Handle | None = None
        self._transport_paused = False
        self._confirm_channels: set[Channel] = set()
        self._last_recv = 0.0
        self._last_send = 0.0
        self._timers: list[asyncio.TimerHandle] = []
        self._heartbeat_timer: asyncio.TimerHandle | None = None
        self._tick_due = 0.0  # when the heartbeat tick should run next
        self._reading_paused = False  # the transport's state; PublisherPause decides
        self.publisher_pause = PublisherPause(self._pause_reading, self._resume_reading)
        self.alarm_reason: str | None = None  # set while a resource alarm is on
        # While the broker recovers: check events (_gated), and the event held with
        # the suspended rest of its batch (see _until_recovered).
        self._gated = server.recovering
        self._held: tuple[pc.Event, Iterator[pc.Event]] | None = None
        # In a broker of several workers (leveret.workers.metadata): the writer of
        # metadata changes, and whether one this connection made is in flight. Its
        # events are always checked then (_gated), and those after a change in flight
        # are held as during recovery, so a declare-ok precedes what follows it.
        self.meta = server.broker.meta
        self._meta_busy = False
        if self.meta is not None:
            self._gated = True
        # Worker k > 0 of several: this connection counts on worker 0 (workers/limits.py),
        # with this many of its channels, and the channel.open worker 0 admitted.
        self._counted = False
        self.channels_counted = 0
        self._channel_admitted: pc.Event | None = None
        # A broker of workers (workers/affinity.py): until the first method that names
        # a queue decides where this connection belongs, the read gate checks events.
        self._affinity = server.handoffs
        if self._affinity is not None:
            self._gated = True
            # ... and after a publish through an exchange decided (affinity.Following)
            self._following: Any = None
        # Input of a connection handed over by another worker, handled before reading.
        self._adopted: tuple[bytes, int] | None = None
        self._told_blocked = False
        # A leveret.links connection from inside this broker (links/direct.py), and
        # whether it is RabbitMQ's trusted direct user "none" (any vhost, no checks).
        self.direct: dict[str, Any] | None = None
        self.trusted = False

    @property
    def name(self) -> str:
        """RabbitMQ's connection name: "client address:port -> broker address:port"."""
        local = self.transport.get_extra_info("sockname") if self.transport else None
        return f"{self.peer} -> {local[0]}:{local[1]}" if local else self.peer

    @property
    def frame_max(self) -> int:
        return self.core.frame_max

    @property
    def channel_max(self) -> int:
        return self.core.channel_max

    @property
    def heartbeat(self) -> int:
        """Negotiated heartbeat interval (0 before tune-ok or when disabled)."""
        return self.core.heartbeat if self.state in ("open", "opened", "closing") else 0

    # --- asyncio.Protocol ---------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        transport.set_write_buffer_limits(high=OUTPUT_HIGH_WATER)  # type: ignore[attr-defined]
        self.peer_cn = certificate_login_name(
            transport.get_extra_info("peercert"), self.config.tls_cert_login_from
        )
        self.direct = transport.get_extra_info("leveret_direct")
        if self.peer_cn is not None:  # a verified client certificate: offer EXTERNAL
            self.core.mechanisms = " ".join((*MECHANISMS, "EXTERNAL"))
        self._last_recv = self._last_send = self.loop.time()
        if self._adopted is not None:
            self._resume_adopted()
            return
        self._timers.append(
            self.loop.call_later(self.config.handshake_timeout, self._handshake_timeout)
        )
        self.server.connections.add(self)
        log.debug("accepting AMQP connection %s", self.peer)

    # --- input: the hot path is ConnectionIO's (buffer_updated, _process) ----

    # --- holding operations while the broker recovers ---------------------------
    #
    # After a restart the broker listens before its queues have their messages back
    # (the store scans in a worker thread). A client can log in and open channels
    # meanwhile; its first operation on queues or messages is held, with everything
    # after it, until recovery is done: the events generator stays suspended (its
    # bytes unparsed) and reading pauses. So a queue.declare's counts are right, and
    # nothing is published in front of a recovered message.

    def _until_recovered(self, events: Iterator[pc.Event]) -> Iterator[pc.Event]:
        for event in events:
            if self._meta_busy:  # a metadata change of ours is in flight
                self._held = (event, events)
                self.publisher_pause.start_recovery()
                return
            if self._counted and type(event) is pc.ChannelOpened:
                if self._count_channel(event, events):
                    return  # held until worker 0 answers
            if self._affinity is not None:
                outcome = self._affinity_decide(event, events)
                if outcome is not None:  # `events` was closed
                    if outcome is not True:  # the handoff failed: parse its bytes again
                        yield from self._until_recovered(outcome)
                    return
            if self.server.recovering and _waits_for_recovery(event):
                self._held = (event, events)
                self.publisher_pause.start_recovery()
                self.server.held.append(self)  # replayed in the order they came
                return
            yield event
        if not self.server.recovering and self.meta is None and self._affinity is None:
            self._gated = False

    # --- affinity: moving to the worker that owns the queues (workers/affinity.py) ----

    def _affinity_decide(
        self, event: pc.Event, events: Iterator[pc.Event]
    ) -> bool | Iterator[pc.Event] | None:
        """At each event until one names a queue: does this connection go to another
        worker? None: go on with `event` here (the decision is made, or not yet).
        True: the connection was handed over (`events` closed, nothing more to do).
        Otherwise the handoff failed after `events` was closed: the events of its
        bytes again, to handle here."""
        handoffs = self._affinity
        mesh = handoffs.mesh  # type: ignore[union-attr]
        if self._following is not None:
            return self._affinity_follow(event, events)
        peer = handoffs.target(mesh, self.vhost, event)  # type: ignore[union-attr]
        if peer is None:
            return None
        if peer == handoffs.STAY or peer == mesh.index:  # type: ignore[union-attr]
            self._affinity = None  # decided: never again for this connection
            return None
        if type(event) is pc.Publish and event.exchange:  # type: ignore[attr-defined]
            # Routed through an exchange to queues of `peer` only: handled here, and
            # the connection moves at a later event, once its confirm was sent (the
            # message is on `peer` then: nothing published after it can overtake it).
            if not _confirms(self.channels.get(event.channel)):  # type: ignore[attr-defined]
                self._affinity = None  # nothing would say when its message got there
                return None
            self._following = handoffs.Following(peer)  # type: ignore[union-attr]
            return None
        self._affinity = None  # decided: never again for this connection
        return self._affinity_move(peer, event, events)

    def _affinity_follow(
        self, event: pc.Event, events: Iterator[pc.Event]
    ) -> bool | Iterator[pc.Event] | None:
        """After a publish decided for another worker: move at `event` if nothing
        holds the connection here and `event` does not point elsewhere; stay for good
        when it does, or when the tries are spent. Returns as `_affinity_decide`."""
        handoffs = self._affinity
        following = self._following
        peer = following.peer  # type: ignore[union-attr]
        kind = type(event)
        if kind is not pc.MethodReceived and kind is not pc.Publish:
            return None  # (acks, heartbeats: not a moment to move at, nor a try)
        there = handoffs.target(handoffs.mesh, self.vhost, event)  # type: ignore[union-attr]
        if there is not None and there != peer:
            self._affinity = self._following = None  # its queues are not all there
            log.debug("connection %s stays: it also uses queues not on worker %d", self.peer, peer)
            return None
        self._flush()  # what answers earlier events leaves first, from here
        if handoffs.cannot_move(self, event) is None:  # type: ignore[union-attr]
            self._affinity = self._following = None
            return self._affinity_move(peer, event, events)
        if kind is pc.Publish and not _confirms(self.channels.get(event.channel)):  # type: ignore[attr-defined]
            self._affinity = self._following = None  # handled here, unconfirmed
            return None
        following.tries -= 1  # type: ignore[union-attr]
        if following.tries <= 0:  # type: ignore[union-attr]
            self._affinity = self._following = None
            log.debug("connection %s stays: it never could move to worker %d", self.peer, peer)
        return None

    def _affinity_move(
        self, peer: int, event: pc.Event, events: Iterator[pc.Event]
    ) -> bool | Iterator[pc.Event] | None:
        """Hand this connection to worker `peer` at `event` if it can go; returns as
        `_affinity_decide`."""
        handoffs = self.server.handoffs
        if not handoffs.can_send(peer):
            log.debug("connection %s stays: worker %d is not linked", self.peer, peer)
            return None
        self._flush()  # what answers earlier methods leaves first, from here
        reason = handoffs.cannot_move(self, event)  # type: ignore[union-attr]
        if reason is None and len(self.core.pending) > handoffs.MAX_INPUT:  # type: ignore[union-attr]
            reason = "a large unhandled input"
        if reason is not None:
            log.debug("connection %s stays: %s", self.peer, reason)
            return None
        events.close()  # the core keeps the bytes after `event` as pending
        core = self.core
        pending = handoffs.encode_event(event, core.frame_max) + core.pending  # type: ignore[union-attr]
        core._buf = b""
        try:
            state = pickle.dumps(self.export_state(pending), pickle.HIGHEST_PROTOCOL)
            handoffs.send(peer, self.transport.get_extra_info("socket"), state)  # type: ignore
        except Exception as exc:  # the connection stays and goes on from its bytes
            log.warning("connection %s stays: %s", self.peer, exc)
            return core.receive_data(pending)
        log.info("connection %s handed to worker %d, which owns its queues", self.peer, peer)
        # It leaves this worker's counts and lists (the worker that took it counts it,
        # and its byte counts go on there: connection_lost adds none to the vhost's).
        self.broker.connections_opened -= 1
        self.broker.channels_opened -= len(self.channels)
        self.broker.connections.discard(self)
        counts = self.broker.limit_counts
        if counts is not None and self.vhost is not None:
            # worker 0 moves its count to the adopting worker in one step
            channels = self.channels_counted if self._counted else len(self.channels)
            self._counted, self.channels_counted = False, 0
            counts.moved(peer, self.vhost.name, self.user or "", channels)
        self.state = "closed"
        self.transport.abort()  # type: ignore[union-attr]  # our descriptor only: no FIN
        return True

    def export_state(self, pending: bytes) -> dict[str, Any]:
        """An open connection as another worker continues it (`import_state`): the
        core's (tuned sizes, open channels), the login, the channels' numbering
        (delivery tags, confirm sequence numbers), counters, and `pending`, the bytes
        read and not handled. Only for a connection `affinity.cannot_move` allows."""
        return {
            "core": self.core.export_state(),
            "user": self.user,
            "vhost": self.vhost.name,
            "client_properties": self.client_properties,
            "capabilities": self.capabilities,
            "connected_at": self.connected_at,
            "counts": (self.recv_oct, self.send_oct, self.recv_cnt, self.send_cnt),
            "channels": [ch.export_state() for ch in self.channels.values()],
            "input": pending,
            "worker": self.broker.mesh.index if self.broker.mesh is not None else 0,
        }

    def import_state(self, state: dict[str, Any]) -> None:
        """Become the connection `export_state` described, before `connection_made`
        (which then handles its input first). Raises ValueError if this worker
        cannot take it (its vhost or user is gone)."""
        vhost = self.broker.vhosts.get(state["vhost"])
        if vhost is None:
            raise ValueError(f"vhost {state['vhost']!r} not found")
        user = state["user"] or ""
        access = self.broker.access
        if access.users.get(user) is None or access.permission(user, vhost.name) is None:
            raise ValueError(f"user {user!r} may not use vhost {vhost.name!r} any more")
        self.core.import_state(state["core"])
        self.user = user
        self.vhost = vhost
        self.client_properties = state["client_properties"]
        self.capabilities = state["capabilities"]
        self.connected_at = state["connected_at"]
        self.recv_oct, self.send_oct, self.recv_cnt, self.send_cnt = state["counts"]
        self.access_changed()
        self.state = "open"
        self._affinity = None  # where its queues are: no decision to make again
        # (_gated stays as the constructor set it: the first read clears it when
        # nothing else needs it, as for any connection.)
        for item in state["channels"]:
            self._add_channel(item["number"]).import_state(item)
        self._adopted = (state["input"], state["worker"])

    def _resume_adopted(self) -> None:
        """connection_made of a connection handed over: open at once, without a
        handshake, and handle the bytes the other worker had read."""
        data, worker = self._adopted  # type: ignore[misc]
        self._adopted = None
        self.server.connections.add(self)
        self.broker.connections.add(self)
        counts = self.broker.limit_counts
        if counts is not None and counts.index != 0:
            # (the worker that handed it over had worker 0 count it here: `moved`)
            self._counted = True
            self.channels_counted = len(self.channels)
        self.broker.connections_opened += 1
        self.broker.channels_opened += len(self.channels)
        self.state = "opened"
        alarms = self.server.alarms
        if alarms is not None and alarms.blocking:
            self.alarm_raised(alarms.reason)
        if self.heartbeat:
            self._tick_due = self.loop.time() + self.heartbeat / 2
            self._heartbeat_timer = self.loop.call_later(self.heartbeat / 2, self._heartbeat_tick)
        log.info(
            "connection %s taken over from worker %d: user '%s', vhost '%s'",
            self.peer,
            worker,
            self.user,
            self.vhost.name,
        )
        if data:
            self._received(self.core.receive_data(data))

    def recovery_done(self) -> None:
        """The server finished recovery: run what was held, then read again."""
        self._gated = self.meta is not None
        held, self._held = self._held, None
        if self.meta is not None:  # what runs now may hold again (a metadata change)
            self.publisher_pause.end_recovery()
            if held is not None and self.state != "closed":
                self._received(self._until_recovered(_replay(*held)))
            return
        if held is not None and self.state != "closed":
            event, rest = held
            self._process(_replay(event, rest))
        self.publisher_pause.end_recovery()

    def hold_for(
        self,
        change: asyncio.Future[Any],
        ch: Channel,
        index: int,
        answer: Callable[[Any], None],
    ) -> None:
        """A metadata change made on channel `ch` by method `index` is in flight (in a
        broker of several workers): hold this connection's later events until it is
        done, then `answer(result)` (declare-ok...) or close the channel with its error,
        and run what was held."""
        self._meta_busy = True
        change.add_done_callback(partial(self._change_done, ch, index, answer))

    def _change_done(
        self,
        ch: Channel,
        index: int,
        answer: Callable[[Any], None],
        change: asyncio.Future[Any],
    ) -> None:
        self._meta_busy = False
        if self.state == "closed":
            self._held = None
            return
        try:
            try:
                if not ch.closing:
                    answer(change.result())
            except (AMQPError, ModelError) as exc:
                self._channel_exception(ch, exc, index)
        except AMQPError as exc:
            self.close_with_error(exc)
        except ModelError as exc:
            self.close_with_error(amqp_error(exc))
        except Exception:
            log.exception("internal error on connection %s", self.peer)
            self.close_with_error(
                ConnectionError_(INTERNAL_ERROR, "internal error; see the broker log")
            )
        held, self._held = self._held, None
        if held is not None and self.state not in ("closed", "closing"):
            self.publisher_pause.end_recovery()
            self._received(self._until_recovered(_replay(*held)))
        elif self._out:
            self._flush()

    def _event(self, event: pc.Event) -> None:
        """Every event but the hot two: methods, channel lifecycle, handshake, closing."""
        kind = type(event)
        if kind is pc.MethodReceived:
            number = event.channel  # type: ignore[attr-defined]
            method = event.method  # type: ignore[attr-defined]
            if number:
                ch = self.channels.get(number)
                if ch is not None and not ch.closing:
                    try:
                        ch.handle_method(method)
                    except (AMQPError, ModelError) as exc:
                        self._channel_exception(ch, exc, method.index)
            else:
                self._connection_method(method)
        elif kind is pc.Nack:
            e: Any = event
            ch = self.channels.get(e.channel)
            if ch is not None and not ch.closing:
                try:
                    ch.on_basic_nack(e)  # the event has a method's field names
                except (AMQPError, ModelError) as exc:
                    self._channel_exception(ch, exc, BASIC_NACK)
        elif kind is pc.ChannelOpened:
            self._add_channel(event.channel)  # type: ignore[attr-defined]
            self.broker.channels_opened += 1
        elif kind is pc.ChannelClosed:  # the client closed it; close-ok follows
            ch = self.channels.pop(event.channel, None)  # type: ignore[attr-defined]
            if ch is not None and self._counted:
                self._channel_gone()
            if ch is not None:
                # Confirms already due (transient messages, persistent ones on disk)
                # go out before close-ok, as RabbitMQ sends those it has; the ones
                # still waiting for the disk are dropped by cleanup().
                if ch.confirm_mode:
                    self.confirms_written(ch)
                ch.cleanup()
        elif kind is pc.ChannelCloseOk:  # our channel.close is acknowledged
            ch = self.channels.pop(event.channel, None)  # type: ignore[attr-defined]
            if ch is not None and self._counted:
                self._channel_gone()
        elif kind is pc.ChannelProtocolError:  # over max message size: close queued
            e = event
            ch = self.channels.get(e.channel)
            if ch is not None:
                self.log_channel_error(e.channel, e.error)
                ch.cleanup()
        elif kind is pc.StartOkReceived:
            self._on_login(event)  # type: ignore[arg-type]
        elif kind is pc.OpenRequested:
            self._on_open(event)  # type: ignore[arg-type]
        elif kind is pc.ConnectionClosed:  # the client closes; close-ok follows
            self._flush()  # publisher confirms already due go out before close-ok
            self._teardown()  # no deliveries after close-ok: requeue, drop consumers
            self.state = "closing"
        elif kind is pc.ConnectionCloseOk:
            pass  # data_received lingers once the events are taken
        elif kind is pc.ProtocolError:
            e = event
            self._protocol_error(e.error, e.drop)
        elif kind is pc.BadProtocolHeader:
            # Spec 4.2.2: the core answered with the version we speak; now close.
            received = event.received  # type: ignore[attr-defined]
            log.info("client %s sent an unsupported protocol header %r", self.peer, received)
            self._linger()
        else:
            raise ConnectionError_(
                COMMAND_INVALID, f"unexpected {type(event).__name__} from a client"
            )

    def _add_channel(self, number: int) -> Channel:
        """A new channel of this connection: opened by the client, or moved here with
        the connection from another worker (`import_state`). Whatever every channel
        of this broker needs from its start is set up here, for both."""
        self.channels[number] = channel = Channel(self, number)
        if self.meta is not None:  # its metadata methods go through the writer
            self.meta.channel_opened(channel)
        return channel

    def _channel_exception(self, ch: Channel, exc: AMQPError | ModelError, index: int) -> None:
        """A channel handler raised: close the channel, or the connection for hard errors."""
        if isinstance(exc, ModelError):
            exc = amqp_error(exc)
        if not exc.class_id and index:
            exc.class_id, exc.method_id = index >> 16, index & 0xFFFF
        if isinstance(exc, ChannelError) and not exc.is_connection_error:
            ch.close_with_error(exc)
        else:
            raise exc

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state not in ("closing", "closed") and self.state != "header":
            if exc is not None:
                log.info("client %s closed the connection abruptly: %s", self.peer, exc)
            else:
                log.info("client %s closed the TCP connection without connection.close", self.peer)
        self.state = "closed"
        for queue in self.publisher_pause.close():
            queue.throttled.discard(self)
        for timer in self._timers:
            timer.cancel()
        if self._heartbeat_timer is not None:
            self._heartbeat_timer.cancel()
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        self._teardown()
        self.server.connections.discard(self)
        if self._counted:
            self._release_count(self.vhost.name if self.vhost is not None else None)
        if self in self.broker.connections:
            self.broker.connections.discard(self)
            self.vhost.stats.add(connection_counts(self))  # vhost totals never go back
            self.vhost.octets[0] += self.recv_oct
            self.vhost.octets[1] += self.send_oct

    def pause_writing(self) -> None:
        self._transport_paused = True
        self._set_writable(False)

    def resume_writing(self) -> None:
        self._transport_paused = False
        self._set_writable(self._out_bytes < OUTPUT_HIGH_WATER)

    # --- resource alarms ----------------------------------------------------

    def alarm_raised(self, reason: str) -> None:
        if self.state != "opened":
            return
        self.alarm_reason = reason
        if self.capabilities.get("connection.blocked") and not self._told_blocked:
            self._told_blocked = True
            self.send_method(0, cmd.Connection.Blocked(reason))

    def alarm_cleared(self) -> None:
        self.alarm_reason = None
        if self._told_blocked:
            self._told_blocked = False
            self.send_method(0, cmd.Connection.Unblocked())
        self.publisher_pause.end_alarm()

    def publishing_while_alarmed(self) -> None:
        """A publish arrived during an alarm: stop reading this connection (RabbitMQ's block)."""
        if not self.publisher_pause.alarm:
            log.info("connection %s blocked: %s", self.peer, self.alarm_reason)
            self.publisher_pause.start_alarm()

    # --- publisher flow control ---------------------------------------------

    def maybe_throttle(self, queue: Any) -> None:
        """Stop reading from this publisher until `queue`'s consumers catch up.

        A connection that consumes is never paused: its own acks may be what
        drains the queue.
        """
        pause = self.publisher_pause
        if pause.closed or queue in pause.flow:
            return
        if any(ch.consumers for ch in self.channels.values()):
            return
        queue.throttle(self)  # the queue calls resume_after_flow when it drains
        pause.start_flow(queue)

    def pause_for_disk(self) -> None:
        pause = self.publisher_pause
        if not pause.disk and not pause.closed and self.vhost is not None:
            self.vhost.hooks.wait_for_disk(self)  # calls resume_after_disk
            pause.start_disk()

    # broker.ports.Publisher and DiskWaiter: the model and the store resume us here.

    def resume_after_disk(self) -> None:
        self.publisher_pause.end_disk()

    def resume_after_flow(self, queue: Any) -> None:
        self.publisher_pause.end_flow(queue)

    def _pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self._last_recv = self.loop.time()  # silence while paused was ours, not theirs
            if not self.transport.is_closing():
                self.transport.resume_reading()

    # --- output -------------------------------------------------------------

    def confirms_due(self, channel: Channel) -> None:
        self._confirm_channels.add(channel)
        if self._flush_handle is None:
            self._flush_soon()

    def confirms_written(self, channel: Channel) -> None:
        """Queue the channel's ready confirms now, ahead of what comes next (its
        channel.close on an error), instead of at the end of the loop turn."""
        if channel in self._confirm_channels:
            self._confirm_channels.discard(channel)
            channel.flush_confirms()

    def forget_confirms(self, channel: Channel) -> None:
        """The channel is closed: its confirms not written yet are never sent."""
        self._confirm_channels.discard(channel)

    def _flush_confirms(self) -> None:
        channels = self._confirm_channels
        if channels:
            self._confirm_channels = set()
            for channel in channels:
                channel.flush_confirms()

    def _event_replicated(self, event: pc.Event) -> None:
        """A cluster leader: a method that changed definitions is answered (with all
        output after it) once the followers hold the change (leveret.cluster)."""
        tap = replica.TAP
        mark = tap.sql_position  # type: ignore[union-attr]
        self._event(event)
        if tap is not None and tap.sql_position != mark:
            self._hold = tap.sql_position

    def hold_output_until(self, change: asyncio.Future[Any]) -> None:
        """A worker of a leading cluster node: what this connection writes from now on
        (the answer a metadata change writes as it is applied here, delete-ok, and all
        output after it, in order) leaves only once `change` is done, which it is once
        the node's followers hold every worker's write for it."""
        self._held_changes.append(change)
        if not self._hold:
            self._hold = -1
        change.add_done_callback(self._held_change_done)

    def _held_change_done(self, change: asyncio.Future[Any]) -> None:
        if change in self._held_changes:
            self._held_changes.remove(change)
        if not self._held_changes and self.state != "closed":
            self._flush()

    def _hold_for_followers(self) -> bool:
        if self._held_changes:
            return True  # `_held_change_done` flushes
        tap = replica.TAP
        if tap is None or self._hold < 0 or tap.reached(self._hold):  # type: ignore[attr-defined]
            self._hold = 0
            return False
        if not self._hold_waiting:
            self._hold_waiting = True
            tap.when_safe(self._hold, self._hold_over)  # type: ignore[attr-defined]
        return True

    def _hold_over(self) -> None:
        self._hold_waiting = False
        self._flush()

    def _set_writable(self, writable: bool) -> None:
        if self.writable == writable:
            return
        self.writable = writable
        for channel in list(self.channels.values()):
            channel.update_deliverable()

    def send_method(self, channel: int, method: Any) -> None:
        self.write(wire.encode_method(method, channel))

    # --- handshake ----------------------------------------------------------

    def _handshake_timeout(self) -> None:
        if self.state in ("header", "start-ok", "tune-ok", "open") and self.transport:
            log.warning(
                "closing connection %s: handshake not finished within %.1f s",
                self.peer,
                self.config.handshake_timeout,
            )
            self.state = "closed"
            self.transport.close()

    def _connection_method(self, method: Any) -> None:
        """A method on channel 0 once the connection is open (the core did the handshake)."""
        if isinstance(method, cmd.Connection.UpdateSecret):
            self.send_method(0, cmd.Connection.UpdateSecretOk())
        elif isinstance(method, cmd.Connection.Blocked | cmd.Connection.Unblocked):
            pass  # informational from a client; nothing to do
        else:
            index = method.index
            raise ConnectionError_(
                COMMAND_INVALID,
                f"method {method.name} is not valid on channel 0",
                CLASS_CONNECTION,
                index & 0xFFFF,
            )

    def _on_login(self, event: pc.StartOkReceived) -> None:
        self.state = "start-ok"
        self.client_properties = event.client_properties
        caps = self.client_properties.get("capabilities") or {}
        self.capabilities = dict(caps) if isinstance(caps, dict) else {}
        mechanism = event.mechanism
        if mechanism == "EXTERNAL" and self.peer_cn is not None:
            self._login_external(self.peer_cn)
            return
        if self.direct is not None and self.direct["trusted"]:
            self.user, self.trusted, self.impersonator = "none", True, True
            self.state = "tune-ok"
            self.core.accept_login()
            return
        if mechanism not in MECHANISMS:
            log.warning("client %s asked for authentication mechanism %r", self.peer, mechanism)
            self._refuse_login(
                ConnectionError_(
                    ACCESS_REFUSED,
                    f"unsupported authentication mechanism '{mechanism}'; supported: "
                    + " ".join(MECHANISMS),
                )
            )
            return
        username = event.username
        user = None
        if username is not None:
            user = self.broker.access.authenticate(username, event.password or "")
        reason = "wrong password or unknown user"
        if user is not None and user.name in self.config.loopback_users and self.direct is None:
            host = self.peer.rpartition(":")[0]
            if not is_loopback(host):
                user, reason = None, f"user '{username}' can only connect via localhost"
        self.broker.counters.auth_attempt(user is not None)
        if user is None:
            log.warning(
                "authentication of user %r from %s failed (mechanism %s): %s",
                username,
                self.peer,
                mechanism,
                reason,
            )
            self._refuse_login(
                ConnectionError_(
                    ACCESS_REFUSED,
                    f"Login was refused using authentication mechanism {mechanism}. "
                    "For details see the broker logfile.",
                )
            )
            return
        self.user = username
        self.impersonator = user.is_impersonator
        self.state = "tune-ok"
        self.core.accept_login()

    def _login_external(self, cn: str) -> None:
        """SASL EXTERNAL: the verified certificate's CN names the user."""
        user = self.broker.access.users.get(cn)
        self.broker.counters.auth_attempt(user is not None)
        if user is None:
            log.warning(
                "EXTERNAL login from %s refused: no user '%s' (certificate CN)", self.peer, cn
            )
            self._refuse_login(
                ConnectionError_(
                    ACCESS_REFUSED,
                    "Login was refused using authentication mechanism EXTERNAL. "
                    "For details see the broker logfile.",
                )
            )
            return
        self.user = cn
        self.impersonator = user.is_impersonator
        self.state = "tune-ok"
        self.core.accept_login()

    def _refuse_login(self, exc: ConnectionError_) -> None:
        """End a failed login after a short delay, to slow password guessing; nothing
        more is read from the client meanwhile.

        A client that announced the `authentication_failure_close` capability gets
        the 403 connection.close; one that did not cannot expect a close method
        during the handshake and, as with RabbitMQ, just sees the socket close.
        """
        self.state = "start-ok"
        self.core.refuse_login()  # what the client sends meanwhile is ignored
        self._pause_reading()
        if self.capabilities.get("authentication_failure_close") is True:
            then: Callable[[], None] = partial(self.close_with_error, exc)
        else:
            then = self._drop_silently
        delay = self.config.auth_failure_delay
        if delay > 0:
            self._timers.append(self.loop.call_later(delay, then))
        else:
            then()

    def _drop_silently(self) -> None:
        """The refused client gets a FIN and no close method (what it sent during
        the delay is read and discarded meanwhile, so the close is no reset)."""
        self._linger()

    def _on_open(self, event: pc.OpenRequested) -> None:
        self.state = "open"
        name = event.virtual_host
        vhost = self.broker.vhosts.get(name)
        if vhost is None:
            raise ConnectionError_(NOT_ALLOWED, f"vhost {name} not found", 10, 40)
        user = self.user or ""
        counts = self.broker.limit_counts
        if counts is not None and counts.index != 0:
            # A worker other than 0 of several: worker 0 holds the broker's counts.
            self._counted = True
            if counts.limited(name, user):
                self._meta_busy = True  # later events wait (_until_recovered)
                counts.admit(name, user).add_done_callback(partial(self._admitted, vhost))
                return
            counts.opened(name, user)
            self._open_allowed(vhost)
            return
        # RabbitMQ's order: the vhost's limit, the user's limit, then permissions.
        limit = vhost.limits.get("max-connections")
        if limit is not None and self._open_count(vhost=name) >= limit:
            raise _limit_reached("vhost", limit, name, user)
        account = self.broker.access.users.get(user)
        limit = account.limit("max-connections") if account is not None else None
        if limit is not None and self._open_count(user=user) >= limit:
            raise _limit_reached("user", limit, name, user)
        self._open_allowed(vhost)

    def _open_count(self, *, vhost: str | None = None, user: str | None = None) -> int:
        """Open connections of a vhost or user: this process's, and on worker 0 of
        several those the other workers hold too (workers/limits.py)."""
        n = len(self.broker.connections_of(vhost=vhost, user=user))
        counts = self.broker.limit_counts
        if counts is not None:
            n += counts.remote(("v", vhost) if vhost is not None else ("u", user or ""))
        return n

    def _admitted(self, vhost: Vhost, answer: asyncio.Future[Any]) -> None:
        """Worker 0's answer to a connection's limits (a worker other than 0)."""
        self._meta_busy = False
        refused = None if answer.cancelled() or answer.exception() else answer.result()
        if self.state != "open":  # the client went away meanwhile
            self._counted = False
            counts = self.broker.limit_counts
            if refused is None and counts is not None:  # worker 0 counted it
                counts.closed(vhost.name, self.user or "")
            self._held = None
            return
        try:
            if refused is not None:
                self._release_count(None)  # not counted by worker 0
                raise _limit_reached(refused[0], refused[1], vhost.name, self.user or "")
            self._open_allowed(vhost)
        except AMQPError as exc:
            self.close_with_error(exc)
            self._held = None
            return
        held, self._held = self._held, None
        if held is not None and self.state == "opened":
            self.publisher_pause.end_recovery()
            self._received(self._until_recovered(_replay(*held)))
        elif self._out:
            self._flush()

    def _release_count(self, vhost: str | None) -> None:
        """A worker other than 0: this connection no longer counts on worker 0."""
        if not self._counted:
            return
        self._counted = False
        channels, self.channels_counted = self.channels_counted, 0
        counts = self.broker.limit_counts
        if vhost is not None and counts is not None:
            counts.closed(vhost, self.user or "", channels)

    # --- a user's channels counted on worker 0 (a worker other than 0 of several) ----

    def _count_channel(self, event: pc.Event, events: Iterator[pc.Event]) -> bool:
        """A channel.open on a worker other than 0: when its user has max-channels,
        hold it (its open-ok is still the core's, unsent, while `events` is suspended)
        until worker 0 admits it; True when held."""
        if event is self._channel_admitted:  # (seen again by each gate it passes)
            return False
        counts = self.broker.limit_counts
        user = self.user or ""
        if counts.channel_limited(user):
            self._held = (event, events)
            self._meta_busy = True
            self.publisher_pause.start_recovery()
            answer = counts.admit_channel(user)
            answer.add_done_callback(partial(self._channel_answer, event))
            return True
        self.channels_counted += 1
        counts.channels(user, 1)
        return False

    def _channel_answer(self, event: pc.Event, answer: asyncio.Future[Any]) -> None:
        self._meta_busy = False
        refused = None if answer.cancelled() or answer.exception() else answer.result()
        if refused is None:
            self.channels_counted += 1  # worker 0 counted it (or is down: reported later)
        held, self._held = self._held, None
        if self.state != "opened":
            return
        if refused is not None:
            # As the one-process guard: a connection error, and no open-ok.
            self.core._deferred.clear()
            if held is not None:
                held[1].close()  # type: ignore[attr-defined]
            self.close_with_error(
                ConnectionError_(
                    NOT_ALLOWED,
                    f"number of channels opened for user '{self.user}' has reached the "
                    f"maximum allowed user limit of ({refused})",
                )
            )
            return
        if held is not None:
            self._channel_admitted = event
            self.publisher_pause.end_recovery()
            self._received(self._until_recovered(_replay(*held)))

    def _channel_gone(self) -> None:
        if self.channels_counted > 0:
            self.channels_counted -= 1
            self.broker.limit_counts.channels(self.user or "", -1)

    def _open_allowed(self, vhost: Vhost) -> None:
        """connection.open past the limits: permissions, then open-ok."""
        name = vhost.name
        user = self.user or ""
        if not self.trusted and self.broker.access.permission(user, name) is None:
            self._release_count(name)
            raise ConnectionError_(
                NOT_ALLOWED, f"access to vhost '{name}' refused for user '{user}'", 10, 40
            )
        self.vhost = vhost
        self.access_changed()
        self.broker.connections.add(self)
        self.broker.connections_opened += 1
        self.state = "opened"
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        self.core.accept_open()
        alarms = self.server.alarms
        if alarms is not None and alarms.blocking:
            self.alarm_raised(alarms.reason)
        if self.heartbeat:
            self._tick_due = self.loop.time() + self.heartbeat / 2
            self._heartbeat_timer = self.loop.call_later(self.heartbeat / 2, self._heartbeat_tick)
        log.info("connection %s opened: user '%s', vhost '%s'", self.peer, self.user, vhost.name)

    # --- heartbeats ---------------------------------------------------------

    def _heartbeat_tick(self) -> None:
        if self.state not in ("opened", "closing") or self.transport is None:
            return
        now = self.loop.time()
        if self._reading_paused:
            self._last_recv = now  # we are not reading, so we cannot hear heartbeats
        late = now - self._tick_due > self.heartbeat / 2
        self._tick_due = now + self.heartbeat / 2
        if late:
            # The loop itself stalled (a long fsync, GC, a burst of work): the
            # client's frames may be sitting unread in the socket.  Judge only
            # after the loop has had a turn to read them.
            self._last_recv = max(self._last_recv, now - self.heartbeat)
        if now - self._last_recv > 2 * self.heartbeat:
            log.warning("missed heartbeats from client %s, timeout: %ds", self.peer, self.heartbeat)
            self.state = "closed"
            self.transport.abort()
            return
        if now - self._last_send >= self.heartbeat / 2:
            self.write(HEARTBEAT_FRAME)
        self._heartbeat_timer = self.loop.call_later(self.heartbeat / 2, self._heartbeat_tick)

    # --- channels -----------------------------------------------------------

    def close_channel(self, ch: Channel, exc: AMQPError) -> None:
        """Channel exception: channel.close with the error; frames until close-ok are dropped."""
        self.log_channel_error(ch.number, exc)
        self.core.close_channel_with_error(ch.number, exc)
        if self._flush_handle is None:
            self._flush_soon()

    def log_channel_error(self, number: int, exc: AMQPError) -> None:
        log.info(
            "channel error on connection %s, channel %d: %s", self.peer, number, exc.reply_text
        )

    # --- closing ------------------------------------------------------------

    def _protocol_error(self, exc: AMQPError, drop: bool) -> None:
        """The core found the client's bytes broken and queued connection.close."""
        log.warning("closing connection %s: %s", self.peer, exc.reply_text)
        handshake_done = self.state == "opened"
        # The core queued connection.close already: confirms not yet written stay
        # unsent (teardown forgets them), since nothing may follow the close.
        self._teardown()
        self._flush()
        self.state = "closing"
        if drop or not handshake_done:
            self._linger()
        else:
            self._timers.append(self.loop.call_later(CLOSE_OK_TIMEOUT, self._linger))

    def close_with_error(self, exc: AMQPError, drop: bool = False) -> None:
        """Connection exception: send connection.close; `drop` when the stream is unusable."""
        if self.state in ("closing", "closed"):
            return
        log.warning("closing connection %s: %s", self.peer, exc.reply_text)
        self.close(exc.code, exc.reply_text, exc.class_id, exc.method_id)
        if drop or self.state == "header":
            self._linger()

    def close(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        """Start the server side of the close handshake."""
        if self.state in ("closing", "closed") or self.transport is None:
            return
        handshake_done = self.state == "opened"
        self.state = "closing"
        self._flush_confirms()  # ready confirms go out before connection.close
        self.core.close(code, text, class_id, method_id)
        self._flush()
        self._teardown()
        if handshake_done:
            self._timers.append(self.loop.call_later(CLOSE_OK_TIMEOUT, self._linger))
        else:
            self._linger()

    def force_close(self, reason: str = "shutdown", text: str | None = None) -> None:
        self.close(
            CONNECTION_FORCED,
            text or f"CONNECTION_FORCED - broker forced connection closure with reason '{reason}'",
        )

    def stats_sample(self, seconds: float) -> None:
        """The stats sampler's tick (broker.stats.Sampler): rates of this connection."""
        for channel in self.channels.values():
            channel.stats.sample(seconds)
        self.stats_rates, self._stats_last = rates_between(
            self._stats_last, connection_counts(self), seconds
        )
        octets = (self.recv_oct, self.send_oct)
        last, self._octets_last = self._octets_last, octets
        if seconds > 0:
            self.octet_rates = ((octets[0] - last[0]) / seconds, (octets[1] - last[1]) / seconds)

    def access_changed(self) -> None:
        """Look up this user's permissions and tags again (they were changed)."""
        if self.trusted:
            return  # no guard: RabbitMQ's direct user "none" may do anything
        access = self.broker.access
        user = self.user or ""
        perm = access.permission(user, self.vhost.name)
        topics = access.topics(user, self.vhost.name)
        self.guard = Guard(user, self.vhost, perm, topics) if Guard.needed(perm, topics) else None
        account = access.users.get(user)
        self.impersonator = account is not None and account.is_impersonator
        limited = account is not None and account.limit("max-channels") is not None
        if self._counted:  # a worker other than 0: worker 0 admits (_until_recovered)
            limited = False
        self.core.channel_guard = self._check_channel_limit if limited else None

    def _check_channel_limit(self, number: int) -> None:
        """Before channel.open-ok: the user's max-channels, over all their connections
        (a connection error, as RabbitMQ's)."""
        account = self.broker.access.users.get(self.user or "")
        limit = account.limit("max-channels") if account is not None else None
        if limit is None:
            return
        open_now = sum(len(c.channels) for c in self.broker.connections_of(user=self.user))
        counts = self.broker.limit_counts
        if counts is not None:  # worker 0 of several: the other workers' channels too
            open_now += counts.remote(("c", self.user or ""))
        if open_now >= limit:
            raise ConnectionError_(
                NOT_ALLOWED,
                f"number of channels opened for user '{self.user}' has reached the "
                f"maximum allowed user limit of ({limit})",
            )

    def _linger(self) -> None:
        """End the connection without a TCP reset.

        Sends what is buffered and a FIN, then keeps reading (and discarding, as
        state "closed" makes data_received do) until the client's FIN, when
        eof_received lets the transport close, or LINGER_TIMEOUT.  A client may
        legally go on writing after its connection.close (amqplib does, for
        publishes buffered on other channels); closing the socket on unread data
        would reset the connection and lose the close-ok it is waiting for.
        """
        transport = self.transport
        if transport is None or self.state == "closed":
            return
        self._flush()
        self.state = "closed"
        if transport.is_closing():
            return
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        if transport.can_write_eof():
            try:
                transport.write_eof()
            except OSError:  # the client is gone already (a reset while we waited)
                transport.close()
                return
        timer = self.loop.call_later(LINGER_TIMEOUT, transport.close)
        self._timers.append(timer)

    def eof_received(self) -> bool:
        """The client's FIN: let asyncio close the transport (after our buffered writes)."""
        return False

    def _teardown(self) -> None:
        """Requeue unacked messages, drop consumers and exclusive queues. Idempotent."""
        channels = list(self.channels.values())
        self.channels.clear()
        if self._counted and self.channels_counted:  # (worker 0 counts them no more)
            self.broker.limit_counts.channels(self.user or "", -self.channels_counted)
            self.channels_counted = 0
        for channel in channels:
            channel.cleanup()
        if self.exclusive_queues:
            queues = list(self.exclusive_queues)
            self.exclusive_queues.clear()
            for queue in queues:
                queue.vhost.delete_queue(queue)
