"""One broker from outside: worker 0's management API and Prometheus endpoint, and
every worker's ctl socket, show the queues, connections, channels and consumers of
every worker, and the node's figures (memory, descriptors, churn, logins, the
store's, alarms) as the whole broker's.

In a broker of several worker processes (leveret.workers) each worker holds its own
queues' messages and its own clients' connections; worker 0 alone runs the
management API and Prometheus. `WorkerStats` is the piece of each worker that
bridges the two:

- on every worker it serves calls over the mesh: "stats" answers a `Report` of
  what this worker holds (its queues' Prometheus figures and, for the API's queue
  routes, their JSON as the management API shows them, built by the same functions
  that build worker 0's own; its connections, channels and consumers likewise; its
  vhosts' message counts and rates; its process's gauges, alarms and churn rates;
  its counters of the node's, `node_counters`, with the global counters);
  "close_connection" closes one of its connections
  (DELETE /api/connections/{name} on worker 0); "api_get" and "api_purge" get
  messages from and purge a queue it owns (the API's .../get and .../contents),
  run on the owner as worker 0 runs them for its own queues;
- on worker 0 it keeps the latest report of each other worker and hands them to the
  routes (`management/routes/`), to Prometheus' scrape and to `leveret ctl`'s
  listings (a ctl listing on another worker's socket gathers the same way); it sums
  the node's figures, keeping a restarted worker's past counters (`_retire`) so
  the node's never go back.

Reports are pulled, not pushed: an API request, a scrape or a ctl listing first
`refresh()`es, which asks every other live worker at most once per
`INTERVAL` (1 s; RabbitMQ's collect_statistics_interval is 5 s), all at once, and
reuses the answers for requests within that second. A broker nobody looks at
exchanges nothing; a worker starts its rates sampler (broker.stats.Sampler) with
the first report it is asked for, so rates exist where the counts change.

A worker that does not answer within `TIMEOUT` keeps its last report; a worker that
is down has none, and its queues show RabbitMQ's `"state": "down"` with their
definition only.

Nothing here runs on a one-process broker: the launcher makes a `WorkerStats` only
for a node with a mesh, and the routes and collectors ask for it with one getattr.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import resource
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from leveret.broker import definitions_json, inventory
from leveret.broker.errors import NotFound
from leveret.broker.queues.remote import RemoteQueue
from leveret.broker.stats import FIELDS, Sampler, total, vhost_counts
from leveret.management.node_info import proc_io
from leveret.management.prometheus.collectors.global_counters import QUEUE_SIDE
from leveret.management.prometheus.scrape import queue_row
from leveret.management.routes.common import NODE
from leveret.management.routes.messages import get_from
from leveret.management.routes.runtime import _channel_json, _connection_json, _consumer_json
from leveret.management.routes.topology import _queue_json
from leveret.server.alarms import resident_bytes
from leveret.workers.metadata import absent

if TYPE_CHECKING:
    from leveret.handle import NodeHandle
    from leveret.management.prometheus.scrape import Scrape

log = logging.getLogger("leveret.management")

#: the channel-side count that publishes with confirms add to (FIELDS order)
CONFIRM = FIELDS.index("publish_confirm")

#: how old a worker's report may be before a request asks for a new one (seconds)
INTERVAL = 1.0
#: how long worker 0 waits for a report before it uses the last one (seconds)
TIMEOUT = 2.0
#: what a queue's single view adds to its list entry
SINGLE_ONLY = ("consumer_details", "deliveries", "incoming")
#: what a channel's single view adds to its list entry
CHANNEL_SINGLE_ONLY = ("consumer_details", "publishes", "deliveries")
#: TLS fields a list shows as null and a single connection as "" (RabbitMQ's quirk)
BLANK_IN_SINGLE = (
    "ssl_protocol",
    "ssl_cipher",
    "ssl_hash",
    "ssl_key_exchange",
    "peer_cert_subject",
    "peer_cert_issuer",
    "peer_cert_validity",
)


# --- what one worker reports ------------------------------------------------------------


@dataclass
class QueueReport:
    """One queue as its owner shows it: Prometheus' row (scrape.queue_row's columns),
    its depth rates (ready, unacked per second) and, when asked for, the management
    API's single view (with `worker`)."""

    row: tuple[float, ...]
    rates: tuple[float, float]
    doc: dict[str, Any] | None = None


class Pending:
    """A transport stand-in for Prometheus' pending-bytes figure of a reported
    connection."""

    def __init__(self, size: int) -> None:
        self.size = size

    def get_write_buffer_size(self) -> int:
        return self.size


@dataclass
class ChannelReport:
    """One channel: its management views and the figures Prometheus' channel families
    read (the same attribute names as a live channel's, so the collectors read
    either)."""

    doc: dict[str, Any]  # the single view (list view: less CHANNEL_SINGLE_ONLY)
    figures: SimpleNamespace


