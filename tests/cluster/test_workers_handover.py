"""Handovers of a leader of workers: three real nodes of `--workers 2` on a real etcd,
pika publishing with confirms to a queue of each worker. `leveret ctl
transfer_leadership` hands the lead to a named node, then SIGTERM of that leader hands
it to another; the publishers reconnect and go on. Every confirmed message of both
workers' queues is on the last leader, in order, duplicates only of unconfirmed ones."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .cluster_support import Cluster, needs_etcd
from .test_failover import _drain, check_delivery
from .test_workers_failover import WORKERS, Publisher, _queue_on

pytestmark = [needs_etcd, pytest.mark.slow]


def _ctl(node, *args: str) -> subprocess.CompletedProcess[str]:  # noqa: ANN001
    return subprocess.run(
        [sys.executable, "-m", "leveret", "ctl", "--data-dir", node.data_dir, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_handovers_of_a_leader_of_workers_lose_no_confirmed_message(cluster_dir: str) -> None:
    queues = [_queue_on(0), _queue_on(1)]
    cluster = Cluster(cluster_dir, extra=("--workers", str(WORKERS)))
    try:
        names = {n.name for n in cluster.nodes}
        leader = cluster.wait_leader(timeout=60)
        cluster.wait_in_sync(names, timeout=60)
        publishers = [Publisher(cluster.urls(first=leader), q) for q in queues]
        for _ in range(200):
            for p in publishers:
                p.publish_one()
        target = next(n for n in cluster.nodes if n is not leader)
        out = _ctl(leader, "transfer_leadership", target.name)
        assert out.returncode == 0, out.stdout + out.stderr + cluster.logs()[-6000:]
        assert f"{target.name} now leads" in out.stdout
        assert cluster.leader_name() == target.name
        confirmed = [len(p.confirmed) for p in publishers]
        for _ in range(200):
            for p in publishers:
                p.publish_one()  # reconnected: to the new leader's workers
        assert [len(p.confirmed) for p in publishers] == [n + 200 for n in confirmed]
        assert "Leveret started with 2 workers" in target.log_text()
        cluster.wait_in_sync(names, timeout=90)
        # SIGTERM of the leader hands over to the most caught-up follower, then exits.
        target.stop(timeout=60)
        new = cluster.wait_leader(other_than=target.name, timeout=60)
        assert "handing over to" in target.log_text(), target.log_text()[-4000:]
        for _ in range(200):
            for p in publishers:
                p.publish_one()
        assert "Leveret started with 2 workers" in new.log_text()
        for p in publishers:
            p.close()
        for queue, p in zip(queues, publishers, strict=True):
            got = _drain(cluster.urls(new), queue)
            assert len(p.confirmed) == 600
            check_delivery(got, p.confirmed, set(range(p.next)), p.retried)
    except Exception:
        print(cluster.logs()[-20000:])
        raise
    finally:
        cluster.close()
