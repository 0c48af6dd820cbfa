"""The owner's side of messages crossing between workers: what this worker does for
the others with the queues it owns (leveret.workers.crossing is the other side).

- PUBLISH: the message goes into the record's queues as a local publish would put
  it (one WriteBarrier for all of them, the store writing a persistent body once
  for a durable fan-out); once they hold it (durably, for a persistent message in
  a durable queue) the sender gets a CONFIRM for the record's number, or a NACK
  (flag REFUSED when x-overflow=reject-publish turned it away). A queue that is
  gone meanwhile is skipped, as a local publish routed to a queue deleted at that
  moment would be.
- "consume": a consumer on the queue whose channel is a `LinkedChannel`: its
  deliveries go to the consumer's worker as DELIVER records, numbered per worker,
  and wait there for ACK or REJECT records as a local channel's deliveries wait
  for basic.ack. The queue's own dispatch (round-robin, priorities, single active
  consumer, prefetch) treats it as any other consumer.
- CREDIT: the consumer's channel stopped taking deliveries (0: channel.flow, a client
  that does not read) or takes them again (1); the queue holds its messages meanwhile.
- "cancel": the consumer goes; with `requeue` (its channel closed) what it had not
  acked goes back to the queue, redelivered.
- "get", "purge", "queue_counts": basic.get, queue.purge, and the counts that
  queue.declare-ok and queue.delete-ok give.
- A worker that goes away: its consumers go, and every delivery it had not acked
  (basic.get ones too) is requeued, as when a client connection drops.

Delivery ids start from the clock at each start of the worker, so an ack of a
delivery made before a restart matches nothing after it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from leveret.broker.consumer import Consumer
from leveret.broker.durability import WriteBarrier
from leveret.broker.errors import NotFound
from leveret.server.channel import check_consume
from leveret.workers import link as records
from leveret.workers.crossing import REFUSED
from leveret.workers.mesh import Mesh
from leveret.workers.messages import decode, encode, remember

if TYPE_CHECKING:
    from leveret.broker.broker import Broker
    from leveret.broker.queues.base import Queue, QueueEntry
    from leveret.broker.vhost import VirtualHost

log = logging.getLogger("leveret.workers")


class LinkedChannel:
    """The channel of a consumer whose client is on another worker
    (broker.ports.DeliveryChannel): deliveries become DELIVER records.

    `deliverable` is a plain attribute, read by the queue's dispatch for every
    delivery; a consumer of a channel with a global prefetch is a `CreditChannel`."""

    __slots__ = (
        "serving",
        "peer",
        "ref",
        "deliverable",
        "global_prefetch",
        "unacked_count",
        "credit_out",
        "credit",
        "asked",
    )

    def __init__(self, serving: Serving, peer: int, ref: int, global_prefetch: int) -> None:
        self.serving = serving
        self.peer = peer
        self.ref = ref
        self.unacked_count = 0
        self.credit_out = 0
        self.asked = False
        self.credit: int | None = None
        self.deliverable = True
        self.global_prefetch = global_prefetch

    def deliver(self, consumer: Consumer, queue: Queue, entry: QueueEntry) -> None:
        """The queue's delivery to this consumer: a DELIVER record (the owner keeps
        the delivery until its ACK or REJECT). Here rather than a call to `Serving`:
        every message a consumer on another worker takes comes this way."""
        serving = self.serving
        serving._next_delivery += 1
        delivery = serving._next_delivery
        if self.credit is not None:
            self.credit -= 1
            if self.credit <= 0:
                self.deliverable = False
            elif not queue.ready:
                serving.return_credit(self)  # nothing more to use it on
        stats = queue.stats
        if entry.redelivered:
            stats.redeliver += 1
        if consumer.no_ack:
            stats.deliver_no_ack += 1
            queue.removed(entry)
        else:
            stats.deliver += 1
            out = serving._out.get(self.peer)
            if out is None:
                out = serving._out[self.peer] = {}
            out[delivery] = (queue, entry, consumer)
            consumer.unacked += 1
            self.unacked_count += 1
        message = entry.message
        body = None
        if message.body is None or entry.location is not None:
            body = queue.delivery_body(entry)  # paged out, or durable: the store's part
        link = serving.mesh.links.get(self.peer)
        if link is None or link.closed:
            return  # the worker is gone: _peer_lost requeues what it had
        link.deliver(
            self.ref,
            delivery,
            records.REDELIVERED if entry.redelivered else 0,
            encode(message, body),
        )

    def on_consumer_cancelled_by_broker(self, consumer: Consumer) -> None:
        """The queue was deleted: the consumer's worker tells its client."""
        self.serving.cancelled(self, consumer)


