"""Messages to and from queues other workers own: the side of the worker that serves
the client (leveret.workers.serving is the owner's side).

Every vhost of a worker broker holds this worker's `Crossing` (`vhost.crossing`);
a `RemoteQueue` hands it what a local queue would do itself:

- Publishing. `enqueue` sends a PUBLISH to the owner, one per message and owner
  (the queues of a fan-out that one owner has join the record: the link writer
  keeps it open while the routing goes on). A publish with a barrier (publisher
  confirms, a tx.commit, a persistent message) takes `barrier.add()` under the
  record's sequence number; the owner's CONFIRM or NACK for it resolves it. A NACK
  that says the queue refused the message (x-overflow=reject-publish) nacks a
  confirm and is silent otherwise, as on one process.
- Consuming. basic.consume is a call to the owner ("consume"), which checks it as
  a local basic.consume would (exclusive use, x-priority, the queue type's own
  rules) and registers a consumer there whose deliveries come back as DELIVER
  records under the consumer's `ref`. Each becomes a QueueEntry of the RemoteQueue
  (its `seq` the owner's delivery id), delivered through the real channel, so
  delivery tags, the channel's counts and redelivered flags are the channel's own;
  its ack, reject or requeue goes back as ACK or REJECT records (runs of ids).
  The owner enforces the consumer's prefetch. basic.qos global=true is this
  worker's: `grant` gives the owners credit (CREDIT n) from what the channel's
  window has left (channel.credit_out counts the credit not used yet, which the
  channel's local consumers see too); an owner gives back the credit of a consumer
  whose queue has nothing ready, and asks for credit when a message comes for it.
  A channel that stops taking deliveries (channel.flow, a client not reading) sends
  CREDIT 0 for its other consumers, and CREDIT 1 when it takes them again: the
  owner holds them meanwhile (a credit-granted consumer gets no grant meanwhile).
- basic.cancel waits for the owner's answer (deliveries it sent before arrive
  first); the deliveries not acked yet stay the channel's, to ack or reject, as in
  RabbitMQ. A channel or connection that closes cancels without waiting, and the
  owner requeues what the consumer had not acked (sent, in flight, or unacked).
- basic.get and queue.purge are calls; the owner answers as for a local client.
- While a call is out, the client connection holds its later events
  (AMQPConnection.hold_for), so its operations keep their order.
- A worker that goes away: publishes waiting for its confirm are nacked; consumers
  on its queues get basic.cancel (consumer_cancel_notify), as RabbitMQ cancels a
  consumer whose queue's node went down; what they had not acked stays with their
  channels and is requeued by the owner when it restarts (its store has it).
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Any

from pamqp import commands as cmd

from leveret.broker.consumer import Consumer
from leveret.broker.errors import ModelError
from leveret.broker.queues import QUEUE_CLASSES
from leveret.broker.queues.base import QueueEntry
from leveret.protocol import methods as wire
from leveret.protocol.constants import (
    BASIC_CANCEL,
    BASIC_CONSUME,
    BASIC_GET,
    NOT_FOUND,
    QUEUE_PURGE,
)
from leveret.protocol.errors import AMQPError, ChannelError
from leveret.server.publishing import FailureReporter
from leveret.workers import link as records
from leveret.workers.mesh import Mesh, PeerDown
from leveret.workers.messages import decode, encode

if TYPE_CHECKING:
    import asyncio

    from leveret.broker.broker import Broker
    from leveret.broker.message import Message
    from leveret.broker.queues.remote import RemoteQueue
    from leveret.server.channel import Channel

log = logging.getLogger("leveret.workers")

#: NACK flag: the queue refused the message (x-overflow=reject-publish), nothing failed
REFUSED = 1

#: queue types whose queues take a transient message without a write to the store
#: (not `persists_all`): the owner confirms such a message as soon as it enqueued it
_KEEPS_TRANSIENT_IN_MEMORY = frozenset(
    name for name, cls in QUEUE_CLASSES.items() if not cls.persists_all
)


class QueueRefused(Exception):
    """The owner's queue turned a message away (x-overflow=reject-publish)."""


def _quiet(barrier: Any) -> bool:
    """A plain publish's barrier (no confirm, no transaction): it only reports disk
    failures, and a message the owner refused or never got is no failure there."""
    return type(barrier) is FailureReporter


