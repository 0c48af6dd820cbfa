"""process_start_time_seconds, as prometheus-client's process collector has it
(`/metrics` only)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from leveret.management.prometheus.scrape import Scrape


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


class ProcessCollector:
    def collect(self, s: Scrape) -> Iterator[Metric]:
        if s.mode == "metrics":
            yield _process_start()