class CreditChannel(LinkedChannel):
    """A `LinkedChannel` whose client's channel has basic.qos global=true: its worker
    keeps the window across all the channel's consumers and grants this one credit
    (CREDIT n: n more deliveries) from what is left of it."""

    __slots__ = ("_deliverable",)

    def __init__(self, serving: Serving, peer: int, ref: int) -> None:
        super().__init__(serving, peer, ref, 0)
        self.credit = 0
        self.deliverable = False

    @property  # type: ignore[override]
    def deliverable(self) -> bool:
        """Whether the consumer takes a delivery now. A credit-granted consumer without
        credit that the queue offers one asks its channel's worker for credit, once."""
        if self._deliverable:
            return True
        if self.credit == 0 and not self.asked:
            self.asked = True
            self.serving.credit_back(self, 0)
        return False

    @deliverable.setter
    def deliverable(self, value: bool) -> None:
        self._deliverable = value


class _PeerPublishers:
    """The publishers of the worker `peer`, as a queue that paused them sees them
    (broker.ports.Publisher): one object per worker."""

    __slots__ = ("serving", "peer")

    def __init__(self, serving: Serving, peer: int) -> None:
        self.serving = serving
        self.peer = peer

    def resume_after_flow(self, queue: Any) -> None:
        mesh = self.serving.mesh
        if self.peer in mesh.peers:
            mesh.call(self.peer, "behind", queue.vhost.name, queue.name, False).add_done_callback(
                _ignore
            )


class _Confirm:
    """A PUBLISH record's barrier callback: CONFIRM or NACK to its sender."""

    __slots__ = ("serving", "peer", "seq", "refused")

    def __init__(self, serving: Serving, peer: int, seq: int) -> None:
        self.serving = serving
        self.peer = peer
        self.seq = seq
        self.refused = False

    def __call__(self, error: BaseException | None) -> None:
        self.serving._confirm(self.peer, self.seq, error, self.refused)


