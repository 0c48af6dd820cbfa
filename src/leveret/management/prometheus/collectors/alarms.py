"""rabbitmq_alarms_*: whether each resource alarm is in effect (`/metrics` only, as
RabbitMQ's per-object registry has the core metrics only)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from leveret.management.prometheus.scrape import Scrape
from leveret.management.prometheus.text import Family, Rendered, rendered
from leveret.server.alarms import resident_bytes

if TYPE_CHECKING:
    from leveret.handle import NodeHandle


class AlarmCollector:
    def __init__(self, node: NodeHandle) -> None:
        self.node = node  # its alarms start with its listeners, after the collector

    def collect(self, s: Scrape) -> Iterator[Rendered]:
        if s.mode != "metrics":
            return
        alarms = self.node.alarms
        active = alarms.active if alarms is not None else set()
        if s.workers is not None and alarms is not None:
            # the node's: any worker's, or all of them over the node's watermark
            used, limit = s.workers.node_memory(resident_bytes(), alarms.memory_limit)
            active = s.workers.alarms(active, used, limit)
        for name, doc, on in (
            ("memory_used_watermark", "is 1 if VM memory watermark alarm is in effect",
             "memory" in active),
            ("free_disk_space_watermark", "is 1 if free disk space watermark alarm is in effect",
             "disk" in active),
            # Leveret raises no file-descriptor alarm
            ("file_descriptor_limit", "is 1 if file descriptor limit alarm is in effect", False),
        ):  # fmt: skip
            yield rendered(Family(f"rabbitmq_alarms_{name}", "untyped", doc).add(int(on)))
