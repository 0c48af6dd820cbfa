"""Prometheus metrics in the names, types and labels of RabbitMQ's rabbitmq_prometheus.

Three endpoints, as RabbitMQ 3.10 has them (tests/compat/prometheus records its):

- `/metrics`: node totals; every per-object family summed into one unlabelled
  sample, so RabbitMQ's Grafana dashboards and alerts work unchanged;
- `/metrics/per-object`: the same families with a sample per queue, channel and
  connection (labels `vhost`/`queue`, `channel`);
- `/metrics/detailed?family=GROUP&vhost=V`: only the groups asked for (RabbitMQ's
  group names: `queue_coarse_metrics`, `channel_metrics`, ...), per object, named
  `rabbitmq_detailed_*`, plus the cluster-wide `rabbitmq_cluster_*` groups.

The families are grouped as RabbitMQ's collector groups them (GROUPS below); each
group reads the live model at scrape time (a Collector), so metrics cost nothing
between scrapes and nothing per message beyond the counters broker/stats.py keeps
anyway. Families that only an Erlang VM has (reductions, schedulers, Mnesia,
allocators) are left out: docs/differences.md#prometheus lists them.

Leveret's own series start with `leveret_`: the store's fsync latency and group
commit sizes, and message bodies paged out to disk.
"""

from __future__ import annotations

import logging
import os
import platform
import resource
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, NamedTuple

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

import leveret
from leveret.broker.stats import FIELDS, queue_type_label, total, vhost_counts
from leveret.server.alarms import resident_bytes

if TYPE_CHECKING:
    from leveret.server.listener import Server
    from leveret.store.committer import Buckets

log = logging.getLogger("leveret.prometheus")

NODE = "leveret@localhost"  # as the management API names the node
PROTOCOL = "amqp091"
#: the RabbitMQ version whose metrics these are (build_info's rabbitmq_version)
RABBITMQ_VERSION = "3.10.8"
#: queue types whose series RabbitMQ always lists, whether or not such queues exist
QUEUE_TYPES = ("classic", "quorum", "stream")
#: the (queue type, dead-letter strategy) series RabbitMQ 3.10 always lists, by reason
DEAD_LETTER_SERIES: dict[str, set[tuple[str, str]]] = {
    "confirmed": {("quorum", "at_least_once")},
    "delivery_limit": {("quorum", s) for s in ("at_least_once", "at_most_once", "disabled")},
    "expired": {("classic", "at_most_once"), ("classic", "disabled")}
    | {("quorum", s) for s in ("at_least_once", "at_most_once", "disabled")},
    "maxlen": {("classic", "at_most_once"), ("classic", "disabled")}
    | {("quorum", s) for s in ("at_most_once", "disabled")},
    "rejected": {("classic", "at_most_once"), ("classic", "disabled")}
    | {("quorum", s) for s in ("at_least_once", "at_most_once", "disabled")},
}
_I = {name: i for i, name in enumerate(FIELDS)}
#: what queues count that the global counters show by queue type
QUEUE_SIDE = ("deliver", "deliver_no_ack", "get", "get_no_ack", "get_empty", "redeliver", "ack")
_NAN = float("nan")


@dataclass
class Family:
    """One family before rendering: samples carry every label; `kept` names the labels
    that stay when `/metrics` sums the per-object samples (e.g. `protocol`)."""

    name: str
    kind: str  # "gauge", "counter" (name without _total), "untyped"
    doc: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)
    kept: tuple[str, ...] = ()
    # Per-object samples as two columns (labels, values): no tuple per sample, which on a
    # scrape of thousands of queues is most of the work (and of the garbage).
    columns: tuple[list[dict[str, str]], list[float]] | None = None

    def add(self, value: float, **labels: str) -> Family:
        self.samples.append((labels, value))
        return self


@dataclass
class Scrape:
    """What one scrape reads from the broker, collected once and shared by the groups."""

    server: Server
    vhost_filter: set[str] | None = None
    # False for /metrics: the per-object groups add one sum instead of a sample per
    # object, so a scrape of many queues makes no label dict per queue and family.
    per_object: bool = True

    def __post_init__(self) -> None:
        broker = self.server.broker
        self.broker = broker
        self.vhosts = list(broker.vhosts.values())
        self.connections = list(broker.connections)
        self.channels = [
            ch for c in self.connections for ch in c.channels.values() if not ch.closing
        ]
        self.queues = [q for v in self.vhosts for q in v.queues.values()]
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
                out = [{"channel": _channel_label(ch)} for ch in self.channels]
            elif kind == "channel-vhost":
                out = [
                    {"channel": _channel_label(ch), "vhost": ch.vhost.name} for ch in self.channels
                ]
            else:  # connections: RabbitMQ's label is `channel`, sic
                out = [{"channel": conn.name} for conn in self.connections]
            self._labels[kind] = out
        return out

    @property
    def queue_rows(self) -> list[tuple[float, ...]]:
        """Each queue's figures (the Q_* columns), read once per scrape."""
        if self._rows is None:
            self._rows = [_queue_row(q) for q in self.queues]
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


