"""Prometheus metrics in the names of RabbitMQ's rabbitmq_prometheus plugin.

`/metrics` gives totals over all objects, as RabbitMQ does by default, so its
Grafana dashboards work unchanged; `/metrics/per-object` adds per-queue series
labelled {vhost, queue}. Everything is read from the live model at scrape time
(a Collector), so metrics cost nothing between scrapes and nothing per message
beyond the counters broker/stats.py keeps anyway. The text is prometheus-client's.

Leveret's own series start with `leveret_`: the store's fsync latency and group
commit sizes, and message bodies paged out to disk.
"""

from __future__ import annotations

import logging
import os
import resource
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    UnknownMetricFamily,
)

import leveret
from leveret.broker.stats import FIELDS, total, vhost_counts
from leveret.server.alarms import resident_bytes

if TYPE_CHECKING:
    from leveret.server.listener import Server
    from leveret.store.committer import Buckets

log = logging.getLogger("leveret.prometheus")

NODE = "leveret@localhost"
AMQP = {"protocol": "amqp091"}
_I = {name: i for i, name in enumerate(FIELDS)}


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float, labels: dict[str, str] | None = None) -> Metric:
    if labels is None:
        return CounterMetricFamily(name, doc, value=value)
    family = CounterMetricFamily(name, doc, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def _untyped(name: str, doc: str, value: float, labels: dict[str, str] | None = None) -> Metric:
    family = UnknownMetricFamily(name, doc, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), value)
    return family


def _histogram(name: str, doc: str, buckets: Buckets) -> HistogramMetricFamily:
    cumulative, running = [], 0
    for bound, count in zip((*buckets.bounds, float("inf")), buckets.counts, strict=True):
        running += count
        cumulative.append(("+Inf" if bound == float("inf") else repr(bound), running))
    return HistogramMetricFamily(name, doc, buckets=cumulative, sum_value=buckets.sum)