class Serving:
    """The queues this worker owns, served to the other workers."""

    def __init__(self, broker: Broker, mesh: Mesh) -> None:
        self.broker = broker
        self.mesh = mesh
        self._next_delivery = time.time_ns()
        # peer -> delivery id -> (queue, entry, consumer; None for basic.get)
        self._out: dict[int, dict[int, tuple[Any, Any, Consumer | None]]] = {}
        self._consumers: dict[tuple[int, int], Consumer] = {}  # (peer, ref) -> consumer
        self._publishers: dict[int, _PeerPublishers] = {}
        mesh.on(records.PUBLISH, self._on_publish)
        mesh.on(records.ACK, self._on_ack)
        mesh.on(records.REJECT, self._on_reject)
        mesh.on(records.CREDIT, self._on_credit)
        mesh.serve("consume", self._consume)
        mesh.serve("cancel", self._cancel)
        mesh.serve("get", self._get)
        mesh.serve("purge", self._purge)
        mesh.serve("queue_counts", self._queue_counts)
        mesh.peer_lost.append(self._peer_lost)

    # --- lookups ------------------------------------------------------------------------

    def _vhost(self, name: str) -> VirtualHost:
        vhost = self.broker.vhosts.get(name)
        if vhost is None:
            raise NotFound(f"no vhost '{name}'")
        return vhost

    def _queue(self, vhost: str, name: str) -> Any:
        """The queue this worker owns; NotFound as basic.consume answers one missing."""
        queue = self._vhost(vhost).queues.get(name)
        if queue is None or queue.remote:
            raise NotFound(f"no queue '{name}' in vhost '{vhost}'")
        return queue

    # --- publishing -----------------------------------------------------------------------

    def _on_publish(self, peer: int, record: records.Publish) -> None:
        vhost = self.broker.vhosts.get(record.vhost)
        queues = []
        if vhost is not None:
            for name in record.queues:
                queue = vhost.queues.get(name)
                if queue is not None and not queue.remote:
                    queues.append(queue)
        seq = record.seq
        if not queues:
            if seq:
                self._confirm(peer, seq, None, False)  # routed to nothing left: confirmed
            return
        assert vhost is not None
        data = record.message
        message = decode(data)
        remember(message, data)  # a delivery as it is enqueued sends these bytes back
        stored = message.persistent
        if seq and not stored and vhost.persisting:
            # (A loop, not any() over a generator: asked for every confirmed transient
            # message, and `persisting` counts the other workers' queues too.)
            for queue in queues:
                if queue.persists_all:
                    stored = True
                    break
        if not seq or not stored:
            # As a local publish: no barrier for a transient message (it is the queue's
            # once enqueued), so no object a message to make here either.
            refused = False
            for queue in queues:
                if not queue.enqueue(message):
                    refused = True
                if queue.consumers_behind():
                    self._behind(peer, queue)
            if seq:
                self._confirm(peer, seq, None, refused)
            return
        confirm = _Confirm(self, peer, seq)
        barrier = WriteBarrier(confirm)
        hooks = vhost.hooks
        shared = len(queues) > 1 and hooks.share_body(message, queues, barrier)
        try:
            for queue in queues:
                if not queue.enqueue(message, barrier):
                    confirm.refused = True
                if queue.consumers_behind():
                    self._behind(peer, queue)
        finally:
            if shared:
                hooks.share_done()
        barrier.seal()

    def _behind(self, peer: int, queue: Any) -> None:
        """`queue`'s consumers are far behind: the worker `peer` pauses its publishers
        into it, as a local publisher pauses (server/publisher_pause.py), until the
        queue drains (it calls the peer's `_PeerPublishers.resume_after_flow`)."""
        publishers = self._publishers.get(peer)
        if publishers is None:
            publishers = self._publishers[peer] = _PeerPublishers(self, peer)
        if publishers in queue.throttled:
            return
        queue.throttle(publishers)
        if peer in self.mesh.peers:
            self.mesh.call(peer, "behind", queue.vhost.name, queue.name, True).add_done_callback(
                _ignore
            )

    def _confirm(self, peer: int, seq: int, error: BaseException | None, refused: bool) -> None:
        """CONFIRM (or NACK) the sender's publish `seq`; a loop turn's join into runs."""
        link = self.mesh.links.get(peer)
        if link is None or link.closed:
            return
        if error is not None:
            log.error("message from worker %d not stored, nacking: %s", peer, error)
            link.settle_open(records.NACK, 0, seq)
        elif refused:
            link.settle_open(records.NACK, 0, seq, REFUSED)
        else:
            link.settle_open(records.CONFIRM, 0, seq)

    # --- deliveries -----------------------------------------------------------------------

    def _settled(self, peer: int, record: records.Settle) -> list[tuple[Any, Any, Any]]:
        out = self._out.get(peer)
        if not out:
            return []
        taken = []
        for delivery in record.ids():
            item = out.pop(delivery, None)
            if item is None:
                continue  # requeued already (its consumer's channel closed) or stale
            consumer = item[2]
            if consumer is not None:
                consumer.unacked -= 1
                consumer.channel.unacked_count -= 1
            taken.append(item)
        return taken

    def _on_ack(self, peer: int, record: records.Settle) -> None:
        """Acks, one per delivery of a consumer's stream: `_settled`'s bookkeeping and
        the queue's settle in one pass over the record's runs."""
        out = self._out.get(peer)
        if not out:
            return
        pop = out.pop
        touched = set()
        for first, count in record.runs:
            for delivery in range(first, first + count):
                item = pop(delivery, None)
                if item is None:
                    continue  # requeued already (its consumer's channel closed) or stale
                queue, entry, consumer = item
                if consumer is not None:
                    consumer.unacked -= 1
                    consumer.channel.unacked_count -= 1
                queue.stats.ack += 1
                queue.settle(entry)
                touched.add(queue)
        _redispatch(touched)

    def _on_reject(self, peer: int, record: records.Settle) -> None:
        taken = self._settled(peer, record)
        if record.flags & records.REQUEUE:
            # A closed channel's returns go back as the queue takes those (CLOSING).
            _requeue(taken, closing=bool(record.flags & records.CLOSING))
            return
        touched = set()
        for queue, entry, _consumer in taken:
            queue.reject(entry)
            touched.add(queue)
        _redispatch(touched)

    def _on_credit(self, peer: int, record: records.Credit) -> None:
        """The consumer's channel stopped taking deliveries (0) or takes them again."""
        consumer = self._consumers.get((peer, record.ref))
        if consumer is None:
            return
        channel: Any = consumer.channel
        if channel.credit is not None:  # a grant of n more deliveries
            channel.credit += record.credit
            channel.asked = False
            channel.deliverable = channel.credit > 0
            _dispatch(consumer.queue)
            if channel.credit > 0 and not consumer.queue.ready:
                self.return_credit(channel)
            return
        channel.deliverable = record.credit > 0
        if channel.deliverable:
            _dispatch(consumer.queue)

    def return_credit(self, channel: LinkedChannel) -> None:
        """The consumer's queue has nothing ready: its unused credit goes back to the
        client's channel, for its other consumers."""
        n = channel.credit or 0
        channel.credit = 0
        channel.deliverable = False
        channel.asked = False
        self.credit_back(channel, n)

    def credit_back(self, channel: LinkedChannel, n: int) -> None:
        """To the client's worker: `n` credits returned, or (0) a request for credit."""
        if channel.peer in self.mesh.peers:
            self.mesh.call(channel.peer, "credit_back", channel.ref, n).add_done_callback(_ignore)

    # --- consumers ------------------------------------------------------------------------

    def _consume(
        self,
        peer: int,
        vhost: str,
        name: str,
        ref: int,
        tag: str,
        no_ack: bool,
        exclusive: bool,
        prefetch: int,
        global_prefetch: int,
        arguments: dict[str, Any],
        credit: bool = False,
    ) -> bool:
        queue = self._queue(vhost, name)
        exclusive, priority = check_consume(
            queue, exclusive, arguments, prefetch, global_prefetch, no_ack
        )
        channel = (
            CreditChannel(self, peer, ref)
            if credit and not no_ack
            else LinkedChannel(self, peer, ref, global_prefetch)
        )
        consumer = Consumer(tag, channel, queue, no_ack, exclusive, prefetch, priority, arguments)
        queue.add_consumer(consumer)
        self._consumers[(peer, ref)] = consumer
        # After the answer: consume-ok goes to the client before any delivery.
        asyncio.get_running_loop().call_soon(_dispatch, queue)
        return True

    def _cancel(self, peer: int, ref: int, requeue: bool) -> bool:
        consumer = self._consumers.pop((peer, ref), None)
        if consumer is None:
            return False
        queue: Any = consumer.queue
        consumer.channel.deliverable = False  # type: ignore[misc]
        queue.remove_consumer(consumer)
        if requeue:
            out = self._out.get(peer, {})
            mine = [d for d, item in out.items() if item[2] is consumer]
            taken = []
            for delivery in mine:
                item = out.pop(delivery)
                consumer.unacked -= 1
                taken.append(item)
            _requeue(taken, closing=True)
        queue.vhost.maybe_auto_delete(queue)
        _redispatch((queue,))
        return True

    def cancelled(self, channel: LinkedChannel, consumer: Consumer) -> None:
        """The consumer's queue was deleted here: its worker cancels it at its client."""
        if self._consumers.pop((channel.peer, channel.ref), None) is None:
            return
        channel.deliverable = False
        if channel.peer in self.mesh.peers:
            self.mesh.call(channel.peer, "cancelled", channel.ref).add_done_callback(_ignore)

    # --- basic.get, purge, counts ---------------------------------------------------------

    def _get(self, peer: int, vhost: str, name: str, no_ack: bool) -> Any:
        queue = self._queue(vhost, name)
        entry = queue.get()
        stats = queue.stats
        if entry is None:
            stats.get_empty += 1
            return None
        if entry.redelivered:
            stats.redeliver += 1
        self._next_delivery += 1
        delivery = self._next_delivery
        if no_ack:
            stats.get_no_ack += 1
            queue.vhost.on_message_removed(queue, entry)
        else:
            stats.get += 1
            queue.unacked += 1
            out = self._out.get(peer)
            if out is None:
                out = self._out[peer] = {}
            out[delivery] = (queue, entry, None)
        message = entry.message
        body = None
        if message.body is None or entry.location is not None:
            body = queue.delivery_body(entry)
        return (delivery, entry.redelivered, encode(message, body), queue.message_count)

    def _purge(self, peer: int, vhost: str, name: str) -> int:
        queue = self._queue(vhost, name)
        return queue.vhost.purge_queue(queue)

    def _queue_counts(self, peer: int, vhost: str, name: str) -> tuple[int, int]:
        """(messages ready, consumers) of a queue this worker owns."""
        queue = self._queue(vhost, name)
        return queue.message_count, queue.consumer_count

    # --- a worker that goes away ----------------------------------------------------------

    def _peer_lost(self, peer: int) -> None:
        publishers = self._publishers.pop(peer, None)
        if publishers is not None:
            for vhost in self.broker.vhosts.values():
                for queue in vhost.queues.values():
                    throttled = getattr(queue, "throttled", None)
                    if throttled:
                        throttled.discard(publishers)
        queues = set()
        for key, consumer in list(self._consumers.items()):
            if key[0] != peer:
                continue
            del self._consumers[key]
            consumer.channel.deliverable = False  # type: ignore[misc]
            consumer.queue.remove_consumer(consumer)
            queues.add(consumer.queue)
        taken = list(self._out.pop(peer, {}).values())
        for _queue, _entry, consumer in taken:
            if consumer is not None:
                consumer.unacked -= 1
        _requeue(taken, closing=True)
        for queue in queues:
            queue.vhost.maybe_auto_delete(queue)
        _redispatch(queues)


def _ignore(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


def _dispatch(queue: Any) -> None:
    if not queue.deleted and queue.consumers and queue.ready:
        queue.dispatch()


def _redispatch(queues: Any) -> None:
    for queue in queues:
        _dispatch(queue)


def _requeue(taken: list[tuple[Any, Any, Any]], closing: bool) -> None:
    """Put deliveries back in their queues (in their places, redelivered)."""
    by_queue: dict[Any, list[Any]] = {}
    for queue, entry, _consumer in taken:
        by_queue.setdefault(queue, []).append(entry)
    for queue, entries in by_queue.items():
        if closing:
            queue.return_unacked(entries)
        else:
            queue.requeue(entries, dispatch=False)
    _redispatch(by_queue)