def _channel_label(ch: Any) -> str:
    """A channel as the management API names it: "<connection name> (<number>)"."""
    return f"{ch.conn.name} ({ch.number})"


# --- the groups, in RabbitMQ's names ----------------------------------------------------


def _connection_churn(s: Scrape) -> Iterator[Family]:
    broker = s.broker
    retired = broker.counters.retired_churn
    churn = [sum(v.churn[i] for v in s.vhosts) + retired[i] for i in range(3)]
    for name, doc, value in (
        ("connections_opened", "Total number of connections opened", broker.connections_opened),
        (
            "connections_closed",
            "Total number of connections closed or terminated",
            broker.connections_opened - len(s.connections),
        ),
        ("channels_opened", "Total number of channels opened", broker.channels_opened),
        (
            "channels_closed",
            "Total number of channels closed",
            broker.channels_opened - len(s.channels),
        ),
        ("queues_declared", "Total number of queues declared", churn[0]),
        ("queues_created", "Total number of queues created", churn[1]),
        ("queues_deleted", "Total number of queues deleted", churn[2]),
    ):
        yield Family(name, "counter", doc).add(value)


def _node_coarse(s: Scrape) -> Iterator[Family]:
    try:
        fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        fds = 0
    try:
        st = os.statvfs(s.server.config.data_dir or ".")
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = 0
    yield Family("process_open_fds", "gauge", "Open file descriptors").add(fds)
    yield Family("process_open_tcp_sockets", "gauge", "Open TCP sockets").add(
        len(s.server.connections)
    )
    yield Family("process_resident_memory_bytes", "gauge", "Memory used in bytes").add(
        resident_bytes()
    )
    yield Family("disk_space_available_bytes", "gauge", "Disk space available in bytes").add(free)


def max_tcp_sockets(max_fds: int) -> int:
    """Sockets that fit in the descriptor limit, reckoned as RabbitMQ reckons its
    sockets_total: 90% of what is left after 100 descriptors for files."""
    return max(0, round((max_fds - 100) * 0.9))


def _node(s: Scrape) -> Iterator[Family]:
    alarms = s.server.alarms
    max_fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    yield Family("process_max_fds", "gauge", "Open file descriptors limit").add(max_fds)
    yield Family("process_max_tcp_sockets", "gauge", "Open TCP sockets limit").add(
        max_tcp_sockets(max_fds)
    )
    yield Family("resident_memory_limit_bytes", "gauge", "Memory high watermark in bytes").add(
        alarms.memory_limit if alarms is not None else 0
    )
    yield Family(
        "disk_space_available_limit_bytes", "gauge", "Free disk space low watermark in bytes"
    ).add(alarms.disk_free_limit if alarms is not None else 0)
    yield Family("erlang_uptime_seconds", "gauge", "Node uptime").add(
        time.monotonic() - s.server.started_at
    )


def _node_persister(s: Scrape) -> Iterator[Family]:
    """The message store's fsyncs, as RabbitMQ's I/O sync counters."""
    state = s.server.durable_state
    committer = state.messages.committer if state is not None else None
    fsyncs = committer.fsync_seconds if committer is not None else None
    yield Family("io_sync_ops", "counter", "Total number of I/O sync operations").add(
        fsyncs.count if fsyncs is not None else 0
    )
    yield Family("io_sync_time_seconds", "counter", "Total I/O sync time").add(
        fsyncs.sum if fsyncs is not None else 0.0
    )


RAFT = (
    ("raft_term", "counter", "Current Raft term number"),
    ("raft_log_snapshot_index", "gauge", "Raft log snapshot index"),
    ("raft_log_last_applied_index", "gauge", "Raft log last applied index"),
    ("raft_log_commit_index", "gauge", "Raft log commit index"),
    ("raft_log_last_written_index", "gauge", "Raft log last written index"),
    ("raft_entry_commit_latency_seconds", "gauge", "Time taken for a log entry to be committed"),
)


def _ra(s: Scrape) -> Iterator[Family]:
    """Raft logs of replicated queues: a queue type that has one gives
    `raft_metrics()` -> {family: value}; none does yet, so these are empty."""
    families = [Family(name, kind, doc) for name, kind, doc in RAFT]
    for q in s.queues:
        raft = getattr(q, "raft_metrics", None)
        if raft is None:
            continue
        values = raft()
        for family in families:
            if family.name in values:
                family.add(values[family.name], vhost=q.vhost.name, queue=q.name)
    yield from families


