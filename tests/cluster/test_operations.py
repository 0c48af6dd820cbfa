"""Operating a cluster: /api/nodes on any node, leveret ctl, Prometheus, handovers."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
import urllib.request

import pika
import pytest

from .cluster_support import Cluster, needs_etcd
from .test_failover import _connect

pytestmark = [needs_etcd, pytest.mark.slow]


def _http(port: int, path: str, method: str = "GET", body=None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as res:
        return res.status, res.read().decode()


def _ctl(node, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "leveret", "ctl", "--data-dir", node.data_dir, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def ops_cluster(cluster_dir: str):
    c = Cluster(cluster_dir, management=True, prometheus=True)
    try:
        c.wait_leader()
        c.wait_in_sync({n.name for n in c.nodes})
        yield c
    finally:
        c.close()


def test_api_nodes_ctl_and_metrics_from_any_node(ops_cluster: Cluster) -> None:
    c = ops_cluster
    leader = c.wait_leader()
    for node in c.nodes:  # followers proxy HTTP to the leader
        status, text = _http(node.management_port, "/api/nodes")
        assert status == 200
        nodes = {n["name"]: n for n in json.loads(text)}
        assert set(nodes) == {f"leveret@{n.name}" for n in c.nodes}
        assert [n for n, v in nodes.items() if v["leader"]] == [f"leveret@{leader.name}"]
        for entry in nodes.values():
            assert entry["running"] is True
            for field in ("type", "mem_used", "fd_used", "disk_free", "uptime", "os_pid"):
                assert field in entry
        assert nodes[f"leveret@{leader.name}"]["os_pid"] == str(leader.proc.pid)
    follower = next(n for n in c.nodes if n is not leader)
    out = _ctl(follower, "cluster_status")
    assert out.returncode == 0, out.stderr
    assert f"leader {leader.name}" in out.stdout
    rows = [line.split("\t") for line in out.stdout.splitlines()[2:]]
    assert sorted(r[0] for r in rows) == sorted(n.name for n in c.nodes)
    assert all(r[3] == "true" for r in rows)  # in sync
    data = json.loads(_ctl(leader, "--formatter", "json", "cluster_status").stdout)
    assert data["leader"] == leader.name and len(data["nodes"]) == 3
    _status, metrics = _http(follower.prometheus_port, "/metrics")
    assert "leveret_cluster_in_sync_followers 2.0" in metrics
    assert 'leveret_cluster_replication_lag_bytes{follower="' in metrics
    changes = re.search(r"^leveret_cluster_leadership_changes_total (\S+)$", metrics, re.M)
    assert changes is not None and float(changes.group(1)) >= 1
    # A node that is down stays listed, not running.
    follower.kill()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        nodes = {n["name"]: n for n in json.loads(_http(leader.management_port, "/api/nodes")[1])}
        if nodes[f"leveret@{follower.name}"]["running"] is False:
            break
        time.sleep(0.2)
    assert nodes[f"leveret@{follower.name}"]["running"] is False
    bad = _ctl(leader, "transfer_leadership", "nosuch")
    assert bad.returncode != 0 and "nosuch" in bad.stderr


def test_transfer_leadership_and_sigterm_handover(ops_cluster: Cluster) -> None:
    c = ops_cluster
    leader = c.wait_leader()
    target = next(n for n in c.nodes if n is not leader)
    conn = pika.BlockingConnection(pika.URLParameters(leader.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("moved", durable=True)
    for i in range(100):
        ch.basic_publish("", "moved", str(i).encode(), pika.BasicProperties(delivery_mode=2))
    conn.close()
    # Global parameters are catalog rows: the next leaders have them (set through a
    # follower's proxy, answered once the followers hold them).
    assert _http(target.management_port, "/api/cluster-name", "PUT", {"name": "ops"})[0] == 204
    gp = "/api/global-parameters/ops-setting"
    assert _http(leader.management_port, gp, "PUT", {"value": {"a": 1}})[0] == 201
    out = _ctl(leader, "transfer_leadership", target.name)
    assert out.returncode == 0, out.stderr + c.logs()
    assert f"{target.name} now leads" in out.stdout
    assert c.leader_name() == target.name
    c.wait_in_sync({n.name for n in c.nodes})
    # SIGTERM of the leader hands over before it exits; nothing confirmed is lost.
    target.stop()
    new = c.wait_leader(other_than=target.name)
    assert "handing over to" in target.log_text(), target.log_text()[-4000:]
    conn = _connect([new.url])  # its broker may still be starting over its copy
    ch = conn.channel()
    assert ch.queue_declare("moved", durable=True, passive=True).method.message_count == 100
    assert conn._impl.server_properties["cluster_name"] in ("ops", b"ops")
    conn.close()
    assert json.loads(_http(new.management_port, "/api/cluster-name")[1]) == {"name": "ops"}
    assert json.loads(_http(new.management_port, gp)[1]) == {
        "name": "ops-setting",
        "value": {"a": 1},
    }
