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
    """Five nemeses, each of another kind, in the seed's order (seed 4: a bridge, the
    clients cut from the leader, an asymmetric cut, one etcd member of three killed, a
    follower cut), under load: nothing confirmed lost, nothing phantom, no duplicate
    of a confirmed message that is not a redelivery, order kept per publisher, streams
    without gaps or rewrites."""
    kinds = ["bridge", "asymmetric", "etcd-down", "follower-cut", "client-cut"]
    report = _run(seed=4, events=5, only=kinds)
    assert report["failures"] == 0, format_report(report)
    assert all(q["confirmed"] > 0 for q in report["queues"])


@pytest.mark.timeout(300)
def test_lossy_link_etcd_quorum_lost_and_clock_jumps() -> None:
    """Seed 38, each fault held 4 leases, under load: one etcd member of three
    killed, then halfway through a second (quorum lost: nobody can be elected or
    change the in-sync set until they are back); both followers' wall clocks jumped
    a day ahead and halfway through the leader paused past its lease, so a node whose
    clock is a day ahead takes over, then the clocks jumped back (the old leader
    rejoins as a follower); 40 % packet loss between the leader and a follower,
    which is also slowed. Nothing confirmed lost, phantom, duplicated or out of
    order, as above."""
    report = _run(seed=38, events=3, only=["lossy", "etcd-down", "clock-jump"], hold=4)
    assert report["failures"] == 0, format_report(report)
    events = {e["nemesis"]: e["what"] for e in report["events"]}
    assert "40% loss" in events["lossy"], events
    assert "1 of 3 left" in events["etcd-down"], events
    assert "clocks jumped +86400 s, then leader" in events["clock-jump"], events
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