def _auth_attempts(s: Scrape) -> Iterator[Family]:
    attempts = s.broker.counters.auth_attempts or {PROTOCOL: [0, 0]}
    kept = ("protocol",)
    every = Family("auth_attempts", "counter", "Total number of authorization attempts", kept=kept)
    ok = Family(
        "auth_attempts_succeeded",
        "counter",
        "Total number of successful authentication attempts",
        kept=kept,
    )
    failed = Family(
        "auth_attempts_failed",
        "counter",
        "Total number of failed authentication attempts",
        kept=kept,
    )
    for protocol, (succeeded, refused) in sorted(attempts.items()):
        every.add(succeeded + refused, protocol=protocol)
        ok.add(succeeded, protocol=protocol)
        failed.add(refused, protocol=protocol)
    yield from (every, ok, failed)


def _auth_attempts_detailed(s: Scrape) -> Iterator[Family]:
    """Attempts by source address and user: RabbitMQ keeps them only when told to
    (off by default, as here), so the families are listed without samples."""
    for name, doc in (
        ("auth_attempts_detailed", "Total number of authorization attempts with source info"),
        (
            "auth_attempts_detailed_succeeded",
            "Total number of successful authorization attempts with source info",
        ),
        (
            "auth_attempts_detailed_failed",
            "Total number of failed authorization attempts with source info",
        ),
    ):
        yield Family(name, "counter", doc, kept=("remote_address", "username", "protocol"))


# A queue's figures, as columns: what the queue families are made of.
Q_READY, Q_UNACKED, Q_PAGED, Q_BYTES, Q_CONSUMERS, Q_BUSY, Q_PUBLISHED = range(7)
Q_COLUMNS = 7


def _queue_row(q: Any) -> tuple[float, ...]:
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


def _per_queue(
    s: Scrape, specs: Iterable[tuple[str, str, str, Callable[[tuple[float, ...]], float]]]
) -> Iterator[Family]:
    for name, kind, doc, of in specs:
        yield s.each_queue(Family(name, kind, doc), of)


def _zero(r: tuple[float, ...]) -> float:
    return 0


def _queue_coarse(s: Scrape) -> Iterator[Family]:
    yield from _per_queue(
        s,
        (
            (
                "queue_messages_ready",
                "gauge",
                "Messages ready to be delivered to consumers",
                lambda r: r[Q_READY],
            ),
            (
                "queue_messages_unacked",
                "gauge",
                "Messages delivered to consumers but not yet acknowledged",
                lambda r: r[Q_UNACKED],
            ),
            (
                "queue_messages",
                "gauge",
                "Sum of ready and unacknowledged messages - total queue depth",
                lambda r: r[Q_READY] + r[Q_UNACKED],
            ),
        ),
    )


QUEUE_CONSUMERS = ("queue_consumers", "gauge", "Consumers on a queue", lambda r: r[Q_CONSUMERS])


def _queue_consumer_count(s: Scrape) -> Iterator[Family]:
    yield from _per_queue(s, (QUEUE_CONSUMERS,))


def _queue(s: Scrape) -> Iterator[Family]:
    """As the management API's queue fields, with its stand-ins where Leveret keeps no
    such sum (docs/management.md#stand-ins): persistent and unacknowledged bytes."""
    yield from _per_queue(
        s,
        (
            QUEUE_CONSUMERS,
            # As RabbitMQ: the share of time consumers could take messages; a queue whose
            # consumers all have room counts as 1.0, none as 0.
            ("queue_consumer_capacity", "gauge", "Consumer capacity", lambda r: r[Q_BUSY]),
            (
                "queue_consumer_utilisation",
                "gauge",
                "Same as consumer capacity",
                lambda r: r[Q_BUSY],
            ),
            (
                "queue_process_memory_bytes",
                "gauge",
                "Memory in bytes used by the Erlang queue process",
                _zero,
            ),
            (
                "queue_messages_ram",
                "gauge",
                "Ready and unacknowledged messages stored in memory",
                lambda r: r[Q_READY] + r[Q_UNACKED] - r[Q_PAGED],
            ),
            (
                "queue_messages_ram_bytes",
                "gauge",
                "Size of ready and unacknowledged messages stored in memory",
                lambda r: r[Q_BYTES],
            ),
            (
                "queue_messages_ready_ram",
                "gauge",
                "Ready messages stored in memory",
                lambda r: r[Q_READY] - r[Q_PAGED],
            ),
            (
                "queue_messages_unacked_ram",
                "gauge",
                "Unacknowledged messages stored in memory",
                lambda r: r[Q_UNACKED],
            ),
            ("queue_messages_persistent", "gauge", "Persistent messages", _zero),
            (
                "queue_messages_persistent_bytes",
                "gauge",
                "Size in bytes of persistent messages",
                _zero,
            ),
            (
                "queue_messages_bytes",
                "gauge",
                "Size in bytes of ready and unacknowledged messages",
                lambda r: r[Q_BYTES],
            ),
            (
                "queue_messages_ready_bytes",
                "gauge",
                "Size in bytes of ready messages",
                lambda r: r[Q_BYTES],
            ),
            (
                "queue_messages_unacked_bytes",
                "gauge",
                "Size in bytes of all unacknowledged messages",
                _zero,
            ),
            (
                "queue_messages_paged_out",
                "gauge",
                "Messages paged out to disk",
                lambda r: r[Q_PAGED],
            ),
            (
                "queue_messages_paged_out_bytes",
                "gauge",
                "Size in bytes of messages paged out to disk",
                _zero,
            ),
            (
                "queue_head_message_timestamp",
                "gauge",
                "Timestamp of the first message in the queue, if any",
                lambda r: _NAN,
            ),
            (
                "queue_disk_reads",
                "counter",
                "Total number of times queue read messages from disk",
                _zero,
            ),
            (
                "queue_disk_writes",
                "counter",
                "Total number of times queue wrote messages to disk",
                _zero,
            ),
        ),
    )


