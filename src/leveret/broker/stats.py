"""Message counters: one integer add per message on the hot path, rates once a second.

Every queue, exchange, channel and connection owns a MessageStats. The hot path
only ever does `stats.publish += 1` (and the like); nothing there allocates,
looks at the clock or keeps history. The Sampler (started with the management
API) walks the objects once a second and turns the counts into rates, keeping
one previous reading per object, so statistics cost memory in proportion to the
number of objects, never to the number of messages or to time. That is the
difference from RabbitMQ's management stats database, whose history is what
runs it out of memory.

Counts of a channel that closes are added to its connection's, and a closed
connection's to its vhost's, so vhost and overview totals never go backwards.
The names are RabbitMQ's `message_stats` keys.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from leveret.broker.broker import Broker

FIELDS = (
    "publish",  # channel, queue: messages published (into the queue, for a queue)
    "publish_in",  # exchange: published to it
    "publish_out",  # exchange: routed by it to at least one queue
    "confirm",  # channel: publisher confirms sent
    "deliver",  # channel, queue: delivered to consumers that ack
    "deliver_no_ack",  # ... to consumers that do not
    "get",  # basic.get answered, acknowledgement required
    "get_no_ack",
    "get_empty",
    "redeliver",  # deliveries with the redelivered flag
    "ack",
    "return_unroutable",  # mandatory and no queue: basic.return
    "drop_unroutable",  # no queue and not mandatory: dropped
    # channel: published in confirm mode. Not counted per message: the channel's
    # confirm sequence number is that count, folded in here when the channel closes.
    "publish_confirm",
)
_INDEX = {name: i for i, name in enumerate(FIELDS)}
# Which keys RabbitMQ shows for each kind of object (all of them, zeros too, once any moved).
CHANNEL_KEYS = (
    "publish",
    "confirm",
    "deliver",
    "deliver_no_ack",
    "get",
    "get_no_ack",
    "get_empty",
    "redeliver",
    "ack",
    "return_unroutable",
    "drop_unroutable",
)
QUEUE_KEYS = ("publish", "deliver", "deliver_no_ack", "get", "get_no_ack", "redeliver", "ack")
EXCHANGE_KEYS = ("publish_in", "publish_out")
_DELIVER_GET = tuple(_INDEX[k] for k in ("deliver", "deliver_no_ack", "get", "get_no_ack"))


class MessageStats:
    """Counters of one object. Attributes are plain ints for the hot path's `+= 1`."""

    __slots__ = (*FIELDS, "rates", "_last", "depth_rates", "_last_depth")

    def __init__(self) -> None:
        for name in FIELDS:
            setattr(self, name, 0)
        self.rates: tuple[float, ...] | None = None  # per second, set by the Sampler
        self._last: tuple[int, ...] | None = None
        # Queues only: how fast (ready, unacked) grow or shrink, per second.
        self.depth_rates = (0.0, 0.0)
        self._last_depth: tuple[int, int] | None = None

    def snapshot(self) -> tuple[int, ...]:
        """The counts now, in FIELDS order: cheap, and safe to keep."""
        return tuple(getattr(self, name) for name in FIELDS)

    def add(self, other: MessageStats | tuple[int, ...]) -> None:
        """Fold another object's counts into these (a channel that closed, say)."""
        counts = other.snapshot() if isinstance(other, MessageStats) else other
        for name, n in zip(FIELDS, counts, strict=True):
            if n:
                setattr(self, name, getattr(self, name) + n)

    def sample(self, seconds: float) -> None:
        """Turn the counts since the last sample into rates (the Sampler's tick)."""
        self.rates, self._last = rates_between(self._last, self.snapshot(), seconds)

    def sample_depth(self, ready: int, unacked: int, seconds: float) -> None:
        last, self._last_depth = self._last_depth, (ready, unacked)
        if last is not None and seconds > 0:
            self.depth_rates = ((ready - last[0]) / seconds, (unacked - last[1]) / seconds)

    def to_json(
        self, keys: tuple[str, ...] = CHANNEL_KEYS, by_side: bool = False
    ) -> dict[str, Any]:
        return message_stats_json(self.snapshot(), self.rates, keys, by_side)


def total(stats: Iterable[MessageStats | tuple[int, ...]]) -> tuple[int, ...]:
    sums = [0] * len(FIELDS)
    for s in stats:
        counts = s.snapshot() if isinstance(s, MessageStats) else s
        for i, n in enumerate(counts):
            sums[i] += n
    return tuple(sums)


