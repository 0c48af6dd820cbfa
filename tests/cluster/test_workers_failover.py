"""A cluster whose nodes run workers (`--workers 2`): three real nodes on a real etcd,
each a supervisor with two worker processes, pika publishing with confirms to a queue
of each worker; the whole leader (its supervisor and its workers) SIGKILLed, as when
its machine dies. Every confirmed message of both workers' queues is on the new
leader, whose workers started over their replicas; the old leader comes back,
syncs (one cut per worker) and is in sync again."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pika
import pika.exceptions
import pytest

from leveret.cluster.local import NodeProcess
from leveret.workers.mesh import placement

from .cluster_support import Cluster, needs_etcd
from .test_failover import PikaPublisher, _drain, check_delivery

pytestmark = [needs_etcd, pytest.mark.slow]

WORKERS = 2


def _queue_on(worker: int) -> str:
    return next(
        name
        for name in (f"wk-ha-{i}" for i in range(1000))
        if placement("/", name, WORKERS) == worker
    )


def _worker_pids(node: NodeProcess) -> list[int | None]:
    """The pid of each of the node's workers, by index (None: not started), from its
    supervisor's status file."""
    with open(os.path.join(node.data_dir, "workers-status.json"), encoding="utf-8") as f:
        return [w.get("pid") for w in json.load(f)["workers"]]


def _kill_whole_node(node: NodeProcess) -> None:
    """SIGKILL the node's supervisor and every worker it runs (they are in a session
    of their own, so the supervisor's death alone would let them stop cleanly)."""
    pids = [pid for pid in _worker_pids(node) if pid]
    node.kill()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@contextmanager
def cluster_of_workers(cluster_dir: str) -> Iterator[tuple[Cluster, set[str], NodeProcess]]:
    """Three nodes of `--workers 2` with a leader and every node in sync: (the
    cluster, its nodes' names, the leader); the cluster is closed at the end."""
    cluster = Cluster(cluster_dir, extra=("--workers", str(WORKERS)))
    try:
        names = {n.name for n in cluster.nodes}
        leader = cluster.wait_leader(timeout=60)
        cluster.wait_in_sync(names, timeout=60)
        yield cluster, names, leader
    finally:
        cluster.close()


def publish_rounds(publishers: list[Publisher], rounds: int) -> None:
    """`rounds` publishes on each publisher in turn (a publish rides out a failover:
    PikaPublisher.publish_one)."""
    for _ in range(rounds):
        for p in publishers:
            p.publish_one()


def check_queues(urls: list[str], queues: list[str], publishers: list[Publisher]) -> None:
    """Each publisher closed and its queue drained through `urls`: every confirmed
    message there, first copies in order, duplicates only of retried ones."""
    for p in publishers:
        p.close()
    for queue, p in zip(queues, publishers, strict=True):
        got = _drain(urls, queue)
        check_delivery(got, p.confirmed, set(range(p.next)), p.retried)


def test_leader_of_workers_sigkilled_loses_no_confirmed_message(cluster_dir: str) -> None:
    queues = [_queue_on(0), _queue_on(1)]
    with cluster_of_workers(cluster_dir) as (cluster, names, leader):
        publishers = [Publisher(cluster.urls(), q) for q in queues]
        publish_rounds(publishers, 300)
        leader = cluster.wait_leader()
        _kill_whole_node(leader)
        # through the proxies, to the new leader's workers
        publish_rounds(publishers, 200)
        new = cluster.wait_leader(other_than=leader.name)
        assert os.path.isdir(os.path.join(new.data_dir, "worker-1"))
        assert "Leveret started with 2 workers" in leader.log_text()
        leader.start()  # it follows, its copy compared and synced worker by worker
        cluster.wait_in_sync(names, timeout=90)
        check_queues(cluster.urls(), queues, publishers)
        assert all(len(p.confirmed) >= 500 for p in publishers)
        text = new.log_text()
        assert "Leveret started with 2 workers" in text
        assert "2 worker definitions image(s)" in text  # the old leader's sync
        assert "started again; its followers sync again" not in text
        # A node of another layout is never synced (so it can never lead): its copy
        # would be served by stores that read none of these.
        odd = NodeProcess(
            "odd", cluster.nodes[0].etcd_url, cluster_dir, cluster=cluster.name, lease=1.0
        )
        cluster.nodes.append(odd)  # killed with the others
        odd.start()
        deadline = time.monotonic() + 60
        while "runs --workers 1" not in odd.log_text():
            assert time.monotonic() < deadline, odd.log_text()[-3000:]
            time.sleep(0.2)
        assert "this cluster's nodes run --workers 2, odd runs --workers 1" in odd.log_text()
        assert not os.path.exists(os.path.join(odd.data_dir, "workers.json"))


class Publisher(PikaPublisher):
    """PikaPublisher that also rides out a failover or a worker's restart while it
    opens its channel: the connection may close under it (the leader stepped down or
    died), and until the queue's owner is back a declare answers 404 (its home node is
    down, as in RabbitMQ). A publish counts as confirmed only once confirmed."""

    def _open(self) -> None:
        deadline = time.monotonic() + 60
        while True:
            try:
                super()._open()
                return
            except pika.exceptions.ChannelClosedByBroker as exc:
                if exc.reply_code != 404 or time.monotonic() > deadline:
                    raise
            except (pika.exceptions.AMQPConnectionError, OSError):
                if time.monotonic() > deadline:
                    raise
            self.close()
            time.sleep(0.2)


def test_a_worker_killed_alone_on_the_leader_then_the_leader(cluster_dir: str) -> None:
    """Worker 1 of the leader is SIGKILLed under confirmed publishing: its supervisor
    starts it again over its store, and the followers, whose copies may hold writes it
    reported but never made, sync again before confirms go on. Then the whole leader
    is SIGKILLed: every confirmed message of both workers' queues is on the new one."""
    queues = [_queue_on(0), _queue_on(1)]
    with cluster_of_workers(cluster_dir) as (cluster, names, leader):
        publishers = [Publisher(cluster.urls(), q) for q in queues]
        publish_rounds(publishers, 200)
        os.kill(_worker_pids(leader)[1], signal.SIGKILL)
        publish_rounds(publishers, 200)
        deadline = time.monotonic() + 60
        while "worker 1 of leader" not in leader.log_text():
            assert time.monotonic() < deadline, leader.log_text()[-3000:]
            time.sleep(0.2)
        assert cluster.leader_name() == leader.name
        cluster.wait_in_sync(names, timeout=60, caught_up=False)
        publish_rounds(publishers, 200)
        _kill_whole_node(leader)
        publish_rounds(publishers, 100)
        cluster.wait_leader(other_than=leader.name)
        check_queues(cluster.urls(), queues, publishers)