def _per_channel(
    s: Scrape, specs: Iterable[tuple[str, str, str, Callable[[Any], float]]], vhost: bool = False
) -> Iterator[Family]:
    for name, kind, doc, of in specs:
        family = Family(name, kind, doc)
        yield s.each(family, s.channels, "channel-vhost" if vhost else "channel", of)


def _uncommitted(ch: Any, part: str) -> int:
    tx = ch.tx
    return len(getattr(tx, part)) if tx is not None else 0


def _channel(s: Scrape) -> Iterator[Family]:
    yield from _per_channel(
        s,
        (
            ("channel_consumers", "gauge", "Consumers on a channel", lambda ch: len(ch.consumers)),
            (
                "channel_messages_unacked",
                "gauge",
                "Delivered but not yet acknowledged messages",
                lambda ch: ch.unacked_count,
            ),
            (
                "channel_messages_unconfirmed",
                "gauge",
                "Published but not yet confirmed messages",
                lambda ch: ch.publish_seq - ch.confirmed_upto if ch.confirm_mode else 0,
            ),
            (
                "channel_messages_uncommitted",
                "gauge",
                "Messages received in a transaction but not yet committed",
                lambda ch: _uncommitted(ch, "publishes"),
            ),
            (
                "channel_acks_uncommitted",
                "gauge",
                "Message acknowledgements in a transaction not yet committed",
                lambda ch: _uncommitted(ch, "settlements"),
            ),
            (
                "consumer_prefetch",
                "gauge",
                "Limit of unacknowledged messages for each consumer",
                lambda ch: ch.prefetch_count,
            ),
            (
                "channel_prefetch",
                "gauge",
                "Total limit of unacknowledged messages for all consumers on a channel",
                lambda ch: ch.global_prefetch,
            ),
        ),
    )


def _stat(key: str) -> Callable[[Any], float]:
    return lambda ch: getattr(ch.stats, key)


def _channel_exchange(s: Scrape) -> Iterator[Family]:
    """Per channel (RabbitMQ: per channel and exchange; docs/differences.md#prometheus)."""
    yield from _per_channel(
        s,
        (
            (
                "channel_messages_published",
                "counter",
                "Total number of messages published into an exchange on a channel",
                _stat("publish"),
            ),
            (
                "channel_messages_confirmed",
                "counter",
                "Total number of messages published into an exchange and confirmed on the channel",
                _stat("confirm"),
            ),
            (
                "channel_messages_unroutable_returned",
                "counter",
                "Total number of messages published as mandatory into an exchange and returned "
                "to the publisher as unroutable",
                _stat("return_unroutable"),
            ),
            (
                "channel_messages_unroutable_dropped",
                "counter",
                "Total number of messages published as non-mandatory into an exchange and "
                "dropped as unroutable",
                _stat("drop_unroutable"),
            ),
        ),
        vhost=True,
    )


def _channel_queue(s: Scrape) -> Iterator[Family]:
    """Per channel (RabbitMQ: per channel and queue; docs/differences.md#prometheus)."""
    yield from _per_channel(
        s,
        (
            (
                "channel_get_ack",
                "counter",
                "Total number of messages fetched with basic.get in manual acknowledgement mode",
                _stat("get"),
            ),
            (
                "channel_get",
                "counter",
                "Total number of messages fetched with basic.get in automatic acknowledgement mode",
                _stat("get_no_ack"),
            ),
            (
                "channel_messages_delivered_ack",
                "counter",
                "Total number of messages delivered to consumers in manual acknowledgement mode",
                _stat("deliver"),
            ),
            (
                "channel_messages_delivered",
                "counter",
                "Total number of messages delivered to consumers in automatic acknowledgement mode",
                _stat("deliver_no_ack"),
            ),
            (
                "channel_messages_redelivered",
                "counter",
                "Total number of messages redelivered to consumers",
                _stat("redeliver"),
            ),
            (
                "channel_messages_acked",
                "counter",
                "Total number of messages acknowledged by consumers",
                _stat("ack"),
            ),
            (
                "channel_get_empty",
                "counter",
                "Total number of times basic.get operations fetched no message",
                _stat("get_empty"),
            ),
        ),
        vhost=True,
    )