def rates_between(
    last: tuple[int, ...] | None, now: tuple[int, ...], seconds: float
) -> tuple[tuple[float, ...] | None, tuple[int, ...]]:
    if last is None or seconds <= 0:
        return (0.0,) * len(now), now
    return tuple(max(0, b - a) / seconds for a, b in zip(last, now, strict=True)), now


# RabbitMQ keeps a channel's or a queue's counts in two tables, the publishing side and
# the delivering side, and shows a side's keys (zeros too) only once that side moved.
PUBLISH_SIDE = frozenset(("publish", "confirm", "return_unroutable", "drop_unroutable"))


def message_stats_json(
    counts: tuple[int, ...],
    rates: tuple[float, ...] | None,
    keys: tuple[str, ...] = CHANNEL_KEYS,
    by_side: bool = False,
) -> dict[str, Any]:
    """RabbitMQ's `message_stats`: each of `keys` with `<key>_details.rate`, plus
    `deliver_get` (deliveries and gets together); empty while nothing moved. With
    `by_side` (channels, queues), each side's keys only once that side moved."""
    if by_side:
        publish = tuple(k for k in keys if k in PUBLISH_SIDE)
        deliver = tuple(k for k in keys if k not in PUBLISH_SIDE)
        keys = tuple(
            k for side in (publish, deliver) if any(counts[_INDEX[k]] for k in side) for k in side
        )
    indexes = [_INDEX[k] for k in keys]
    if not any(counts[i] for i in indexes):
        return {}
    out: dict[str, Any] = {}
    for i in indexes:
        name = FIELDS[i]
        out[name] = counts[i]
        out[name + "_details"] = {"rate": round(rates[i], 1) if rates else 0.0}
    if "deliver" in keys:
        out["deliver_get"] = sum(counts[i] for i in _DELIVER_GET)
        rate = sum(rates[i] for i in _DELIVER_GET) if rates else 0.0
        out["deliver_get_details"] = {"rate": round(rate, 1)}
    return out


# --- aggregates ----------------------------------------------------------------------------


def connection_counts(conn: Any) -> tuple[int, ...]:
    """A connection's counts: its closed channels' plus its open channels'."""
    return total([conn.stats, *(ch.stats for ch in conn.channels.values())])


#: RabbitMQ's churn figures (overview `churn_rates`, a node's counters), in this order
CHURN = (
    "connection_created",
    "connection_closed",
    "channel_created",
    "channel_closed",
    "queue_declared",
    "queue_created",
    "queue_deleted",
)


def churn_counts(broker: Any) -> tuple[int, ...]:
    """Connections and channels opened and closed, queues declared, created and deleted
    since start (CHURN order), as Prometheus' rabbitmq_*_total counters count them. Closed
    ones are those opened and no longer open."""
    connections = broker.client_connections()
    channels = sum(len(c.channels) for c in connections)
    queues = list(broker.counters.retired_churn)  # of deleted vhosts
    for vhost in broker.vhosts.values():
        for i, n in enumerate(vhost.churn):
            queues[i] += n
    return (
        broker.connections_opened,
        broker.connections_opened - len(connections),
        broker.channels_opened,
        broker.channels_opened - channels,
        *queues,
    )


def vhost_counts(vhost: Any, connections: Iterable[Any]) -> tuple[int, ...]:
    """A vhost's counts: closed connections' plus the open ones' (channel side)."""
    return total([vhost.stats, *(connection_counts(c) for c in connections)])


