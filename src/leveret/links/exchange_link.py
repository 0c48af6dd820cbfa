"""A federated exchange's link to one upstream.

On the upstream it makes what RabbitMQ's federation makes, with the same names,
so either broker can be on either side:

- the upstream exchange (declared like the downstream one if it is missing);
- a durable queue `federation: X -> <this broker's name>[:vhost:X]` with the
  upstream's `expires` and `message-ttl` (and `x-internal-purpose`);
- an internal exchange `<that queue> A` (or `B`, alternating over restarts) of
  type `x-federation-upstream` carrying max-hops and this broker's name, or a
  fanout when the upstream does not know that type (503), bound to the queue;
- for each distinct (routing key, arguments) of the downstream exchange's
  bindings, an exchange-to-exchange binding from the upstream exchange to the
  internal one, its arguments carrying `x-bound-from` (who asked, and how many
  hops further a federated upstream may pass the binding on).

It consumes that queue and publishes each message to the downstream exchange
with its routing key and an `x-received-from` entry; a message that has made
`max-hops` hops or already passed through this broker (and vhost) is dropped.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from leveret.client.errors import ClientError, ConnectionClosed, NotFound
from leveret.links import headers as hd
from leveret.links.federation import INTERNAL_PURPOSE, FederationLink
from leveret.links.forwarder import Forwarder
from leveret.protocol import fieldtable as ft
from leveret.protocol.constants import COMMAND_INVALID

if TYPE_CHECKING:
    from leveret.client.channel import Channel
    from leveret.client.connection import Connection
    from leveret.client.message import Message

log = logging.getLogger("leveret.links")

BOUND_FROM = "x-bound-from"
_suffixes: dict[tuple[str, str, str], str] = {}  # the internal exchange's suffix in use


class ExchangeLink(FederationLink):
    kind = "exchange"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._channel: Channel | None = None
        self._internal: str | None = None
        self._queue: str | None = None
        # upstream binding (_key) → the local bindings that make it (_local)
        self._bindings: dict[tuple[str, bytes], set[Any]] = defaultdict(set)
        self._upstream_vhost = "/"
        self._upstream_cluster: str | None = None
        self._accepting = False

    def queue_name(self, upstream_vhost: str) -> str:
        """RabbitMQ's upstream queue name: `federation: X -> node[:vhost:X]`."""
        node = self.manager.cluster_name
        if self.vhost == upstream_vhost:
            down = "" if self.name == self.upstream.exchange else f":{self.name}"
        else:
            down = f":{self.vhost}:{self.name}"
        return f"federation: {self.upstream.exchange} -> {node}{down}"

    async def _session(self) -> None:
        self._accepting = False
        try:
            await self._run_session()
        finally:
            self._accepting = False

    async def _run_session(self) -> None:
        up = self.upstream
        upstream, downstream, uri = await self._connect()
        self._upstream_vhost = uri.vhost
        cluster = upstream.server_properties.get("cluster_name")
        if isinstance(cluster, bytes):
            cluster = cluster.decode(errors="replace")
        self._upstream_cluster = cluster if isinstance(cluster, str) else None
        exchange = self.manager.broker.vhosts[self.vhost].exchanges.get(self.name)
        if exchange is None:
            return  # deleted meanwhile; the federation stops this link
        dch = await downstream.channel(confirms=up.ack_mode == "on-confirm")
        uch = await upstream.channel(confirms=False)
        self._channel = uch
        await self._ensure_upstream_exchange(upstream, exchange)
        queue = self.queue_name(uri.vhost)
        self._queue = queue
        arguments: dict[str, Any] = {}  # typed as RabbitMQ types them
        if up.expires is not None:
            arguments["x-expires"] = ft.Long(up.expires)
        if up.message_ttl is not None:
            arguments["x-message-ttl"] = ft.Long(up.message_ttl)
        arguments[INTERNAL_PURPOSE] = "federation"
        await uch.declare_queue(queue, durable=True, arguments=arguments)
        key = (self.vhost, self.name, up.name)
        old = _suffixes.get(key, "A")
        suffix = "B" if old == "A" else "A"
        internal = f"{queue} {suffix}"
        self._internal = internal
        await self._declare_internal(upstream, uch, internal)
        await uch.bind_queue(queue, internal, "")
        _suffixes[key] = suffix
        self._bindings.clear()
        self._accepting = True  # from here on, binding changes go upstream as they come
        for binding in list(exchange.bindings.values()):
            await self._add(binding)
        await _disposable(upstream, lambda ch: ch.delete_exchange(f"{queue} {old}"))
        forwarder = Forwarder(
            uch,
            queue,
            dch,
            self._transform(uri.safe),
            ack_mode=up.ack_mode,
            prefetch=up.prefetch,
            consumer_tag=up.consumer_tag,
            on_moved=self.moved,
        )
        self.forwarder = forwarder
        try:
            await forwarder.start()
            self.running(downstream)
            await forwarder.finished
        finally:
            await forwarder.stop()

    async def _ensure_upstream_exchange(self, upstream: Connection, exchange: Any) -> None:
        name = self.upstream.exchange
        try:
            await _disposable(
                upstream, lambda ch: ch.declare_exchange(name, passive=True), raise_=True
            )
        except NotFound:
            ch = await upstream.channel(confirms=False)
            try:
                await ch.declare_exchange(
                    name,
                    exchange.type_name,
                    durable=exchange.durable,
                    auto_delete=exchange.auto_delete,
                    internal=exchange.internal,
                    arguments=dict(exchange.arguments),
                )
            finally:
                await ch.close()

    async def _declare_internal(self, upstream: Connection, uch: Channel, name: str) -> None:
        """x-federation-upstream where the upstream has it (a 503, a connection error,
        otherwise: so on a connection of its own), else a fanout."""
        await _disposable(upstream, lambda ch: ch.delete_exchange(name))
        purpose = {INTERNAL_PURPOSE: "federation"}
        arguments = {
            "x-max-hops": ft.Long(self.upstream.max_hops),
            "x-downstream-name": self.manager.cluster_name,
            "x-downstream-vhost": self.vhost,
            **purpose,
        }
        probe = await self.manager.connect(_without_recovery(upstream), "Federation link check", 0)
        try:
            ch = await probe.channel(confirms=False)
            await ch.declare_exchange(
                name,
                "x-federation-upstream",
                durable=True,
                internal=True,
                auto_delete=True,
                arguments=arguments,
            )
            return
        except ConnectionClosed as exc:
            if exc.reply_code != COMMAND_INVALID:
                raise
        finally:
            await _quietly_close(probe)
        await uch.declare_exchange(
            name, "fanout", durable=True, internal=True, auto_delete=True, arguments=purpose
        )

    # --- bindings -------------------------------------------------------------------

    def binding_changed(self, added: bool, binding: Any) -> None:
        if not self._accepting:
            return  # the session binds what is there when it starts
        self.federation._spawn(self._change(added, binding))

    async def _change(self, added: bool, binding: Any) -> None:
        try:
            if added:
                await self._add(binding)
            else:
                await self._remove(binding)
        except ClientError as exc:
            log.warning("federation %s: binding change not made upstream: %s", self.describe(), exc)
            if self.forwarder is not None:
                self.forwarder.fail(f"could not change a binding upstream: {exc}")

    async def _add(self, binding: Any) -> None:
        key = _key(binding)
        dests = self._bindings[key]
        first = not dests
        dests.add(_local(binding))
        if not first and BOUND_FROM not in binding.arguments:
            return
        arguments = self._bound_from(binding.arguments)
        if arguments is None or self._channel is None or self._internal is None:
            return
        await self._channel.bind_exchange(
            self._internal, self.upstream.exchange, binding.routing_key, arguments
        )

    async def _remove(self, binding: Any) -> None:
        key = _key(binding)
        dests = self._bindings.get(key)
        if not dests:
            return
        dests.discard(_local(binding))
        if dests and BOUND_FROM not in binding.arguments:
            return
        self._bindings.pop(key, None)
        arguments = self._bound_from(binding.arguments)
        if arguments is None or self._channel is None or self._internal is None:
            return
        await self._channel.unbind_exchange(
            self._internal, self.upstream.exchange, binding.routing_key, arguments
        )

    def _bound_from(self, arguments: dict[str, Any]) -> dict[str, Any] | None:
        """The binding's arguments with this hop first in x-bound-from; None: not passed on."""
        max_hops = self.upstream.max_hops
        previous = arguments.get(BOUND_FROM)
        if isinstance(previous, list) and previous and isinstance(previous[0], dict):
            seen = any(
                isinstance(e, dict)
                and _text(e.get("cluster-name")) == self._upstream_cluster
                and _text(e.get("vhost")) == self._upstream_vhost
                for e in previous
            )
            hops = 0 if seen else min(int(previous[0].get("hops", 0)) - 1, max_hops)
        else:
            previous, hops = [], max_hops
        if hops <= 0:
            return None
        suffix = _suffixes.get((self.vhost, self.name, self.upstream.name), "A")
        entry = {
            "cluster-name": self.manager.cluster_name,
            "vhost": self.vhost,
            "exchange": f"{self.vhost}:{self.name} {suffix}",
            "hops": ft.Short(hops),
        }
        return {**arguments, BOUND_FROM: [entry, *previous]}

    # --- messages -----------------------------------------------------------------------

    def _transform(self, safe_uri: str) -> Any:
        up = self.upstream
        own = self.manager.cluster_name
        vhost = self.vhost
        target = self.name
        upstream_vhost = self._upstream_vhost
        upstream_cluster = self._upstream_cluster

        def transform(message: Message) -> tuple[str, str, bytes] | None:
            table = hd.headers_of(message.raw_header or hd.EMPTY_HEADER)
            count = hd.received_from_count(table)
            if count is not None and (
                count >= up.max_hops or hd.already_seen(hd.hops(table), own, vhost)
            ):
                return None  # max-hops reached, or a loop back here: dropped (and acked)
            entry = [("uri", safe_uri), ("exchange", target), ("redelivered", message.redelivered)]
            if upstream_cluster is not None:
                entry.append(("cluster-name", upstream_cluster))
            entry.append(("vhost", upstream_vhost))
            value = hd.longstr_table(entry)

            def edit(t: dict[str, bytes]) -> None:
                hd.prepend(t, hd.RECEIVED_FROM, value)

            header = hd.rewrite(message.raw_header, edit, drop_user_id=not up.trust_user_id)
            return target, message.routing_key, header

        return transform

    async def clean_upstream(self) -> None:
        """Delete the upstream queue and internal exchange, on a connection of its own
        (the link's are closed by now)."""
        if self._queue is None:
            return
        queue, internal = self._queue, self._internal
        conn = await self.manager.connect(self.last_uri(), "Federation link cleanup", 0)
        try:
            await _disposable(conn, lambda ch: ch.delete_queue(queue))
            if internal is not None:
                await _disposable(conn, lambda ch: ch.delete_exchange(internal))
        finally:
            await _quietly_close(conn)