def _per_connection(
    s: Scrape, specs: Iterable[tuple[str, str, str, Callable[[Any], float]]]
) -> Iterator[Family]:
    for name, kind, doc, of in specs:
        yield s.each(Family(name, kind, doc), s.connections, "connection", of)


def _connection_coarse(s: Scrape) -> Iterator[Family]:
    yield from _per_connection(
        s,
        (
            (
                "connection_incoming_bytes",
                "counter",
                "Total number of bytes received on a connection",
                lambda c: c.recv_oct,
            ),
            (
                "connection_outgoing_bytes",
                "counter",
                "Total number of bytes sent on a connection",
                lambda c: c.send_oct,
            ),
        ),
    )


def _connection(s: Scrape) -> Iterator[Family]:
    yield from _per_connection(
        s,
        (
            (
                "connection_incoming_packets",
                "counter",
                "Total number of packets received on a connection",
                lambda c: c.recv_cnt,
            ),
            (
                "connection_outgoing_packets",
                "counter",
                "Total number of packets sent on a connection",
                lambda c: c.send_cnt,
            ),
            (
                "connection_pending_packets",
                "gauge",
                "Number of packets waiting to be sent on a connection",
                lambda c: c.transport.get_write_buffer_size() if c.transport else 0,
            ),
            ("connection_channels", "gauge", "Channels on a connection", lambda c: len(c.channels)),
        ),
    )


def _channel_queue_exchange(s: Scrape) -> Iterator[Family]:
    """Per queue (RabbitMQ: per channel, exchange and queue; docs/differences.md#prometheus)."""
    family = Family(
        "queue_messages_published", "counter", "Total number of messages published to queues"
    )
    if s.per_object:
        family.columns = (s.labels("published"), [r[Q_PUBLISHED] for r in s.queue_rows])
    else:
        family.add(sum(r[Q_PUBLISHED] for r in s.queue_rows))
    yield family


#: RabbitMQ's collector groups (the `family` values /metrics/detailed takes), in its order
GROUPS: dict[str, Callable[[Scrape], Iterator[Family]]] = {
    "connection_churn_metrics": _connection_churn,
    "node_coarse_metrics": _node_coarse,
    "node_metrics": _node,
    "node_persister_metrics": _node_persister,
    "ra_metrics": _ra,
    "auth_attempt_metrics": _auth_attempts,
    "auth_attempt_detailed_metrics": _auth_attempts_detailed,
    "queue_coarse_metrics": _queue_coarse,
    "queue_consumer_count": _queue_consumer_count,
    "queue_metrics": _queue,
    "channel_metrics": _channel,
    "channel_exchange_metrics": _channel_exchange,
    "channel_queue_metrics": _channel_queue,
    "connection_coarse_metrics": _connection_coarse,
    "connection_metrics": _connection,
    "channel_queue_exchange_metrics": _channel_queue_exchange,
}
#: /metrics: every group (queue_metrics has the consumers); per-object adds the detailed
#: auth attempts
DEFAULT_GROUPS = tuple(
    g for g in GROUPS if g not in ("queue_consumer_count", "auth_attempt_detailed_metrics")
)
PER_OBJECT_GROUPS = tuple(g for g in GROUPS if g != "queue_consumer_count")


def _vhost_status(s: Scrape) -> Iterator[Family]:
    family = Family("vhost_status", "gauge", "Whether a given vhost is running")
    for v in s.vhosts:
        if s.vhost_filter is None or v.name in s.vhost_filter:
            family.add(1, vhost=v.name)
    yield family


def _exchanges(s: Scrape) -> Iterator[tuple[Any, Any]]:
    for v in s.vhosts:
        if s.vhost_filter is None or v.name in s.vhost_filter:
            for x in v.exchanges.values():
                yield v, x


def _exchange_bindings(s: Scrape) -> Iterator[Family]:
    family = Family(
        "exchange_bindings",
        "gauge",
        "Number of bindings for an exchange. This value is cluster-wide.",
    )
    for v, x in _exchanges(s):
        family.add(len(getattr(x, "bindings", ())), vhost=v.name, exchange=x.name, type=x.type_name)
    yield family


def _exchange_names(s: Scrape) -> Iterator[Family]:
    family = Family(
        "exchange_name",
        "gauge",
        "Enumerates exchanges without any additional info. This value is cluster-wide. "
        "A cheaper alternative to `exchange_bindings`",
    )
    for v, x in _exchanges(s):
        family.add(1, vhost=v.name, exchange=x.name, type=x.type_name)
    yield family


#: /metrics/detailed only, named rabbitmq_cluster_*
CLUSTER_GROUPS: dict[str, Callable[[Scrape], Iterator[Family]]] = {
    "vhost_status": _vhost_status,
    "exchange_bindings": _exchange_bindings,
    "exchange_names": _exchange_names,
}


