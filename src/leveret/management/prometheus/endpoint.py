"""The Prometheus endpoints, and the collectors a node registered for them."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.core import Metric

from leveret.management.prometheus.scrape import Scrape
from leveret.management.prometheus.text import Rendered, render

if TYPE_CHECKING:
    from leveret.handle import NodeHandle

log = logging.getLogger("leveret.prometheus")


class Collector(Protocol):
    """One package's families: read at scrape time, kept nowhere between scrapes."""

    def collect(self, s: Scrape) -> Iterable[Rendered | Metric]:
        """The families for `s.mode`'s endpoint (none, for an endpoint it is not on)."""


class Metrics:
    """The collectors a node registered, in the order their families go out."""

    def __init__(self, node: NodeHandle, collectors: Iterable[Collector] = ()) -> None:
        self.node = node
        self.collectors = list(collectors)

    def collect(
        self,
        mode: str = "metrics",
        groups: Iterable[str] | None = None,
        vhosts: Iterable[str] | None = None,
    ) -> Iterator[Rendered | Metric]:
        """One scrape: `mode` is "metrics", "per-object" or "detailed" (which alone
        takes `groups`, RabbitMQ's family names, and `vhosts`)."""
        wanted = set(vhosts) if vhosts else None
        s = Scrape(
            self.node,
            wanted if mode == "detailed" else None,
            per_object=mode != "metrics",
            mode=mode,
            groups=tuple(groups) if groups is not None else (),
        )
        for collector in self.collectors:
            yield from collector.collect(s)

    def render(
        self,
        mode: str = "metrics",
        groups: Iterable[str] | None = None,
        vhosts: Iterable[str] | None = None,
    ) -> bytes:
        return render(self.collect(mode, groups, vhosts))


class PrometheusServer:
    """`/metrics`, `/metrics/per-object` and `/metrics/detailed` on their own port, in
    the broker's loop."""

    def __init__(self, metrics: Metrics, host: str, port: int) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    async def _metrics(self, request: web.Request) -> web.Response:
        stats = getattr(self.metrics.node, "worker_stats", None)
        if stats is not None:
            await stats.refresh()  # other workers' objects (management/workers.py)
        path = request.path.rstrip("/")
        if path.endswith("/per-object"):
            body = self.metrics.render("per-object")
        elif path.endswith("/detailed"):
            query = request.query
            body = self.metrics.render(
                "detailed", query.getall("family", []), query.getall("vhost", [])
            )
        else:
            body = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self) -> int:
        app = web.Application()
        for path in ("/metrics", "/metrics/per-object", "/metrics/detailed"):
            app.router.add_get(path, self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        sockets = site._server.sockets if site._server is not None else []  # type: ignore[union-attr]
        if sockets:
            self.port = sockets[0].getsockname()[1]
        log.info("Prometheus metrics on http://%s:%d/metrics", self.host, self.port)
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
