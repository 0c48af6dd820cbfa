"""The cluster as a leader's management API and Prometheus show it.

A leading node's `ClusterNode` takes a snapshot of what it knows (`snapshot`): its
members and which of them run, each follower's own figures and replication lag, the
in-sync set, the term. `api_nodes` and `families` build `/api/nodes` and the
`leveret_cluster_*` series from a snapshot alone, so that they give the same answer
in the process that runs the cluster node (`--workers 1`) and in worker 0 of a node
of workers, whose supervisor runs the cluster node and sends it each snapshot over
the control channel (workers/control.py): worker 0 serves the management API and
Prometheus there, and holds the last snapshot in a `ClusterView`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from leveret.cluster.node import ClusterNode

#: a follower's figures that its own report (link.status) replaces while it runs
_FOLLOWER_DEFAULTS: dict[str, Any] = {
    "os_pid": "",
    "uptime": 0,
    "mem_used": 0,
    "fd_used": 0,
    "sockets_used": 0,
    "proc_used": 0,
    "mem_alarm": False,
    "disk_free_alarm": False,
}


def snapshot(node: ClusterNode) -> dict[str, Any]:
    """What a leading node knows of its cluster, as JSON (plain lists and dicts)."""
    position = node.tap.position if node.tap is not None else 0
    alive = set(node.alive)
    names = sorted(set(node.members) | alive | {node.name})
    status = {}
    lag = {}
    for name in names:
        if name == node.name:
            continue
        link = node.links.get(name)
        if link is not None and name in alive:
            status[name] = dict(link.status)
        if name in node.members:
            acked = link.acked if link is not None and link.state == "live" else 0
            lag[name] = max(0, position - max(acked, 0))
    return {
        "name": node.name,
        "nodes": names,
        "running": sorted(alive | {node.name}),
        "status": status,
        "lag_bytes": lag,
        "in_sync_followers": len([n for n in node.isr if n != node.name]),
        "term": node.term,
        "min_replicas": node.min_replicas(),
    }


def api_nodes(view: dict[str, Any], own: dict[str, Any]) -> list[dict[str, Any]]:
    """GET /api/nodes on the leader: every node, with RabbitMQ's fields (the leader's
    own `own` from its broker, a follower's from the figures it sends), `running` and
    `leader`."""
    running = set(view["running"])
    out = []
    for name in view["nodes"]:
        if name == view["name"]:
            entry = {**own, "running": True, "leader": True}
        else:
            entry = {
                **own,
                **_FOLLOWER_DEFAULTS,
                **view["status"].get(name, {}),
                "running": name in running,
                "leader": False,
            }
        entry["name"] = f"leveret@{name}"
        out.append(entry)
    return out


def families(view: dict[str, Any]) -> Iterator[Metric]:
    """The cluster's Prometheus series, served by the leader beside the broker's own."""
    lag = GaugeMetricFamily(
        "leveret_cluster_replication_lag_bytes",
        "Bytes of the replication stream the leader sent that the follower has not "
        "acknowledged (a follower that is down or resyncing: the whole stream since)",
        labels=["follower"],
    )
    for name, value in sorted(view["lag_bytes"].items()):
        lag.add_metric([name], value)
    yield lag
    yield GaugeMetricFamily(
        "leveret_cluster_in_sync_followers",
        "Followers in the in-sync set: every confirmed write is on each of them",
        value=view["in_sync_followers"],
    )
    yield CounterMetricFamily(
        "leveret_cluster_leadership_changes",
        "Elections won in this cluster since it was created (the etcd term)",
        value=view["term"],
    )
    yield GaugeMetricFamily(
        "leveret_cluster_min_replicas",
        "Nodes (the leader included) that must hold a write before it is confirmed",
        value=view["min_replicas"],
    )


class ClusterView:
    """Worker 0's stand-in for the `ClusterNode` its supervisor runs: the management
    API's and Prometheus' cluster answers from the supervisor's last snapshot. Before
    the first one comes, the node is shown alone, leading (it does: a node runs
    workers only while it leads)."""

    def __init__(self, name: str) -> None:
        self.view: dict[str, Any] = {
            "name": name,
            "nodes": [name],
            "running": [name],
            "status": {},
            "lag_bytes": {},
            "in_sync_followers": 0,
            "term": 0,
            "min_replicas": 1,
        }

    def update(self, view: dict[str, Any]) -> None:
        if not isinstance(view, dict) or not isinstance(view.get("nodes"), list):
            raise ValueError(f"not a cluster snapshot: {view!r}")
        self.view = view

    def api_nodes(self, own: dict[str, Any]) -> list[dict[str, Any]]:
        return api_nodes(self.view, own)

    def metrics(self) -> Iterator[Metric]:
        return families(self.view)
