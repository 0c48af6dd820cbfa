"""Federation: which exchanges and queues follow which upstreams, and their links.

A policy with `federation-upstream` (one upstream's name),
`federation-upstream-set` (a set's name, or `all`) or
`federation-upstream-pattern` (a regular expression over upstream names)
federates the exchanges and queues it matches. Each (downstream exchange or
queue, upstream) pair gets one link: `ExchangeLink` (exchange_link.py) or
`QueueLink` (queue_link.py). `Federation` keeps the set of links equal to
what the policies and parameters ask for: it re-checks a vhost whenever one
of its exchanges, queues or policies changes (VirtualHost.watchers) or an
upstream or set is set or cleared, and passes a federated exchange's binding
changes to its links.

A link whose upstream, policy or downstream goes away deletes what it made
on the upstream (its queue and internal exchange), as RabbitMQ does, unless
the upstream says `resource-cleanup-mode: never`. When the broker itself stops,
links keep them, so messages published upstream meanwhile wait there
(docs/differences.md#plugins-federation-keeps-upstream-queues).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from leveret.broker.policies import winner
from leveret.client.errors import ClientError
from leveret.links.forwarder import Forwarder, LinkFailed, cancel_for_good
from leveret.links.shovel import status_time
from leveret.links.uris import LinkURI, parse

if TYPE_CHECKING:
    from leveret.client.connection import Connection
    from leveret.links.manager import LinkManager

log = logging.getLogger("leveret.links")

DEFAULT_PREFETCH = 1000
DEFAULT_RECONNECT_DELAY = 5
INTERNAL_PURPOSE = "x-internal-purpose"
FEDERATION_KEYS = ("federation-upstream", "federation-upstream-set", "federation-upstream-pattern")


@dataclass(frozen=True)
class Upstream:
    """An upstream as one link sees it: the upstream's value, a set element's overrides."""

    name: str
    uris: tuple[str, ...]
    exchange: str
    queue: str
    consumer_tag: str
    prefetch: int
    reconnect_delay: float
    max_hops: int
    expires: int | None
    message_ttl: int | None
    trust_user_id: bool
    ack_mode: str
    cleanup: str

    @classmethod
    def resolve(cls, name: str, value: dict, element: dict, downstream: str) -> Upstream:
        def get(key: str, default: Any) -> Any:
            if key in element:
                return element[key]
            return value.get(key, default)

        uri = get("uri", [])
        return cls(
            name=name,
            uris=(uri,) if isinstance(uri, str) else tuple(uri),
            exchange=get("exchange", downstream),
            queue=get("queue", downstream),
            consumer_tag=get("consumer-tag", f"federation-link-{name}"),
            prefetch=get("prefetch-count", DEFAULT_PREFETCH),
            reconnect_delay=get("reconnect-delay", DEFAULT_RECONNECT_DELAY),
            max_hops=get("max-hops", 1),
            expires=get("expires", None),
            message_ttl=get("message-ttl", None),
            trust_user_id=get("trust-user-id", False),
            ack_mode=get("ack-mode", "on-confirm"),
            cleanup=get("resource-cleanup-mode", "default"),
        )


def upstreams_for(manager: LinkManager, vhost: Any, definition: dict) -> list[Upstream]:
    """The upstreams a policy definition names, in a vhost, for a downstream `name`
    (RabbitMQ's rabbit_federation_upstream:for/1); unknown upstreams are skipped."""
    params = manager.broker.parameters
    upstreams = params.of(vhost.name, "federation-upstream")
    if "federation-upstream" in definition:
        elements = [{"upstream": definition["federation-upstream"]}]
    elif "federation-upstream-set" in definition:
        set_name = definition["federation-upstream-set"]
        if set_name == "all":
            elements = [{"upstream": n} for n in sorted(upstreams)]
        else:
            elements = params.of(vhost.name, "federation-upstream-set").get(set_name) or []
    elif "federation-upstream-pattern" in definition:
        regex = re.compile(definition["federation-upstream-pattern"])
        elements = [{"upstream": n} for n in sorted(upstreams) if regex.search(n)]
    else:
        return []
    return [e for e in elements if e.get("upstream") in upstreams]


class FederationLink:
    """What exchange and queue links share: the retry loop, connections and status."""

    kind = "exchange"

    def __init__(
        self, federation: Federation, vhost: str, name: str, upstream: Upstream, policy: str
    ) -> None:
        self.federation = federation
        self.manager = federation.manager
        self.vhost = vhost
        self.name = name
        self.upstream = upstream
        self.policy = policy
        self.status_name = "starting"
        self.error: str | None = None
        self.since = time.time()
        self.uri: str | None = None
        self.local_connection: str | None = None
        self.attempt = 0
        self.id = f"{zlib.crc32(repr((vhost, self.kind, name, upstream.name)).encode()):08x}"
        self._task: asyncio.Task[None] | None = None
        self._conns: list[Connection] = []
        self.forwarder: Forwarder | None = None
        self._stopped = False

    @property
    def upstream_name(self) -> str:
        return self.upstream.exchange if self.kind == "exchange" else self.upstream.queue

    def start(self) -> None:
        self._stopped = False
        self._task = asyncio.ensure_future(self._run())

    async def stop(self, cleanup: bool = False) -> None:
        self._stopped = True
        task, self._task = self._task, None
        await cancel_for_good(task)
        if cleanup and self.upstream.cleanup != "never":
            try:
                await asyncio.wait_for(self.clean_upstream(), 15)
            except (ClientError, OSError, TimeoutError) as exc:
                log.warning(
                    "federation %s: could not clean up the upstream: %s", self.describe(), exc
                )
        await self._close()

    async def restart(self) -> None:
        await self.stop()
        self._set("starting")
        self.start()

    def describe(self) -> str:
        return (
            f"{self.kind} '{self.name}' in vhost '{self.vhost}' (upstream '{self.upstream.name}')"
        )

    def _set(self, status: str, error: str | None = None) -> None:
        self.status_name, self.error, self.since = status, error, time.time()

    async def _run(self) -> None:
        up = self.upstream
        while not self._stopped:
            if self.status_name != "starting":
                self._set("starting")
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except (ClientError, LinkFailed, OSError, TimeoutError) as exc:
                reason = str(exc) or type(exc).__name__
                log.warning("federation %s stopped: %s", self.describe(), reason)
                self._set("error", reason)
            except Exception as exc:
                log.exception("federation %s failed", self.describe())
                self._set("error", f"internal error: {exc!r}")
            finally:
                await self._close()
                self.forwarder = None
            self.attempt += 1
            await asyncio.sleep(up.reconnect_delay or DEFAULT_RECONNECT_DELAY)

    def last_uri(self) -> LinkURI:
        """The upstream URI of the latest attempt."""
        up = self.upstream
        return parse(up.uris[max(self.attempt, 0) % len(up.uris)], default_vhost=self.vhost)

    async def _connect(self) -> tuple[Connection, Connection, LinkURI]:
        up = self.upstream
        uri = self.last_uri()
        name = f"Federation link (upstream: {up.name}, policy: {self.policy})"
        local = parse("amqp://", default_vhost=self.vhost)
        downstream = await self.manager.connect(local, name, up.reconnect_delay)
        self._conns.append(downstream)
        upstream = await self.manager.connect(uri, name, up.reconnect_delay)
        self._conns.append(upstream)
        self.uri = uri.safe
        return upstream, downstream, uri

    def running(self, downstream: Connection) -> None:
        link = downstream._link
        transport = link.transport if link is not None else None
        number = transport.get_extra_info("sockname")[1] if transport is not None else 0
        self.local_connection = f"direct:{number} -> leveret:0"
        self._set("running")
        log.info("federation %s running, upstream %s", self.describe(), self.uri)

    def moved(self, n: int) -> None:
        key = ("federation", self.vhost, self.kind, self.name, self.upstream.name)
        self.manager.count_moved(key, n)

    async def _session(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    async def clean_upstream(self) -> None:
        """Delete what the link made on the upstream (a link taken away for good)."""

    async def _close(self) -> None:
        conns, self._conns = self._conns, []
        for conn in conns:
            try:
                await asyncio.wait_for(conn.close(), 10)
            except (ClientError, OSError, TimeoutError):
                conn.abort()

    def status(self, node: str) -> dict[str, Any]:
        """RabbitMQ's GET /api/federation-links object."""
        up = self.upstream
        if self.kind == "exchange":
            out: dict[str, Any] = {
                "node": node,
                "exchange": self.name,
                "upstream_exchange": up.exchange,
            }
        else:
            out = {
                "node": node,
                "queue": self.name,
                "upstream_queue": up.queue,
                "consumer_tag": up.consumer_tag,
            }
        out.update(
            {
                "type": self.kind,
                "vhost": self.vhost,
                "upstream": up.name,
                "id": self.id,
                "status": self.status_name,
            }
        )
        if self.status_name == "running" and self.local_connection:
            out["local_connection"] = self.local_connection
        if self.status_name == "error":
            out["error"] = self.error
        out["uri"] = self.uri or parse(up.uris[0], default_vhost=self.vhost).safe
        out["timestamp"] = status_time(self.since)
        return out


class Federation:
    def __init__(self, manager: LinkManager) -> None:
        self.manager = manager
        self.broker = manager.broker
        self.links: dict[tuple[str, str, str, str], FederationLink] = {}
        # (vhost, kind, name) → its links: what the watcher looks up per event
        self._by_object: dict[tuple[str, str, str], set[FederationLink]] = {}
        self._dirty: set[str] = set()
        self._scheduled = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._running = False

    def start(self) -> None:
        self._running = True
        self.broker.vhost_watchers.append(self._watch)
        for vhost in list(self.broker.vhosts):
            self._reconcile(vhost)

    async def stop(self) -> None:
        self._running = False
        if self._watch in self.broker.vhost_watchers:
            self.broker.vhost_watchers.remove(self._watch)
        links, self.links = list(self.links.values()), {}
        self._by_object.clear()
        await asyncio.gather(*(link.stop() for link in links), return_exceptions=True)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # --- following the model ----------------------------------------------------------

    def upstreams_changed(self, vhost: str) -> None:
        self._mark(vhost)

    def _watch(self, vhost: Any, event: str, subject: Any) -> None:
        """Called on every declare, delete, bind and unbind of every vhost: kept cheap,
        and free for vhosts without federation upstreams (nothing to federate)."""
        name = vhost.name
        if event in ("bind", "unbind"):
            links = self._by_object.get((name, "exchange", subject.source.name))
            if links:
                for link in list(links):
                    link.binding_changed(event == "bind", subject)  # type: ignore[attr-defined]
            return
        if event in ("exchange-deleted", "queue-deleted"):
            kind = "exchange" if event == "exchange-deleted" else "queue"
            if self._by_object.get((name, kind, subject.name)):
                self._mark(name)
            return
        if not self._has_upstreams(name):
            return
        if event == "policies":
            self._mark(name)
        elif self._federable(event, subject) and self._wants(vhost, event, subject):
            self._mark(name)

    def _has_upstreams(self, vhost: str) -> bool:
        values = self.broker.parameters.values
        return any(k[0] == vhost and k[1] == "federation-upstream" for k in values)

    @staticmethod
    def _federable(kind: str, obj: Any) -> bool:
        if INTERNAL_PURPOSE in obj.arguments:
            return False
        if kind == "exchange":
            return bool(obj.name) and obj.type_name != "x-federation-upstream"
        return obj.exclusive_owner is None

    def _wants(self, vhost: Any, kind: str, obj: Any) -> bool:
        """Whether a policy of the vhost names upstreams for this exchange or queue."""
        queue_type = "" if kind == "exchange" else obj.queue_type
        policy = winner(vhost.policies, kind, obj.name, queue_type or "classic")
        return policy is not None and any(k in policy.definition for k in FEDERATION_KEYS)

    def _mark(self, vhost: str) -> None:
        """Re-check the vhost once this loop turn is over (a policy change touches many)."""
        self._dirty.add(vhost)
        if not self._scheduled and self._running:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        dirty, self._dirty = self._dirty, set()
        for vhost in dirty:
            self._reconcile(vhost)

    def _reconcile(self, vhost_name: str) -> None:
        from leveret.links.exchange_link import ExchangeLink
        from leveret.links.queue_link import QueueLink

        vhost = self.broker.vhosts.get(vhost_name)
        wanted: dict[tuple[str, str, str, str], tuple[Upstream, str]] = {}
        if vhost is not None and vhost.policies and self._has_upstreams(vhost_name):
            for exchange in vhost.exchanges.values():
                if self._federable("exchange", exchange):
                    self._want(wanted, vhost, "exchange", exchange.name, "")
            for queue in vhost.queues.values():
                if self._federable("queue", queue):
                    self._want(wanted, vhost, "queue", queue.name, queue.queue_type)
        for key, link in list(self.links.items()):
            if key[0] != vhost_name:
                continue
            want = wanted.get(key)
            if want is None or want[0] != link.upstream:
                del self.links[key]
                self._by_object[key[:3]].discard(link)
                gone = want is None
                self._spawn(link.stop(cleanup=gone))
        for key, (upstream, policy) in wanted.items():
            if key in self.links:
                continue
            cls = ExchangeLink if key[1] == "exchange" else QueueLink
            link = cls(self, key[0], key[2], upstream, policy)
            self.links[key] = link
            self._by_object.setdefault(key[:3], set()).add(link)
            link.start()
        for obj in [k for k, v in self._by_object.items() if not v]:
            del self._by_object[obj]

    def _want(self, wanted: dict, vhost: Any, kind: str, name: str, queue_type: str) -> None:
        policy = winner(vhost.policies, kind, name, queue_type or "classic")
        if policy is None:
            return
        params = self.broker.parameters.of(vhost.name, "federation-upstream")
        for element in upstreams_for(self.manager, vhost, policy.definition):
            up_name = element["upstream"]
            upstream = Upstream.resolve(up_name, params[up_name], element, name)
            wanted[(vhost.name, kind, name, up_name)] = (upstream, policy.name)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- status -------------------------------------------------------------------------

    def status(self) -> list[dict[str, Any]]:
        from leveret.links.manager import NODE

        return [link.status(NODE) for _key, link in sorted(self.links.items())]

    async def restart(self, vhost: str, link_id: str) -> bool:
        for link in list(self.links.values()):
            if link.vhost == vhost and link.id == link_id:
                await link.restart()
                return True
        return False