# --- node totals: objects now, and counters that never go back -----------------------------


def _totals(s: Scrape) -> Iterator[Family]:
    consumers = sum(r[Q_CONSUMERS] for r in s.queue_rows)
    yield Family("connections", "gauge", "Connections currently open").add(len(s.connections))
    yield Family("channels", "gauge", "Channels currently open").add(len(s.channels))
    yield Family("consumers", "gauge", "Consumers currently connected").add(consumers)
    yield Family("queues", "gauge", "Queues available").add(len(s.queues))


def _global(s: Scrape) -> Iterator[Family]:
    """RabbitMQ's rabbit_global_counters: by protocol, and by queue type for what
    queues do (deliveries, acks); never going back, deleted objects included."""
    broker = s.broker
    counters = broker.counters
    proto = {"protocol": PROTOCOL}
    kept = ("protocol", "queue_type", "dead_letter_strategy")

    def one(name: str, kind: str, doc: str, value: float) -> Family:
        return Family(name, kind, doc, kept=kept).add(value, **proto)

    by_vhost: dict[str, list[Any]] = {v.name: [] for v in s.vhosts}
    for conn in s.connections:
        if conn.vhost is not None and conn.vhost.name in by_vhost:
            by_vhost[conn.vhost.name].append(conn)
    channel_side = total(
        [counters.retired_stats, *(vhost_counts(v, by_vhost[v.name]) for v in s.vhosts)]
    )
    received = channel_side[_I["publish"]]
    dropped = channel_side[_I["drop_unroutable"]]
    returned = channel_side[_I["return_unroutable"]]
    received_confirm = channel_side[_I["publish_confirm"]] + sum(
        ch.publish_seq - ch.confirms_folded for ch in s.channels
    )
    publishers = sum(1 for ch in s.channels if ch.stats.publish)
    consumers = sum(r[Q_CONSUMERS] for r in s.queue_rows)
    yield one("global_consumers", "gauge", "Current number of consumers", consumers)
    yield one("global_publishers", "gauge", "Current number of publishers", publishers)
    yield one(
        "global_messages_received", "counter", "Total number of messages received from publishers",
        received,
    )  # fmt: skip
    yield one(
        "global_messages_received_confirm",
        "counter",
        "Total number of messages received from publishers expecting confirmations",
        received_confirm,
    )
    yield one(
        "global_messages_routed", "counter", "Total number of messages routed to queues or streams",
        received - dropped - returned,
    )  # fmt: skip
    yield one(
        "global_messages_unroutable_dropped",
        "counter",
        "Total number of messages published as non-mandatory into an exchange and dropped as "
        "unroutable",
        dropped,
    )
    yield one(
        "global_messages_unroutable_returned",
        "counter",
        "Total number of messages published as mandatory into an exchange and returned to the "
        "publisher as unroutable",
        returned,
    )
    yield one(
        "global_messages_confirmed", "counter", "Total number of messages confirmed to publishers",
        channel_side[_I["confirm"]],
    )  # fmt: skip
    # What queues did, by queue type (queue-side counts, deleted queues included).
    by_type = counters.queue_counts(s.vhosts, QUEUE_SIDE)
    zero = dict.fromkeys(QUEUE_SIDE, 0)
    for name, doc, keys in (
        ("delivered", "Total number of messages delivered to consumers",
         ("deliver", "deliver_no_ack", "get", "get_no_ack")),
        ("delivered_consume_manual_ack",
         "Total number of messages delivered to consumers using basic.consume with manual "
         "acknowledgment", ("deliver",)),
        ("delivered_consume_auto_ack",
         "Total number of messages delivered to consumers using basic.consume with automatic "
         "acknowledgment", ("deliver_no_ack",)),
        ("delivered_get_manual_ack",
         "Total number of messages delivered to consumers using basic.get with manual "
         "acknowledgment", ("get",)),
        ("delivered_get_auto_ack",
         "Total number of messages delivered to consumers using basic.get with automatic "
         "acknowledgment", ("get_no_ack",)),
        ("get_empty", "Total number of times basic.get operations fetched no message",
         ("get_empty",)),
        ("redelivered", "Total number of messages redelivered to consumers", ("redeliver",)),
        ("acknowledged", "Total number of message acknowledgements received from consumers",
         ("ack",)),
    ):  # fmt: skip
        family = Family(f"global_messages_{name}", "counter", doc, kept=kept)
        for queue_type in sorted({*QUEUE_TYPES, *by_type}):
            counts = by_type.get(queue_type, zero)
            family.add(
                sum(counts[k] for k in keys),
                protocol=PROTOCOL,
                queue_type=queue_type_label(queue_type),
            )
        yield family
    dead = counters.dead_lettered
    for reason, doc in (
        ("confirmed", "Total number of messages dead-lettered and confirmed by target queues"),
        ("delivery_limit", "Total number of messages dead-lettered due to delivery-limit exceeded"),
        ("expired", "Total number of messages dead-lettered due to message TTL exceeded"),
        ("maxlen", "Total number of messages dead-lettered due to overflow drop-head or "
         "reject-publish-dlx"),
        ("rejected", "Total number of messages dead-lettered due to basic.reject or basic.nack"),
    ):  # fmt: skip
        family = Family(f"global_messages_dead_lettered_{reason}", "counter", doc, kept=kept)
        keys = {(qt, st) for (r, qt, st) in dead if r == reason} | DEAD_LETTER_SERIES[reason]
        for queue_type, strategy in sorted(keys):
            family.add(
                dead.get((reason, queue_type, strategy), 0),
                queue_type=queue_type_label(queue_type),
                dead_letter_strategy=strategy,
            )
        yield family


