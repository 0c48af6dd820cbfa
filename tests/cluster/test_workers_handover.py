"""Handovers of a leader of workers: three real nodes of `--workers 2` on a real etcd,
pika publishing with confirms to a queue of each worker. `leveret ctl
transfer_leadership` hands the lead to a named node, then SIGTERM of that leader hands
it to another; the publishers reconnect and go on. Every confirmed message of both
workers' queues is on the last leader, in order, duplicates only of unconfirmed ones."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .cluster_support import needs_etcd
from .test_workers_failover import (
    Publisher,
    _queue_on,
    check_queues,
    cluster_of_workers,
    publish_rounds,
)

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
    with cluster_of_workers(cluster_dir) as (cluster, names, leader):
        try:
            publishers = [Publisher(cluster.urls(first=leader), q) for q in queues]
            publish_rounds(publishers, 200)
            target = next(n for n in cluster.nodes if n is not leader)
            out = _ctl(leader, "transfer_leadership", target.name)
            assert out.returncode == 0, out.stdout + out.stderr + cluster.logs()[-6000:]
            assert f"{target.name} now leads" in out.stdout
            assert cluster.leader_name() == target.name
            confirmed = [len(p.confirmed) for p in publishers]
            publish_rounds(publishers, 200)  # reconnected: to the new leader's workers
            assert [len(p.confirmed) for p in publishers] == [n + 200 for n in confirmed]
            assert "Leveret started with 2 workers" in target.log_text()
            cluster.wait_in_sync(names, timeout=90)
            # SIGTERM of the leader hands over to the most caught-up follower, then exits.
            target.stop(timeout=60)
            new = cluster.wait_leader(other_than=target.name, timeout=60)
            assert "handing over to" in target.log_text(), target.log_text()[-4000:]
            publish_rounds(publishers, 200)
            assert "Leveret started with 2 workers" in new.log_text()
            check_queues(cluster.urls(new), queues, publishers)
            assert all(len(p.confirmed) == 600 for p in publishers)
        except Exception:
            print(cluster.logs()[-20000:])
            raise
