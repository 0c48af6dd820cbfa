"""A shovel: RabbitMQ's dynamic (or static) shovel, run with leveret.client.

One `Shovel` object per definition runs one task for its whole life:

    starting → (connect source, connect destination, declare, consume) → running
        → on failure: terminated (reason) → wait reconnect-delay → starting ...
        → src-delete-after reached: the shovel deletes its own parameter and ends

Each attempt takes the next URI of `src-uri` and of `dest-uri` in turn. Inside
an attempt, leveret.client's own recovery rides out a dropped connection
(reconnect, restore the consumer, send unconfirmed publishes again); only when
it gives up, or a broker refuses something, does the attempt fail. Status
follows RabbitMQ's: `starting` while connecting (with Leveret's `reason` when
the last attempt failed), `running` with the endpoints, `terminated` with a
reason until the next attempt.

A source queue that does not exist is declared durable with `src-queue-args`,
as RabbitMQ does (a passive declare first, so an existing queue is used as it
is); the same for `dest-queue`. An exchange source gets an exclusive
server-named queue bound with `src-exchange-key`.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from typing import TYPE_CHECKING, Any

from leveret.client.channel import Channel
from leveret.client.errors import ClientError, NotFound
from leveret.client.message import Message
from leveret.links import headers as hd
from leveret.links.forwarder import Forwarder, LinkFailed, cancel_for_good
from leveret.links.uris import LinkURI, parse

if TYPE_CHECKING:
    from leveret.client.connection import Connection
    from leveret.links.manager import LinkManager

log = logging.getLogger("leveret.links")

DEFAULT_PREFETCH = 1000
DEFAULT_RECONNECT_DELAY = 5
CLIENT_RECONNECT_ATTEMPTS = 3  # then the attempt fails and the next URI is tried


def status_time(when: float) -> str:
    """RabbitMQ's status timestamp: local time, e.g. 2024-05-01 9:03:07."""
    t = datetime.datetime.fromtimestamp(when)
    return f"{t.year}-{t.month:02}-{t.day:02} {t.hour}:{t.minute:02}:{t.second:02}"


class ShovelDefinition:
    """A validated shovel value, with RabbitMQ's defaults and legacy key names."""

    def __init__(self, value: dict[str, Any]) -> None:
        self.value = value

        def uris(key: str) -> list[str]:
            v = value[key]
            return [v] if isinstance(v, str) else list(v)

        self.src_uris = uris("src-uri")
        self.dest_uris = uris("dest-uri")
        self.src_queue: str | None = value.get("src-queue")
        self.src_exchange: str | None = value.get("src-exchange")
        self.src_exchange_key: str = value.get("src-exchange-key", "")
        self.src_queue_args: dict[str, Any] = value.get("src-queue-args") or {}
        self.src_consumer_args: dict[str, Any] = value.get("src-consumer-args") or {}
        self.prefetch: int = value.get(
            "src-prefetch-count", value.get("prefetch-count", DEFAULT_PREFETCH)
        )
        self.delete_after: Any = value.get("src-delete-after", value.get("delete-after", "never"))
        self.dest_queue: str | None = value.get("dest-queue")
        self.dest_exchange: str | None = value.get("dest-exchange")
        self.dest_exchange_key: str | None = value.get("dest-exchange-key")
        self.dest_queue_args: dict[str, Any] = value.get("dest-queue-args") or {}
        self.add_forward_headers: bool = value.get(
            "dest-add-forward-headers", value.get("add-forward-headers", False)
        )
        self.add_timestamp_header: bool = value.get(
            "dest-add-timestamp-header", value.get("add-timestamp-header", False)
        )
        self.publish_properties: dict[str, Any] = (
            value.get("dest-publish-properties", value.get("publish-properties")) or {}
        )
        self.ack_mode: str = value.get("ack-mode", "on-confirm")
        self.reconnect_delay: float = value.get("reconnect-delay", DEFAULT_RECONNECT_DELAY)

    def source_endpoint(self) -> dict[str, str]:
        if self.src_queue is not None:
            return {"src_queue": self.src_queue}
        return {"src_exchange": self.src_exchange or "", "src_exchange_key": self.src_exchange_key}

    def dest_endpoint(self) -> dict[str, str]:
        out = {}
        if self.dest_exchange is not None:
            out["dest_exchange"] = self.dest_exchange
        if self.dest_exchange_key is not None:
            out["dest_exchange_key"] = self.dest_exchange_key
        if self.dest_queue is not None:
            out["dest_queue"] = self.dest_queue
        return out


