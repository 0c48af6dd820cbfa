"""RabbitMQ's core metrics: its collector groups, read from the live model.

The families are grouped as RabbitMQ's core collector groups them (GROUPS below);
each group reads the model at scrape time, so metrics cost nothing between scrapes
and nothing per message beyond the counters broker/stats.py keeps anyway. Families
that only an Erlang VM has (reductions, schedulers, Mnesia, allocators) are left
out: docs/differences.md#prometheus lists them.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from leveret.broker.stats import churn_counts
from leveret.management.prometheus.scrape import (
    Q_BUSY,
    Q_BYTES,
    Q_CONSUMERS,
    Q_PAGED,
    Q_PUBLISHED,
    Q_READY,
    Q_UNACKED,
    Scrape,
)
from leveret.management.prometheus.text import Family, Rendered, rendered
from leveret.server.alarms import resident_bytes

NODE = "leveret@localhost"  # as the management API names the node
PROTOCOL = "amqp091"
#: queue types whose series RabbitMQ always lists, whether or not such queues exist
QUEUE_TYPES = ("classic", "quorum", "stream")
_NAN = float("nan")


# --- the groups, in RabbitMQ's names ----------------------------------------------------


def _connection_churn(s: Scrape) -> Iterator[Family]:
    broker = s.broker
    if s.workers is not None:  # the node's: every worker's (management/workers.py)
        counts = s.workers.churn_counts(churn_counts(broker))
        conns_opened, conns_closed, channels_opened, channels_closed = counts[:4]
        churn = list(counts[4:])
    else:
        retired = broker.counters.retired_churn
        churn = [sum(v.churn[i] for v in s.vhosts) + retired[i] for i in range(3)]
        conns_opened, channels_opened = broker.connections_opened, broker.channels_opened
        conns_closed = conns_opened - len(s.connections)
        channels_closed = channels_opened - len(s.channels)
    for name, doc, value in (
        ("connections_opened", "Total number of connections opened", conns_opened),
        (
            "connections_closed",
            "Total number of connections closed or terminated",
            conns_closed,
        ),
        ("channels_opened", "Total number of channels opened", channels_opened),
        ("channels_closed", "Total number of channels closed", channels_closed),
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
        st = os.statvfs(s.node.config.data_dir or ".")
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = 0
    sockets, memory = len(s.node.connections), resident_bytes()
    if s.workers is not None:  # every process of the node
        fds = s.workers.gauge("fd_used", fds)
        sockets = s.workers.gauge("sockets_used", sockets)
        memory = s.workers.gauge("mem_used", memory)
    yield Family("process_open_fds", "gauge", "Open file descriptors").add(fds)
    yield Family("process_open_tcp_sockets", "gauge", "Open TCP sockets").add(sockets)
    yield Family("process_resident_memory_bytes", "gauge", "Memory used in bytes").add(memory)
    yield Family("disk_space_available_bytes", "gauge", "Disk space available in bytes").add(free)


def max_tcp_sockets(max_fds: int) -> int:
    """Sockets that fit in the descriptor limit, reckoned as RabbitMQ reckons its
    sockets_total: 90% of what is left after 100 descriptors for files."""
    return max(0, round((max_fds - 100) * 0.9))


def _node(s: Scrape) -> Iterator[Family]:
    alarms = s.node.alarms
    max_fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    max_sockets = max_tcp_sockets(max_fds)
    memory_limit = alarms.memory_limit if alarms is not None else 0
    if s.workers is not None:  # the node's: every worker's limits and share
        limits = s.workers.fd_limits(max_fds)
        max_fds, max_sockets = sum(limits), sum(map(max_tcp_sockets, limits))
        memory_limit = s.workers.memory_limit(memory_limit)
    yield Family("process_max_fds", "gauge", "Open file descriptors limit").add(max_fds)
    yield Family("process_max_tcp_sockets", "gauge", "Open TCP sockets limit").add(max_sockets)
    yield Family("resident_memory_limit_bytes", "gauge", "Memory high watermark in bytes").add(
        memory_limit
    )
    yield Family(
        "disk_space_available_limit_bytes", "gauge", "Free disk space low watermark in bytes"
    ).add(alarms.disk_free_limit if alarms is not None else 0)
    yield Family("erlang_uptime_seconds", "gauge", "Node uptime").add(
        time.monotonic() - s.node.started_at
    )


def _node_persister(s: Scrape) -> Iterator[Family]:
    """The message store's fsyncs, as RabbitMQ's I/O sync counters."""
    state = s.node.durable_state
    committer = state.messages.committer if state is not None else None
    fsyncs = committer.fsync_seconds if committer is not None else None
    if fsyncs is not None and s.workers is not None:  # every worker's store
        fsyncs = s.workers.histogram("fsync_seconds", fsyncs)
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
    attempts = s.broker.counters.auth_attempts
    if s.workers is not None:  # every worker's
        attempts = s.workers.auth_attempts(attempts)
    attempts = attempts or {PROTOCOL: [0, 0]}
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


def _pending_bytes(conn: Any) -> int:
    """What waits in a connection's socket buffer; an MQTT connection's transport (TCP,
    TLS or WebSocket adapter) may not say, and counts 0 then."""
    size = getattr(conn.transport, "get_write_buffer_size", None)
    return size() if size is not None else 0


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
                _pending_bytes,
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


def _totals(s: Scrape) -> Iterator[Family]:
    consumers = sum(r[Q_CONSUMERS] for r in s.queue_rows)
    yield Family("connections", "gauge", "Connections currently open").add(len(s.connections))
    yield Family("channels", "gauge", "Channels currently open").add(len(s.channels))
    yield Family("consumers", "gauge", "Consumers currently connected").add(consumers)
    yield Family("queues", "gauge", "Queues available").add(len(s.queues))


class CoreCollector:
    """RabbitMQ's core families: every group on `/metrics` (summed) and
    `/metrics/per-object`, the groups asked for on `/metrics/detailed`, and the node
    totals."""

    def collect(self, s: Scrape) -> Iterator[Rendered]:
        if s.mode == "detailed":
            for name in s.groups:
                if name in GROUPS:
                    for family in GROUPS[name](s):
                        yield rendered(family, "rabbitmq_detailed_")
                elif name in CLUSTER_GROUPS:
                    for family in CLUSTER_GROUPS[name](s):
                        yield rendered(family, "rabbitmq_cluster_")
            return
        per_object = s.per_object
        for name in PER_OBJECT_GROUPS if per_object else DEFAULT_GROUPS:
            for family in GROUPS[name](s):
                yield rendered(family, "rabbitmq_", per_object)
        for family in _totals(s):
            yield rendered(family, "rabbitmq_")
