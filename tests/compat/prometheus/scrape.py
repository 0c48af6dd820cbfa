"""Scrape a Prometheus endpoint into {family: {"type": ..., "labels": [...]}}.

The family names are those of the `# TYPE` lines (counters keep `_total`, as both
brokers print them); the label names are the union over the family's samples, so a
family with no sample records no labels.
"""

from __future__ import annotations

import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

#: the endpoints recorded; detailed asks for every family group RabbitMQ 3.10 has
DETAILED_GROUPS = (
    "connection_churn_metrics",
    "node_coarse_metrics",
    "node_metrics",
    "node_persister_metrics",
    "ra_metrics",
    "auth_attempt_metrics",
    "auth_attempt_detailed_metrics",
    "queue_coarse_metrics",
    "queue_consumer_count",
    "queue_metrics",
    "channel_metrics",
    "channel_exchange_metrics",
    "channel_process_metrics",
    "channel_queue_metrics",
    "connection_coarse_metrics",
    "connection_metrics",
    "channel_queue_exchange_metrics",
    "vhost_status",
    "exchange_bindings",
    "exchange_names",
)
ENDPOINTS = {
    "metrics": "/metrics",
    "per-object": "/metrics/per-object",
    "detailed": "/metrics/detailed?" + "&".join(f"family={g}" for g in DETAILED_GROUPS),
    "detailed-queues-of-a-vhost": "/metrics/detailed?vhost=%2F&family=queue_coarse_metrics",
}
_SUFFIXES = ("_bucket", "_sum", "_count", "_created", "_total")


def fetch(url: str) -> tuple[int, str, str]:
    """(status, content type, text)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


def families(text: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            out[name] = {"type": kind, "labels": set()}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name not in out:
                name = next((name[: -len(s)] for s in _SUFFIXES if name[: -len(s)] in out), name)
            if name in out:
                out[name]["labels"].update(sample.labels)
    return {k: {"type": v["type"], "labels": sorted(v["labels"])} for k, v in sorted(out.items())}


def scrape(base: str) -> dict[str, Any]:
    """Every endpoint of a Prometheus listener: status, and families when it is 200."""
    out: dict[str, Any] = {}
    for key, path in ENDPOINTS.items():
        status, content_type, text = fetch(base.rstrip("/") + path)
        entry: dict[str, Any] = {"status": status}
        if status == 200:
            entry["content_type"] = content_type.split(";")[0]
            entry["families"] = families(text)
        out[key] = entry
    return out
