"""The cluster's Prometheus series, served by the leader beside the broker's own."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from leveret.cluster.node import ClusterNode


def families(node: ClusterNode) -> Iterator[Metric]:
    tap = node.tap
    position = tap.position if tap is not None else 0
    lag = GaugeMetricFamily(
        "leveret_cluster_replication_lag_bytes",
        "Bytes of the replication stream the leader sent that the follower has not "
        "acknowledged (a follower that is down or resyncing: the whole stream since)",
        labels=["follower"],
    )
    for name in sorted(set(node.members) - {node.name}):
        link = node.links.get(name)
        acked = link.acked if link is not None and link.state == "live" else 0
        lag.add_metric([name], max(0, position - max(acked, 0)))
    yield lag
    yield GaugeMetricFamily(
        "leveret_cluster_in_sync_followers",
        "Followers in the in-sync set: every confirmed write is on each of them",
        value=len([n for n in node.isr if n != node.name]),
    )
    yield CounterMetricFamily(
        "leveret_cluster_leadership_changes",
        "Elections won in this cluster since it was created (the etcd term)",
        value=node.term,
    )
    yield GaugeMetricFamily(
        "leveret_cluster_min_replicas",
        "Nodes (the leader included) that must hold a write before it is confirmed",
        value=node.min_replicas(),
    )