class Sampler:
    """Once a second: rates for every object and for each vhost's totals.

    Runs only while the management API (or anything else that wants rates) is on;
    a broker without it pays nothing. The vhost totals' previous readings live
    here, keyed by name, so a deleted vhost's entry goes with the next tick.
    """

    INTERVAL = 1.0

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.vhost_rates: dict[str, tuple[float, ...]] = {}
        self._vhost_last: dict[str, tuple[int, ...]] = {}
        self.overview_rates: tuple[float, ...] | None = None
        self._overview_last: tuple[int, ...] | None = None
        self.churn_rates: tuple[float, ...] | None = None
        self._churn_last: tuple[int, ...] | None = None
        self._task: asyncio.Task[None] | None = None
        self._at = time.monotonic()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.INTERVAL)
            self.tick()

    def tick(self) -> None:
        now = time.monotonic()
        seconds, self._at = now - self._at, now
        broker = self.broker
        by_vhost: dict[str, list[Any]] = {name: [] for name in broker.vhosts}
        for conn in broker.connections:
            conn.stats_sample(seconds)
            vhost = conn.vhost
            if vhost is not None and vhost.name in by_vhost:
                by_vhost[vhost.name].append(conn)
        for vhost in broker.vhosts.values():
            for queue in vhost.queues.values():
                stats = queue.stats
                stats.sample(seconds)
                stats.sample_depth(queue.message_count, queue.unacked, seconds)
            for exchange in vhost.exchanges.values():
                exchange.stats.sample(seconds)
        vhost_last, self._vhost_last = self._vhost_last, {}
        for name, conns in by_vhost.items():
            counts = vhost_counts(broker.vhosts[name], conns)
            rates, self._vhost_last[name] = rates_between(vhost_last.get(name), counts, seconds)
            self.vhost_rates[name] = rates or ()
        for name in list(self.vhost_rates):
            if name not in by_vhost:
                del self.vhost_rates[name]
        overview = total(self._vhost_last.values())
        self.overview_rates, self._overview_last = rates_between(
            self._overview_last, overview, seconds
        )
        self.churn_rates, self._churn_last = rates_between(
            self._churn_last, churn_counts(broker), seconds
        )


# --- node totals ----------------------------------------------------------------------------


def queue_type_label(queue_type: str) -> str:
    """A queue type as RabbitMQ's `queue_type` label names it ("classic" ->
    "rabbit_classic_queue"): the one place the label is made, for every queue type."""
    return f"rabbit_{queue_type}_queue"


class NodeCounters:
    """Node totals that must outlive the objects that made them, as RabbitMQ's
    rabbit_global_counters do: the Prometheus `rabbitmq_global_*` and
    `rabbitmq_auth_attempts_*` families never go back.

    Nothing here is touched per published message. Queues' counts (deliveries,
    acks, ...) are read from the live queues at scrape time; a deleted queue's are
    folded in here by type, a deleted vhost's closed-connection counts and churn
    likewise. Dead-lettering and logins add to their counters as they happen.
    """

    def __init__(self) -> None:
        self.retired_queues: dict[str, MessageStats] = {}  # queue type -> deleted queues
        self.retired_stats = MessageStats()  # channel-side counts of deleted vhosts
        self.retired_churn = [0, 0, 0]  # queues declared, created, deleted, of deleted vhosts
        # (reason, queue type, dead-letter strategy) -> messages
        self.dead_lettered: dict[tuple[str, str, str], int] = {}
        self.auth_attempts: dict[str, list[int]] = {}  # protocol -> [succeeded, failed]

    def queue_deleted(self, queue: Any) -> None:
        retired = self.retired_queues.get(queue.queue_type)
        if retired is None:
            retired = self.retired_queues[queue.queue_type] = MessageStats()
        retired.add(queue.stats)

    def vhost_deleted(self, vhost: Any) -> None:
        """Keep a deleted vhost's totals. Its stats and churn objects then point here, so
        that connections still closing add to the node's totals."""
        self.retired_stats.add(vhost.stats)
        vhost.stats = self.retired_stats
        for i, n in enumerate(vhost.churn):
            self.retired_churn[i] += n
        vhost.churn = self.retired_churn

    def add_dead_lettered(self, reason: str, queue_type: str, strategy: str, n: int = 1) -> None:
        key = (reason, queue_type, strategy)
        self.dead_lettered[key] = self.dead_lettered.get(key, 0) + n

    def auth_attempt(self, succeeded: bool, protocol: str = "amqp091") -> None:
        counts = self.auth_attempts.get(protocol)
        if counts is None:
            counts = self.auth_attempts[protocol] = [0, 0]
        counts[0 if succeeded else 1] += 1

    def queue_counts(
        self, vhosts: Iterable[Any], keys: tuple[str, ...]
    ) -> dict[str, dict[str, int]]:
        """Queue-side counts of `keys` by queue type: the live queues' and the deleted
        ones'. One pass, reading only those keys (a scrape of many queues)."""
        by_type: dict[str, list[int]] = {}
        for kind, stats in self.retired_queues.items():
            by_type[kind] = [getattr(stats, k) for k in keys]
        for vhost in vhosts:
            for queue in vhost.queues.values():
                sums = by_type.get(queue.queue_type)
                if sums is None:
                    sums = by_type[queue.queue_type] = [0] * len(keys)
                stats = queue.stats
                for i, k in enumerate(keys):
                    sums[i] += getattr(stats, k)
        return {kind: dict(zip(keys, sums, strict=True)) for kind, sums in by_type.items()}