def _ignore(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()  # retrieved: a cancel nobody waits for may fail quietly


class Crossing:
    """This worker's data path to the queues other workers own (`vhost.crossing`)."""

    def __init__(self, broker: Broker, mesh: Mesh) -> None:
        self.broker = broker
        self.mesh = mesh
        self._seq = 0  # PUBLISH sequence numbers (0: no confirm wanted)
        # peer -> seq -> (the barrier's callback, whether the barrier is a confirm's)
        self._confirms: dict[int, dict[int, tuple[Any, bool]]] = {}
        self._next_ref = 0
        self._consumers: dict[int, Consumer] = {}  # ref -> consumer on a RemoteQueue
        self._refs: dict[Consumer, int] = {}
        # Consumers of channels with basic.qos global=true -> the credit granted to
        # them that no delivery has used yet (also counted in channel.credit_out).
        self._credit: dict[Consumer, int] = {}
        # Of those, the ones whose owner returned their credit (their queue had
        # nothing ready): none is granted to them until their owner asks.
        self._idle: set[Consumer] = set()
        # Consumers whose "consume" is not answered yet, with the deliveries that
        # came before the answer was handled (the owner sends them after it).
        self._early: dict[int, list[records.Deliver]] = {}
        self._blocked: dict[int, set[RemoteQueue]] = {}  # peer -> queues with paused publishers
        mesh.on(records.CONFIRM, self._on_confirm)
        mesh.on(records.NACK, self._on_confirm)
        mesh.on(records.DELIVER, self._on_deliver)
        mesh.serve("cancelled", self._on_cancelled)
        mesh.serve("behind", self._on_behind)
        mesh.serve("credit_back", self._on_credit_back)
        mesh.peer_lost.append(self._peer_lost)
        mesh.peer_joined.append(self._peer_joined)
        for peer in mesh.links:
            self._peer_joined(peer)

    # --- publishing -------------------------------------------------------------------

    def enqueue(self, queue: RemoteQueue, message: Message, barrier: Any) -> None:
        peer = queue.worker
        link = self.mesh.links.get(peer)
        if link is None or link.closed:
            if barrier is not None:
                # A confirm is a nack, a tx.commit fails; a plain publish is dropped
                # (as one routed to a queue that is gone).
                barrier.add()(None if _quiet(barrier) else PeerDown(peer))
            return
        vhost = queue.vhost.name
        writer = link.writer
        if writer.open_token is message and writer.publish_more(message, vhost, queue.name):
            return  # one record per owner: the fan-out's earlier queue opened it
        seq = 0
        if barrier is not None:
            quiet = type(barrier) is FailureReporter  # (_quiet, inline)
            if not (
                quiet and not message.persistent and queue.queue_type in _KEEPS_TRANSIENT_IN_MEMORY
            ):
                # (A plain publish's barrier only reports a store's failure, and the
                # owner stores a transient message in such a queue nowhere: a CONFIRM
                # of it would tell nobody anything, so none is asked for.)
                self._seq += 1
                seq = self._seq
                waiting = self._confirms.get(peer)
                if waiting is None:
                    waiting = self._confirms[peer] = {}
                # With the barrier's kind: True, a publisher confirm's (its callback is
                # the channel's partial of _confirm_written for the number); False, a
                # tx.commit's; None, a plain publish's (_quiet).
                waiting[seq] = (
                    barrier.add(),
                    None if quiet else type(getattr(barrier, "on_done", None)) is partial,
                )
        link.publish_open(message, seq, vhost, queue.name, encode(message))

    def _on_confirm(self, peer: int, settle: records.Settle) -> None:
        waiting = self._confirms.get(peer)
        if not waiting:
            return
        if settle.kind == records.CONFIRM:
            pop = waiting.pop
            for first, count in settle.runs:
                for seq in range(first, first + count):
                    item = pop(seq, None)
                    if item is not None:
                        item[0](None)
            return
        refused = settle.flags & REFUSED
        for seq in settle.ids():
            item = waiting.pop(seq, None)
            if item is None:
                continue
            done, confirm = item  # True: a confirm; False: a tx.commit; None: neither
            if refused and not confirm:
                done(None)  # without confirms a refused message is dropped silently
            elif refused:
                done(QueueRefused("x-overflow=reject-publish"))
            else:
                done(RuntimeError(f"worker {peer} could not store the message"))

    def _on_behind(self, peer: int, vhost: str, name: str, behind: bool) -> None:
        """The owner's queue is far behind its consumers (or drained again)."""
        vh = self.broker.vhosts.get(vhost)
        queue: Any = vh.queues.get(name) if vh is not None else None
        if queue is None or not queue.remote or queue.worker != peer:
            return
        queue.behind = behind
        if not behind and queue.throttled and self.writable(peer):
            queue.release_publishers()

    def all_linked(self) -> bool:
        """Whether the link to every other worker is up (a publish to a worker
        without one is dropped: the delayed exchange waits for this first)."""
        mesh = self.mesh
        return len(mesh.peers) == mesh.count - 1

    def writable(self, worker: int) -> bool:
        """Whether publishers to `worker`'s queues go on. A link that is gone holds
        nothing back (what is sent to it fails at once), whatever it said last: one
        that was full when its peer died never drains, and a publisher paused for it
        would wait past the new link's coming up."""
        link = self.mesh.links.get(worker)
        return link is None or link.writable or link.closed

    def wait_writable(self, queue: RemoteQueue) -> None:
        blocked = self._blocked.get(queue.worker)
        if blocked is None:
            blocked = self._blocked[queue.worker] = set()
        blocked.add(queue)

    def _link_writable(self, peer: int, writable: bool) -> None:
        if writable:
            for queue in self._blocked.pop(peer, ()):
                if not queue.behind:
                    queue.release_publishers()

    # --- settlements ------------------------------------------------------------------

    def settle(self, queue: RemoteQueue, entry: QueueEntry, kind: str) -> None:
        link = self.mesh.links.get(queue.worker)
        if link is None or link.closed:
            return  # the owner went down: its store has the message, unacked
        if kind == "ack":
            link.settle_open(records.ACK, 0, entry.seq)
        elif kind == "requeue":
            link.settle_open(records.REJECT, 0, entry.seq, records.REQUEUE)
        elif kind == "return":  # the channel closed with it
            link.settle_open(records.REJECT, 0, entry.seq, records.REQUEUE | records.CLOSING)
        else:
            link.settle_open(records.REJECT, 0, entry.seq)

    # --- consumers --------------------------------------------------------------------

    def consume(self, channel: Channel, m: cmd.Basic.Consume, tag: str, queue: RemoteQueue) -> None:
        """basic.consume on `queue`: registered on the owner, answered once it is."""
        conn = channel.conn
        arguments = dict(m.arguments or {})
        priority = arguments.get("x-priority", 0)
        self._next_ref += 1
        ref = self._next_ref
        consumer = Consumer(
            tag,
            channel,
            queue,
            m.no_ack,
            bool(m.exclusive),
            channel.prefetch_count,
            priority if type(priority) is int else 0,
            arguments,
        )
        self._consumers[ref] = consumer
        self._refs[consumer] = ref
        self._early[ref] = []
        credit = bool(channel.global_prefetch) and not m.no_ack
        call = self.mesh.call(
            queue.worker,
            "consume",
            queue.vhost.name,
            queue.name,
            ref,
            tag,
            bool(m.no_ack),
            bool(m.exclusive),
            channel.prefetch_count,
            channel.global_prefetch,
            arguments,
            credit,
        )

        def registered(call: asyncio.Future[Any]) -> None:
            """Bookkeeping, whatever becomes of the client (before `answer`)."""
            if call.cancelled() or call.exception() is not None:
                self._forget(consumer)
            elif channel.closing or conn.state == "closed":
                self._forget(consumer)  # registered there, but nobody here wants it
                self._cancel_on_owner(queue.worker, ref, True)
            if ref not in self._consumers:
                self._early.pop(ref, None)

        def answer(_result: Any) -> None:
            early = self._early.pop(ref, [])
            queue.add_consumer(consumer)
            channel.consumers[tag] = consumer
            if not m.nowait:
                channel.send_method(wire.unchecked(cmd.Basic.ConsumeOk, tag))
            for deliver in early:
                self._deliver(consumer, deliver)
            if credit:
                self._credit[consumer] = 0
                self.grant(channel)
            if not channel.deliverable:  # stopped meanwhile (channel.flow, a full socket)
                self.deliverable_changed(channel)

        call.add_done_callback(registered)
        conn.hold_for(self._answer_of(call, queue), channel, BASIC_CONSUME, answer)

    def cancel(self, channel: Channel, m: cmd.Basic.Cancel, consumer: Consumer) -> None:
        """basic.cancel of a consumer on a RemoteQueue: cancel-ok once the owner dropped
        it, so that every delivery it sent before comes first."""
        conn = channel.conn
        queue: RemoteQueue = consumer.queue  # type: ignore[assignment]
        ref = self._refs.get(consumer)
        call = self._cancel_on_owner(queue.worker, ref, False) if ref is not None else None

        def answer(_result: Any) -> None:
            self._forget(consumer)
            if not m.nowait:
                channel.send_method(wire.unchecked(cmd.Basic.CancelOk, m.consumer_tag))

        if call is None:
            answer(None)
            return
        # Whatever the owner answers (it may have gone meanwhile), the consumer is gone.
        call.add_done_callback(lambda _call: self._forget(consumer))
        conn.hold_for(self._answer_of(call, queue, quiet=True), channel, BASIC_CANCEL, answer)

    def deliverable_changed(self, channel: Channel) -> None:
        """The channel stopped taking deliveries (channel.flow, a full socket) or takes
        them again: its consumers' owners stop or go on delivering (CREDIT 0 or 1)."""
        credit = 1 if channel.deliverable else 0
        for consumer in channel.consumers.values():
            ref = self._refs.get(consumer)
            if ref is None or consumer in self._credit:
                continue  # credit-granted consumers get no more grants meanwhile
            link = self.mesh.links.get(consumer.queue.worker)  # type: ignore[attr-defined]
            if link is not None and not link.closed:
                link.send(records.Credit(ref, credit))
        if credit:
            self.grant(channel)

    def grant(self, channel: Channel) -> None:
        """basic.qos global=true across workers: what the channel's window has left
        (its unacked deliveries and the credit not used yet both count) is granted to
        its consumers on other workers' queues, one delivery each in turn, so the
        channel never holds more unacked deliveries than its window."""
        limit = channel.global_prefetch
        if not limit or not channel.deliverable or channel.closing:
            return
        credited = self._credit
        idle = self._idle
        remote = [c for c in channel.consumers.values() if c in credited and c not in idle]
        if not remote:
            return
        room = limit - channel.unacked_count - channel.credit_out
        if room <= 0:
            return
        # Fewest outstanding first: an idle consumer does not take the whole window.
        remote.sort(key=credited.__getitem__)
        grants = dict.fromkeys(remote, 0)
        while room > 0:
            for consumer in remote:
                if room <= 0:
                    break
                grants[consumer] += 1
                room -= 1
        for consumer, n in grants.items():
            ref = self._refs.get(consumer)
            link = self.mesh.links.get(consumer.queue.worker)  # type: ignore[attr-defined]
            if ref is None or link is None or link.closed:
                continue
            credited[consumer] += n
            channel.credit_out += n
            link.send(records.Credit(ref, n))

    def _on_credit_back(self, peer: int, ref: int, n: int) -> None:
        """The owner returned `n` unused credits of consumer `ref` (its queue had
        nothing ready), or (0) asks for credit (its queue has a message for it)."""
        consumer = self._consumers.get(ref)
        if consumer is None or consumer not in self._credit:
            return
        channel: Any = consumer.channel
        if n:
            n = min(n, self._credit[consumer])
            self._credit[consumer] -= n
            channel.credit_out -= n
            self._idle.add(consumer)
        else:
            self._idle.discard(consumer)
        if not channel.closing:
            # The window's room to the channel's local queues first, then credit.
            channel._redispatch(())

    def _drop_credit(self, consumer: Consumer) -> None:
        """The consumer is gone: its unused credit goes back to its channel's window."""
        n = self._credit.pop(consumer, None)
        if n is None:
            return
        self._idle.discard(consumer)
        channel: Any = consumer.channel
        channel.credit_out -= n
        if n and not channel.closing:
            self.grant(channel)

    def _forget(self, consumer: Consumer) -> None:
        """Drop `consumer` here, telling the owner nothing."""
        self._drop_credit(consumer)
        ref = self._refs.pop(consumer, None)
        if ref is not None:
            self._consumers.pop(ref, None)
        channel: Any = consumer.channel
        if channel.consumers.get(consumer.tag) is consumer:
            del channel.consumers[consumer.tag]
        queue = consumer.queue
        if consumer in queue.consumers:
            queue.consumers.remove(consumer)

    def forget_consumer(self, consumer: Consumer) -> None:
        """The consumer's channel or connection closed (or its queue went): the owner
        drops it and requeues what it had not acked, without an answer awaited."""
        self._drop_credit(consumer)
        ref = self._refs.pop(consumer, None)
        if ref is None:
            return
        self._consumers.pop(ref, None)
        self._cancel_on_owner(consumer.queue.worker, ref, True)  # type: ignore[attr-defined]

    def _cancel_on_owner(self, peer: int, ref: int, requeue: bool) -> asyncio.Future[Any] | None:
        if peer not in self.mesh.peers:
            return None
        fut = self.mesh.call(peer, "cancel", ref, requeue)
        fut.add_done_callback(_ignore)
        return fut

    def _on_deliver(self, peer: int, deliver: records.Deliver) -> None:
        consumer = self._consumers.get(deliver.ref)
        if consumer is None:
            return  # cancelled by a close: the owner requeues what it sent
        early = self._early.get(deliver.ref)
        if early is not None:
            if consumer.channel.closing:  # type: ignore[attr-defined]
                del self._early[deliver.ref]  # closed before its consume-ok went out
                self.forget_consumer(consumer)
                return
            early.append(deliver)  # before the consume's answer was handled
            return
        # (`_deliver`, inline: every message a consumer here takes from another
        # worker's queue comes this way)
        channel: Any = consumer.channel
        if channel.closing:
            return
        entry = QueueEntry(
            deliver.delivery, decode(deliver.message), bool(deliver.flags & records.REDELIVERED)
        )
        queue = consumer.queue
        if not consumer.no_ack:
            queue.unacked += 1
        credit = self._credit
        if credit:
            credited = credit.get(consumer)
            if credited:  # the delivery uses a credit: it counts as unacked from now
                credit[consumer] = credited - 1
                channel.credit_out -= 1
        channel.deliver(consumer, queue, entry)

    def _deliver(self, consumer: Consumer, deliver: records.Deliver) -> None:
        channel: Any = consumer.channel
        if channel.closing:
            return
        entry = QueueEntry(
            deliver.delivery, decode(deliver.message), bool(deliver.flags & records.REDELIVERED)
        )
        queue = consumer.queue
        if not consumer.no_ack:
            queue.unacked += 1
        credited = self._credit.get(consumer)
        if credited:  # the delivery uses a credit: it counts as unacked from now
            self._credit[consumer] = credited - 1
            channel.credit_out -= 1
        channel.deliver(consumer, queue, entry)

    def _on_cancelled(self, peer: int, ref: int) -> bool:
        """The owner cancelled the consumer `ref` (its queue was deleted)."""
        consumer = self._consumers.pop(ref, None)
        if consumer is None:
            return False
        self._refs.pop(consumer, None)
        self._cancelled_by_broker(consumer)
        return True

    def _cancelled_by_broker(self, consumer: Consumer) -> None:
        self._drop_credit(consumer)
        queue = consumer.queue
        if consumer in queue.consumers:
            queue.consumers.remove(consumer)
        consumer.channel.on_consumer_cancelled_by_broker(consumer)  # type: ignore[attr-defined]

    # --- basic.get, queue.purge ---------------------------------------------------------

    def basic_get(self, channel: Channel, m: cmd.Basic.Get, queue: RemoteQueue) -> None:
        conn = channel.conn
        no_ack = bool(m.no_ack)
        call = self.mesh.call(queue.worker, "get", queue.vhost.name, queue.name, no_ack)

        def taken(call: asyncio.Future[Any]) -> None:
            """A message taken for a channel that closed meanwhile goes back."""
            if call.cancelled() or call.exception() is not None or no_ack:
                return
            got = call.result()
            if got is not None and (channel.closing or conn.state == "closed"):
                self.settle(queue, QueueEntry(got[0], None), "return")  # type: ignore[arg-type]

        def answer(got: Any) -> None:
            if got is None:
                channel.answer_get(queue, None, no_ack, 0)
                return
            delivery, redelivered, data, count = got
            entry = QueueEntry(delivery, decode(data), redelivered)
            if not no_ack:
                queue.unacked += 1
            channel.answer_get(queue, entry, no_ack, count)

        call.add_done_callback(taken)
        conn.hold_for(self._answer_of(call, queue), channel, BASIC_GET, answer)

    def purge(self, channel: Any, m: cmd.Queue.Purge, queue: RemoteQueue) -> None:
        call = self.mesh.call(queue.worker, "purge", queue.vhost.name, queue.name)

        def answer(count: int) -> None:
            if not m.nowait:
                channel.send_method(cmd.Queue.PurgeOk(count))

        channel.conn.hold_for(self._answer_of(call, queue), channel, QUEUE_PURGE, answer)

    def _answer_of(
        self, call: asyncio.Future[Any], queue: RemoteQueue, quiet: bool = False
    ) -> asyncio.Future[Any]:
        """`call`'s outcome as the client is to get it: the owner's AMQP and model
        errors as they are, its absence as RabbitMQ answers for a queue whose node is
        down (404); `quiet`: a failure is no error for the client (a cancel)."""
        answer: asyncio.Future[Any] = call.get_loop().create_future()

        def done(call: asyncio.Future[Any]) -> None:
            error = PeerDown(queue.worker) if call.cancelled() else call.exception()
            if error is None:
                answer.set_result(call.result())
            elif quiet:
                answer.set_result(None)
            else:
                answer.set_exception(self._client_error(queue, error))

        call.add_done_callback(done)
        return answer

    @staticmethod
    def _client_error(queue: RemoteQueue, error: BaseException) -> BaseException:
        if isinstance(error, PeerDown):
            return ChannelError(
                NOT_FOUND,
                f"home node 'worker-{queue.worker}' of durable {queue.describe()} "
                "is down or inaccessible",
            )
        if isinstance(error, (AMQPError, ModelError)):
            return error
        log.error("worker %d failed a call for %s: %r", queue.worker, queue.describe(), error)
        return ChannelError(NOT_FOUND, f"{queue.describe()} could not be reached: {error}")

    # --- workers coming and going ------------------------------------------------------

    def _peer_joined(self, peer: int) -> None:
        link = self.mesh.links.get(peer)
        if link is not None:
            link.on_writable = lambda writable: self._link_writable(peer, writable)
            # Publishers paused for the link this one replaces: the new one takes them.
            self._link_writable(peer, link.writable)

    def _peer_lost(self, peer: int) -> None:
        error = PeerDown(peer)
        for done, confirm in self._confirms.pop(peer, {}).values():
            done(error if confirm is not None else None)
        for ref, consumer in list(self._consumers.items()):
            if consumer.queue.worker != peer:  # type: ignore[attr-defined]
                continue
            if ref in self._early:
                continue  # its consume fails with PeerDown
            del self._consumers[ref]
            self._refs.pop(consumer, None)
            self._cancelled_by_broker(consumer)
        for queue in self._blocked.pop(peer, ()):
            queue.release_publishers()
        for vhost in self.broker.vhosts.values():
            for queue in vhost.queues.values():
                if queue.remote and queue.worker == peer and queue.behind:  # type: ignore[attr-defined]
                    queue.behind = False  # type: ignore[attr-defined]
                    queue.release_publishers()  # type: ignore[attr-defined]


def attach(broker: Broker, mesh: Mesh) -> Crossing:
    """Run the data path between `broker`'s worker and the others: both sides (this
    one, and the owner's, leveret.workers.serving) on `mesh`; every vhost, now and
    later, gets the crossing."""
    from leveret.workers.replies import WorkerDirectReplies
    from leveret.workers.serving import Serving

    crossing = Crossing(broker, mesh)
    broker.crossing = crossing
    for vhost in broker.vhosts.values():
        vhost.crossing = crossing
    Serving(broker, mesh)
    broker.direct_reply = WorkerDirectReplies(mesh)
    return crossing