def _info(s: Scrape) -> Iterator[Rendered]:
    cluster = s.broker.cluster_name
    yield _rendered(
        Family("rabbitmq_identity_info", "untyped", "RabbitMQ node & cluster identity info").add(
            1,
            rabbitmq_node=NODE,
            rabbitmq_cluster=cluster,
            rabbitmq_cluster_permanent_id=s.broker.cluster_id,
        )
    )
    yield _rendered(
        Family("rabbitmq_build_info", "untyped", "RabbitMQ & Erlang/OTP version info").add(
            1,
            rabbitmq_version=RABBITMQ_VERSION,
            prometheus_plugin_version=leveret.__version__,
            prometheus_client_version=CLIENT_VERSION,
            # No Erlang: the runtime that runs the broker, named as such.
            erlang_version=f"python-{platform.python_version()}",
        )
    )


def _distribution_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


CLIENT_VERSION = _distribution_version("prometheus-client")


# --- rendering ---------------------------------------------------------------------------


class Rendered(NamedTuple):
    """A family as it goes out: full name, samples (aggregated on /metrics)."""

    name: str
    kind: str  # "counter" (name without _total), "gauge", "untyped"
    doc: str
    samples: Iterable[tuple[dict[str, str], float]]


def _rendered(family: Family, prefix: str = "", per_object: bool = True) -> Rendered:
    samples: Iterable[tuple[dict[str, str], float]] = family.samples
    if family.columns is not None:
        labels, values = family.columns
        samples = (
            zip(labels, values, strict=True)
            if not family.samples
            else [
                *family.samples,
                *zip(labels, values, strict=True),
            ]
        )
    if not per_object:
        samples = list(samples)
    if not per_object and (family.kept or not samples or any(lb for lb, _v in samples)):
        # /metrics: sums by the kept labels (one unlabelled 0 when there is nothing)
        sums: dict[tuple[tuple[str, str], ...], float] = {}
        for labels, value in samples:
            key = tuple((k, v) for k, v in labels.items() if k in family.kept)
            sums[key] = sums.get(key, 0) + value
        if not sums and not family.kept:
            sums[()] = 0
        samples = [(dict(k), v) for k, v in sums.items()]
    return Rendered(prefix + family.name, family.kind, family.doc, samples)


def _label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def render(items: Iterable[Rendered | Metric]) -> bytes:
    """The Prometheus text format (0.0.4), as prometheus-client's generate_latest writes
    it (tests/unit/test_prometheus_text.py compares the two). Written here because a
    per-object scrape of 10,000 queues is 220,000 samples, and the library's per-sample
    objects made that take seconds on the broker's loop: here each object's label text
    is made once per scrape. Other metrics (histograms) go through the library."""
    items = list(items)  # alive until the end: label texts are cached by id()
    out: list[str] = []
    others: list[Metric] = []
    label_text: dict[int, str] = {}
    for item in items:
        if not isinstance(item, Rendered):
            others.append(item)
            continue
        name = item.name + "_total" if item.kind == "counter" else item.name
        doc = item.doc.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {item.kind}\n")
        for labels, value in item.samples:
            text = label_text.get(id(labels))
            if text is None:
                text = ",".join(f'{k}="{_label_value(v)}"' for k, v in sorted(labels.items()))
                text = label_text[id(labels)] = "{" + text + "}" if text else ""
            out.append(f"{name}{text} {floatToGoString(value)}\n")
    body = "".join(out).encode()
    if others:
        body += generate_latest(_Metrics(others))  # type: ignore[arg-type]
    return body


class _Metrics:
    """A registry-like list of prometheus-client metrics, for generate_latest."""

    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> list[Metric]:
        return self.metrics


def _histogram(name: str, doc: str, buckets: Buckets) -> HistogramMetricFamily:
    cumulative, running = [], 0
    for bound, count in zip((*buckets.bounds, float("inf")), buckets.counts, strict=True):
        running += count
        cumulative.append(("+Inf" if bound == float("inf") else repr(bound), running))
    return HistogramMetricFamily(name, doc, buckets=cumulative, sum_value=buckets.sum)


