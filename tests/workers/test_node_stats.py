"""One node from outside: worker 0's Prometheus node-level families and /api/nodes
show the whole broker of workers (management/workers.py): process gauges summed over
every process (the supervisor's memory and descriptors too), counters summed over
every worker and kept across a worker's restart, any worker's alarm the node's.

Real `leveret server --workers 2` processes, clients on both workers."""

from __future__ import annotations

import os
import re
import resource
import signal
import socket
import sys
from pathlib import Path

import pika
import pytest
import requests
from tests.compat.common import split_allowed
from tests.compat.prometheus import workload
from tests.compat.prometheus.allowed import ALLOWED
from tests.compat.prometheus.replay import differences, recording
from tests.compat.prometheus.scrape import scrape
from tests.workers.inprocess import in_process_workers
from tests.workers.procs import Workers, wait_for

from leveret.ctl import call
from leveret.workers.mesh import placement

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers: Linux")

AUTH = ("guest", "guest")
#: the broker's memory watermark: each of the two workers alarms above half of it
WATERMARK = 6_000_000_000
SAMPLE = re.compile(r"^(\w+)(\{[^}]*\})? (\S+)$", re.MULTILINE)


def _free_ports(n: int) -> list[int]:
    """`n` different ports free now (all held at once while they are picked)."""
    held = [socket.socket() for _ in range(n)]
    try:
        for s in held:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


class Node:
    """A broker of two worker processes with worker 0's management API and Prometheus."""

    def __init__(self, tmp: Path) -> None:
        for attempt in range(5):
            # A port found free may be taken before the broker binds it: then again.
            self.management, self.prometheus = _free_ports(2)
            (tmp / str(attempt)).mkdir()
            self.broker = Workers(
                tmp / str(attempt),
                2,
                "--management-port",
                str(self.management),
                "--prometheus-port",
                str(self.prometheus),
                "--memory-high-watermark",
                str(WATERMARK),
            ).wait_listening()
            if " not started on " not in self.broker.text():
                break
            self.broker.kill()
        else:
            raise AssertionError(f"no free HTTP ports:\n{self.broker.text()}")
        self.opened = 0  # connections this test opened (every attempt of connect_to)
        self.channels = 0

    def connect_to(self, worker: int, name: str) -> pika.BlockingConnection:
        before = self.broker.connect  # count every connection connect_to makes

        def counted(name: str = "wk-proc") -> pika.BlockingConnection:
            self.opened += 1
            return before(name)

        self.broker.connect = counted  # type: ignore[method-assign]
        try:
            conn = self.broker.connect_to(worker, name)
        finally:
            self.broker.connect = before  # type: ignore[method-assign]
        conn.channel()
        self.channels += 1
        return conn

    def metrics(self) -> dict[str, float]:
        """/metrics' samples without labels, and auth attempts' by name."""
        text = requests.get(f"http://127.0.0.1:{self.prometheus}/metrics", timeout=30).text
        out = {}
        for name, labels, value in SAMPLE.findall(text):
            if not labels or labels == '{protocol="amqp091"}':
                out[name] = float(value)
        return out

    def node(self) -> dict:
        response = requests.get(
            f"http://127.0.0.1:{self.management}/api/nodes", auth=AUTH, timeout=30
        )
        assert response.status_code == 200, response.text
        [doc] = response.json()
        return doc

    def pids(self) -> list[int]:
        """Every process of the node: the workers (workers-status.json), the supervisor."""
        return [w["pid"] for w in self.broker.status()["workers"]] + [self.broker.proc.pid]


