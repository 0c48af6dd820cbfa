"""A node's figures as RabbitMQ's /api/nodes and /api/overview show them.

RabbitMQ reports an Erlang node: schedulers, garbage collection, Mnesia, its
message store's file handles. Leveret is one Python process, so each field gets
the nearest real figure of that process where there is one (context switches and
I/O bytes from the kernel, Python's garbage collections, the event loop's ready
callbacks as the run queue, the churn counters) and otherwise a documented
stand-in of the same JSON type (docs/management.md#stand-ins), never a missing
key: monitoring tools read these fields by name.
"""

from __future__ import annotations

import asyncio
import gc
import os
import platform
import resource
import sys
from typing import Any

from leveret.broker.stats import CHURN, churn_counts
from leveret.server.connection import MECHANISMS

#: RabbitMQ's default retention of samples (seconds), as its overview reports it;
#: Leveret keeps one previous sample per object instead (docs/management.md#statistics)
SAMPLE_RETENTION_POLICIES = {
    "global": [600, 3600, 28800, 86400],
    "basic": [600, 3600],
    "detailed": [600],
}

_MECHANISM_TEXT = {
    "PLAIN": "SASL PLAIN authentication mechanism",
    "AMQPLAIN": "QPid AMQPLAIN mechanism",
    "EXTERNAL": "SASL EXTERNAL authentication mechanism (the client certificate's CN)",
}

#: Erlang figures with no counterpart in a Python process: 0, and a rate of 0.0
_ZERO_COUNTERS = (
    "gc_bytes_reclaimed",
    "io_read_avg_time",
    "io_reopen_count",
    "io_seek_avg_time",
    "io_seek_count",
    "io_sync_avg_time",
    "io_sync_count",
    "io_write_avg_time",
    "mnesia_disk_tx_count",
    "mnesia_ram_tx_count",
    "msg_store_read_count",
    "msg_store_write_count",
    "queue_index_read_count",
    "queue_index_write_count",
)


def _rate(value: float | None) -> dict[str, float]:
    return {"rate": round(value or 0.0, 1)}


def churn_json(server: Any, rates: tuple[float, ...] | None) -> dict[str, Any]:
    """connection_created, ..., queue_deleted, each with `_details.rate` (the sampler's).
    A node of several workers: every worker's (management/workers.py)."""
    counts = churn_counts(server.broker)
    stats = getattr(server, "worker_stats", None)
    if stats is not None:
        counts, rates = stats.churn_counts(counts), stats.churn_rates(rates)
    out: dict[str, Any] = {}
    for i, (name, count) in enumerate(zip(CHURN, counts, strict=True)):
        out[name] = count
        out[f"{name}_details"] = _rate(rates[i] if rates else 0.0)
    return out


def auth_mechanisms(server: Any) -> list[dict[str, Any]]:
    """The SASL mechanisms the AMQP listener offers (EXTERNAL with verified certificates)."""
    names = [*MECHANISMS, "EXTERNAL"]
    external = bool(server.config.tls_verify)
    return [
        {
            "name": name,
            "description": _MECHANISM_TEXT.get(name, name),
            "enabled": name != "EXTERNAL" or external,
        }
        for name in names
    ]


def contexts(server: Any, node: str | None = None) -> list[dict[str, Any]]:
    """The HTTP listeners (RabbitMQ's web contexts): management and Prometheus. Ports
    are strings and `cowboy_opts` an Erlang term there; Leveret's stand-in is "[]".
    The overview's entries also name the node and carry `ssl_opts`."""
    out = []
    if server.management is not None:
        out.append(
            {
                "description": "Leveret Management",
                "path": "/",
                "cowboy_opts": "[]",
                "ip": server.config.host,
                "port": str(server.management.port),
            }
        )
    prometheus = getattr(server, "prometheus", None)
    if prometheus is not None:
        out.append(
            {
                "description": "Leveret Prometheus",
                "path": "/",
                "cowboy_opts": "[]",
                "port": str(prometheus.port),
                "protocol": "'http/prometheus'",
            }
        )
    if node is not None:
        out = [{**c, "node": node, "ssl_opts": []} for c in out]
    return out


def enabled_plugins(server: Any) -> list[str]:
    """The RabbitMQ plugins whose features this broker has on (built in, not plugins)."""
    names = ["rabbitmq_consistent_hash_exchange", "rabbitmq_shovel"]
    if server.management is not None:
        names += ["rabbitmq_management", "rabbitmq_shovel_management"]
    if getattr(server, "prometheus", None) is not None:
        names.append("rabbitmq_prometheus")
    return sorted(names)


def proc_io() -> dict[str, int]:
    """This process's I/O counters from Linux's /proc/self/io (empty elsewhere)."""
    try:
        with open("/proc/self/io") as f:
            pairs = (line.split(":", 1) for line in f)
            return {k.strip(): int(v) for k, v in pairs}
    except (OSError, ValueError):
        return {}


def _run_queue() -> int:
    """Callbacks ready to run in the event loop: the nearest thing to Erlang's run
    queue (work waiting for a scheduler)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return 0
    return len(getattr(loop, "_ready", ()))


def node_details(server: Any, churn_rates: tuple[float, ...] | None) -> dict[str, Any]:
    """The fields of a node that _node_json does not build itself."""
    config = server.config
    usage = resource.getrusage(resource.RUSAGE_SELF)
    io = proc_io()
    fd_total = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    out: dict[str, Any] = {
        "auth_mechanisms": auth_mechanisms(server),
        "cluster_links": [],
        "config_files": [config.config_file] if getattr(config, "config_file", None) else [],
        "contexts": contexts(server),
        "context_switches": usage.ru_nvcsw + usage.ru_nivcsw,
        "context_switches_details": _rate(0.0),
        "db_dir": os.path.abspath(config.data_dir) if config.persistence else "",
        "enabled_plugins": enabled_plugins(server),
        "gc_num": sum(s["collections"] for s in gc.get_stats()),
        "gc_num_details": _rate(0.0),
        "io_read_bytes": io.get("read_bytes", 0),
        "io_read_bytes_details": _rate(0.0),
        "io_read_count": io.get("syscr", 0),
        "io_read_count_details": _rate(0.0),
        "io_write_bytes": io.get("write_bytes", 0),
        "io_write_bytes_details": _rate(0.0),
        "io_write_count": io.get("syscw", 0),
        "io_write_count_details": _rate(0.0),
        "log_files": ["<stderr>"],
        "mem_calculation_strategy": "rss",
        "metrics_gc_queue_length": dict.fromkeys(
            (
                "channel_closed",
                "channel_consumer_deleted",
                "connection_closed",
                "consumer_deleted",
                "exchange_deleted",
                "node_node_deleted",
                "queue_deleted",
                "vhost_deleted",
            ),
            0,
        ),
        "net_ticktime": 60,
        "proc_total": fd_total,
        "ra_open_file_metrics": {"ra_log_segment_writer": 0, "ra_log_wal": 0},
        "run_queue": _run_queue(),
        "sockets_total": fd_total,
        **churn_json(server, churn_rates),
    }
    for name in _ZERO_COUNTERS:
        out[name] = 0
        out[f"{name}_details"] = _rate(0.0)
    for gauge in ("disk_free", "fd_used", "mem_used", "proc_used", "sockets_used"):
        out[f"{gauge}_details"] = _rate(0.0)
    return out


def runtime_version() -> tuple[str, str]:
    """(erlang_version, erlang_full_version) stand-ins: the Python that runs Leveret."""
    return platform.python_version(), f"Python {sys.version.split()[0]} ({sys.platform})"