def _leveret(server: Server) -> Iterator[Rendered | Metric]:
    if server.cluster is not None:  # leveret.cluster: replication lag, in-sync set
        yield from server.cluster.metrics()
    if server.links is not None:  # leveret.links: messages moved per shovel and link
        yield from server.links.metrics()
    state = server.durable_state
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
    for family in (
        Family("leveret_paged_out_messages", "counter", "Message bodies moved out of RAM to disk")
        .add(state.paged_out),
        Family("leveret_paged_out_bytes", "counter", "Bytes of message bodies moved out of RAM to disk")
        .add(state.paged_out_bytes),
        Family("leveret_message_bodies_in_memory_bytes", "gauge", "Bytes of queued message bodies held in RAM")
        .add(state.memory_used),
    ):  # fmt: skip
        yield _rendered(family)


def _delayed(s: Scrape, per_object: bool) -> Rendered:
    """Messages delayed exchanges hold back (broker/exchanges/delayed.py), which
    RabbitMQ's plugin shows only as the exchange's messages_delayed: per exchange on
    /metrics/per-object, their sum on /metrics."""
    family = Family(
        "leveret_exchange_messages_delayed",
        "gauge",
        "Messages a delayed exchange holds until their x-delay has passed",
    )
    for vhost in s.vhosts:
        for x in vhost.exchanges.values():
            if x.type_name == "x-delayed-message":
                family.add(x.router.info()["messages_delayed"], vhost=vhost.name, exchange=x.name)
    return _rendered(family, per_object=per_object)


def _process_start_time() -> float:
    """When this process started (seconds since the epoch), from /proc as
    prometheus-client's process collector reads it; else when this module loaded."""
    try:
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


PROCESS_STARTED = _process_start_time()


def _process_start() -> Metric:
    return GaugeMetricFamily(
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
        value=PROCESS_STARTED,
    )


class BrokerCollector:
    """Reads the broker when Prometheus scrapes; keeps nothing between scrapes."""

    def __init__(
        self,
        server: Server,
        mode: str = "metrics",
        groups: Iterable[str] | None = None,
        vhosts: Iterable[str] | None = None,
    ) -> None:
        self.server = server
        self.mode = mode  # "metrics", "per-object" or "detailed"
        self.groups = tuple(groups) if groups is not None else None
        self.vhosts = set(vhosts) if vhosts else None

    def render(self) -> bytes:
        return render(self.collect())

    def collect(self) -> Iterator[Rendered | Metric]:
        s = Scrape(
            self.server,
            self.vhosts if self.mode == "detailed" else None,
            per_object=self.mode != "metrics",
        )
        if self.mode == "detailed":
            wanted = self.groups or ()
            for name in wanted:
                if name in GROUPS:
                    for family in GROUPS[name](s):
                        yield _rendered(family, "rabbitmq_detailed_")
                elif name in CLUSTER_GROUPS:
                    for family in CLUSTER_GROUPS[name](s):
                        yield _rendered(family, "rabbitmq_cluster_")
            yield from _info(s)
            return
        per_object = self.mode == "per-object"
        for name in PER_OBJECT_GROUPS if per_object else DEFAULT_GROUPS:
            for family in GROUPS[name](s):
                yield _rendered(family, "rabbitmq_", per_object)
        for family in _totals(s):
            yield _rendered(family, "rabbitmq_")
        for family in _global(s):
            yield _rendered(family, "rabbitmq_", per_object=False)
        if not per_object:  # RabbitMQ's per-object registry has the core metrics only
            yield from self._alarms()
            yield _process_start()
        yield from _info(s)
        yield from _leveret(self.server)
        yield _delayed(s, per_object)

    def _alarms(self) -> Iterator[Rendered]:
        alarms = self.server.alarms
        active = alarms.active if alarms is not None else set()
        for name, doc, on in (
            ("memory_used_watermark", "is 1 if VM memory watermark alarm is in effect",
             "memory" in active),
            ("free_disk_space_watermark", "is 1 if free disk space watermark alarm is in effect",
             "disk" in active),
            # Leveret raises no file-descriptor alarm
            ("file_descriptor_limit", "is 1 if file descriptor limit alarm is in effect", False),
        ):  # fmt: skip
            yield _rendered(Family(f"rabbitmq_alarms_{name}", "untyped", doc).add(int(on)))


class PrometheusServer:
    """`/metrics`, `/metrics/per-object` and `/metrics/detailed` on their own port, in
    the broker's loop."""

    def __init__(self, server: Server, host: str, port: int) -> None:
        self.server = server
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    async def _metrics(self, request: web.Request) -> web.Response:
        path = request.path.rstrip("/")
        if path.endswith("/per-object"):
            collector = BrokerCollector(self.server, "per-object")
        elif path.endswith("/detailed"):
            query = request.query
            collector = BrokerCollector(
                self.server, "detailed", query.getall("family", []), query.getall("vhost", [])
            )
        else:
            collector = BrokerCollector(self.server)
        body = collector.render()
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
