"""What one scrape reads from the broker, collected once and shared by the collectors."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from leveret.management.prometheus.text import Family

if TYPE_CHECKING:
    from leveret.handle import NodeHandle

# A queue's figures, as columns: what the queue families are made of.
Q_READY, Q_UNACKED, Q_PAGED, Q_BYTES, Q_CONSUMERS, Q_BUSY, Q_PUBLISHED = range(7)
Q_COLUMNS = 7


def queue_row(q: Any) -> tuple[float, ...]:
    ready = q.ready
    consumers = q.consumer_count
    return (
        q.message_count,
        q.unacked,
        getattr(ready, "paged", 0),  # a long queue's tail kept as disk positions only
        getattr(ready, "bytes", 0),
        consumers,
        1 if consumers else 0,
        q.stats.publish,
    )


@dataclass
class Scrape:
    """What one scrape reads from the broker, collected once and shared by the
    collectors, and which endpoint asked."""

    node: NodeHandle
    vhost_filter: set[str] | None = None
    # False for /metrics: the per-object groups add one sum instead of a sample per
    # object, so a scrape of many queues makes no label dict per queue and family.
    per_object: bool = True
    mode: str = "metrics"  # "metrics", "per-object" or "detailed"
    groups: tuple[str, ...] = ()  # /metrics/detailed's family=... values, in order

    def __post_init__(self) -> None:
        broker = self.node.broker
        self.broker = broker
        self.vhosts = list(broker.vhosts.values())
        self.connections = broker.client_connections()  # AMQP and MQTT
        self.channels = [
            ch for c in self.connections for ch in c.channels.values() if not ch.closing
        ]
        self.queues = [q for v in self.vhosts for q in v.queues.values()]
        # Worker 0 of several workers: every worker's queues, connections and channels.
        self.workers = getattr(self.node, "worker_stats", None)
        if self.workers is not None:
            self.workers.extend_scrape(self)
        if self.vhost_filter is not None:
            self.queues = [q for q in self.queues if q.vhost.name in self.vhost_filter]
        self._labels: dict[str, list[dict[str, str]]] = {}
        self._rows: list[tuple[float, ...]] | None = None
        self._sums: tuple[float, ...] | None = None

    def labels(self, kind: str) -> list[dict[str, str]]:
        """The per-object labels of the queues, channels or connections, in their order
        (made once per scrape)."""
        out = self._labels.get(kind)
        if out is None:
            if kind == "queue":
                out = [{"vhost": q.vhost.name, "queue": q.name} for q in self.queues]
            elif kind == "published":
                out = [{"queue_vhost": q.vhost.name, "queue": q.name} for q in self.queues]
            elif kind == "channel":
                out = [{"channel": channel_label(ch)} for ch in self.channels]
            elif kind == "channel-vhost":
                out = [
                    {"channel": channel_label(ch), "vhost": ch.vhost.name} for ch in self.channels
                ]
            else:  # connections: RabbitMQ's label is `channel`, sic
                out = [{"channel": conn.name} for conn in self.connections]
            self._labels[kind] = out
        return out

    @property
    def queue_rows(self) -> list[tuple[float, ...]]:
        """Each queue's figures (the Q_* columns), read once per scrape."""
        if self._rows is None:
            self._rows = [queue_row(q) for q in self.queues]
        return self._rows

    def each_queue(self, family: Family, of: Callable[[tuple[float, ...]], float]) -> Family:
        """A sample per queue, or (/metrics) `of` the column sums: every queue figure
        is linear in the columns, so the sum of `of` is `of` of the sums."""
        rows = self.queue_rows
        if self.per_object:
            family.columns = (self.labels("queue"), list(map(of, rows)))
        else:
            if self._sums is None:
                self._sums = tuple(map(sum, zip(*rows, strict=True))) if rows else (0,) * Q_COLUMNS
            family.add(of(self._sums))
        return family

    def each(
        self, family: Family, objects: list[Any], kind: str, of: Callable[[Any], float]
    ) -> Family:
        """A sample per object (per-object), or their sum (/metrics)."""
        if self.per_object:
            family.columns = (self.labels(kind), list(map(of, objects)))
        else:
            family.add(sum(map(of, objects)))
        return family


def channel_label(ch: Any) -> str:
    """A channel as the management API names it: "<connection name> (<number>)"."""
    return f"{ch.conn.name} ({ch.number})"
