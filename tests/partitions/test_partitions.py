"""Partitions, pauses and disk errors on a cluster with a network of its own
(`tests/partitions`: namespaces, nemeses, checker). CI runs a short fixed schedule
and one regression test per failure the long schedules found; longer schedules run
with `python -m tests.partitions --seed N --minutes M`."""

from __future__ import annotations

import pytest

from leveret.cluster.local import etcd_binary

from .net import why_unavailable
from .run import Run, format_report

_why = why_unavailable()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_why is not None, reason=f"partition harness unavailable: {_why}"),
    pytest.mark.skipif(etcd_binary() is None, reason="etcd not installed"),
]


def _run(**kwargs: object) -> dict:
    report = Run(**kwargs).run()  # type: ignore[arg-type]
    print(format_report(report))
    return report


def test_short_schedule() -> None:
    """Five nemeses, each of another kind, in the seed's order (seed 4: a bridge, an
    asymmetric cut, etcd's quorum lost, which changes the leader, a follower cut, the
    clients cut from the leader), under load: nothing confirmed lost, nothing phantom,
    no duplicate of a confirmed message that is not a redelivery, order kept per
    publisher, streams without gaps or rewrites."""
    report = _run(seed=4, events=5)
    assert report["failures"] == 0, format_report(report)
    assert all(q["confirmed"] > 0 for q in report["queues"])


def test_leader_cut_from_followers_gives_the_lead_up() -> None:
    """The leader cut from both followers while it still reaches etcd held its lease
    and confirmed nothing for as long as the partition lasted; now it gives the lead
    up past two leases, a follower leads, and confirms go on during the partition (held
    for 14 leases: the checker wants confirms once 4 leases and the clients' own
    detection of dead connections have passed)."""
    report = _run(seed=1, events=1, only=["leader-isolated"], hold=14)
    assert report["failures"] == 0, format_report(report)
    (event,) = report["events"]
    before, after = event["leader"].split(" -> ")
    assert before != after, format_report(report)


def test_follower_disk_errors_and_a_paused_leader() -> None:
    """A follower whose replication writes fail with EIO (the datadir test hook) leaves
    the in-sync set while the leader confirms with the other, and rejoins once its
    disk works; then the leader's process group is paused past its lease or a follower
    is (the seed decides): nothing confirmed is lost. Seed 3 pauses the leader; a
    publisher that reconnects to it as it resumes and steps down gets no confirm from
    it (docs/cluster.md#known-loss-after-eio)."""
    report = _run(seed=3, events=2, only=["follower-eio", "pause"], hold=4)
    assert report["failures"] == 0, format_report(report)
    assert [e["nemesis"] for e in report["events"]] == ["pause", "follower-eio"] or [
        e["nemesis"] for e in report["events"]
    ] == ["follower-eio", "pause"]
