"""Channel handlers for the methods that manage the model: exchange.*, queue.*.

A mixin of Channel, split out because these are request/response methods with
no message flow; they read best as a list of small handlers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pamqp import commands as cmd

from leveret.broker.direct_reply import PSEUDO_QUEUE
from leveret.broker.queues import Queue
from leveret.protocol import methods as wire
from leveret.protocol.constants import NOT_FOUND, PRECONDITION_FAILED
from leveret.protocol.errors import ChannelError

if TYPE_CHECKING:
    from leveret.protocol.events import Publish


def _args(table: Any) -> dict[str, Any]:
    return dict(table) if table else {}


class ModelMethods:
    """exchange.* and queue.* handlers; `self` is a server.channel.Channel (its
    `vhost`, `conn` and `last_queue_name` are what these read)."""

    def send_method(self, method: Any) -> None:  # provided by Channel
        raise NotImplementedError

    def on_publish(self, event: Publish) -> None:  # provided by PublishMethods
        """Declared on this base so that the connection's read loop, which may only
        know this layer (server/connection_io.pxd), calls it as a C method."""
        raise NotImplementedError

    # --- exchange -----------------------------------------------------------

    def on_exchange_declare(self, m: cmd.Exchange.Declare) -> None:
        arguments = _args(m.arguments)
        if not m.passive:
            self.vhost.check_alternate_type(m.exchange, m.exchange_type, arguments)
        self.vhost.declare_exchange(
            m.exchange,
            m.exchange_type,
            m.passive,
            m.durable,
            m.auto_delete,
            m.internal,
            arguments,
            self.conn.user or "",
        )
        if not m.nowait:
            self.send_method(cmd.Exchange.DeclareOk())

    def on_exchange_delete(self, m: cmd.Exchange.Delete) -> None:
        self.vhost.delete_exchange(m.exchange, m.if_unused)
        if not m.nowait:
            self.send_method(cmd.Exchange.DeleteOk())

    def on_exchange_bind(self, m: cmd.Exchange.Bind) -> None:
        vhost = self.vhost
        vhost.bind(
            vhost.get_exchange(m.source),
            vhost.get_exchange(m.destination),
            m.routing_key,
            _args(m.arguments),
        )
        if not m.nowait:
            self.send_method(cmd.Exchange.BindOk())

    def on_exchange_unbind(self, m: cmd.Exchange.Unbind) -> None:
        self.vhost.unbind(m.source, m.destination, False, m.routing_key, _args(m.arguments))
        if not m.nowait:
            self.send_method(cmd.Exchange.UnbindOk())

    # --- queue --------------------------------------------------------------

    def queue_by_name(self, name: str) -> Queue:
        """A queue for a method's queue field; empty means the channel's last declared queue."""
        if not name:
            if not self.last_queue_name:
                raise ChannelError(NOT_FOUND, "no previously declared queue")
            name = self.last_queue_name
        return self.vhost.get_queue(name, self.conn)

    def on_queue_declare(self, m: cmd.Queue.Declare) -> None:
        if m.queue == PSEUDO_QUEUE and m.passive:
            # RabbitMQ answers a passive declare of the reply-to pseudo-queue, with
            # 0 messages and 1 consumer (recorded: tests/compat/amqp, ext.direct_reply_to).
            if not m.nowait:
                self.send_method(wire.unchecked(cmd.Queue.DeclareOk, m.queue, 0, 1))
            return
        name, server_named = m.queue, False
        if not name and not m.passive:
            name, server_named = self.generated_queue_name or self.vhost.new_queue_name(), True
            self.generated_queue_name = None
        queue = self.vhost.declare_queue(
            name,
            m.passive,
            m.durable,
            m.exclusive,
            m.auto_delete,
            _args(m.arguments),
            self.conn,
            server_named,
            default_type=True,
        )
        if queue.exclusive_owner is self.conn:
            self.conn.exclusive_queues.add(queue)
        self.last_queue_name = queue.name
        if not m.nowait:
            self.send_method(
                wire.unchecked(
                    cmd.Queue.DeclareOk, queue.name, queue.message_count, queue.consumer_count
                )
            )

    def on_queue_bind(self, m: cmd.Queue.Bind) -> None:
        queue = self.queue_by_name(m.queue)
        self.vhost.bind(
            self.vhost.get_exchange(m.exchange), queue, m.routing_key, _args(m.arguments)
        )
        if not m.nowait:
            self.send_method(cmd.Queue.BindOk())

    def on_queue_unbind(self, m: cmd.Queue.Unbind) -> None:
        name = m.queue or self.last_queue_name
        if not name:
            raise ChannelError(NOT_FOUND, "no previously declared queue")
        self.vhost.unbind(m.exchange, name, True, m.routing_key, _args(m.arguments), self.conn)
        self.send_method(cmd.Queue.UnbindOk())

    def on_queue_purge(self, m: cmd.Queue.Purge) -> None:
        queue = self.queue_by_name(m.queue)
        if queue.remote:  # the owner purges and counts
            self.vhost.crossing.purge(self, m, queue)
            return
        count = self.vhost.purge_queue(queue)
        if not m.nowait:
            self.send_method(cmd.Queue.PurgeOk(count))

    def on_queue_delete(self, m: cmd.Queue.Delete) -> None:
        name = m.queue or self.last_queue_name or ""
        if name not in self.vhost.queues:
            # Deleting a missing queue succeeds, as in RabbitMQ 3.x.
            if not m.nowait:
                self.send_method(cmd.Queue.DeleteOk(0))
            return
        queue = self.queue_by_name(name)
        if m.if_unused and queue.consumers:
            raise ChannelError(PRECONDITION_FAILED, f"{queue.describe()} in use")
        if m.if_empty and queue.message_count:
            raise ChannelError(PRECONDITION_FAILED, f"{queue.describe()} not empty")
        # delete-ok goes out before the basic.cancel notifications for the queue's
        # consumers, as from RabbitMQ: py-amqp raises on a cancel it receives while
        # it waits for delete-ok for a consumer on the same channel (kombu's suite).
        if not m.nowait:
            self.send_method(cmd.Queue.DeleteOk(queue.message_count))
        self.vhost.delete_queue(queue)
        self.conn.exclusive_queues.discard(queue)
