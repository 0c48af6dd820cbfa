"""Where Leveret's Prometheus families differ from RabbitMQ 3.10's, on purpose.

case: the endpoint ("metrics", "per-object", "detailed", "detailed-queues-of-a-vhost");
path: the family (fnmatch patterns). docs/differences.md#prometheus has the reasons.
"""

from __future__ import annotations

from ..common import Allowed

_ERLANG = (
    "differences.md#prometheus-erlang",
    "Erlang VM internals (allocators, schedulers, processes, reductions, garbage "
    "collection, distribution links, Mnesia): Leveret is not an Erlang VM, and the Python "
    "runtime's figures under Erlang names would mislead",
)
_STORAGE = (
    "differences.md#prometheus-storage",
    "RabbitMQ's storage internals (message store, queue index, file I/O calls): Leveret's "
    "store reports its fsyncs as rabbitmq_io_sync_* and the rest as leveret_store_*",
)
_PER_CHANNEL = (
    "differences.md#prometheus-per-channel",
    "counted per channel (and per queue), not per channel and exchange or queue: that "
    "would cost a dictionary update per message; sums by channel, vhost or queue agree",
)

ALLOWED: list[Allowed] = [
    Allowed("*", "missing", "erlang_vm_*", *_ERLANG),
    Allowed("*", "missing", "erlang_mnesia_*", *_ERLANG),
    Allowed("*", "missing", "rabbitmq_*erlang_*", *_ERLANG),
    Allowed("*", "missing", "rabbitmq_*process_reductions_total", *_ERLANG),
    Allowed("*", "missing", "rabbitmq_*schema_db_*", *_ERLANG),
    Allowed("*", "missing", "rabbitmq_*msg_store_*", *_STORAGE),
    Allowed("*", "missing", "rabbitmq_*queue_index_*", *_STORAGE),
    Allowed("*", "missing", "rabbitmq_*io_*", *_STORAGE),
    Allowed(
        "*",
        "missing",
        "telemetry_scrape_*",
        "differences.md#prometheus-telemetry",
        "the Erlang Prometheus library's account of its own scrapes; Prometheus records "
        "every target's scrape duration and size itself",
    ),
    Allowed("*", "labels", "rabbitmq_*channel_*", *_PER_CHANNEL),
    Allowed("*", "labels", "rabbitmq_*queue_messages_published_total", *_PER_CHANNEL),
    Allowed(
        "*",
        "extra",
        "leveret_*",
        "differences.md#prometheus-leveret",
        "Leveret's own series (store fsync latency, group commits, paged-out bodies), in "
        "their own namespace",
    ),
]