def _key(binding: Any) -> tuple[str, bytes]:
    """The upstream binding a local one makes: its arguments as the link's client sends
    them (protocol.methods.unchecked keeps a long's and a short's type, gives other
    integers the smallest type), so local bindings that differ only in a signedint
    against a byte (two bindings here, as in RabbitMQ) make one upstream binding, kept
    until the last of them goes, while a long makes its own."""
    from leveret.protocol.methods import _table_keeping_long_and_short

    return (binding.routing_key, _table_keeping_long_and_short(binding.arguments))


def _local(binding: Any) -> tuple[Any, str]:
    """One local binding among those that share an upstream one: its destination and its
    arguments with their types."""
    from leveret.broker.exchange import arguments_key

    return (binding.destination, arguments_key(binding.arguments))


def _text(value: Any) -> Any:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _without_recovery(conn: Connection) -> Any:
    """The LinkURI-like target of a connection, for a one-off connection to it."""
    return _Target(conn)


class _Target:
    """Adapts a live connection's parameters for LinkManager.connect (one-off probes)."""

    def __init__(self, conn: Connection) -> None:
        self.direct = False
        self.params = conn.params


async def _disposable(conn: Connection, op: Any, raise_: bool = False) -> Any:
    """One operation on a channel of its own (a 404 closes it); errors are ignored
    unless `raise_`."""
    ch = await conn.channel(confirms=False)
    try:
        return await op(ch)
    except ClientError:
        if raise_:
            raise
        return None
    finally:
        if ch.is_open:
            await ch.close()


async def _quietly_close(conn: Connection) -> None:
    try:
        await conn.close()
    except (ClientError, OSError):
        conn.abort()
