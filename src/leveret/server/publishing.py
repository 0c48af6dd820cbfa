"""Channel handlers on the publishing side: basic.publish and its content frames,
routing, mandatory returns, publisher confirms and transactions.

A mixin of Channel, split out along the publish/consume seam. Hot path:
basic.publish is decoded by hand and the header is kept as the bytes that
arrived.
"""

from __future__ import annotations

import json
import logging
from functools import partial

from pamqp import commands as cmd

from leveret.broker import direct_reply, stream_offsets
from leveret.broker.durability import WriteBarrier
from leveret.broker.exchange import Exchange
from leveret.broker.message import Message
from leveret.broker.queue_args import amqp_type_name, parse_expiration
from leveret.broker.queues.base import Queue
from leveret.broker.stats import MessageStats
from leveret.protocol import methods as wire
from leveret.protocol.constants import (
    ACCESS_REFUSED,
    CLASS_BASIC,
    NO_ROUTE,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    RESOURCE_ERROR,
)
from leveret.protocol.errors import ChannelError, ConnectionError_
from leveret.protocol.events import Publish  # a C type when compiled (events.pxd)
from leveret.protocol.fieldtable import join_table, split_table
from leveret.protocol.properties import (
    FLAG_EXPIRATION,
    FLAG_HEADERS,
    FLAG_REPLY_TO,
    FLAG_USER_ID,
    decode_properties,
    encode_header,
    publish_flags,
    rewrite_header,
    short_string,
    split_properties,
)
from leveret.server.model_methods import ModelMethods

log = logging.getLogger("leveret.channel")

# Property flags on_publish tests, as C integers when compiled (publishing.pxd): a
# test against a module-level Python int would box the C `flags` first.
_C_USER_ID = FLAG_USER_ID
_C_SPECIAL = FLAG_REPLY_TO | FLAG_EXPIRATION | FLAG_HEADERS  # the broker acts on these

MAX_MESSAGE_SIZE = 128 * 1024 * 1024  # RabbitMQ's default max_message_size


class Transaction:
    __slots__ = ("publishes", "settlements")

    def __init__(self) -> None:
        self.publishes: list[tuple[Exchange, Message, bool]] = []
        self.settlements: list[tuple[str, int, bool, bool]] = []


class FailureReporter:
    """Barrier-like sink for writes nobody waits for; only failures matter."""

    __slots__ = ("add",)

    def __init__(self, on_failure) -> None:
        self.add = lambda: on_failure


