"""An etcd cluster of three members under a Leveret cluster: one member lost, then
its quorum, then both back. Every node is given all three endpoints."""

from __future__ import annotations

import threading
import time

import pika
import pytest

from .cluster_support import Cluster, needs_etcd
from .test_failover import PikaPublisher, _drain, check_delivery

pytestmark = [needs_etcd, pytest.mark.slow]

# etcd's own elections take up to a few of its 500 ms election timeouts on a loaded
# machine; a 3 s lease rides them out (the 1 s of the other tests would not)
LEASE = 3.0


def test_etcd_cluster_loses_one_member_then_its_quorum(cluster_dir: str) -> None:
    c = Cluster(cluster_dir, lease=LEASE, etcd_members=3)
    try:
        leader = c.wait_leader()
        c.wait_in_sync({n.name for n in c.nodes})
        term = c._get("term")
        publisher = PikaPublisher(c.urls(leader), "quorum")
        for _ in range(50):
            publisher.publish_one()

        # (a) One member of three dies, etcd's leader (the others elect one of them):
        # the nodes go on through the others, with the same leader and term, and
        # confirms keep flowing.
        first = c.etcd_leader()
        first.kill()
        for _ in range(100):
            publisher.publish_one()
        assert publisher.retried == set(), "a publish failed while etcd kept its quorum"
        assert c.leader_name() == leader.name
        assert c._get("term") == term
        c.wait_in_sync({n.name for n in c.nodes})

        # (b) A second dies: no quorum, so no lease renewal. The leader stops
        # confirming and steps down (closing its clients' connections); nobody can be
        # elected meanwhile, and a new publish is not confirmed.
        confirmed: list[int] = []
        stop = threading.Event()
        errors: list[BaseException] = []

        def publish_direct() -> None:  # to the leader only: no failover here
            try:
                conn = pika.BlockingConnection(pika.URLParameters(leader.url))
                ch = conn.channel()
                ch.confirm_delivery()
                ch.queue_declare("quorum.direct", durable=True)
                i = 0
                while not stop.is_set():
                    ch.basic_publish(
                        "", "quorum.direct", str(i).encode(), pika.BasicProperties(delivery_mode=2)
                    )
                    confirmed.append(i)
                    i += 1
            except Exception as exc:  # the leader closed the connection: expected
                errors.append(exc)

        thread = threading.Thread(target=publish_direct, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while len(confirmed) < 20:  # it is publishing, and confirmed
            assert time.monotonic() < deadline and not errors, errors
            time.sleep(0.05)
        second = next(e for e in c.etcds if e.running)
        second.kill()
        deadline = time.monotonic() + 60
        while "lost its lease; stepping down" not in leader.log_text():
            assert time.monotonic() < deadline, c.logs()
            time.sleep(0.1)
        thread.join(30)
        stop.set()
        assert not thread.is_alive(), "the publisher still has confirms coming"
        assert errors, "the leader that lost its lease kept its clients' connections"
        assert all(n.running for n in c.nodes)
        assert c.leader_name() is None  # etcd without a quorum answers nobody

        # (c) Both members back: a leader again (any node), every confirmed message
        # there, and confirms flow again.
        first.start(wait=False)
        second.start(wait=False)
        for e in c.etcds:
            e.wait_healthy(60)
        new = c.wait_leader(timeout=60)
        c.wait_in_sync({n.name for n in c.nodes}, timeout=90)
        for _ in range(50):
            publisher.publish_one()
        publisher.close()
        got = _drain(c.urls(new), "quorum")
        check_delivery(got, publisher.confirmed, set(range(publisher.next)), publisher.retried)
        direct = _drain(c.urls(new), "quorum.direct")
        attempted = set(range(max([*confirmed, *direct], default=0) + 1))
        check_delivery(direct, set(confirmed), attempted)
    except AssertionError:
        print(c.logs())
        raise
    finally:
        c.close()