class BrokerCollector:
    """Reads the broker when Prometheus scrapes; keeps nothing between scrapes."""

    def __init__(self, server: Server, per_object: bool) -> None:
        self.server = server
        self.per_object = per_object

    def collect(self) -> Iterator[Metric]:
        server = self.server
        broker = server.broker
        vhosts = list(broker.vhosts.values())
        queues = [q for v in vhosts for q in v.queues.values()]
        connections = list(broker.connections)
        channels = [ch for c in connections for ch in c.channels.values()]
        yield _untyped(
            "rabbitmq_identity_info",
            "RabbitMQ node & cluster identity info",
            1,
            {"rabbitmq_node": NODE, "rabbitmq_cluster": "leveret"},
        )
        yield _untyped(
            "rabbitmq_build_info",
            "RabbitMQ & Erlang/OTP version info",
            1,
            {"rabbitmq_version": "3.10.8", "leveret_version": leveret.__version__},
        )
        # --- objects
        yield _gauge("rabbitmq_connections", "Connections currently open", len(connections))
        yield _gauge("rabbitmq_channels", "Channels currently open", len(channels))
        yield _gauge("rabbitmq_queues", "Queues available", len(queues))
        consumers = sum(q.consumer_count for q in queues)
        yield _gauge("rabbitmq_consumers", "Consumers currently connected", consumers)
        yield _gauge("rabbitmq_global_consumers", "Current number of consumers", consumers)
        queue_churn = [sum(v.churn[i] for v in vhosts) for i in range(3)]
        churn = {
            "connections_opened": broker.connections_opened,
            "connections_closed": broker.connections_opened - len(connections),
            "channels_opened": broker.channels_opened,
            "channels_closed": broker.channels_opened - len(channels),
            "queues_declared": queue_churn[0],
            "queues_created": queue_churn[1],
            "queues_deleted": queue_churn[2],
        }
        for key, doc in (
            ("connections_opened", "Total number of connections opened"),
            ("connections_closed", "Total number of connections closed or terminated"),
            ("channels_opened", "Total number of channels opened"),
            ("channels_closed", "Total number of channels closed"),
            ("queues_declared", "Total number of queues declared"),
            ("queues_created", "Total number of queues created"),
            ("queues_deleted", "Total number of queues deleted"),
        ):
            yield _counter(f"rabbitmq_{key}_total", doc, churn[key])
        # --- queue depths, totalled (per queue in per_object mode)
        ready = sum(q.message_count for q in queues)
        unacked = sum(q.unacked for q in queues)
        yield from self._queue_families(queues, ready, unacked)
        # --- channels and connections open now (RabbitMQ's channel metrics vanish on close)
        open_counts = total(ch.stats for ch in channels)
        for key, name, doc in (
            (
                "publish",
                "messages_published",
                "Total number of messages published into an exchange on a channel",
            ),  # noqa: E501
            (
                "confirm",
                "messages_confirmed",
                "Total number of messages published into an exchange and confirmed on the channel",
            ),  # noqa: E501
            (
                "return_unroutable",
                "messages_unroutable_returned",
                "Total number of messages published as mandatory into an exchange and returned to the publisher as unroutable",
            ),  # noqa: E501
            (
                "drop_unroutable",
                "messages_unroutable_dropped",
                "Total number of messages published as non-mandatory into an exchange and dropped as unroutable",
            ),  # noqa: E501
            (
                "get",
                "get_ack",
                "Total number of messages fetched with basic.get in manual acknowledgement mode",
            ),  # noqa: E501
            (
                "get_no_ack",
                "get",
                "Total number of messages fetched with basic.get in automatic acknowledgement mode",
            ),  # noqa: E501
            (
                "deliver",
                "messages_delivered_ack",
                "Total number of messages delivered to consumers in manual acknowledgement mode",
            ),  # noqa: E501
            (
                "deliver_no_ack",
                "messages_delivered",
                "Total number of messages delivered to consumers in automatic acknowledgement mode",
            ),  # noqa: E501
            (
                "redeliver",
                "messages_redelivered",
                "Total number of messages redelivered to consumers",
            ),  # noqa: E501
            ("ack", "messages_acked", "Total number of messages acknowledged by consumers"),
            (
                "get_empty",
                "get_empty",
                "Total number of times basic.get operations fetched no message",
            ),  # noqa: E501
        ):
            yield _counter(f"rabbitmq_channel_{name}_total", doc, open_counts[_I[key]])
        yield _gauge(
            "rabbitmq_channel_consumers",
            "Consumers on a channel",
            sum(len(ch.consumers) for ch in channels),
        )
        yield _gauge(
            "rabbitmq_channel_messages_unacked",
            "Delivered but not yet acknowledged messages",
            sum(ch.unacked_count for ch in channels),
        )
        yield _counter(
            "rabbitmq_connection_incoming_bytes_total",
            "Total number of bytes received on a connection",
            sum(c.recv_oct for c in connections),
        )
        yield _counter(
            "rabbitmq_connection_outgoing_bytes_total",
            "Total number of bytes sent on a connection",
            sum(c.send_oct for c in connections),
        )
        # --- since start, closed channels and connections included
        by_vhost: dict[str, list[Any]] = {v.name: [] for v in vhosts}
        for conn in connections:
            if conn.vhost is not None and conn.vhost.name in by_vhost:
                by_vhost[conn.vhost.name].append(conn)
        alltime = total(vhost_counts(v, by_vhost[v.name]) for v in vhosts)
        received = alltime[_I["publish"]]
        dropped, returned = alltime[_I["drop_unroutable"]], alltime[_I["return_unroutable"]]
        delivered = sum(alltime[_I[k]] for k in ("deliver", "deliver_no_ack", "get", "get_no_ack"))
        for name, value, doc in (
            ("received", received, "Total number of messages received from publishers"),
            (
                "routed",
                received - dropped - returned,
                "Total number of messages routed to queues or streams",
            ),  # noqa: E501
            (
                "unroutable_dropped",
                dropped,
                "Total number of messages published as non-mandatory into an exchange and dropped as unroutable",
            ),  # noqa: E501
            (
                "unroutable_returned",
                returned,
                "Total number of messages published as mandatory into an exchange and returned to the publisher as unroutable",
            ),  # noqa: E501
            (
                "confirmed",
                alltime[_I["confirm"]],
                "Total number of messages confirmed to publishers",
            ),  # noqa: E501
            ("delivered", delivered, "Total number of messages delivered to consumers"),
            (
                "delivered_consume_manual_ack",
                alltime[_I["deliver"]],
                "Total number of messages delivered to consumers using basic.consume with manual acknowledgment",
            ),  # noqa: E501
            (
                "delivered_consume_auto_ack",
                alltime[_I["deliver_no_ack"]],
                "Total number of messages delivered to consumers using basic.consume with automatic acknowledgment",
            ),  # noqa: E501
            (
                "delivered_get_manual_ack",
                alltime[_I["get"]],
                "Total number of messages delivered to consumers using basic.get with manual acknowledgment",
            ),  # noqa: E501
            (
                "delivered_get_auto_ack",
                alltime[_I["get_no_ack"]],
                "Total number of messages delivered to consumers using basic.get with automatic acknowledgment",
            ),  # noqa: E501
            (
                "get_empty",
                alltime[_I["get_empty"]],
                "Total number of times basic.get operations fetched no message",
            ),  # noqa: E501
            (
                "redelivered",
                alltime[_I["redeliver"]],
                "Total number of messages redelivered to consumers",
            ),  # noqa: E501
            (
                "acknowledged",
                alltime[_I["ack"]],
                "Total number of message acknowledgements received from consumers",
            ),  # noqa: E501
        ):
            yield _counter(f"rabbitmq_global_messages_{name}_total", doc, value, AMQP)
        yield from self._process_families()
        yield from self._leveret_families()

    def _queue_families(self, queues: list[Any], ready: int, unacked: int) -> Iterator[Metric]:
        specs = (
            (
                "rabbitmq_queue_messages_ready",
                "Messages ready to be delivered to consumers",
                lambda q: q.message_count,
                ready,
            ),  # noqa: E501
            (
                "rabbitmq_queue_messages_unacked",
                "Messages delivered to consumers but not yet acknowledged",
                lambda q: q.unacked,
                unacked,
            ),  # noqa: E501
            (
                "rabbitmq_queue_messages",
                "Sum of ready and unacknowledged messages - total queue depth",
                lambda q: q.message_count + q.unacked,
                ready + unacked,
            ),  # noqa: E501
            ("rabbitmq_queue_consumers", "Consumers on a queue", lambda q: q.consumer_count, None),
        )
        for name, doc, of, whole in specs:
            if self.per_object:
                family = GaugeMetricFamily(name, doc, labels=["vhost", "queue"])
                for q in queues:
                    family.add_metric([q.vhost.name, q.name], of(q))
                yield family
            else:
                yield _gauge(name, doc, whole if whole is not None else sum(of(q) for q in queues))
        doc = "Total number of messages published to queues"
        if self.per_object:
            family = CounterMetricFamily(
                "rabbitmq_queue_messages_published", doc, labels=["vhost", "queue"]
            )
            for q in queues:
                family.add_metric([q.vhost.name, q.name], q.stats.publish)
            yield family
        else:
            yield _counter(
                "rabbitmq_queue_messages_published_total", doc, sum(q.stats.publish for q in queues)
            )

    def _process_families(self) -> Iterator[Metric]:
        server = self.server
        alarms = server.alarms
        active = alarms.active if alarms is not None else set()
        yield _gauge(
            "rabbitmq_process_resident_memory_bytes", "Memory used in bytes", resident_bytes()
        )
        yield _gauge(
            "rabbitmq_resident_memory_limit_bytes",
            "Memory high watermark in bytes",
            alarms.memory_limit if alarms is not None else 0,
        )
        try:
            fds = len(os.listdir("/proc/self/fd"))
        except OSError:
            fds = 0
        yield _gauge("rabbitmq_process_open_fds", "Open file descriptors", fds)
        yield _gauge(
            "rabbitmq_process_max_fds",
            "Open file descriptors limit",
            resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        )
        yield _gauge(
            "rabbitmq_process_open_tcp_sockets", "Open TCP sockets", len(server.connections)
        )
        try:
            st = os.statvfs(server.config.data_dir or ".")
            free = st.f_bavail * st.f_frsize
        except OSError:
            free = 0
        yield _gauge("rabbitmq_disk_space_available_bytes", "Disk space available in bytes", free)
        yield _gauge(
            "rabbitmq_disk_space_available_limit_bytes",
            "Free disk space low watermark in bytes",
            alarms.disk_free_limit if alarms is not None else 0,
        )
        yield _untyped(
            "rabbitmq_alarms_memory_used_watermark",
            "is 1 if VM memory watermark alarm is in effect",
            int("memory" in active),
        )
        yield _untyped(
            "rabbitmq_alarms_free_disk_space_watermark",
            "is 1 if free disk space watermark alarm is in effect",
            int("disk" in active),
        )
        yield _untyped(
            "rabbitmq_alarms_file_descriptor_limit",
            "is 1 if file descriptor limit alarm is in effect",
            0,  # Leveret raises no file-descriptor alarm
        )
        yield _gauge(
            "rabbitmq_erlang_uptime_seconds",
            "Node uptime",
            time.monotonic() - server.started_at,
        )

    def _leveret_families(self) -> Iterator[Metric]:
        if self.server.cluster is not None:  # leveret.cluster: replication lag, in-sync set
            yield from self.server.cluster.metrics()
        state = self.server.durable_state
        if state is None:
            return
        committer = state.messages.committer
        if committer is not None:
            yield _histogram(
                "leveret_store_fsync_seconds",
                "Time one group-commit fsync of the message store took",
                committer.fsync_seconds,
            )
            yield _histogram(
                "leveret_store_group_commit_writes",
                "Writes made durable by one group commit (one write and fsync)",
                committer.batch_sizes,
            )
        yield _counter(
            "leveret_paged_out_messages_total",
            "Message bodies moved out of RAM to disk",
            state.paged_out,
        )
        yield _counter(
            "leveret_paged_out_bytes_total",
            "Bytes of message bodies moved out of RAM to disk",
            state.paged_out_bytes,
        )
        yield _gauge(
            "leveret_message_bodies_in_memory_bytes",
            "Bytes of queued message bodies held in RAM",
            state.memory_used,
        )


class PrometheusServer:
    """`/metrics` and `/metrics/per-object` on their own port, in the broker's loop."""

    def __init__(self, server: Server, host: str, port: int) -> None:
        self.server = server
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None
        self._registries = {}
        for per_object in (False, True):
            registry = CollectorRegistry(auto_describe=False)
            registry.register(BrokerCollector(server, per_object))  # type: ignore[arg-type]
            self._registries[per_object] = registry

    async def _metrics(self, request: web.Request) -> web.Response:
        per_object = request.path.endswith("/per-object")
        body = generate_latest(self._registries[per_object])
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self) -> int:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/metrics/per-object", self._metrics)
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
