"""A federated queue's link to one upstream queue.

The link consumes the upstream queue (with consumer priority -1, so the
upstream's own consumers come first) only while the downstream queue has a
consumer that can take a message and no messages of its own: then it moves
messages over, one prefetch window at a time, and publishes them to the
downstream queue; otherwise it cancels its upstream consumer. RabbitMQ's queue
decorator is told of every change in a queue's consumers and emptiness; here
the link looks at the queue every POLL seconds, which keeps the queue's own
code (and its hot paths) untouched.

Messages get an `x-received-from` entry (uri, queue, redelivered,
visit-count); on their first hop also `x-original-exchange` and
`x-original-routing-key`, and a `CC` header becomes `x-original-cc`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from leveret.client.errors import NotFound
from leveret.links import headers as hd
from leveret.links.exchange_link import _disposable
from leveret.links.federation import FederationLink
from leveret.links.forwarder import Forwarder, LinkFailed
from leveret.protocol import fieldtable as ft

if TYPE_CHECKING:
    from leveret.client.message import Message

log = logging.getLogger("leveret.links")

POLL = 0.1  # seconds between two looks at the downstream queue


class QueueLink(FederationLink):
    kind = "queue"

    def wanted(self) -> bool:
        """RabbitMQ's rule: run when the queue is empty and has an active consumer of
        priority 0 or more (one whose prefetch leaves room)."""
        vhost = self.manager.broker.vhosts.get(self.vhost)
        queue = vhost.queues.get(self.name) if vhost is not None else None
        if queue is None or queue.message_count > 0:
            return False
        return any(c.active and c.priority >= 0 and c.can_take() for c in queue.consumers)

    async def _session(self) -> None:
        up = self.upstream
        upstream, downstream, uri = await self._connect()
        caps = upstream.server_properties.get("capabilities") or {}
        if not caps.get("consumer_priorities"):
            raise LinkFailed("upstream_lacks_consumer_priorities")
        vhost = self.manager.broker.vhosts[self.vhost]
        queue = vhost.queues.get(self.name)
        if queue is None:
            return
        name = up.queue
        try:
            await _disposable(
                upstream, lambda ch: ch.declare_queue(name, passive=True), raise_=True
            )
        except NotFound:
            ch = await upstream.channel(confirms=False)
            try:
                await ch.declare_queue(
                    name,
                    durable=queue.durable,
                    auto_delete=queue.auto_delete,
                    arguments=dict(queue.arguments),
                )
            finally:
                await ch.close()
        dch = await downstream.channel(confirms=up.ack_mode == "on-confirm")
        uch = await upstream.channel(confirms=False)
        forwarder = Forwarder(
            uch,
            name,
            dch,
            self._transform(uri.safe),
            ack_mode=up.ack_mode,
            prefetch=up.prefetch,
            consumer_tag=up.consumer_tag,
            consumer_arguments={"x-priority": -1},
            on_moved=self.moved,
        )
        self.forwarder = forwarder
        try:
            await forwarder.start(consume=False)  # consumes only while the queue wants messages
            self.running(downstream)
            while not forwarder.finished.done():
                want = self.wanted()
                if want and forwarder.paused:
                    await forwarder.resume()
                elif not want and not forwarder.paused:
                    await forwarder.pause()
                await asyncio.wait([forwarder.finished], timeout=POLL)
            forwarder.finished.result()
        finally:
            await forwarder.stop()

    def _transform(self, safe_uri: str) -> Any:
        target = self.name
        base = [("uri", safe_uri), ("queue", target)]
        trust = self.upstream.trust_user_id

        def transform(message: Message) -> tuple[str, str, bytes]:
            def edit(table: dict[str, bytes]) -> None:
                raw = table.get(hd.RECEIVED_FROM)
                visits = 0
                if raw is not None and raw[:1] == b"A":
                    kept = []
                    for element in ft.split_array(raw):
                        if element[:1] == b"F" and _matches(element, safe_uri, target):
                            count = ft.decode_value(element).get("visit-count")
                            visits = count if isinstance(count, int) else 0
                        else:
                            kept.append(element)
                    table[hd.RECEIVED_FROM] = ft.join_array(kept)
                else:
                    table.pop(hd.RECEIVED_FROM, None)
                    table["x-original-exchange"] = ft.encode_value(message.exchange)
                    table["x-original-routing-key"] = ft.encode_value(message.routing_key)
                if "CC" in table:
                    table["x-original-cc"] = table.pop("CC")
                entry = [
                    *base,
                    ("redelivered", message.redelivered),
                    ("visit-count", ft.Long(visits + 1)),
                ]
                hd.prepend(table, hd.RECEIVED_FROM, hd.longstr_table(entry))

            header = hd.rewrite(message.raw_header, edit, drop_user_id=not trust)
            return "", target, header

        return transform


def _matches(element: bytes, uri: str, queue: str) -> bool:
    try:
        value = ft.decode_value(element)
    except (ValueError, IndexError, TypeError):
        return False

    def text(v: Any) -> Any:
        return v.decode(errors="replace") if isinstance(v, bytes) else v

    return text(value.get("uri")) == uri and text(value.get("queue")) == queue