def _rss(pid: int) -> int:
    """VmRSS of `pid` in bytes, from /proc/<pid>/status."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture
def node(tmp_path: Path):
    made = Node(tmp_path)
    yield made
    made.broker.kill()


def test_node_families_and_api_nodes_are_the_sums_over_every_worker(node: Node) -> None:
    conns = [node.connect_to(0, "wk-node-0"), node.connect_to(1, "wk-node-1")]
    conns += [node.connect_to(1, "wk-node-1b")]
    try:
        # Counters: every worker's connections and logins (a report is at most 1 s old).
        def counted():
            """the opened counters of both workers"""
            m = node.metrics()
            return m.get("rabbitmq_connections_opened_total") == node.opened and m

        m = wait_for(counted)
        assert m["rabbitmq_connections_closed_total"] == node.opened - len(conns)
        assert m["rabbitmq_connections"] == len(conns)
        assert m["rabbitmq_channels_opened_total"] == node.channels
        assert m["rabbitmq_channels_closed_total"] == 0
        assert m["rabbitmq_auth_attempts_succeeded_total"] == node.opened
        assert m["rabbitmq_auth_attempts_total"] == node.opened
        assert m["rabbitmq_process_open_tcp_sockets"] == len(conns)
        # io_sync_* are the store's fsyncs of every worker, as its histogram counts them
        assert m["rabbitmq_io_sync_ops_total"] == m["leveret_store_fsync_seconds_count"]

        # Gauges: the resident memory of every process of the node. Each reading of a
        # process moves a little between the scrape and /proc, hence the 10% margins; one
        # worker alone is well under half of it.
        pids = node.pids()
        workers_rss = sum(_rss(pid) for pid in pids[:2])
        every_rss = workers_rss + _rss(pids[2])
        memory = node.metrics()["rabbitmq_process_resident_memory_bytes"]
        assert 0.9 * every_rss <= memory <= 1.1 * every_rss, (memory, workers_rss, every_rss)
        assert memory >= 0.9 * workers_rss
        assert node.metrics()["rabbitmq_resident_memory_limit_bytes"] == WATERMARK
        # Descriptors: the workers' (against their limits)
        fds = sum(_fds(pid) for pid in pids[:2])
        m = node.metrics()
        assert 0.8 * fds <= m["rabbitmq_process_open_fds"] <= 1.2 * fds, (m, fds)
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]  # the workers inherit it
        assert m["rabbitmq_process_max_fds"] == 2 * limit

        doc = node.node()
        assert 0.9 * every_rss <= doc["mem_used"] <= 1.1 * every_rss
        assert doc["mem_limit"] == WATERMARK
        assert doc["mem_alarm"] is False
        assert 0.8 * fds <= doc["fd_used"] <= 1.2 * fds
        assert doc["fd_total"] == doc["sockets_total"] == 2 * limit
        assert doc["sockets_used"] == len(conns)
        assert doc["connection_created"] == node.opened
        assert doc["connection_closed"] == node.opened - len(conns)
        assert doc["channel_created"] == node.channels
        # Any worker's ctl socket lists every worker's connections and queues.
        sock = str(node.broker.data / "worker-1" / "ctl.sock")
        # (worker 0's report, at most 1 s old, may still list a connection connect_to
        # closed)
        wait_for(
            lambda: sorted(r["worker"] for r in call(sock, "list_connections", {})) == [0, 1, 1]
        )
        queue = next(f"wk-node-q{i}" for i in range(100) if placement("/", f"wk-node-q{i}", 2) == 0)
        ch = conns[0].channel()
        node.channels += 1
        ch.queue_declare(queue)
        ch.basic_publish("", queue, b"one")
        ch.basic_publish("", queue, b"two")
        wait_for(
            lambda: (
                [r["messages"] for r in call(sock, "list_queues", {}) if r["name"] == queue] == [2]
            )
        )
        overview = requests.get(
            f"http://127.0.0.1:{node.management}/api/overview", auth=AUTH, timeout=30
        ).json()
        assert overview["churn_rates"]["connection_created"] == node.opened
    finally:
        for conn in conns:
            conn.close()


def test_counters_do_not_go_back_when_a_worker_restarts(node: Node) -> None:
    conns = [node.connect_to(0, "wk-node-0"), node.connect_to(1, "wk-node-1")]
    on_1 = node.broker.status()["workers"][1]
    families = (
        "rabbitmq_connections_opened_total",
        "rabbitmq_connections_closed_total",
        "rabbitmq_channels_opened_total",
        "rabbitmq_channels_closed_total",
        "rabbitmq_auth_attempts_total",
        "rabbitmq_auth_attempts_succeeded_total",
        "rabbitmq_global_messages_received_total",
    )
    conns[1].channel().basic_publish("", "wk-node-nowhere", b"x")  # counted by worker 1
    node.channels += 1
    shown = wait_for(
        lambda: (
            (m := node.metrics())["rabbitmq_connections_opened_total"] == node.opened
            and m["rabbitmq_global_messages_received_total"] == 1
            and m
        )
    )
    before = dict(shown)

    os.kill(on_1["pid"], signal.SIGKILL)

    def restarted():
        """worker 1 running again, with a new pid"""
        w = node.broker.status()["workers"][1]
        return w["pid"] != on_1["pid"] and w["state"] == "running" and w["ready"]

    while not restarted():
        m = node.metrics()  # while it is down, and as it comes back
        for name in families:
            assert m[name] >= shown[name], (name, m[name], shown[name])
        shown = m
    conns.append(node.connect_to(1, "wk-node-again"))

    def again():
        """the new worker 1's connection counted over the old one's"""
        m = node.metrics()
        for name in families:
            assert m[name] >= shown[name], (name, m[name], shown[name])
        return m["rabbitmq_connections_opened_total"] == node.opened and m

    m = wait_for(again)
    # the old worker 1's counts are kept: a restart counts on from where they were
    assert m["rabbitmq_auth_attempts_succeeded_total"] == node.opened
    assert m["rabbitmq_channels_opened_total"] == node.channels
    assert (
        m["rabbitmq_global_messages_received_total"]
        == before["rabbitmq_global_messages_received_total"]
    )
    # open: the one on worker 0 and the new one on worker 1
    assert m["rabbitmq_connections_closed_total"] == node.opened - 2
    assert node.node()["connection_created"] == node.opened
    for conn in (conns[0], conns[2]):
        conn.close()


def test_the_recorded_families_at_two_workers(node: Node) -> None:
    """The recorded Prometheus families (tests/compat/prometheus), scraped from worker
    0 of two with the recording's workload spread over both workers: the same names,
    types and labels as from one process."""
    connections = workload.run(f"amqp://guest:guest@127.0.0.1:{node.broker.port}/%2F")
    try:
        actual = scrape(f"http://127.0.0.1:{node.prometheus}")
    finally:
        for conn in connections:
            conn.close()
    left, _used = split_allowed(differences(recording(), actual), ALLOWED)
    assert left == [], "\n".join(str(d) for d in left)


def test_any_workers_alarm_is_the_nodes(tmp_path: Path) -> None:
    """Worker 1 over its share alarms the node; so do all workers over the node's
    watermark (the supervisor's memory counted) though none is over its own."""
    with in_process_workers(
        2, tmp_path, per_worker={0: {"management_port": 0, "prometheus_port": 0}}
    ) as w:
        api = f"http://127.0.0.1:{w.nodes[0].management.port}/api/nodes"  # type: ignore[union-attr]
        metrics = f"http://127.0.0.1:{w.nodes[0].prometheus.port}/metrics"  # type: ignore[union-attr]
        huge = 1 << 50

        def limits(first: int, second: int) -> None:
            w.nodes[0].alarms.memory_limit = first  # type: ignore[union-attr]
            w.nodes[1].alarms.memory_limit = second  # type: ignore[union-attr]

        def alarmed() -> tuple[bool, bool]:
            """the node's memory alarm in /api/nodes and in Prometheus"""
            doc = requests.get(api, auth=AUTH, timeout=30).json()[0]
            text = requests.get(metrics, timeout=30).text
            return doc["mem_alarm"], "rabbitmq_alarms_memory_used_watermark 1" in text

        w.call(limits, huge, huge)
        assert alarmed() == (False, False)
        w.call(limits, huge, 1)  # worker 1 alone over its share
        wait_for(lambda: alarmed() == (True, True))
        assert not w.nodes[0].alarms.active  # type: ignore[union-attr]
        w.call(limits, huge, huge)
        wait_for(lambda: alarmed() == (False, False))

        # Both workers under their share (they share this test's process, so each
        # reads the same resident memory R), the node's memory over their sum: the
        # supervisor's (here: this process again) makes it 3 R against 2.4 R.
        rss = _rss(os.getpid())
        w.nodes[0].worker_stats.supervisor = os.getpid()  # type: ignore[union-attr]
        w.call(limits, int(rss * 1.2), int(rss * 1.2))
        wait_for(lambda: alarmed() == (True, True))
        assert not w.nodes[0].alarms.active and not w.nodes[1].alarms.active  # type: ignore[union-attr]