@dataclass
class ConnectionReport:
    """One client connection on another worker."""

    doc: dict[str, Any]  # the list view, with `worker`
    user: str | None
    vhost: str | None
    ctl: dict[str, Any]  # its `leveret ctl list_connections` row
    channels: list[ChannelReport]
    figures: SimpleNamespace  # what Prometheus' connection families read
    # an MQTT connection's `leveret ctl list_mqtt_connections` row (with `worker`)
    mqtt: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    """What worker `worker` holds, as it answers "stats"."""

    worker: int
    queue_docs: bool = False  # whether each QueueReport has its `doc`
    queues: dict[tuple[str, str], QueueReport] = field(default_factory=dict)
    connections: list[ConnectionReport] = field(default_factory=list)
    # vhost -> (counts since start in broker.stats.FIELDS order, rates per second)
    vhosts: dict[str, tuple[tuple[int, ...], tuple[float, ...]]] = field(default_factory=dict)
    # vhost -> (bytes received, bytes sent, their rates per second) of this worker's
    # clients in it, closed connections' included; only vhosts with some
    octets: dict[str, tuple[int, int, float, float]] = field(default_factory=dict)
    # (vhost, exchange) -> (counts, rates) of the exchanges that routed a message here:
    # an exchange counts the messages its worker's clients publish to it
    exchanges: dict[tuple[str, str], tuple[tuple[int, ...], tuple[float, ...]]] = field(
        default_factory=dict
    )
    # the worker process that answered (pid, start time): a new one is a restart
    incarnation: tuple[int, float] = (0, 0.0)
    # the node's counters as this worker counts them (`node_counters`)
    counters: dict[tuple[Any, ...], float] = field(default_factory=dict)
    # what only its open channels hold (unconfirmed publishes' count): added to the
    # node's counters once the worker is gone, when those channels are gone with it
    open_counters: dict[tuple[Any, ...], float] = field(default_factory=dict)
    # process gauges: resident bytes, open descriptors, client sockets, the memory
    # alarm's limit, message bodies in RAM
    node: dict[str, int] = field(default_factory=dict)
    alarms: frozenset[str] = frozenset()  # its resource alarms in effect
    churn_rates: tuple[float, ...] = ()  # its sampler's (broker.stats.CHURN order)


def _channel_figures(ch: Any, conn: SimpleNamespace) -> SimpleNamespace:
    tx = ch.tx
    return SimpleNamespace(
        conn=conn,
        number=ch.number,
        vhost=SimpleNamespace(name=ch.vhost.name),
        consumers=tuple(ch.consumers),
        unacked_count=ch.unacked_count,
        publish_seq=ch.publish_seq,
        confirmed_upto=ch.confirmed_upto,
        confirms_folded=getattr(ch, "confirms_folded", 0),
        confirm_mode=ch.confirm_mode,
        tx=None
        if tx is None
        else SimpleNamespace(
            publishes=range(len(tx.publishes)), settlements=range(len(tx.settlements))
        ),
        prefetch_count=ch.prefetch_count,
        global_prefetch=ch.global_prefetch,
        stats=SimpleNamespace(**{k: getattr(ch.stats, k) for k in FIELDS}),
        closing=False,
    )


