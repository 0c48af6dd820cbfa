"""Connection affinity: a client connection moves to the worker that owns its queues.

Most applications use one connection per queue. When the kernel gives such a
connection to a worker that does not own the queue, each of its messages would
cross a worker link twice (publish to the owner, deliver back). Instead, at the
connection's first method that names a queue, the worker that reads it decides
once where the connection belongs:

- the method names no queue yet (channel.open, basic.qos, confirm.select,
  exchange.declare): no decision, look at the next one;
- a queue.declare/bind/unbind/purge/delete, basic.consume or basic.get naming a
  queue, or a basic.publish to the default exchange with a routing key: the
  queue's owner (a `RemoteQueue`'s `worker`, or the placement by name for a queue
  not declared yet); an exclusive or server-named queue: here;
- a basic.publish to a named exchange: where the queues it reaches live
  (`routed_owner`, the routing the publish gets, done just before it; bindings
  are on every worker). None reached: no decision yet. All on one other worker:
  that worker, but only after the publish: the connection handles it here (its
  confirm too) and moves at a later event, once nothing holds it (`Following`).
  Queues here, on several workers, or a publish routed in a way this does not
  follow (CC/BCC, a delayed exchange): here;
- the owner is another worker, and the connection holds nothing that cannot move
  (`cannot_move`): hand it over. Otherwise it stays, and the link between the
  workers serves it.

Handing over stops reading the connection, takes the bytes read but not handled
(the method that decided, encoded again, in front of the rest), and sends the
socket with the connection's state (`AMQPConnection.export_state`) to the owner
over this pair of workers' handoff channel (`Handoffs`, SCM_RIGHTS, handoff.py).
The owner builds the connection from that state, with no handshake, handles the
bytes, then reads the socket (`Server.adopt`). The client sees nothing.

After a publish decided, the connection moves at the first later method or publish
at which `cannot_move` lets it, unless that event names a queue elsewhere or its
publish reaches queues elsewhere (then it stays); after `FOLLOW_TRIES` such events
that could not move (a producer that always has confirms outstanding) it stays.
What was handled before the move stays handled here: nothing is sent twice, and
the move waits until every confirm was sent, so the client's order holds.

The decision runs on the read path's gate (`AMQPConnection._gated`, the check a
read makes while the broker recovers), so it costs a connection nothing once it
is made, and nothing at all on a one-process broker (no `Handoffs`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from leveret.broker.message import Message
from leveret.broker.queues.base import Queue
from leveret.broker.queues.remote import RemoteQueue
from leveret.protocol import connection as pc
from leveret.protocol import methods as wire
from leveret.protocol.constants import (
    BASIC_CONSUME,
    BASIC_GET,
    QUEUE_BIND,
    QUEUE_DECLARE,
    QUEUE_DELETE,
    QUEUE_PURGE,
    QUEUE_UNBIND,
)
from leveret.protocol.frames import body_frames, header_frame
from leveret.protocol.properties import publish_flags
from leveret.workers.handoff import HandoffError, receive_connections, send_connection

if TYPE_CHECKING:
    from leveret.workers.mesh import Mesh

log = logging.getLogger("leveret.workers")

#: the decision "this connection stays where it is" (any worker index is >= 0)
STAY = -1

#: the methods whose `queue` field names the queue a connection uses
_QUEUE_METHODS = frozenset(
    {QUEUE_DECLARE, QUEUE_BIND, QUEUE_UNBIND, QUEUE_PURGE, QUEUE_DELETE, BASIC_CONSUME, BASIC_GET}
)
_REPLY_TO = "amq.rabbitmq.reply-to"

#: how many later events a connection whose publish decided tries to move at before
#: it stays (each one it could not move at: confirms outstanding, output unwritten)
FOLLOW_TRIES = 16

#: how long a handoff may wait for room on its channel before the connection stays
SEND_TIMEOUT = 2.0
#: a connection with more unhandled input than this stays (its first read was a
#: burst of publishes: the link serves it, and the handoff stays a small message)
MAX_INPUT = 1 << 20


def queue_owner(mesh: Mesh, vhost: Any, name: str) -> int:
    """The worker that owns (or will own, once declared) queue `name` of `vhost`."""
    queue = vhost.queues.get(name)
    if queue is None:
        return mesh.owner_of(vhost.name, name)
    if isinstance(queue, RemoteQueue):
        return queue.worker
    return mesh.index


def target(mesh: Mesh, vhost: Any, event: pc.Event) -> int | None:
    """Where `event` says its connection belongs: a worker index, STAY, or None when
    the event names no queue (decide at a later one)."""
    kind = type(event)
    if kind is pc.MethodReceived:
        method = event.method  # type: ignore[attr-defined]
        index = method.index
        if index not in _QUEUE_METHODS:
            return None
        name = method.queue
        if not name or (index == QUEUE_DECLARE and method.exclusive):
            return STAY  # server-named and exclusive queues live on their connection's worker
        if name.startswith(_REPLY_TO):
            return STAY  # direct reply-to: the pseudo-queue of this connection
    elif kind is pc.Publish:
        if event.exchange:  # type: ignore[attr-defined]
            return routed_owner(mesh, vhost, event)
        name = event.routing_key  # type: ignore[attr-defined]
        if not name or name.startswith(_REPLY_TO):
            return STAY
    else:
        return None
    return queue_owner(mesh, vhost, name)


def routed_owner(mesh: Mesh, vhost: Any, event: Any) -> int | None:
    """Where the queues publish `event` (to a named exchange) reaches live: a worker
    index when they are all on that one, STAY when they are on several or the publish
    is routed in a way not followed here, None when it reaches none (or will fail: no
    such exchange), so a later event decides. The routing is the one the publish gets
    when it is handled right after this: same bindings, no await in between."""
    exchange = vhost.exchanges.get(event.exchange)
    if exchange is None or exchange.internal:
        return None
    header = event.header
    if b"\x02CC" in header or b"\x03BCC" in header:
        return STAY  # extra routing keys: not followed, the connection stays
    flags = publish_flags(header)
    message = Message(
        exchange.name, event.routing_key, header, event.body, flags >> 8, flags & 0xFF == 2
    )
    owner = None
    for queue in vhost.route(exchange, message):
        if isinstance(queue, RemoteQueue):
            worker = queue.worker
        elif isinstance(queue, Queue):
            worker = mesh.index
        else:
            return STAY  # a delayed exchange's store: its messages are routed later
        if owner is None:
            owner = worker
        elif owner != worker:
            return STAY
    return owner


class Following:
    """A connection whose publish to a named exchange reached queues of one other
    worker only (`peer`): it moves at a later event (`AMQPConnection._affinity_decide`)
    once it can, within `tries` events."""

    __slots__ = ("peer", "tries")

    def __init__(self, peer: int) -> None:
        self.peer = peer
        self.tries = FOLLOW_TRIES


def encode_event(event: pc.Event, frame_max: int) -> bytes:
    """The frames of a method (or publish with its content) the core parsed: the
    decision takes them from the stream, and the receiver must read them first,
    exactly as the client sent them."""
    number = event.channel  # type: ignore[attr-defined]
    if type(event) is pc.Publish:
        e: Any = event
        parts = [
            wire.encode_publish(number, e.exchange, e.routing_key, e.mandatory, e.immediate),
            header_frame(number, e.header),
            *body_frames(number, e.body, frame_max),
        ]
        return b"".join(parts)
    # as the client sent it: the receiver decodes the same field-table value types
    return wire.encode_method_as_received(event.method, number)  # type: ignore[attr-defined]


def cannot_move(conn: Any, event: pc.Event) -> str | None:
    """Why connection `conn` (an AMQPConnection whose events stopped at `event`) must
    stay where it is; None when its whole state can go to another worker."""
    transport = conn.transport
    if transport is None or conn.state != "opened":
        return "not open"
    if transport.get_extra_info("ssl_object") is not None:
        return "TLS (its session keys are this process's)"
    if conn.direct is not None:
        return "an internal connection"
    if conn.exclusive_queues:
        return "it has exclusive queues"
    if conn._reading_paused:
        return "reading is paused (flow control or an alarm)"
    if conn.alarm_reason is not None or conn._told_blocked:
        return "a resource alarm blocks it (the other worker's alarms are its own)"
    if conn._out or transport.get_write_buffer_size():
        return "output not written yet"
    events = conn.core._events
    if not events or events[-1] is not event:
        return "more events came from the same frame"
    try:
        conn.core.export_state()
    except ValueError as exc:
        return str(exc)
    if set(conn.core._channels) != set(conn.channels):
        return "a channel is between states"
    for channel in conn.channels.values():
        reason = channel.cannot_move()
        if reason is not None:
            return reason
    return None


class Handoffs:
    """This worker's handoff channels, one AF_UNIX socket pair per other worker (made
    by the supervisor with the mesh's, so a restarted worker gets new ones): send a
    connection to a peer, and adopt the ones peers send (`adopt(sock, state)`)."""

    # The decision's parts, reached through the instance the listener holds, so that
    # server/ (the connection) never imports this package (workers/ builds on it).
    STAY = STAY
    MAX_INPUT = MAX_INPUT
    Following = Following
    target = staticmethod(target)
    cannot_move = staticmethod(cannot_move)
    encode_event = staticmethod(encode_event)

    def __init__(self, mesh: Mesh, adopt: Callable[[socket.socket, bytes], None]) -> None:
        self.mesh = mesh
        self.adopt = adopt
        self._senders: dict[int, socket.socket] = {}
        self._readers: dict[int, asyncio.Task[None]] = {}
        self._channels: dict[int, socket.socket] = {}
        self.sent = 0
        self.received = 0

    def attach(self, peer: int, sock: socket.socket) -> None:
        """Use `sock` as the handoff channel with `peer` (replacing an older one)."""
        self.detach(peer)
        # Sending has its own socket object (same file) with a timeout: the loop's
        # reader keeps the channel's other object non-blocking.
        sender = socket.socket(fileno=os.dup(sock.fileno()))
        sender.settimeout(SEND_TIMEOUT)
        self._channels[peer] = sock
        self._senders[peer] = sender
        task = asyncio.get_running_loop().create_task(receive_connections(sock, self._adopt))
        self._readers[peer] = task
        task.add_done_callback(lambda t: self._reader_done(peer, t))

    def _adopt(self, sock: socket.socket, state: bytes) -> None:
        self.received += 1
        self.adopt(sock, state)

    def _reader_done(self, peer: int, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.warning("handoff channel from worker %d broke: %s", peer, exc)
        if self._readers.get(peer) is task:
            self.detach(peer)

    def detach(self, peer: int) -> None:
        sender = self._senders.pop(peer, None)
        if sender is not None:
            sender.close()
        sock = self._channels.pop(peer, None)
        task = self._readers.pop(peer, None)
        if task is not None and not task.done():
            task.cancel()  # its reader leaves the loop first, then the socket closes
            if sock is not None:
                task.add_done_callback(lambda _task: sock.close())
        elif sock is not None:
            sock.close()

    def can_send(self, peer: int) -> bool:
        return peer in self._senders and peer in self.mesh.peers

    def send(self, peer: int, conn: Any, state: bytes) -> None:
        """Give `conn` (a socket or transport socket) and `state` to `peer`. Raises
        OSError or HandoffError when it could not, and then the channel is closed
        (a handoff cut in the middle leaves nothing the peer could read after it)."""
        sender = self._senders.get(peer)
        if sender is None:
            raise HandoffError(f"no handoff channel to worker {peer}")
        try:
            send_connection(sender, conn, state)
        except (OSError, ValueError) as exc:
            self.detach(peer)
            raise HandoffError(f"handoff to worker {peer} failed: {exc}") from exc
        self.sent += 1

    def close(self) -> None:
        for peer in list(self._senders):
            self.detach(peer)
