"""The channel's one permission choke point, as RabbitMQ's channel checks them.

Every method a channel handles passes Guard.check_method before its handler,
and every publish passes Guard.check_publish; handlers themselves never check
permissions. A connection whose user may do everything in its vhost (".*" for
configure, write and read, no topic permissions) has no guard at all, so the
publish hot path then costs one `is None` test. Changes to a user's
permissions replace the guard (Admin → AMQPConnection.access_changed), which
applies them from the next operation on, as in RabbitMQ.

Which permission each method needs (RabbitMQ's rabbit_channel):
  exchange.declare  configure on the exchange; with alternate-exchange also
                    write on the AE and read on the exchange (passive: none)
  exchange.delete   configure on the exchange
  exchange.(un)bind write on the destination, read on the source, topic read
  queue.declare     configure on the queue (server-named: its generated name);
                    with x-dead-letter-exchange also read on the queue and
                    write on the DLX (passive: none)
  queue.(un)bind    write on the queue, read on the exchange, topic read
  queue.purge       read;  queue.delete  configure
  basic.consume/get read on the queue
  basic.publish     write on the exchange, topic write on the routing key
The default exchange is checked under the name "amq.default". Checks that
RabbitMQ makes before permissions (reserved amq.* names, the default
exchange) are left to the handlers, which run them first by not being
guarded here.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from leveret.auth.users import Permission, TopicPermission
from leveret.broker.direct_reply import PSEUDO_QUEUE
from leveret.protocol.constants import (
    ACCESS_REFUSED,
    BASIC_CONSUME,
    BASIC_GET,
    EXCHANGE_BIND,
    EXCHANGE_DECLARE,
    EXCHANGE_DELETE,
    EXCHANGE_UNBIND,
    QUEUE_BIND,
    QUEUE_DECLARE,
    QUEUE_DELETE,
    QUEUE_PURGE,
    QUEUE_UNBIND,
)
from leveret.protocol.errors import ChannelError

if TYPE_CHECKING:
    from leveret.broker.vhost import VirtualHost
    from leveret.server.channel import Channel


class Guard:
    """Permission checks for one user in one vhost, with expressions compiled once."""

    __slots__ = ("user", "vhost", "perm", "topics", "_write_ok", "_topic_regex")

    def __init__(
        self,
        user: str,
        vhost: VirtualHost,
        perm: Permission | None,
        topics: dict[str, TopicPermission],
    ) -> None:
        self.user = user
        self.vhost = vhost
        self.perm = perm  # None: no access at all (revoked while connected)
        self.topics = topics
        self._write_ok: dict[str, bool] = {}  # publish decisions per exchange name
        self._topic_regex: dict[tuple[str, str], re.Pattern[str] | None] = {}

    @staticmethod
    def needed(perm: Permission | None, topics: dict[str, TopicPermission]) -> bool:
        """False when a guard would allow everything (the fast path)."""
        return perm is None or not perm.unrestricted or bool(topics)

    # --- the checks -------------------------------------------------------------

    def _refuse(self, kind: str, name: str) -> ChannelError:
        return ChannelError(
            ACCESS_REFUSED,
            f"access to {kind} '{name}' in vhost '{self.vhost.name}' refused for user "
            f"'{self.user}'",
        )

    def require(self, permission: str, kind: str, name: str) -> None:
        if kind == "queue" and not name:
            return  # no queue named: the handler answers 404 "no previously declared queue"
        if kind == "exchange" and name == "":
            name = "amq.default"
        perm = self.perm
        if perm is None or not perm.allows(permission, name):
            raise self._refuse(kind, name)

    def require_topic(self, permission: str, exchange_name: str, routing_key: str) -> None:
        """Topic permissions apply to topic exchanges that have one for this user."""
        topic = self.topics.get(exchange_name)
        if topic is None:
            return
        exchange = self.vhost.exchanges.get(exchange_name)
        if exchange is None or exchange.type_name != "topic":
            return
        key = (exchange_name, permission)
        if key not in self._topic_regex:
            self._topic_regex[key] = topic.compiled(permission)
        regex = self._topic_regex[key]
        if regex is None or regex.search(routing_key) is None:
            raise ChannelError(
                ACCESS_REFUSED,
                f"access to topic '{routing_key}' in exchange '{exchange_name}' in vhost "
                f"'{self.vhost.name}' refused for user '{self.user}'",
            )

    def check_publish(self, exchange: str, routing_key: str) -> None:
        ok = self._write_ok.get(exchange)
        if ok is None:
            name = exchange or "amq.default"
            ok = self._write_ok[exchange] = self.perm is not None and self.perm.allows(
                "write", name
            )
        if not ok:
            raise self._refuse("exchange", exchange or "amq.default")
        if self.topics:
            self.require_topic("write", exchange, routing_key)

    def check_method(self, channel: Channel, m: Any) -> None:
        """Raise 403 if this user may not run method `m` on `channel`."""
        index = m.index
        if index == QUEUE_DECLARE:
            if m.passive or m.queue == PSEUDO_QUEUE:
                return
            if not m.queue:
                # Checked under the name it will get, as RabbitMQ does.
                channel.generated_queue_name = self.vhost.new_queue_name()
                name = channel.generated_queue_name
            elif m.queue.startswith("amq."):
                return  # the handler refuses the reserved name first
            else:
                name = m.queue
            self.require("configure", "queue", name)
            dlx = (m.arguments or {}).get("x-dead-letter-exchange")
            if isinstance(dlx, str | bytes):
                self.require("read", "queue", name)
                self.require("write", "exchange", dlx.decode() if isinstance(dlx, bytes) else dlx)
        elif index == EXCHANGE_DECLARE:
            if m.passive or not m.exchange:
                return
            self.require("configure", "exchange", m.exchange)
            ae = (m.arguments or {}).get("alternate-exchange")
            if isinstance(ae, str | bytes):
                self.require("write", "exchange", ae.decode() if isinstance(ae, bytes) else ae)
                self.require("read", "exchange", m.exchange)
        elif index == EXCHANGE_DELETE:
            if m.exchange and not m.exchange.startswith("amq."):
                self.require("configure", "exchange", m.exchange)
        elif index in (QUEUE_BIND, QUEUE_UNBIND):
            self.require("write", "queue", _queue_name(channel, m.queue))
            self._check_source(m.exchange, m.routing_key)
        elif index in (EXCHANGE_BIND, EXCHANGE_UNBIND):
            self.require("write", "exchange", m.destination)
            self._check_source(m.source, m.routing_key)
        elif index == QUEUE_PURGE:
            self.require("read", "queue", _queue_name(channel, m.queue))
        elif index == QUEUE_DELETE:
            self.require("configure", "queue", _queue_name(channel, m.queue))
        elif index in (BASIC_CONSUME, BASIC_GET):
            if m.queue != PSEUDO_QUEUE:
                self.require("read", "queue", _queue_name(channel, m.queue))

    def _check_source(self, exchange: str, routing_key: str) -> None:
        if exchange:  # binding to or from the default exchange is refused by the handler
            self.require("read", "exchange", exchange)
            if self.topics:
                self.require_topic("read", exchange, routing_key)


def _queue_name(channel: Channel, name: str) -> str:
    """An empty queue field means the channel's last declared queue."""
    return name or channel.last_queue_name or ""