def _open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def _resident_bytes_of(pid: int) -> int:
    """Another process's resident set size (Linux), 0 where it cannot be read."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


# --- the node's counters ---------------------------------------------------------------

#: the store's histograms (StoreCollector; io_sync_* read the fsync one), by the
#: committer's attribute
HISTOGRAMS = ("fsync_seconds", "batch_sizes")
#: /api/nodes' process counters: (/proc/self/io field, node field)
PROC_IO = (
    ("read_bytes", "io_read_bytes"),
    ("syscr", "io_read_count"),
    ("write_bytes", "io_write_bytes"),
    ("syscw", "io_write_count"),
)
#: the queue churn counts (connection_closed and channel_closed are not counted: they
#: are the node's opened less what is open now, on every worker)
QUEUE_CHURN = ("queue_declared", "queue_created", "queue_deleted")


def node_counters(node: Any) -> dict[tuple[Any, ...], float]:
    """The counters of this worker that its node shows summed (connection, channel and
    queue churn, login attempts, dead-lettered messages, the store's writes, reads,
    page-outs and fsyncs, the process's I/O, context switches and garbage
    collections), flat by key. Each
    only grows while this process lives (see `WorkerStats` for a restart)."""
    broker = node.broker
    out: dict[tuple[Any, ...], float] = {}
    out[("churn", "connection_created")] = broker.connections_opened
    out[("churn", "channel_created")] = broker.channels_opened
    retired = broker.counters.retired_churn
    for i, name in enumerate(QUEUE_CHURN):
        out[("churn", name)] = sum(v.churn[i] for v in broker.vhosts.values()) + retired[i]
    for protocol, (succeeded, failed) in broker.counters.auth_attempts.items():
        out[("auth", protocol, 0)] = succeeded
        out[("auth", protocol, 1)] = failed
    for key, n in broker.counters.dead_lettered.items():
        out[("dead", *key)] = n
    state = getattr(node, "durable_state", None)
    if state is not None:
        for name in ("disk_reads", "disk_writes", "paged_out", "paged_out_bytes"):
            out[("store", name)] = getattr(state, name)
        committer = state.messages.committer
        if committer is not None:
            for attr in HISTOGRAMS:
                buckets = getattr(committer, attr)
                for i, n in enumerate(buckets.counts):
                    out[("hist", attr, i)] = n
                out[("hist", attr, "sum")] = buckets.sum
                out[("hist", attr, "count")] = buckets.count
    io = proc_io()
    for field_name, key in PROC_IO:
        out[("proc", key)] = io.get(field_name, 0)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out[("proc", "context_switches")] = usage.ru_nvcsw + usage.ru_nivcsw
    out[("proc", "gc_num")] = sum(s["collections"] for s in gc.get_stats())
    return out


# --- worker 0's view of another worker's objects ------------------------------------------


class RemoteConnection:
    """A connection another worker holds, as worker 0's routes list it: `name`,
    `user`, `vhost` (worker 0's vhost object) and `worker` as a live connection has
    them, its JSON as its worker built it, and `force_close` through that worker."""

    def __init__(self, stats: WorkerStats, report: ConnectionReport, vhost: Any) -> None:
        self.stats = stats
        self.report = report
        self.name: str = report.doc["name"]
        self.user = report.user
        self.vhost = vhost
        self.worker: int = report.doc["worker"]
        self.channels = {ch.doc["number"]: RemoteChannel(self, ch) for ch in report.channels}

    def json(self, single: bool = False) -> dict[str, Any]:
        doc = self.report.doc
        if single:
            return {k: ("" if k in BLANK_IN_SINGLE and v is None else v) for k, v in doc.items()}
        return doc

    def force_close(
        self, reason: str = "shutdown", text: str | None = None
    ) -> Coroutine[Any, Any, None]:
        """Close it on its worker: awaited, done once that worker sent the close;
        NotFound when that worker is down (the connection went with it) or no longer
        has it."""
        return self._close(text)

    async def _close(self, text: str | None) -> None:
        try:
            closed = await self.stats.mesh.call(self.worker, "close_connection", self.name, text)
        except ConnectionError:
            raise NotFound(self.name) from None
        if not closed:  # it closed since that worker's last report
            raise NotFound(self.name)


class RemoteChannel:
    """A channel of a `RemoteConnection`."""

    def __init__(self, conn: RemoteConnection, report: ChannelReport) -> None:
        self.conn = conn
        self.report = report
        self.number: int = report.doc["number"]
        self.name: str = report.doc["name"]
        self.consumers = {c["consumer_tag"]: c for c in report.doc.get("consumer_details", [])}

    def json(self, single: bool = False) -> dict[str, Any]:
        doc = self.report.doc
        if single:
            return doc
        return {k: v for k, v in doc.items() if k not in CHANNEL_SINGLE_ONLY}


class WorkerStats:
    """This worker's side of the aggregation (see the module's docstring)."""

    def __init__(self, node: NodeHandle) -> None:
        self.node = node
        self.mesh: Any = node.broker.mesh
        self.index: int = self.mesh.index
        self.reports: dict[int, Report] = {}
        self._fetched: dict[int, float] = {}
        self._refreshing: asyncio.Future[None] | None = None
        self._sampler: Sampler | None = None
        # this worker as its reports name it: a restarted worker is a new one
        self.incarnation = (os.getpid(), time.time())
        # worker 0: the supervisor's pid (its memory is the node's too), set by the
        # worker process; counters of other workers' past
        # incarnations; the highest value of each counter shown (never less again)
        self.supervisor: int | None = None
        self._retired: dict[tuple[Any, ...], float] = {}
        self._others: dict[tuple[Any, ...], float] | None = None
        self._high: dict[tuple[Any, ...], float] = {}
        self.mesh.serve("stats", self._serve_stats)
        self.mesh.serve("close_connection", self._serve_close)
        self.mesh.serve("api_get", self._serve_get)
        self.mesh.serve("api_purge", self._serve_purge)
        self.mesh.serve("delayed", self._serve_delayed)

    async def stop(self) -> None:
        if self._sampler is not None:
            await self._sampler.stop()
            self._sampler = None

    # --- serving ---------------------------------------------------------------------

    def _serve_stats(self, peer: int, queue_docs: bool = False) -> Report:
        if self._sampler is None and self.node.management is None:
            # Rates need a sampler; worker 0's runs with its management API.
            self._sampler = Sampler(self.node.broker)
            self._sampler.start()
        return self.report(queue_docs)

    def _serve_close(self, peer: int, name: str, text: str | None) -> bool:
        for conn in self.node.broker.client_connections():
            if conn.name == name:
                conn.force_close(text=text)
                return True
        return False

    def _own_queue(self, vhost: str, name: str) -> Any:
        v = self.node.broker.vhosts.get(vhost)
        queue = v.queues.get(name) if v is not None else None
        if queue is None or isinstance(queue, RemoteQueue):
            raise NotFound(f"no queue '{name}' in vhost '{vhost}'")
        return queue

    def _serve_get(
        self,
        peer: int,
        vhost: str,
        name: str,
        body: dict[str, Any],
        count: int,
        ackmode: str,
        truncate: int | None,
    ) -> list[dict[str, Any]]:
        """POST /api/queues/{vhost}/{name}/get on worker 0 for a queue this worker owns."""
        return get_from(self._own_queue(vhost, name), body, count, ackmode, truncate)

    def _serve_delayed(self, peer: int, vhost: str, name: str) -> int:
        """How many messages this worker's copy of delayed exchange `name` holds back:
        each worker delays what its own clients publish."""
        v = self.node.broker.vhosts.get(vhost)
        exchange = v.exchanges.get(name) if v is not None else None
        if exchange is None:
            return 0
        return exchange.router.info().get("messages_delayed", 0)

    async def delayed(self, vhost: str, name: str) -> int:
        """What the other live workers' copies of delayed exchange `name` hold back (a
        worker that does not answer within `TIMEOUT` counts nothing)."""
        answers = await asyncio.gather(
            *(
                asyncio.wait_for(self.mesh.call(p, "delayed", vhost, name), TIMEOUT)
                for p in self.mesh.peers
            ),
            return_exceptions=True,
        )
        return sum(a for a in answers if isinstance(a, int))

    async def on_owner(self, queue: RemoteQueue, op: str, *args: Any) -> Any:
        """Run the API's operation `op` ("api_get", "api_purge") on the worker that
        owns `queue`. That worker down: RabbitMQ's answer for a queue whose home node
        is down (`absent`: NotFound naming the node for a durable queue; a transient
        one is gone with it)."""
        try:
            return await self.mesh.call(queue.worker, op, *args)
        except ConnectionError:
            raise absent(queue.vhost.name, queue.name, queue.worker, queue.durable) from None

    def _serve_purge(self, peer: int, vhost: str, name: str) -> int:
        """DELETE /api/queues/{vhost}/{name}/contents on worker 0 for a queue this
        worker owns."""
        queue = self._own_queue(vhost, name)
        return queue.vhost.purge_queue(queue)

    def report(self, queue_docs: bool = False) -> Report:
        """What this worker holds now (its own queues, not other workers' placeholders);
        with `queue_docs`, each queue's management JSON too (the most costly part, for
        the API's queue routes only)."""

        broker = self.node.broker
        worker = self.index
        out = Report(worker, queue_docs)
        for vhost in broker.vhosts.values():
            for q in vhost.queues.values():
                if isinstance(q, RemoteQueue):
                    continue
                queue = QueueReport(queue_row(q), q.stats.depth_rates)
                if queue_docs:
                    queue.doc = {**_queue_json(vhost, q, single=True), "worker": worker}
                out.queues[(vhost.name, q.name)] = queue
            for x in vhost.exchanges.values():
                counts = x.stats.snapshot()
                if any(counts):
                    out.exchanges[(vhost.name, x.name)] = (counts, tuple(x.stats.rates or ()))
        ctl_rows = {row["name"]: row for row in inventory.connections(broker)}
        by_vhost: dict[str, list[Any]] = {name: [] for name in broker.vhosts}
        for conn in broker.client_connections():
            doc = _connection_json(conn)
            doc["worker"] = worker
            channels = getattr(conn, "channels", {})
            figures = SimpleNamespace(
                name=conn.name,
                recv_oct=getattr(conn, "recv_oct", 0),
                send_oct=getattr(conn, "send_oct", 0),
                recv_cnt=getattr(conn, "recv_cnt", getattr(conn, "received", 0)),
                send_cnt=getattr(conn, "send_cnt", getattr(conn, "sent", 0)),
                transport=Pending(_pending(conn)),
                channels={},
            )
            reports = []
            for ch in channels.values():
                if ch.closing:
                    continue
                ch_figures = _channel_figures(ch, figures)
                figures.channels[ch.number] = ch_figures
                reports.append(ChannelReport(_channel_json(ch, single=True), ch_figures))
            vhost = conn.vhost.name if conn.vhost is not None else None
            out.connections.append(
                ConnectionReport(
                    doc,
                    conn.user,
                    vhost,
                    {**ctl_rows[conn.peer], "worker": worker}
                    if getattr(conn, "peer", None) in ctl_rows
                    else {},
                    reports,
                    figures,
                    {**conn.info(), "worker": worker} if hasattr(conn, "protocol_name") else {},
                )
            )
            if vhost in by_vhost and getattr(conn, "stats", None) is not None:
                by_vhost[vhost].append(conn)
        for vhost in broker.vhosts.values():
            conns = [c for c in broker.connections if c.vhost is vhost]
            if conns or any(vhost.octets):
                out.octets[vhost.name] = (
                    vhost.octets[0] + sum(c.recv_oct for c in conns),
                    vhost.octets[1] + sum(c.send_oct for c in conns),
                    sum(_oct_rate(c, 0) for c in conns),
                    sum(_oct_rate(c, 1) for c in conns),
                )
        rates = self._sampler.vhost_rates if self._sampler is not None else {}
        for name, conns in by_vhost.items():
            counts = vhost_counts(broker.vhosts[name], conns)
            out.vhosts[name] = (counts, tuple(rates.get(name) or ()))
        counters = broker.counters
        node_counts = out.counters = node_counters(self.node)
        channel_side = total([counters.retired_stats, *(c for c, _ in out.vhosts.values())])
        for i, n in enumerate(channel_side):
            node_counts[("channel_side", i)] = n
        queue_side = counters.queue_counts(list(broker.vhosts.values()), QUEUE_SIDE)
        for queue_type, counts in queue_side.items():
            for key, n in counts.items():
                node_counts[("queue_side", queue_type, key)] = n
        out.open_counters[("channel_side", CONFIRM)] = sum(
            ch.publish_seq - getattr(ch, "confirms_folded", 0)
            for conn in broker.client_connections()
            for ch in getattr(conn, "channels", {}).values()
            if not ch.closing
        )
        alarms = self.node.alarms
        state = getattr(self.node, "durable_state", None)
        out.node = {
            "mem_used": resident_bytes(),
            "fd_used": _open_fds(),
            "sockets_used": len(broker.connections),
            "fd_total": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
            "mem_limit": alarms.memory_limit if alarms is not None else 0,
            "bodies_in_memory": state.memory_used if state is not None else 0,
        }
        out.alarms = frozenset(alarms.active) if alarms is not None else frozenset()
        sampler = self._sampler
        out.churn_rates = tuple(sampler.churn_rates or ()) if sampler is not None else ()
        out.incarnation = self.incarnation
        return out

    # --- worker 0 (and any worker's ctl socket): gathering ---------------------------------

    async def refresh(self, queue_docs: bool = False) -> None:
        """Ask every other live worker whose report is older than INTERVAL (or that
        owns a queue its report lacks, or lacks the queues' JSON that `queue_docs`
        asks for) for a new one; requests at the same time share one round."""
        while self._refreshing is not None:
            await asyncio.shield(self._refreshing)
        now = time.monotonic()
        live = set(self.mesh.peers)
        for peer in list(self.reports):
            if peer not in live:  # down: its objects are gone with it
                self._retire(self.reports.pop(peer))
        missing = self._missing()
        stale = [
            p
            for p in sorted(live)
            if now - self._fetched.get(p, -INTERVAL) >= INTERVAL
            or p in missing
            or (report := self.reports.get(p)) is None
            or (queue_docs and not report.queue_docs)
        ]
        if not stale:
            return
        self._refreshing = asyncio.get_running_loop().create_future()
        try:
            answers = await asyncio.gather(
                *(asyncio.wait_for(self.mesh.call(p, "stats", queue_docs), TIMEOUT) for p in stale),
                return_exceptions=True,
            )
            for peer, answer in zip(stale, answers, strict=True):
                if isinstance(answer, Report):
                    last = self.reports.get(peer)
                    if last is not None and last.incarnation != answer.incarnation:
                        self._retire(last)  # restarted between two looks
                    self.reports[peer] = answer
                    self._fetched[peer] = now
                else:
                    log.warning("no statistics from worker %d: %r", peer, answer)
                    if peer not in set(self.mesh.peers) and peer in self.reports:
                        self._retire(self.reports.pop(peer))
            self._others = None
        finally:
            self._refreshing.set_result(None)
            self._refreshing = None

    def _retire(self, report: Report) -> None:
        """Keep the counters of a worker process that is gone: its next incarnation
        counts from 0 again, and the node's counters must not go back (Prometheus'
        rate() reads a drop as a reset). What it counted after its last report is
        lost."""
        retired = self._retired
        for counts in (report.counters, report.open_counters):
            for key, n in counts.items():
                retired[key] = retired.get(key, 0) + n
        self._others = None

    def _missing(self) -> set[int]:
        """Workers owning a queue their last report does not have (declared since)."""
        out: set[int] = set()
        for vhost in self.node.broker.vhosts.values():
            for q in vhost.queues.values():
                if isinstance(q, RemoteQueue) and q.worker not in out:
                    report = self.reports.get(q.worker)
                    if report is None or (vhost.name, q.name) not in report.queues:
                        out.add(q.worker)
        return out

    # --- worker 0: what the routes read ---------------------------------------------------

    def queue_report(self, q: RemoteQueue) -> QueueReport | None:
        report = self.reports.get(q.worker)
        return report.queues.get((q.vhost.name, q.name)) if report is not None else None

    def queue_json(self, q: RemoteQueue, single: bool = False) -> dict[str, Any]:
        """A queue another worker owns, as its owner reported it. Without a report:
        its definition, with `"state": "down"` when the owner is down (RabbitMQ's
        answer for a queue whose node is down), else "running" (a queue declared
        since the owner's last report, which RabbitMQ also lists without figures
        until its first statistics)."""
        report = self.queue_report(q)
        if report is None or report.doc is None:
            return {
                "arguments": definitions_json._jsonable(q.arguments),
                "auto_delete": q.auto_delete,
                "durable": q.durable,
                "exclusive": q.exclusive_owner is not None,
                "name": q.name,
                "node": NODE,
                "type": q.queue_type,
                "vhost": q.vhost.name,
                "state": "running" if q.worker in self.mesh.peers else "down",
                "worker": q.worker,
            }
        if single:
            return report.doc
        return {k: v for k, v in report.doc.items() if k not in SINGLE_ONLY}

    def consumer_details(self, q: Any) -> list[dict[str, Any]]:
        """The consumers on queue `q` of every worker's client channels (a consumer
        is listed where its channel is, not where the queue is)."""
        vhost, name = q.vhost.name, q.name
        out = [
            _consumer_json(c)
            for conn in self.node.broker.client_connections()
            for ch in getattr(conn, "channels", {}).values()
            for c in ch.consumers.values()
            if c.queue.name == name and c.queue.vhost.name == vhost
        ]
        key = {"name": name, "vhost": vhost}
        for report in self.reports.values():
            for conn_report in report.connections:
                for ch in conn_report.channels:
                    out += [c for c in ch.doc.get("consumer_details", ()) if c["queue"] == key]
        return out

    def queue_figures(self, q: RemoteQueue) -> SimpleNamespace | None:
        """What Prometheus' queue families read of a queue (scrape.queue_row's
        attributes), from its owner's report."""
        report = self.queue_report(q)
        if report is None:
            return None
        r = report.row
        return SimpleNamespace(
            vhost=q.vhost,
            name=q.name,
            queue_type=q.queue_type,
            message_count=r[0],
            unacked=r[1],
            ready=SimpleNamespace(paged=r[2], bytes=r[3]),
            consumer_count=r[4],
            stats=SimpleNamespace(publish=r[6]),
        )

    def queue_totals(self, vhosts: list[Any]) -> tuple[int, int, int, float, float]:
        """(ready, unacked, consumers, ready rate, unacked rate) of the queues other
        workers own in `vhosts`."""
        ready = unacked = consumers = 0
        ready_rate = unacked_rate = 0.0
        for vhost in vhosts:
            for q in vhost.queues.values():
                if not isinstance(q, RemoteQueue):
                    continue
                report = self.queue_report(q)
                if report is None:
                    continue
                row = report.row
                ready += int(row[0])
                unacked += int(row[1])
                consumers += int(row[4])
                ready_rate += report.rates[0]
                unacked_rate += report.rates[1]
        return ready, unacked, consumers, ready_rate, unacked_rate

    def connections(self) -> list[RemoteConnection]:
        """Every other worker's client connections."""
        vhosts = self.node.broker.vhosts
        return [
            RemoteConnection(self, c, vhosts.get(c.vhost) if c.vhost is not None else None)
            for report in self.reports.values()
            for c in report.connections
        ]

    def vhost_message_counts(
        self, names: set[str]
    ) -> tuple[list[tuple[int, ...]], list[tuple[float, ...]]]:
        """Other workers' message counts and rates for these vhosts."""
        counts, rates = [], []
        for report in self.reports.values():
            for name, (c, r) in report.vhosts.items():
                if name in names:
                    counts.append(c)
                    if r:
                        rates.append(r)
        return counts, rates

    def vhost_octets(self, name: str) -> list[tuple[int, int, float, float]]:
        """Other workers' bytes received and sent (and rates) of vhost `name`'s clients."""
        return [r.octets[name] for r in self.reports.values() if name in r.octets]

    def exchange_counts(
        self, vhost: str, name: str
    ) -> tuple[list[tuple[int, ...]], list[tuple[float, ...]]]:
        """Other workers' message counts and rates for exchange `name`: each worker
        routes what its own clients publish, so an exchange's `message_stats` are the
        sum over the workers."""
        counts, rates = [], []
        for report in self.reports.values():
            found = report.exchanges.get((vhost, name))
            if found is not None:
                counts.append(found[0])
                if found[1]:
                    rates.append(found[1])
        return counts, rates

    # --- worker 0: the node's figures ----------------------------------------------------

    def others(self) -> dict[tuple[Any, ...], float]:
        """Every other worker's counters (`node_counters`, with the global counters),
        summed with those of their past incarnations."""
        if self._others is None:
            out = dict(self._retired)
            for report in self.reports.values():
                for key, n in report.counters.items():
                    out[key] = out.get(key, 0) + n
            self._others = out
        return self._others

    def monotone(self, key: tuple[Any, ...], value: float) -> float:
        """`value`, or the highest value shown for `key` when that is more: a node's
        counter never goes back (a connection handed from a worker whose report is
        fresh to one whose report is not yet would briefly count once less)."""
        high = self._high.get(key)
        if high is not None and value < high:
            return high
        self._high[key] = value
        return value

    def counter(self, key: tuple[Any, ...], own: float) -> float:
        """The node's counter `key`: this worker's `own` count plus every other
        worker's, past incarnations included, never less than it was."""
        return self.monotone(key, own + self.others().get(key, 0))

    def churn_counts(self, own: tuple[int, ...]) -> tuple[int, ...]:
        """broker.stats.churn_counts of the node, given this worker's: opened and
        queue churn summed; closed ones are those opened less those open now on
        every worker."""
        open_conns, open_chans = own[0] - own[1], own[2] - own[3]
        for report in self.reports.values():
            open_conns += len(report.connections)
            open_chans += sum(len(c.channels) for c in report.connections)
        conns = int(self.counter(("churn", "connection_created"), own[0]))
        chans = int(self.counter(("churn", "channel_created"), own[2]))
        return (
            conns,
            int(self.monotone(("churn", "connection_closed"), conns - open_conns)),
            chans,
            int(self.monotone(("churn", "channel_closed"), chans - open_chans)),
            *(int(self.counter(("churn", name), own[4 + i])) for i, name in enumerate(QUEUE_CHURN)),
        )

    def churn_rates(self, own: tuple[float, ...] | None) -> tuple[float, ...] | None:
        """The churn rates of the node: each live worker's sampler's, added."""
        rows = [r.churn_rates for r in self.reports.values() if r.churn_rates]
        if own:
            rows.append(own)
        if not rows:
            return own
        return tuple(map(sum, zip(*rows, strict=True)))

    def auth_attempts(self, own: dict[str, list[int]]) -> dict[str, list[int]]:
        """Login attempts (succeeded, failed) by protocol, every worker's."""
        protocols = set(own) | {k[1] for k in self.others() if k[0] == "auth"}
        out = {}
        for protocol in protocols:
            mine = own.get(protocol, (0, 0))
            out[protocol] = [int(self.counter(("auth", protocol, i), mine[i])) for i in range(2)]
        return out

    def histogram(self, attr: str, own: Any) -> SimpleNamespace:
        """One of the store's histograms (`HISTOGRAMS`) of every worker: bucket
        counts, sum and count added (every worker has the same bounds)."""
        return SimpleNamespace(
            bounds=own.bounds,
            counts=[int(self.counter(("hist", attr, i), n)) for i, n in enumerate(own.counts)],
            sum=self.counter(("hist", attr, "sum"), own.sum),
            count=int(self.counter(("hist", attr, "count"), own.count)),
        )

    def gauge(self, name: str, own: float) -> float:
        """A process gauge of the node (`Report.node`): every worker's; resident
        memory the supervisor's too (a node's memory is all its processes'). The
        supervisor's descriptors are not counted: the descriptor figures are the
        workers' against the workers' limits (`fd_total`), which clients use."""
        value = own + sum(r.node.get(name, 0) for r in self.reports.values())
        if name == "mem_used" and self.supervisor is not None:
            value += _resident_bytes_of(self.supervisor)
        return value

    def fd_limits(self, own: int) -> list[int]:
        """Each live worker's descriptor limit, this one's (`own`) first."""
        return [own, *(r.node["fd_total"] for r in self.reports.values() if "fd_total" in r.node)]

    def alarms(self, own: set[str], mem_used: int, mem_limit: int) -> set[str]:
        """The node's resource alarms: any worker's, and the memory alarm when the
        node's resident memory is over its watermark (the workers' shares added)."""
        out = set(own)
        for report in self.reports.values():
            out |= report.alarms
        if mem_limit and mem_used > mem_limit:
            out.add("memory")
        return out

    def memory_limit(self, own: int) -> int:
        """The node's memory watermark: every worker's share added."""
        return own + sum(r.node.get("mem_limit", 0) for r in self.reports.values())

    def node_memory(self, own_used: int, own_limit: int) -> tuple[int, int]:
        """(resident bytes, memory watermark) of the node: every worker's used and
        share of the watermark added, the supervisor's memory too."""
        return int(self.gauge("mem_used", own_used)), self.memory_limit(own_limit)

    def node_totals(self, doc: dict[str, Any]) -> dict[str, Any]:
        """/api/nodes: the broker's node is all its workers: memory (and the
        watermark), descriptors, sockets, I/O and context switches add up, and an
        alarm of any worker is the node's (node_info.churn_json adds the churn)."""
        own_sockets = doc["sockets_used"]
        used, limit = self.node_memory(doc["mem_used"], doc["mem_limit"])
        doc["mem_used"], doc["mem_limit"] = used, limit
        doc["fd_used"] = int(self.gauge("fd_used", doc["fd_used"]))
        fd_total = sum(self.fd_limits(doc["fd_total"]))
        for key in ("fd_total", "proc_total", "sockets_total"):
            doc[key] = fd_total
        doc["sockets_used"] = int(self.gauge("sockets_used", own_sockets))
        doc["proc_used"] += doc["sockets_used"] - own_sockets
        own_alarms = {"memory"} if doc["mem_alarm"] else set()
        if doc["disk_free_alarm"]:
            own_alarms.add("disk")
        alarms = self.alarms(own_alarms, used, limit)
        doc["mem_alarm"] = "memory" in alarms
        doc["disk_free_alarm"] = "disk" in alarms
        for _, key in PROC_IO:
            doc[key] = int(self.counter(("proc", key), doc[key]))
        for key in ("context_switches", "gc_num"):
            doc[key] = int(self.counter(("proc", key), doc[key]))
        return doc

    def global_counters(
        self,
        channel_side: tuple[int, ...],
        queue_side: dict[str, dict[str, int]],
        dead: dict[tuple[str, str, str], int],
    ) -> tuple[tuple[int, ...], dict[str, dict[str, int]], dict[tuple[str, str, str], int]]:
        """Prometheus' global counters with every other worker's (past incarnations
        too) added."""
        others = self.others()
        queue_side = {t: dict(c) for t, c in queue_side.items()}
        dead = dict(dead)
        for key in others:
            if key[0] == "queue_side":
                queue_side.setdefault(key[1], {}).setdefault(key[2], 0)
            elif key[0] == "dead":
                dead.setdefault(key[1:], 0)  # type: ignore[arg-type]
        return (
            tuple(int(self.counter(("channel_side", i), n)) for i, n in enumerate(channel_side)),
            {
                t: {k: int(self.counter(("queue_side", t, k), n)) for k, n in counts.items()}
                for t, counts in queue_side.items()
            },
            {k: int(self.counter(("dead", *k), n)) for k, n in dead.items()},
        )

    def extend_scrape(self, s: Scrape) -> None:
        """Prometheus: other workers' queues (in place of their placeholders, which
        have no figures of their own), connections and channels join the scrape."""
        queues = []
        for q in s.queues:
            if isinstance(q, RemoteQueue):
                figures = self.queue_figures(q)
                if figures is not None:
                    queues.append(figures)
            else:
                queues.append(q)
        s.queues = queues
        for report in self.reports.values():
            for c in report.connections:
                s.connections.append(c.figures)
                s.channels.extend(c.figures.channels.values())

    # --- leveret ctl (every worker's socket) -------------------------------------------------

    async def ctl_ready(self) -> None:
        """Before each ctl operation: the recovery, then fresh reports."""
        await self.node.wait_recovered()
        await self.refresh()

    def ctl_operations(self) -> dict[str, Any]:
        """The ctl listings that show every worker's objects, on any worker's socket
        (each asks the others for their reports as worker 0 does)."""

        def list_queues(broker: Any, vhost: str = "/") -> list[dict[str, Any]]:
            v = broker.admin.vhost(vhost)
            return self.ctl_queues(inventory.queues(v), v)

        def list_connections(broker: Any, vhost: str | None = None) -> list[dict[str, Any]]:
            own = [{**row, "worker": self.index} for row in inventory.connections(broker, vhost)]
            return sorted(own + self.ctl_connections(vhost), key=lambda r: r["name"])

        def list_mqtt_connections(broker: Any) -> list[dict[str, Any]]:
            mqtt = broker.mqtt.open_connections() if broker.mqtt is not None else []
            own = [{**c.info(), "worker": self.index} for c in mqtt]
            return sorted(own + self.ctl_mqtt_connections(), key=lambda r: r["conn_name"])

        return {
            "list_queues": list_queues,
            "list_connections": list_connections,
            "list_mqtt_connections": list_mqtt_connections,
        }

    def ctl_queues(self, rows: list[dict[str, Any]], vhost: Any) -> list[dict[str, Any]]:
        """`leveret ctl list_queues`: a queue another worker owns gets its owner's row."""
        out = []
        for row in rows:
            q = vhost.queues.get(row["name"])
            if isinstance(q, RemoteQueue):
                report = self.queue_report(q)
                if report is not None:
                    figures = report.row
                    row = {**row, "messages": int(figures[0]), "consumers": int(figures[4])}
            out.append(row)
        return out

    def ctl_connections(self, vhost: str | None = None) -> list[dict[str, Any]]:
        """`leveret ctl list_connections`: other workers' rows (with `worker`)."""
        return [
            c.ctl
            for report in self.reports.values()
            for c in report.connections
            if c.ctl and (vhost is None or c.vhost == vhost)
        ]

    def ctl_mqtt_connections(self) -> list[dict[str, Any]]:
        """`leveret ctl list_mqtt_connections`: other workers' MQTT rows (with `worker`)."""
        return [c.mqtt for report in self.reports.values() for c in report.connections if c.mqtt]


def _oct_rate(conn: Any, i: int) -> float:
    rates = getattr(conn, "octet_rates", None)
    return rates[i] if rates else 0.0


def _pending(conn: Any) -> int:
    size = getattr(getattr(conn, "transport", None), "get_write_buffer_size", None)
    return size() if size is not None else 0
