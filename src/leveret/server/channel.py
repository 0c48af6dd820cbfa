"""One AMQP channel: method dispatch, deliveries, acks, consumers, teardown.

Publishing (content assembly, routing, confirms, tx) lives in server.publishing.

Hot path: basic.publish (decoded by hand), its header and body frames,
deliveries out, and basic.ack (decoded by hand). Everything else goes through
pamqp and a handler table.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
from time import monotonic
from typing import TYPE_CHECKING, Any

from pamqp import commands as cmd

from leveret.broker import direct_reply
from leveret.broker.consumer import Consumer
from leveret.broker.message import Message
from leveret.broker.queue_args import amqp_type_name
from leveret.broker.queues.base import Queue, QueueEntry
from leveret.broker.stats import MessageStats
from leveret.protocol import methods as wire
from leveret.protocol.constants import (
    ACCESS_REFUSED,
    BASIC_CANCEL,
    BASIC_CONSUME,
    BASIC_GET,
    BASIC_QOS,
    BASIC_RECOVER,
    BASIC_RECOVER_ASYNC,
    BASIC_REJECT,
    CHANNEL_FLOW,
    CHANNEL_FLOW_OK,
    CLASS_BASIC,
    COMMAND_INVALID,
    CONFIRM_SELECT,
    EXCHANGE_BIND,
    EXCHANGE_DECLARE,
    EXCHANGE_DELETE,
    EXCHANGE_UNBIND,
    NOT_ALLOWED,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    QUEUE_BIND,
    QUEUE_DECLARE,
    QUEUE_DELETE,
    QUEUE_PURGE,
    QUEUE_UNBIND,
    TX_COMMIT,
    TX_ROLLBACK,
    TX_SELECT,
)
from leveret.protocol.errors import AMQPError, ChannelError, ConnectionError_
from leveret.protocol.frames import body_frames, header_frame
from leveret.protocol.methods import deliver_frames
from leveret.server.publishing import FailureReporter, PublishMethods, Transaction

if TYPE_CHECKING:
    from leveret.server.connection import AMQPConnection

log = logging.getLogger("leveret.channel")

# Bodies at least this large are written as they are (writev), not joined with the
# rest of a loop turn's output: copying them costs more than the extra iovecs.
LARGE_BODY = 1024


def check_consume(
    queue: Queue,
    exclusive: bool,
    arguments: dict[str, Any],
    prefetch: int,
    global_prefetch: int,
    no_ack: bool,
) -> tuple[bool, Any]:
    """What basic.consume checks of a queue, in RabbitMQ's order (the queue's owner
    runs them for a consumer of another worker too): whether the consumer holds the
    queue exclusively, and its x-priority."""
    exclusive = exclusive and queue.exclusive_consumers
    # A single-active-consumer queue already gives one consumer the queue: RabbitMQ
    # refuses an exclusive consumer on it as on a queue in exclusive use.
    sac = exclusive and getattr(getattr(queue, "options", None), "single_active_consumer", False)
    if queue.exclusive_consumers and (
        sac or any(c.exclusive for c in queue.consumers) or (exclusive and queue.consumers)
    ):
        raise ChannelError(ACCESS_REFUSED, f"{queue.describe()} in exclusive use")
    priority = arguments.get("x-priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ChannelError(
            PRECONDITION_FAILED,
            f"invalid arg 'x-priority' for {queue.describe()}: "
            f'"expected integer, got {amqp_type_name(priority)}"',
        )
    queue.check_consume(prefetch, global_prefetch, no_ack, arguments)
    return exclusive, priority


class Channel(PublishMethods):
    def __init__(self, conn: AMQPConnection, number: int) -> None:
        self.conn = conn
        self.number = number
        self.vhost = conn.vhost
        # The vhost's tables, looked up per publish (the dicts themselves never change).
        self.exchanges = conn.vhost.exchanges
        self.queues = conn.vhost.queues
        self.default_exchange = conn.vhost.default_exchange
        self.closing = False  # we sent channel.close and wait for close-ok
        self.flow_active = True
        self.deliverable = conn.writable
        # The largest body one frame takes (frame_max is fixed before channels open).
        self.body_max = conn.frame_max - 8
        self.consumers: dict[str, Consumer] = {}
        # delivery tag → (queue, entry, consumer or None for basic.get), in tag order
        self.unacked: dict[int, tuple[Queue, QueueEntry, Consumer | None]] = {}
        self.unacked_count = 0
        # Deliveries other workers may still send this channel under its basic.qos
        # global=true window (credit granted, not used yet): they count against it.
        self.credit_out = 0
        self.delivery_tag = 0
        self.stats = MessageStats()  # broker.stats: counters only, rates come from the sampler
        self.prefetch_count = 0  # for consumers created from now on (global=false)
        self.global_prefetch = 0  # whole channel (global=true)
        self.last_queue_name: str | None = None
        # The amq.gen-* name the permission guard checked for a server-named queue.
        self.generated_queue_name: str | None = None
        # Publisher confirms: seq → None (waiting on disk), True (ok) or False (nack).
        self.confirm_mode = False
        self.publish_seq = 0
        self.confirms_folded = 0  # of publish_seq, added to stats.publish_confirm at close
        self.confirmed_upto = 0
        self.confirm_waiting: dict[int, bool | None] = {}
        self.tx: Transaction | None = None
        self._ack_timer: asyncio.TimerHandle | None = None
        # Persistent publishes without confirms report disk failures through this.
        self._write_failures = FailureReporter(self._persist_failed)
        # Direct reply-to: our token and consumer tag while we consume the pseudo-queue.
        self.reply_token: str | None = None
        self.reply_consumer_tag: str | None = None
        self._handlers = {
            CHANNEL_FLOW: self.on_channel_flow,
            CHANNEL_FLOW_OK: self.on_channel_flow_ok,
            EXCHANGE_DECLARE: self.on_exchange_declare,
            EXCHANGE_DELETE: self.on_exchange_delete,
            EXCHANGE_BIND: self.on_exchange_bind,
            EXCHANGE_UNBIND: self.on_exchange_unbind,
            QUEUE_DECLARE: self.on_queue_declare,
            QUEUE_BIND: self.on_queue_bind,
            QUEUE_PURGE: self.on_queue_purge,
            QUEUE_DELETE: self.on_queue_delete,
            QUEUE_UNBIND: self.on_queue_unbind,
            BASIC_QOS: self.on_basic_qos,
            BASIC_CONSUME: self.on_basic_consume,
            BASIC_CANCEL: self.on_basic_cancel,
            BASIC_GET: self.on_basic_get,
            BASIC_REJECT: self.on_basic_reject,
            BASIC_RECOVER_ASYNC: self.on_basic_recover_async,
            BASIC_RECOVER: self.on_basic_recover,
            CONFIRM_SELECT: self.on_confirm_select,
            TX_SELECT: self.on_tx_select,
            TX_COMMIT: self.on_tx_commit,
            TX_ROLLBACK: self.on_tx_rollback,
        }

    # --- methods in -----------------------------------------------------------

    def handle_method(self, method: Any) -> None:
        """A method for this channel (publish, acks and the channel's own lifecycle
        are the protocol core's and the connection's). Raises AMQPError."""
        handler = self._handlers.get(method.index)
        if handler is None:
            index = method.index
            raise ConnectionError_(
                COMMAND_INVALID,
                f"method {method.name} is not valid from a client on channel {self.number}",
                index >> 16,
                index & 0xFFFF,
            )
        guard = self.conn.guard
        if guard is not None:  # the permission choke point (server.authorization)
            guard.check_method(self, method)
        handler(method)

    # --- frames out ---------------------------------------------------------

    def send_method(self, method: Any) -> None:
        self.conn.write(wire.encode_method(method, self.number))

    def _send_content(
        self, method_frame: bytes, message: Message, body: bytes | None = None
    ) -> None:
        n = self.number
        if body is None:
            body = message.body
        parts = [method_frame, header_frame(n, message.header)]
        parts += body_frames(n, body, self.conn.frame_max)
        self.conn.write(b"".join(parts))

    def close_with_error(self, exc: AMQPError) -> None:
        """Channel exception: tell the client, drop our state, wait for close-ok.

        Confirms that are ready go out first: once our channel.close is sent,
        nothing else may follow on this channel (amqplib forgets the channel when
        it answers close-ok and throws on any later frame for it).  Confirms still
        waiting for the disk are dropped, as RabbitMQ drops them.
        """
        if self.closing:
            return
        if self.confirm_mode:
            self.conn.confirms_written(self)
        self.conn.close_channel(self, exc)
        self.closing = True
        self.cleanup()

    # --- channel class ------------------------------------------------------

    def on_channel_flow(self, m: cmd.Channel.Flow) -> None:
        self.flow_active = bool(m.active)
        self.update_deliverable()
        self.send_method(cmd.Channel.FlowOk(m.active))

    def on_channel_flow_ok(self, m: cmd.Channel.FlowOk) -> None:
        pass  # we never send channel.flow

    def update_deliverable(self) -> None:
        was = self.deliverable
        self.deliverable = self.flow_active and self.conn.writable and not self.closing
        if self.deliverable != was and self.vhost.crossing is not None:
            self.vhost.crossing.deliverable_changed(self)  # its consumers on other workers
        if self.deliverable and not was:
            self._redispatch({c.queue for c in self.consumers.values()})

    # --- deliveries (hot path) ----------------------------------------------

    def deliver(self, consumer: Consumer, queue: Queue, entry: QueueEntry) -> None:
        self.delivery_tag += 1
        tag = self.delivery_tag
        stats, qstats = self.stats, queue.stats
        if entry.redelivered:
            stats.redeliver += 1
            qstats.redeliver += 1
        if consumer.no_ack:
            stats.deliver_no_ack += 1
            qstats.deliver_no_ack += 1
            queue.removed(entry)
        else:
            stats.deliver += 1
            qstats.deliver += 1
            self.unacked[tag] = (queue, entry, consumer)
            consumer.unacked += 1
            self.unacked_count += 1
            entry.delivered_at = monotonic()
            if self._ack_timer is None:
                self._arm_ack_timer(queue, entry)
        message = entry.message
        body = message.body
        if body is None or entry.location is not None:
            body = queue.delivery_body(entry)  # paged out, or durable: the store's part
        size = len(body)
        if 0 < size <= self.body_max:
            if size < LARGE_BODY and type(body) is bytes:
                # The whole delivery as one bytes object (compiled: written in place),
                # joined with everything else written in this loop turn, once.
                self.conn.write(
                    deliver_frames(
                        self.number,
                        consumer.ctag_prefix,
                        tag,
                        entry.redelivered,
                        message.exchange_and_key,
                        message.header,
                        body,
                    )
                )
            else:
                # Written as it is (writev), not copied into the loop turn's join.
                head = wire.deliver_head(
                    self.number,
                    consumer.ctag_prefix,
                    tag,
                    entry.redelivered,
                    message.exchange_and_key,
                    message.header,
                    size,
                )
                self.conn.write_large(head, body, len(head) + size + 1)
        else:
            # An empty body has no body frame at all; a long one takes several.
            deliver = wire.encode_deliver(
                self.number, consumer.ctag_prefix, tag, entry.redelivered, message.exchange_and_key
            )
            self._send_content(deliver, message, body)

    # --- consumer acknowledgement timeout -----------------------------------

    def _ack_timeout_ms(self, queue: Queue) -> int:
        return queue.options.consumer_timeout or self.conn.config.consumer_timeout_ms

    def _arm_ack_timer(self, queue: Queue, entry: QueueEntry) -> None:
        timeout = self._ack_timeout_ms(queue)
        if timeout <= 0:
            return
        due = entry.delivered_at + timeout / 1000.0
        self._ack_timer = self.conn.loop.call_later(
            max(0.0, due - monotonic()) + 0.01, self._check_ack_timeout
        )

    def _check_ack_timeout(self) -> None:
        """Close the channel, as RabbitMQ does, when a delivery stays unacked too long."""
        self._ack_timer = None
        if self.closing or not self.unacked:
            return
        now = monotonic()
        oldest = None
        for queue, entry, _consumer in self.unacked.values():
            timeout = self._ack_timeout_ms(queue)
            if timeout > 0 and now - entry.delivered_at >= timeout / 1000.0:
                self.close_with_error(
                    ChannelError(
                        PRECONDITION_FAILED,
                        f"delivery acknowledgement on channel {self.number} timed out. Timeout "
                        f"value used: {timeout} ms. This timeout value can be configured, see "
                        "consumers doc guide to learn more",
                    )
                )
                return
            if oldest is None:
                oldest = (queue, entry)
        if oldest is not None:
            self._arm_ack_timer(*oldest)

    # --- basic class --------------------------------------------------------

    def on_basic_qos(self, m: cmd.Basic.Qos) -> None:
        if m.prefetch_size:
            raise ConnectionError_(NOT_IMPLEMENTED, f"prefetch_size!=0 ({m.prefetch_size})")
        if m.global_:
            self.global_prefetch = m.prefetch_count
            self._redispatch({c.queue for c in self.consumers.values()})
        else:
            self.prefetch_count = m.prefetch_count
        self.send_method(cmd.Basic.QosOk())

    def on_basic_consume(self, m: cmd.Basic.Consume) -> None:
        tag = m.consumer_tag or "amq.ctag-" + base64.urlsafe_b64encode(
            os.urandom(16)
        ).decode().rstrip("=")
        if tag in self.consumers or tag == self.reply_consumer_tag:
            raise ConnectionError_(
                NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'", CLASS_BASIC, 20
            )
        if m.queue == direct_reply.PSEUDO_QUEUE:
            self._consume_direct_reply(m, tag)
            return
        queue = self.queue_by_name(m.queue)
        if queue.remote:  # another worker owns it: it checks and registers the consumer
            self.vhost.crossing.consume(self, m, tag, queue)
            return
        arguments = dict(m.arguments or {})
        exclusive, priority = check_consume(
            queue, m.exclusive, arguments, self.prefetch_count, self.global_prefetch, m.no_ack
        )
        consumer = Consumer(
            tag, self, queue, m.no_ack, exclusive, self.prefetch_count, priority, arguments
        )
        queue.add_consumer(consumer)
        self.consumers[tag] = consumer
        if not m.nowait:
            self.send_method(wire.unchecked(cmd.Basic.ConsumeOk, tag))
        queue.dispatch()

    def _consume_direct_reply(self, m: cmd.Basic.Consume, tag: str) -> None:
        if not m.no_ack:
            raise ChannelError(
                PRECONDITION_FAILED, "reply consumer cannot acknowledge", CLASS_BASIC, 20
            )
        if self.reply_token is not None:
            raise ChannelError(PRECONDITION_FAILED, "reply consumer already set", CLASS_BASIC, 20)
        self.reply_token = self.conn.broker.direct_reply.register(self)
        self.reply_consumer_tag = tag
        if not m.nowait:
            self.send_method(wire.unchecked(cmd.Basic.ConsumeOk, tag))

    def _stop_direct_reply(self) -> None:
        if self.reply_token is not None:
            self.conn.broker.direct_reply.unregister(self.reply_token)
            self.reply_token = None
            self.reply_consumer_tag = None

    def on_basic_cancel(self, m: cmd.Basic.Cancel) -> None:
        if m.consumer_tag == self.reply_consumer_tag:
            self._stop_direct_reply()
        consumer = self.consumers.get(m.consumer_tag)
        if consumer is not None and consumer.queue.remote:
            # Deliveries the owner sent before it dropped the consumer come first.
            self.vhost.crossing.cancel(self, m, consumer)
            return
        consumer = self.consumers.pop(m.consumer_tag, None)
        if consumer is not None:
            queue = consumer.queue
            queue.remove_consumer(consumer)
            self.vhost.maybe_auto_delete(queue)
            if queue.consumers and queue.ready:
                queue.dispatch()
        if not m.nowait:
            self.send_method(wire.unchecked(cmd.Basic.CancelOk, m.consumer_tag))

    def on_consumer_cancelled_by_broker(self, consumer: Consumer) -> None:
        """The queue went away; tell clients that asked for consumer_cancel_notify."""
        if self.consumers.pop(consumer.tag, None) is None:
            return
        if self.conn.capabilities.get("consumer_cancel_notify") and not self.closing:
            self.send_method(wire.unchecked(cmd.Basic.Cancel, consumer.tag, nowait=True))

    def on_basic_get(self, m: cmd.Basic.Get) -> None:
        queue = self.queue_by_name(m.queue)
        if queue.remote:  # the owner answers
            self.vhost.crossing.basic_get(self, m, queue)
            return
        self.answer_get(queue, queue.get(), m.no_ack)

    def answer_get(
        self, queue: Queue, entry: QueueEntry | None, no_ack: bool, count: int = -1
    ) -> None:
        """basic.get-ok for `entry` taken from `queue` (get-empty for None); `count`:
        the messages left, when the queue's owner counted them."""
        if entry is None:
            self.stats.get_empty += 1
            queue.stats.get_empty += 1
            self.send_method(cmd.Basic.GetEmpty())
            return
        self.delivery_tag += 1
        tag = self.delivery_tag
        stats, qstats = self.stats, queue.stats
        if entry.redelivered:
            stats.redeliver += 1
            qstats.redeliver += 1
        if no_ack:
            stats.get_no_ack += 1
            qstats.get_no_ack += 1
            queue.vhost.on_message_removed(queue, entry)
        else:
            stats.get += 1
            qstats.get += 1
            queue.unacked += 1
            self.unacked[tag] = (queue, entry, None)
            self.unacked_count += 1
            entry.delivered_at = monotonic()
            if self._ack_timer is None:
                self._arm_ack_timer(queue, entry)
        message = entry.message
        body = message.body
        if body is None or entry.location is not None:
            body = queue.delivery_body(entry)
        get_ok = wire.encode_method(
            wire.unchecked(
                cmd.Basic.GetOk,
                tag,
                entry.redelivered,
                message.exchange,
                message.routing_key,
                queue.message_count if count < 0 else count,
            ),
            self.number,
        )
        self._send_content(get_ok, message, body)

    def ack(self, tag: int, multiple: bool) -> None:
        if self.tx is not None:
            self._take(tag, multiple, peek=True)
            self.tx.settlements.append(("ack", tag, multiple, False))
            return
        taken = self._take(tag, multiple)
        self.stats.ack += len(taken)
        self._redispatch(self._settle_acked(taken))

    def _settle_acked(self, taken: list) -> set:
        """Settle acked deliveries; the queues they came from. Its own (cpdef) method
        so that, compiled, the loop's queue, entry and consumer are C types (channel.pxd):
        an ack of 125 deliveries is one loop of C field updates and C calls."""
        touched = set()
        for queue, entry, consumer in taken:
            if consumer is not None:
                consumer.unacked -= 1
            queue.stats.ack += 1
            queue.settle(entry)
            touched.add(queue)
        return touched

    def on_basic_reject(self, m: cmd.Basic.Reject) -> None:
        self._settle_negative("reject", m.delivery_tag, False, m.requeue)

    def on_basic_nack(self, m: cmd.Basic.Nack) -> None:
        self._settle_negative("nack", m.delivery_tag, m.multiple, m.requeue)

    def _settle_negative(self, kind: str, tag: int, multiple: bool, requeue: bool) -> None:
        if self.tx is not None:
            self._take(tag, multiple, peek=True)
            self.tx.settlements.append((kind, tag, multiple, requeue))
            return
        taken = self._take(tag, multiple)
        for queue, _entry, _consumer in taken:
            if queue.queue_type == "stream":
                # RabbitMQ 3.10 closes the connection (540): a stream cannot take a
                # message back or drop it. What was taken goes back as unacked credit.
                self._return_or_drop(taken, True)
                raise ConnectionError_(
                    NOT_IMPLEMENTED,
                    "basic.nack and basic.reject not supported by stream queues "
                    + queue.describe(),
                )
        self._return_or_drop(taken, requeue)

    def _return_or_drop(self, taken: list, requeue: bool, closing: bool = False) -> None:
        by_queue: dict[Queue, list[QueueEntry]] = {}
        for queue, entry, consumer in taken:
            if consumer is not None:
                consumer.unacked -= 1
            if requeue:
                by_queue.setdefault(queue, []).append(entry)
            else:
                queue.reject(entry)
                by_queue.setdefault(queue, [])
        for queue, entries in by_queue.items():
            if entries:
                if closing:
                    queue.return_unacked(entries)
                else:
                    queue.requeue(entries, dispatch=False)
        self._redispatch(by_queue)

    def _take(self, tag: int, multiple: bool, peek: bool = False) -> list:
        """Remove and return the unacked deliveries an ack/nack/reject names."""
        unacked = self.unacked
        if tag == 0 and multiple:
            if peek:
                return []
            taken = list(unacked.values())
            unacked.clear()
            self.unacked_count = 0
            return taken
        if tag not in unacked:
            raise ChannelError(PRECONDITION_FAILED, f"unknown delivery tag {tag}", CLASS_BASIC, 80)
        if peek:
            return []
        if not multiple:
            self.unacked_count -= 1
            return [unacked.pop(tag)]
        taken = []
        for key in list(unacked):  # tags are in ascending order
            if key > tag:
                break
            taken.append(unacked.pop(key))
        self.unacked_count -= len(taken)
        return taken

    def _redispatch(self, queues) -> None:
        if self.global_prefetch and self.consumers:
            # Channel-wide prefetch: freed capacity may belong to any of our consumers.
            queues = set(queues) | {c.queue for c in self.consumers.values()}
            for queue in queues:
                if queue.consumers and queue.ready:
                    queue.dispatch()
            if self.conn.broker.mesh is not None:
                # What the local queues left of the window goes to consumers on
                # other workers' queues (credit).
                self.vhost.crossing.grant(self)
            return
        for queue in queues:
            if queue.consumers and queue.ready:
                queue.dispatch()

    def on_basic_recover_async(self, m: cmd.Basic.RecoverAsync) -> None:
        if not m.requeue:
            raise ConnectionError_(NOT_IMPLEMENTED, "requeue=false", CLASS_BASIC, 100)
        self._return_or_drop(self._take(0, True), True)

    def on_basic_recover(self, m: cmd.Basic.Recover) -> None:
        if not m.requeue:
            raise ConnectionError_(NOT_IMPLEMENTED, "requeue=false", CLASS_BASIC, 110)
        self._return_or_drop(self._take(0, True), True)
        self.send_method(cmd.Basic.RecoverOk())

    # --- teardown -----------------------------------------------------------

    # --- moving the connection to another worker (workers/affinity.py) ------------

    def cannot_move(self) -> str | None:
        """Why this channel's state cannot go to another process (None: it can):
        consumers, deliveries not acked, a transaction with work in it, confirms not
        sent yet, direct reply-to; or it is closing."""
        if self.closing:
            return "a channel is closing"
        if self.consumers or self.reply_token is not None:
            return "a channel has consumers"
        if self.unacked:
            return "a channel has unacked deliveries"
        tx = self.tx
        if tx is not None and (tx.publishes or tx.settlements):
            return "a channel has an open transaction"
        if self.confirm_waiting or self.confirmed_upto != self.publish_seq:
            return "a channel has confirms outstanding"
        return None

    def export_state(self) -> dict[str, Any]:
        """What a channel of the same number on another worker needs to continue this
        one as the client knows it: delivery tags and publish sequence numbers go on
        from where they are, qos, flow, confirm or tx mode (see `cannot_move`)."""
        return {
            "number": self.number,
            "flow_active": self.flow_active,
            "prefetch_count": self.prefetch_count,
            "global_prefetch": self.global_prefetch,
            "delivery_tag": self.delivery_tag,
            "confirm_mode": self.confirm_mode,
            "publish_seq": self.publish_seq,
            "confirmed_upto": self.confirmed_upto,
            "tx": self.tx is not None,
            "last_queue_name": self.last_queue_name,
            "generated_queue_name": self.generated_queue_name,
        }

    def import_state(self, state: dict[str, Any]) -> None:
        """Continue the channel `export_state` described (a new channel of this number)."""
        self.flow_active = state["flow_active"]
        self.prefetch_count = state["prefetch_count"]
        self.global_prefetch = state["global_prefetch"]
        self.delivery_tag = state["delivery_tag"]
        self.confirm_mode = state["confirm_mode"]
        self.publish_seq = state["publish_seq"]
        # Counted as confirmed by the worker it came from (its stats), not again here.
        self.confirms_folded = state["publish_seq"]
        self.confirmed_upto = state["confirmed_upto"]
        self.tx = Transaction() if state["tx"] else None
        self.last_queue_name = state["last_queue_name"]
        self.generated_queue_name = state["generated_queue_name"]
        self.update_deliverable()

    def cleanup(self) -> None:
        """Channel closed: drop consumers, requeue what it had not acked."""
        self.closing = True
        # Its counts go on counting in the connection's totals (cleanup may run twice).
        self.stats.publish_confirm = self.publish_seq - self.confirms_folded
        self.confirms_folded = self.publish_seq
        self.conn.stats.add(self.stats)
        self.stats = MessageStats()
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        self.deliverable = False
        self.tx = None
        # Nothing may follow the channel's close (or close-ok) on it: confirms not
        # sent yet are dropped, as RabbitMQ drops them once a channel is closing.
        self.conn.forget_confirms(self)
        self.confirm_waiting.clear()
        self._stop_direct_reply()
        for consumer in list(self.consumers.values()):
            queue = consumer.queue
            queue.remove_consumer(consumer)
            self.vhost.maybe_auto_delete(queue)
        self.consumers.clear()
        if self.unacked:
            taken = list(self.unacked.values())
            self.unacked.clear()
            self.unacked_count = 0
            self._return_or_drop(taken, True, closing=True)
