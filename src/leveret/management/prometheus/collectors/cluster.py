"""leveret_cluster_*: replication lag and the in-sync set, on the leader (the
families are cluster/view.py's)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from prometheus_client.core import Metric

from leveret.management.prometheus.scrape import Scrape


class Replicated(Protocol):
    """The cluster node this node leads for (leveret.cluster.node.ClusterNode)."""

    def metrics(self) -> Iterable[Any]: ...


class ClusterCollector:
    def __init__(self, cluster: Replicated) -> None:
        self.cluster = cluster

    def collect(self, s: Scrape) -> Iterator[Metric]:
        if s.mode != "detailed":
            yield from self.cluster.metrics()
