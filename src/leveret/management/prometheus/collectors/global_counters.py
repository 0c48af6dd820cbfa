"""RabbitMQ's global counters (rabbit_global_counters): by protocol, and by queue
type for what queues do; never going back, deleted objects included."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from leveret.broker.stats import FIELDS, queue_type_label, total, vhost_counts
from leveret.management.prometheus.collectors.core import PROTOCOL, QUEUE_TYPES
from leveret.management.prometheus.scrape import Q_CONSUMERS, Scrape
from leveret.management.prometheus.text import Family, Rendered, rendered

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
        # MQTT connections have no channel counters: their operations count in the vhost's.
        if getattr(conn, "stats", None) is None:
            continue
        if conn.vhost is not None and conn.vhost.name in by_vhost:
            by_vhost[conn.vhost.name].append(conn)
    channel_side = total(
        [counters.retired_stats, *(vhost_counts(v, by_vhost[v.name]) for v in s.vhosts)]
    )
    by_type = counters.queue_counts(s.vhosts, QUEUE_SIDE)
    dead = counters.dead_lettered
    if s.workers is not None:  # worker 0 of several: every worker's counts
        channel_side, by_type, dead = s.workers.global_counters(channel_side, by_type, dead)
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


class GlobalCollector:
    """`rabbitmq_global_*`, summed by their labels, on `/metrics` and per-object."""

    def collect(self, s: Scrape) -> Iterator[Rendered]:
        if s.mode == "detailed":
            return
        for family in _global(s):
            yield rendered(family, "rabbitmq_", per_object=False)
