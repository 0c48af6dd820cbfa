"""The partition harness against nodes that run workers (`leveret server --workers 2
--cluster-etcd ...`: a supervisor that holds the node's lease and replication stream,
and two worker processes that serve the clients and relay their writes to it;
docs/cluster.md#a-cluster-of-nodes-that-run-workers). The same nemeses, clients and
checker as `test_partitions.py`, plus `worker-pause` (one worker of the leader
SIGSTOPped while its supervisor goes on) and `supervisor-pause` (the leader's
supervisor SIGSTOPped while its workers go on). CI runs two short fixed schedules and three
rounds of the soak loop; `--soak-rounds N` runs N nemesis events, every kind once per
round of twelve, and `python -m tests.partitions --workers 2 --minutes M` longer
schedules."""

from __future__ import annotations

import pytest

from leveret.cluster.local import etcd_binary

from . import nemeses
from .net import why_unavailable
from .run import Run, format_report

_why = why_unavailable()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_why is not None, reason=f"partition harness unavailable: {_why}"),
    pytest.mark.skipif(etcd_binary() is None, reason="etcd not installed"),
]

WORKERS = 2


def _run(**kwargs: object) -> dict:
    report = Run(workers=WORKERS, **kwargs).run()  # type: ignore[arg-type]
    print(format_report(report))
    return report


def _what(report: dict) -> dict[str, str]:
    return {e["nemesis"]: e["what"] for e in report["events"]}


@pytest.mark.timeout(300)
def test_workers_leader_isolated_etcd_quorum_lost_bridge_clients_cut() -> None:
    """Seed 5, each fault held 5 leases, under load on nodes of two workers: the
    leader cut from both followers (it gives the lead up, a follower's workers start
    over its copy), one etcd member killed and halfway through a second (quorum lost:
    the leader steps down and stops its workers), two nodes cut from each other with
    both reaching the third, every client cut from the leader. Nothing confirmed lost,
    phantom, duplicated without the redelivered flag or out of order; streams without
    gaps or rewrites."""
    kinds = ["leader-isolated", "etcd-down", "client-cut", "bridge"]
    report = _run(seed=5, events=4, only=kinds, hold=5)
    assert report["failures"] == 0, format_report(report)
    assert "1 of 3 left" in _what(report)["etcd-down"], _what(report)
    isolated = next(e for e in report["events"] if e["nemesis"] == "leader-isolated")
    before, after = isolated["leader"].split(" -> ")
    assert before != after, format_report(report)
    assert all(q["confirmed"] > 0 for q in report["queues"])


@pytest.mark.timeout(300)
def test_workers_paused_leader_paused_worker_and_follower_disk_errors() -> None:
    """Seed 4, each fault held 5 leases (10 s), on nodes of two workers: the leader's
    whole process group (supervisor and workers) SIGSTOPped past its lease, a follower
    leads and the old one, resumed, follows; a follower's replication writes fail with
    EIO (it leaves the in-sync set and rejoins); one worker of the leader SIGSTOPped
    past the nodes' --worker-liveness-timeout (5 s), so its supervisor kills and
    restarts it while the node keeps the lead, and the followers sync again. Nothing
    confirmed lost, as above."""
    kinds = ["pause", "worker-pause", "follower-eio"]
    report = _run(seed=4, events=3, only=kinds, hold=5)
    assert report["failures"] == 0, format_report(report)
    what = _what(report)
    assert what["pause"].startswith("leader "), what
    assert " of leader " in what["worker-pause"] and "paused" in what["worker-pause"], what
    assert all(q["confirmed"] > 0 for q in report["queues"])


@pytest.mark.soak
@pytest.mark.timeout(900)
def test_workers_soak(soak_rounds: int) -> None:
    """`soak_rounds` nemesis events of every kind (seed 1842: the first three are the
    leader's wall clock an hour ahead, an asymmetric cut, and the leader's supervisor
    alone SIGSTOPped while its workers run on: they stop once its lease has run out,
    and their clients connect to the new leader), random holds, on nodes of two
    workers: nothing confirmed lost."""
    report = _run(seed=1842, events=soak_rounds, only=sorted(nemeses.ALL))
    assert report["failures"] == 0, format_report(report)
    assert all(q["confirmed"] > 0 for q in report["queues"])