class Shovel:
    def __init__(
        self,
        manager: LinkManager,
        vhost: str,
        name: str,
        value: dict[str, Any],
        kind: str = "dynamic",
    ) -> None:
        self.manager = manager
        self.vhost = vhost
        self.name = name
        self.kind = kind
        self.definition = ShovelDefinition(value)
        self.state = "starting"
        self.reason: str | None = None
        self.since = time.time()
        self.src_uri: str | None = None
        self.dest_uri: str | None = None
        self.moved = 0  # messages moved since this broker started (Prometheus)
        self.attempt = 0
        self._task: asyncio.Task[None] | None = None
        self._conns: list[Connection] = []
        self._forwarder: Forwarder | None = None
        self._stopped = False

    # --- life ---------------------------------------------------------------------

    def start(self) -> None:
        self._stopped = False
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        self._stopped = True
        task, self._task = self._task, None
        await cancel_for_good(task)
        await self._close()

    async def restart(self) -> None:
        await self.stop()
        self._set("starting")
        self.start()

    def _set(self, state: str, reason: str | None = None) -> None:
        self.state, self.reason, self.since = state, reason, time.time()

    async def _run(self) -> None:
        d = self.definition
        while not self._stopped:
            if self.state != "starting":
                self._set("starting", self.reason)
            try:
                completed = await self._attempt()
            except asyncio.CancelledError:
                raise
            except (ClientError, LinkFailed, OSError, TimeoutError) as exc:
                reason = str(exc) or type(exc).__name__
                log.warning(
                    "shovel '%s' in vhost '%s' stopped: %s; %s",
                    self.name,
                    self.vhost,
                    reason,
                    f"restarting in {d.reconnect_delay:g} s"
                    if d.reconnect_delay
                    else "not restarting",
                )
                # As RabbitMQ: still "starting" if it never ran (with Leveret's reason).
                self._set("terminated" if self.state == "running" else "starting", reason)
                completed = False
            except Exception as exc:
                log.exception("shovel '%s' in vhost '%s' failed", self.name, self.vhost)
                self._set("terminated", f"internal error: {exc!r}")
                completed = False
            finally:
                await self._close()
            if completed:
                log.info(
                    "shovel '%s' in vhost '%s' is done (src-delete-after %s): deleting it",
                    self.name,
                    self.vhost,
                    d.delete_after,
                )
                self.manager.shovel_completed(self)
                return
            self.attempt += 1
            if not d.reconnect_delay:
                return  # RabbitMQ: reconnect-delay 0 means the shovel stays terminated
            await asyncio.sleep(d.reconnect_delay)

    async def _attempt(self) -> bool:
        """One connect-and-forward session; True when src-delete-after was reached."""
        d = self.definition
        src = parse(d.src_uris[self.attempt % len(d.src_uris)])
        dest = parse(d.dest_uris[self.attempt % len(d.dest_uris)])
        conn_name = f"Shovel {self.name}"
        src_conn = await self.manager.connect(src, conn_name, d.reconnect_delay)
        self._conns.append(src_conn)
        dest_conn = await self.manager.connect(dest, conn_name, d.reconnect_delay)
        self._conns.append(dest_conn)
        dest_ch = await dest_conn.channel(confirms=d.ack_mode == "on-confirm")
        if d.dest_queue is not None:
            await ensure_queue(dest_conn, d.dest_queue, d.dest_queue_args)
        src_ch = await src_conn.channel(confirms=False)
        if d.src_queue is not None:
            count = await ensure_queue(src_conn, d.src_queue, d.src_queue_args)
            queue: Any = d.src_queue
        else:
            queue = await src_ch.declare_queue(exclusive=True)
            await src_ch.bind_queue(queue, d.src_exchange or "", d.src_exchange_key)
            count = 0
        limit = None
        if d.delete_after == "queue-length":
            limit = count
        elif isinstance(d.delete_after, int):
            limit = d.delete_after
        if limit == 0:
            return True
        self.src_uri, self.dest_uri = src.safe, dest.safe
        forwarder = Forwarder(
            src_ch,
            queue,
            dest_ch,
            self._transform(src, dest),
            ack_mode=d.ack_mode,
            prefetch=d.prefetch,
            limit=limit,
            consumer_arguments=d.src_consumer_args,
            on_moved=self._moved,
        )
        self._forwarder = forwarder
        try:
            await forwarder.start()
            self._set("running")
            log.info("shovel '%s' in vhost '%s' running", self.name, self.vhost)
            await forwarder.finished
        finally:
            await forwarder.stop()
            self._forwarder = None
        return limit is not None

    def _moved(self, n: int) -> None:
        self.moved += n
        self.manager.count_moved(("shovel", self.vhost, self.name), n)

    async def _close(self) -> None:
        conns, self._conns = self._conns, []
        for conn in conns:
            try:
                await asyncio.wait_for(conn.close(), 10)
            except (ClientError, OSError, TimeoutError):
                conn.abort()

    # --- what is sent ---------------------------------------------------------------

    def _transform(self, src: LinkURI, dest: LinkURI) -> Any:
        d = self.definition
        fixed_exchange = "" if d.dest_queue is not None else d.dest_exchange
        fixed_key = d.dest_queue if d.dest_queue is not None else d.dest_exchange_key
        entries: list[tuple[str, str]] = []
        if d.add_forward_headers:
            entries = [
                ("shovelled-by", self.manager.cluster_name),
                ("shovel-type", self.kind),
                ("shovel-name", self.name),
                ("shovel-vhost", self.vhost),
                ("src-uri", src.safe),
                ("dest-uri", dest.safe),
            ]
            if d.src_queue is not None:
                entries.append(("src-queue", d.src_queue))
            else:
                entries += [
                    ("src-exchange", d.src_exchange or ""),
                    ("src-exchange-key", d.src_exchange_key),
                ]
            entries += list(d.dest_endpoint().items())
            entries = [(k.replace("_", "-"), v) for k, v in entries]
        shovelled = hd.shovelled_entry(entries) if entries else b""
        stamp = d.add_timestamp_header
        props = d.publish_properties
        rewrite = bool(entries or stamp or props)

        def edit(table: dict[str, bytes]) -> None:
            if shovelled:
                hd.prepend(table, hd.SHOVELLED, shovelled)
            if stamp:
                table[hd.SHOVELLED_TIMESTAMP] = hd.timestamp_value()

        def transform(message: Message) -> tuple[str, str, bytes | None]:
            exchange = message.exchange if fixed_exchange is None else fixed_exchange
            key = message.routing_key if fixed_key is None else fixed_key
            header = message.raw_header
            if rewrite:
                header = hd.rewrite(header, edit if (shovelled or stamp) else None, props)
            return exchange, key, header

        return transform

    # --- status ---------------------------------------------------------------------------

    def status(self, node: str) -> dict[str, Any]:
        """RabbitMQ's GET /api/shovels object."""
        out: dict[str, Any] = {
            "node": node,
            "timestamp": status_time(self.since),
            "name": self.name,
            "vhost": self.vhost,
            "type": self.kind,
            "state": self.state,
        }
        if self.state == "running":
            out["src_uri"] = self.src_uri
            out["src_protocol"] = "amqp091"
            out["dest_protocol"] = "amqp091"
            out["dest_uri"] = self.dest_uri
            out.update(self.definition.source_endpoint())
            out.update(self.definition.dest_endpoint())
        elif self.reason is not None:
            out["reason"] = self.reason
        return out


async def ensure_queue(conn: Connection, name: str, arguments: dict[str, Any]) -> int:
    """RabbitMQ's ensure_queue: use the queue if it exists, else declare it durable.

    Returns its message count. The passive declare runs on a channel of its own,
    since a 404 closes it.
    """
    probe: Channel = await conn.channel(confirms=False)
    try:
        found = await probe.declare_queue(name, passive=True)
        count = found.message_count
    except NotFound:
        maker = await conn.channel(confirms=False)
        try:
            made = await maker.declare_queue(name, durable=True, arguments=arguments)
            count = made.message_count
        finally:
            await maker.close()
    else:
        await probe.close()
    return count