class PublishMethods(ModelMethods):
    """basic.publish, confirm.*, tx.*; `self` is a server.channel.Channel."""

    # --- publishing (hot path) ----------------------------------------------

    def on_publish(self, event: Publish) -> None:
        """basic.publish with its content, as the protocol core assembled it."""
        # (Compiled, `flags` and `delivery_mode` are C integers: publishing.pxd.)
        if event.immediate:
            raise ConnectionError_(NOT_IMPLEMENTED, "immediate=true", CLASS_BASIC, 40)
        self.stats.publish += 1
        conn = self.conn
        if conn.alarm_reason is not None:
            conn.publishing_while_alarmed()
        guard = conn.guard
        if guard is not None:  # permissions (server.authorization); None: may do anything
            guard.check_publish(event.exchange, event.routing_key)
        exchange = self.exchanges.get(event.exchange)
        if exchange is None:
            raise ChannelError(
                NOT_FOUND, f"no exchange '{event.exchange}' in vhost '{self.vhost.name}'"
            )
        if exchange.internal:
            raise ChannelError(ACCESS_REFUSED, f"cannot publish to internal {exchange.describe()}")
        header = event.header
        flags = publish_flags(header)  # property flags << 8 | delivery_mode
        delivery_mode = flags & 0xFF
        flags >>= 8
        if flags & _C_USER_ID:
            self._check_user_id(header)
        name = exchange.name
        message = Message(
            name,
            event.routing_key,
            header,
            event.body,
            flags,
            delivery_mode == 2,
            # The names as they arrived, unless the exchange was found under another.
            event.names if name == event.exchange else None,
        )
        if flags & _C_SPECIAL:
            self._apply_special_properties(message, flags)
            check = exchange.router.check_publish  # the delayed exchange's x-delay
            if check is not None:
                check(message)
        if self.tx is not None:
            self.tx.publishes.append((exchange, message, event.mandatory))
            return
        self._route(exchange, message, event.mandatory)

    def _check_user_id(self, header: bytes) -> None:
        user_id = decode_properties(header).user_id
        if user_id != self.conn.user and not self.conn.impersonator:
            raise ChannelError(
                PRECONDITION_FAILED,
                f"user_id property set to '{user_id}' but authenticated user was "
                f"'{self.conn.user}'",
                CLASS_BASIC,
                40,
            )

    def _apply_special_properties(self, message: Message, flags: int) -> None:
        """Properties the broker acts on: expiration, CC/BCC, direct reply-to."""
        changes: dict[int, bytes] = {}
        if flags & FLAG_EXPIRATION:
            message.ttl = parse_expiration(message.properties.expiration)
        if flags & FLAG_HEADERS and (b"\x02CC" in message.header or b"\x03BCC" in message.header):
            headers = message.headers or {}
            keys = [message.routing_key]
            for name in ("CC", "BCC"):
                if name in headers:
                    extra = headers[name]
                    if not isinstance(extra, list):
                        raise ChannelError(
                            PRECONDITION_FAILED,
                            f'invalid message: {{unacceptable_type_in_header,"{name}",'
                            f"{amqp_type_name(extra)}}}",
                            CLASS_BASIC,
                            40,
                        )
                    keys += [k.decode() if isinstance(k, bytes) else str(k) for k in extra]
            if "BCC" in headers:
                # Blind copies must not show up in deliveries.
                table = split_table(split_properties(message.header)[FLAG_HEADERS])
                del table["BCC"]
                changes[FLAG_HEADERS] = join_table(table)
            message.routing_keys = keys
        if flags & FLAG_REPLY_TO and message.properties.reply_to == direct_reply.PSEUDO_QUEUE:
            if self.reply_token is None:
                raise ChannelError(
                    PRECONDITION_FAILED, "fast reply consumer does not exist", CLASS_BASIC, 40
                )
            changes[FLAG_REPLY_TO] = short_string(direct_reply.PREFIX + self.reply_token)
        if changes:
            message.set_header(rewrite_header(message.header, changes))

    def _route(
        self,
        exchange: Exchange,
        message: Message,
        mandatory: bool,
        barrier: WriteBarrier | None = None,
    ) -> None:
        if exchange is not self.default_exchange:
            if message.routing_keys is None:
                queues = self.vhost.route(exchange, message)
            else:
                queues = self.vhost.route_keys(exchange, message, message.routing_keys)
        else:
            routing_key = message.routing_key
            if routing_key.startswith("amq."):
                # Names no queue can have: direct reply-to and Leveret's extensions.
                if routing_key.startswith(direct_reply.PREFIX):
                    self._route_direct_reply(message, mandatory)
                    return
                if routing_key == stream_offsets.ROUTING_KEY:
                    self._answer_stream_offsets(message)
                    return
            if message.routing_keys is None:
                # The queue of that name (vhost.route's first case, without the call).
                queue = self.queues.get(routing_key)
                queues = [queue] if queue is not None else []
            else:
                queues = self.vhost.route_keys(exchange, message, message.routing_keys)
        stats: MessageStats = exchange.stats
        stats.publish_in += 1
        seq = 0
        if self.confirm_mode:
            self.publish_seq += 1
            seq = self.publish_seq
            self.conn.confirms_due(self)
        if queues:
            stats.publish_out += 1
            if (
                barrier is None
                and (message.persistent or (self.vhost.persisting and _stores_transient(queues)))
                # (crossing: a worker's queues on other workers confirm when they have it)
                and (self.vhost.hooks.active or self.vhost.crossing is not None)
            ):
                if seq:
                    # The confirm waits for the fsync of every durable queue's copy.
                    self.confirm_waiting[seq] = None
                    barrier = WriteBarrier(partial(self._confirm_written, seq))
                else:
                    barrier = self._write_failures
            # Durable fan-out: the store may write the body once for every queue.
            shared = barrier is not None and len(queues) > 1
            shared = shared and self.vhost.hooks.share_body(message, queues, barrier)
            accepted = True
            queue: Queue  # compiled: a C type, so enqueue() is a C call
            try:
                for target in queues:
                    if not isinstance(target, Queue):  # a delayed exchange's store
                        if not target.enqueue(message, barrier):
                            accepted = False
                        continue
                    queue = target
                    if not queue.enqueue(message, barrier):
                        accepted = False
                    if queue.consumers_behind():
                        self.conn.maybe_throttle(queue)
            finally:
                if shared:
                    self.vhost.hooks.share_done()
            if not accepted and seq:
                self.confirm_waiting[seq] = False  # x-overflow=reject-publish
            if seq and barrier is not None:
                barrier.seal()
        elif mandatory:
            self.stats.return_unroutable += 1
            returned = wire.encode_method(
                wire.unchecked(
                    cmd.Basic.Return, NO_ROUTE, "NO_ROUTE", exchange.name, message.routing_key
                ),
                self.number,
            )
            self._send_content(returned, message)
        else:
            self.stats.drop_unroutable += 1

    def _confirm_written(self, seq: int, error: BaseException | None) -> None:
        waiting = self.confirm_waiting
        if waiting.get(seq, 0) is None:
            waiting[seq] = error is None
            if error is not None:
                log.error(
                    "persistent message %d on channel %d not stored, nacking: %s",
                    seq,
                    self.number,
                    error,
                )
            if not self.closing:
                self.conn.confirms_due(self)

    def _persist_failed(self, error: BaseException | None) -> None:
        """A publish without confirms could not be stored: say so by closing the channel."""
        if error is None or self.closing or self.conn.state != "opened":
            return
        self.close_with_error(
            ChannelError(
                RESOURCE_ERROR,
                f"RESOURCE_ERROR - could not store a persistent message on disk: {error}",
                CLASS_BASIC,
                40,
            )
        )

    def _answer_stream_offsets(self, request: Message) -> None:
        """The tail-offsets extension (broker/stream_offsets.py): reply to reply_to."""
        if self.confirm_mode:
            self.publish_seq += 1
            self.conn.confirms_due(self)
        if not request.properties.reply_to:
            return  # nowhere to answer; like an unroutable publish without mandatory
        stream_offsets.when_readable(
            self.vhost, request.body or b"", lambda: self._reply_stream_offsets(request)
        )

    def _reply_stream_offsets(self, request: Message) -> None:
        props = request.properties
        body = json.dumps(stream_offsets.answer(self.vhost, request.body or b"")).encode()
        reply_props = cmd.Basic.Properties(
            content_type="application/json", correlation_id=props.correlation_id
        )
        header = encode_header(len(body), reply_props)
        reply = Message("", props.reply_to, header, body, int.from_bytes(header[12:14]), False)
        if props.reply_to.startswith(direct_reply.PREFIX):
            target = self.conn.broker.direct_reply.lookup(props.reply_to)
            if target is not None and not target.closing:
                target.deliver_reply(reply)
        else:
            queue = self.vhost.queues.get(props.reply_to)
            if queue is not None:
                queue.enqueue(reply)

    def _route_direct_reply(self, message: Message, mandatory: bool) -> None:
        target = self.conn.broker.direct_reply.lookup(message.routing_key)
        if self.confirm_mode:
            self.publish_seq += 1
            self.conn.confirms_due(self)
        if target is not None and not target.closing:
            target.deliver_reply(message)
        elif mandatory:
            returned = wire.encode_method(
                wire.unchecked(cmd.Basic.Return, NO_ROUTE, "NO_ROUTE", "", message.routing_key),
                self.number,
            )
            self._send_content(returned, message)

    def deliver_reply(self, message: Message) -> None:
        """A direct reply-to delivery: no queue, no ack (the consumer is no-ack)."""
        self.delivery_tag += 1
        deliver = wire.encode_deliver(
            self.number,
            wire.deliver_prefix(self.reply_consumer_tag or ""),
            self.delivery_tag,
            False,
            message.exchange_and_key,
        )
        self._send_content(deliver, message)

    def flush_confirms(self) -> None:
        """Send one basic.ack (multiple) for every confirm that has become ready.

        Called once per loop turn by the connection, so a burst of publishes
        costs one ack frame, not one per message.  Never once the channel is
        closing: no frame may follow its channel.close or close-ok.
        """
        if self.closing:
            return
        waiting = self.confirm_waiting
        upto = self.confirmed_upto
        out = []
        if waiting:
            for seq in list(waiting):
                state = waiting[seq]
                if state is None:
                    break
                del waiting[seq]
                if state is False:
                    if seq - 1 > upto:
                        out.append(wire.encode_confirm(self.number, seq - 1, True))
                    out.append(wire.encode_confirm(self.number, seq, False, nack=True))
                    upto = seq
            last = next(iter(waiting)) - 1 if waiting else self.publish_seq
        else:
            last = self.publish_seq
        if last > upto:
            out.append(wire.encode_confirm(self.number, last, last - upto > 1))
            upto = last
        self.stats.confirm += upto - self.confirmed_upto
        self.confirmed_upto = upto
        if out:
            self.conn.write(b"".join(out))

    # --- confirm and tx -----------------------------------------------------

    def on_confirm_select(self, m: cmd.Confirm.Select) -> None:
        if self.tx is not None:
            raise ChannelError(PRECONDITION_FAILED, "cannot switch from tx to confirm mode")
        self.confirm_mode = True
        if not m.nowait:
            self.send_method(cmd.Confirm.SelectOk())

    def on_tx_select(self, m: cmd.Tx.Select) -> None:
        if self.confirm_mode:
            raise ChannelError(PRECONDITION_FAILED, "cannot switch from confirm to tx mode")
        if self.tx is None:
            self.tx = Transaction()
        self.send_method(cmd.Tx.SelectOk())

    def on_tx_commit(self, m: cmd.Tx.Commit) -> None:
        tx = self.tx
        if tx is None:
            raise ChannelError(PRECONDITION_FAILED, "channel is not transactional")
        self.tx = None  # apply for real, then start the next transaction
        # commit-ok goes out only once the transaction's persistent messages are on disk.
        barrier = WriteBarrier(self._tx_written)
        try:
            for exchange, message, mandatory in tx.publishes:
                if not exchange.deleted:
                    self._route(exchange, message, mandatory, barrier)
            for kind, tag, multiple, requeue in tx.settlements:
                if kind == "ack":
                    self.ack(tag, multiple)
                else:
                    self._settle_negative(kind, tag, multiple, requeue)
        finally:
            self.tx = Transaction()
        barrier.seal()

    def _tx_written(self, error: BaseException | None) -> None:
        if self.closing or self.conn.state != "opened":
            return
        if error is not None:
            self.close_with_error(
                ChannelError(
                    RESOURCE_ERROR,
                    f"RESOURCE_ERROR - tx.commit failed: could not store messages on disk: {error}",
                    90,
                    20,
                )
            )
            return
        self.send_method(cmd.Tx.CommitOk())

    def on_tx_rollback(self, m: cmd.Tx.Rollback) -> None:
        if self.tx is None:
            raise ChannelError(PRECONDITION_FAILED, "channel is not transactional")
        self.tx = Transaction()
        self.send_method(cmd.Tx.RollbackOk())


def _stores_transient(queues: list) -> bool:
    """Whether a queue keeps transient messages on disk too (a quorum queue), or on
    another worker (a RemoteQueue): then the confirm of a transient message also
    waits for the fsync, or for the owner. Asked of transient
    messages only, and only in a vhost that has such queues (vhost.persisting)."""
    for queue in queues:
        # (getattr: a delayed exchange's DelayedMessages stands in the list as a queue)
        if getattr(queue, "persists_all", False):
            return True
    return False
