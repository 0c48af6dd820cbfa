"""The management API's and Prometheus' cluster views on a cluster whose nodes run
workers (`--workers 2`): worker 0 of the leader serves them with the cluster its
supervisor's node sees (cluster/view.py), and they answer as those of a cluster of
one-process nodes (`--workers 1`), field by field: the same node list, the same
fields in each node, which node leads, which run (a follower SIGKILLed turns to not
running), the overview's cluster_name, `/api/nodes/{name}`, the leveret_cluster_*
series. Three real nodes on a real etcd for each count, one count after the other."""

from __future__ import annotations

import json
import time
import urllib.error
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .cluster_support import Cluster, needs_etcd
from .test_operations import _ctl, _http

pytestmark = [needs_etcd, pytest.mark.slow]


def _nodes(port: int) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in json.loads(_http(port, "/api/nodes")[1])}


def _wait_nodes(port: int, running: set[str], expected: int, timeout: float = 30) -> dict:
    """/api/nodes once it lists `expected` nodes of which exactly `running` run."""
    deadline = time.monotonic() + timeout
    nodes: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        nodes = _nodes(port)
        if len(nodes) == expected and {n for n, v in nodes.items() if v["running"]} == running:
            return nodes
        time.sleep(0.2)
    raise AssertionError(f"/api/nodes did not show {sorted(running)} running: {nodes}")


def _cluster_series(text: str) -> dict[str, dict[tuple, float]]:
    """leveret_cluster_* and rabbitmq_identity_info samples: family -> labels -> value."""
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("leveret_cluster_") or family.name == "rabbitmq_identity_info":
            for s in family.samples:
                labels = tuple(sorted(s.labels.items()))
                out.setdefault(s.name, {})[labels] = s.value
    return out


def _views(workers: int, directory: str) -> dict[str, Any]:
    """What a cluster of nodes of `workers` workers shows: /api/nodes from the leader
    and from a follower (which passes HTTP to the leader), /api/nodes/{name} for each,
    the overview, Prometheus' cluster series, `leveret ctl cluster_status`, and
    /api/nodes once a follower is SIGKILLed."""
    c = Cluster(directory, management=True, prometheus=True, extra=("--workers", str(workers)))
    try:
        names = {n.name for n in c.nodes}
        leader = c.wait_leader(timeout=60)
        c.wait_in_sync(names, timeout=60)
        leader = c.wait_leader()
        follower = next(n for n in c.nodes if n is not leader)
        every = {f"leveret@{n}" for n in names}
        out: dict[str, Any] = {"leader": f"leveret@{leader.name}"}
        out["nodes"] = _wait_nodes(leader.management_port, every, 3)
        out["via_follower"] = _wait_nodes(follower.management_port, every, 3)
        out["each"] = {
            name: json.loads(_http(leader.management_port, f"/api/nodes/{name}")[1])
            for name in sorted(every)
        }
        with pytest.raises(urllib.error.HTTPError) as missing:
            _http(leader.management_port, "/api/nodes/leveret@nosuch")
        out["missing"] = missing.value.code
        out["overview"] = json.loads(_http(leader.management_port, "/api/overview")[1])
        out["metrics"] = _cluster_series(_http(leader.prometheus_port, "/metrics")[1])
        status = _ctl(leader, "--formatter", "json", "cluster_status")
        assert status.returncode == 0, status.stderr
        out["cluster_status"] = json.loads(status.stdout)
        follower.kill()
        out["killed"] = f"leveret@{follower.name}"
        out["after_kill"] = _wait_nodes(
            leader.management_port, every - {out["killed"]}, 3, timeout=60
        )
        return out
    finally:
        c.close()


def _shape(value: Any) -> Any:
    """A JSON value's structure: its keys and their types, not the figures."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(v) for v in value[:1]]
    return type(value).__name__


def test_worker_0_shows_the_cluster_as_one_process_does(tmp_path: Any) -> None:
    one = _views(1, str(tmp_path / "one"))
    two = _views(2, str(tmp_path / "two"))
    for got in (one, two):
        every = set(got["nodes"])
        assert every == {"leveret@n0", "leveret@n1", "leveret@n2"}
        # which node leads, and that every node runs
        assert [n for n, v in got["nodes"].items() if v["leader"]] == [got["leader"]]
        assert all(v["running"] is True for v in got["nodes"].values())
        assert set(got["via_follower"]) == every
        assert [n for n, v in got["via_follower"].items() if v["leader"]] == [got["leader"]]
        assert set(got["each"]) == every
        for name, entry in got["each"].items():
            assert entry["name"] == name
            assert entry["leader"] == (name == got["leader"])
        assert got["missing"] == 404
        assert got["overview"]["cluster_name"] == "test"
        leader = got["leader"].removeprefix("leveret@")
        assert got["cluster_status"]["leader"] == leader
        assert len(got["cluster_status"]["nodes"]) == 3
        # a SIGKILLed follower stays listed, not running; the others run
        after = got["after_kill"]
        assert set(after) == every
        assert after[got["killed"]]["running"] is False
        assert [n for n, v in after.items() if v["leader"]] == [got["leader"]]
        series = got["metrics"]
        followers = sorted(n.removeprefix("leveret@") for n in every if n != got["leader"])
        lag = series["leveret_cluster_replication_lag_bytes"]
        assert sorted(dict(k)["follower"] for k in lag) == followers
        assert series["leveret_cluster_in_sync_followers"] == {(): 2.0}
        assert series["leveret_cluster_min_replicas"] == {(): 2.0}
        assert series["leveret_cluster_leadership_changes_total"][()] >= 1
        identity = next(iter(series["rabbitmq_identity_info"]))
        assert dict(identity)["rabbitmq_cluster"] == "test"
    # field by field: the same fields of the same types in every node, the leader's
    # and the followers' (running or not), in the list and on their own
    for key in ("nodes", "via_follower", "each", "after_kill"):
        assert _shape(two[key]) == _shape(one[key]), key
    assert _shape(two["overview"]) == _shape(one["overview"])
    assert set(two["metrics"]) == set(one["metrics"])

    # `leveret ctl cluster_status`: the leader's row and a follower's (whichever nodes)
    def rows(status: dict) -> dict:
        return {n["role"]: _shape(n) for n in status["nodes"]}

    assert rows(two["cluster_status"]) == rows(one["cluster_status"])
    assert _shape({**two["cluster_status"], "nodes": []}) == _shape(
        {**one["cluster_status"], "nodes": []}
    )
