"""The cluster as `/api/nodes` and the `leveret_cluster_*` series show it, built from a
snapshot (`cluster/view.py`), and the control-channel note that carries a snapshot to
worker 0 of a node of workers (`workers/control.py`). Real socket pairs; the answers
of real nodes are compared in test_workers_views.py."""

from __future__ import annotations

import asyncio
import socket

import pytest

from leveret.cluster.view import ClusterView, api_nodes, families
from leveret.workers import handoff
from leveret.workers.control import cluster_view, send_cluster, send_ping

SNAPSHOT = {
    "name": "n1",
    "nodes": ["n0", "n1", "n2"],
    "running": ["n0", "n1"],
    "status": {"n0": {"os_pid": "42", "uptime": 5000, "mem_used": 7}},
    "lag_bytes": {"n0": 0, "n2": 1234},
    "in_sync_followers": 1,
    "term": 3,
    "min_replicas": 2,
}

#: the leader's own node (node_info's fields, a few of them)
OWN = {
    "name": "leveret@localhost",
    "type": "disc",
    "os_pid": "9",
    "uptime": 1,
    "mem_used": 100,
    "fd_used": 10,
    "sockets_used": 2,
    "proc_used": 2,
    "mem_alarm": False,
    "disk_free_alarm": False,
}


def test_every_node_with_the_leader_and_running_flags() -> None:
    nodes = {n["name"]: n for n in api_nodes(SNAPSHOT, dict(OWN))}
    assert list(nodes) == ["leveret@n0", "leveret@n1", "leveret@n2"]
    assert nodes["leveret@n1"] == {**OWN, "name": "leveret@n1", "running": True, "leader": True}
    # a running follower: its own figures; the rest of the fields the leader's
    n0 = nodes["leveret@n0"]
    assert (n0["os_pid"], n0["uptime"], n0["mem_used"]) == ("42", 5000, 7)
    assert (n0["running"], n0["leader"], n0["type"]) == (True, False, "disc")
    # one that is down: listed, not running, no figures of its own
    n2 = nodes["leveret@n2"]
    assert (n2["running"], n2["leader"], n2["os_pid"], n2["mem_used"]) == (False, False, "", 0)
    assert set(n2) == set(n0) == set(nodes["leveret@n1"])


def test_the_series_from_a_snapshot() -> None:
    got = {f.name: f for f in families(SNAPSHOT)}
    lag = got["leveret_cluster_replication_lag_bytes"]
    assert [(s.labels, s.value) for s in lag.samples] == [
        ({"follower": "n0"}, 0),
        ({"follower": "n2"}, 1234),
    ]
    assert got["leveret_cluster_in_sync_followers"].samples[0].value == 1
    assert got["leveret_cluster_leadership_changes"].samples[0].value == 3
    assert got["leveret_cluster_min_replicas"].samples[0].value == 2


def test_worker_0_before_its_first_snapshot_shows_its_node_alone_leading() -> None:
    view = ClusterView("n1")
    assert [(n["name"], n["running"], n["leader"]) for n in view.api_nodes(dict(OWN))] == [
        ("leveret@n1", True, True)
    ]
    view.update(SNAPSHOT)
    assert len(view.api_nodes(dict(OWN))) == 3
    with pytest.raises(ValueError, match="not a cluster snapshot"):
        view.update({"nodes": "n0"})
    assert len(view.api_nodes(dict(OWN))) == 3  # the last good one stays


def test_a_snapshot_note_reaches_the_worker_between_pings() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert send_ping(a, 1)
        assert send_cluster(a, SNAPSHOT)
        assert send_ping(a, 2)
        got: list = []

        async def read() -> None:
            def note(state: bytes) -> None:
                got.append(cluster_view(state))
                if len(got) == 3:
                    a.close()

            await asyncio.wait_for(handoff.receive_connections(b, lambda s, _: s.close(), note), 30)

        asyncio.run(read())
        assert got == [None, SNAPSHOT, None]


def test_a_cluster_note_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(ValueError, match="not an object"):
        cluster_view(b'{"cluster": [1, 2]}')
    assert cluster_view(b'{"ping": 3}') is None
