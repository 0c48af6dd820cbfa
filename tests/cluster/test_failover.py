"""Three real nodes on a real etcd: the leader is killed, paused, cut off; followers die.

The claims checked each time: no confirmed message is lost, order per queue is kept
(the first copy of each message comes in publish order), and the only duplicates
are of messages whose publish was not confirmed.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import pika
import pytest

from leveret.client import PublishTimeout, connect

from .cluster_support import LEASE, Cluster, needs_etcd

pytestmark = [needs_etcd, pytest.mark.slow]


def _params(urls: list[str]) -> list[pika.URLParameters]:
    params = []
    for url in urls:
        p = pika.URLParameters(url)
        p.connection_attempts = 1
        p.socket_timeout = 2
        p.blocked_connection_timeout = 10
        params.append(p)
    return params


def _drain(urls: list[str], queue: str, deadline: float = 60.0) -> list[int]:
    """Everything in `queue`. A node that steps down (or hands over) right after a
    failover disconnects its clients, as designed: the drain reconnects and goes on."""
    end = time.monotonic() + deadline
    got: list[int] = []
    while True:
        conn = _connect(urls)
        try:
            ch = conn.channel()
            while True:
                method, _props, body = ch.basic_get(queue, auto_ack=True)
                if method is None:
                    conn.close()
                    return got
                got.append(int(body))
        except pika.exceptions.AMQPConnectionError:
            if time.monotonic() > end:
                raise
            time.sleep(0.5)


def _connect(urls: list[str], deadline: float = 30.0) -> pika.BlockingConnection:
    end = time.monotonic() + deadline
    while True:
        try:
            return pika.BlockingConnection(_params(urls))
        except pika.exceptions.AMQPError:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)


def check_delivery(
    got: list[int], confirmed: set[int], attempted: set[int], retried: set[int] | None = None
) -> None:
    """No confirmed message lost, first copies in order, duplicates only of retried ones."""
    present = set(got)
    lost = confirmed - present
    assert not lost, f"{len(lost)} confirmed message(s) lost, e.g. {sorted(lost)[:10]}"
    assert present <= attempted
    seen: set[int] = set()
    firsts = []
    duplicates = set()
    for value in got:
        if value in seen:
            duplicates.add(value)
        else:
            seen.add(value)
            firsts.append(value)
    assert firsts == sorted(firsts), "order per queue not kept"
    if retried is not None:
        assert duplicates <= retried, f"duplicates of confirmed messages: {duplicates - retried}"


class PikaPublisher:
    """Confirmed publishing of 0, 1, 2, ... with pika over several hosts; a publish
    that fails (the connection went) is retried on a new connection."""

    def __init__(self, urls: list[str], queue: str, arguments: dict | None = None) -> None:
        self.urls = urls
        self.queue = queue
        self.arguments = arguments
        self.confirmed: set[int] = set()
        self.retried: set[int] = set()
        self.next = 0
        self._open()

    def _open(self) -> None:
        self.conn = _connect(self.urls)
        self.ch = self.conn.channel()
        self.ch.confirm_delivery()
        self.ch.queue_declare(self.queue, durable=True, arguments=self.arguments)

    def publish_one(self) -> None:
        value = self.next
        while True:
            try:
                self.ch.basic_publish(
                    "", self.queue, str(value).encode(), pika.BasicProperties(delivery_mode=2)
                )
                break
            except (pika.exceptions.AMQPError, OSError):
                self.retried.add(value)
                self._open()
        self.confirmed.add(value)
        self.next += 1

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass


@pytest.mark.soak
def test_leader_sigkill_under_confirmed_publishing_pika(cluster: Cluster, soak_rounds: int) -> None:
    rounds = max(1, soak_rounds - 1)
    leader = cluster.wait_leader()
    publisher = PikaPublisher(cluster.urls(), "ha")
    killed: list[str] = []
    for _ in range(rounds):
        for _ in range(300):
            publisher.publish_one()
        leader = cluster.wait_leader()
        leader.kill()
        killed.append(leader.name)
        for _ in range(300):
            publisher.publish_one()  # through the proxies, to the new leader
        new = cluster.wait_leader(other_than=leader.name)
        leader.start()  # it comes back as a follower and catches up
        cluster.wait_in_sync({n.name for n in cluster.nodes}, timeout=60)
        assert new.running
    publisher.close()
    got = _drain(cluster.urls(), "ha")
    attempted = set(range(publisher.next))
    check_delivery(got, publisher.confirmed, attempted, publisher.retried)


def test_leader_sigkill_leveret_client_recovers(cluster: Cluster) -> None:
    async def run() -> tuple[set[int], list[int]]:
        conn = await connect(cluster.urls(), reconnect_delay=0.05, reconnect_max_delay=0.5)
        ch = await conn.channel()
        await ch.declare_queue("lc", durable=True)
        confirmed: set[int] = set()
        for i in range(1200):
            if i == 400:
                cluster.wait_leader().kill()
            await ch.publish(str(i).encode(), "lc", persistent=True)
            confirmed.add(i)
        # What the client declared came back with it: the queue is there, durable.
        declared = await ch.declare_queue("lc", durable=True, passive=True)
        assert declared.message_count >= len(confirmed)
        await conn.close()
        return confirmed, []

    confirmed, _ = asyncio.run(run())
    got = _drain(cluster.urls(), "lc")
    check_delivery(got, confirmed, set(range(1200)))


def test_follower_killed_leader_goes_on(cluster: Cluster) -> None:
    leader = cluster.wait_leader()
    follower = next(n for n in cluster.nodes if n is not leader)
    publisher = PikaPublisher(cluster.urls(leader), "fk")
    for _ in range(100):
        publisher.publish_one()
    follower.kill()
    for _ in range(300):
        publisher.publish_one()  # two of three still hold every write
    publisher.close()
    remaining = {n.name for n in cluster.nodes if n is not follower}
    cluster.wait_in_sync(remaining)
    assert cluster.leader_name() == leader.name
    follower.start()
    cluster.wait_in_sync({n.name for n in cluster.nodes})
    got = _drain(cluster.urls(), "fk")
    check_delivery(got, publisher.confirmed, set(range(publisher.next)), set())


def test_two_of_three_killed_confirms_stop_then_resume(cluster: Cluster) -> None:
    leader = cluster.wait_leader()
    followers = [n for n in cluster.nodes if n is not leader]

    async def run() -> None:
        conn = await connect([leader.url], recovery=False)
        ch = await conn.channel()
        await ch.declare_queue("two", durable=True)
        await ch.publish(b"0", "two", persistent=True)
        for node in followers:
            node.kill()
        # Safety before availability: no confirm, and no error either.
        with pytest.raises(PublishTimeout):
            await ch.publish(b"1", "two", persistent=True, timeout=4 * LEASE)
        pending = asyncio.ensure_future(ch.publish(b"2", "two", persistent=True))
        # A definition change is not acknowledged either until a follower holds it.
        admin = await connect([leader.url], recovery=False)
        admin_ch = await admin.channel()
        declaring = asyncio.ensure_future(admin_ch.declare_queue("two.new", durable=True))
        await asyncio.sleep(LEASE)
        assert not pending.done()
        assert not declaring.done()
        # One node comes back (whichever left the in-sync set last is still in it).
        back = next((n for n in followers if n.name not in cluster.in_sync()), followers[0])
        back.start()
        await asyncio.wait_for(pending, 60)  # confirmed once it caught up
        await asyncio.wait_for(declaring, 30)
        await ch.publish(b"3", "two", persistent=True)
        await conn.close()
        await admin.close()

    try:
        asyncio.run(run())
    except AssertionError:
        print(cluster.logs())
        raise
    got = _drain([leader.url], "two")
    assert got == [0, 1, 2, 3]


def test_leader_paused_longer_than_lease_confirms_nothing_after(cluster: Cluster) -> None:
    old = cluster.wait_leader()
    confirms: list[tuple[float, int]] = []  # (monotonic time, value) on the old leader
    stop = threading.Event()
    errors: list[BaseException] = []

    def publish_direct() -> None:
        try:
            conn = pika.BlockingConnection(_params([old.url]))
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare("paused", durable=True)
            i = 0
            while not stop.is_set():
                ch.basic_publish(
                    "", "paused", str(i).encode(), pika.BasicProperties(delivery_mode=2)
                )
                confirms.append((time.monotonic(), i))
                i += 1
        except Exception as exc:  # the old leader closed the connection: expected
            errors.append(exc)

    thread = threading.Thread(target=publish_direct, daemon=True)
    thread.start()
    time.sleep(0.5)
    old.signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    new = cluster.wait_leader(other_than=old.name)
    time.sleep(LEASE)
    resumed_at = time.monotonic()
    old.signal(signal.SIGCONT)
    thread.join(30)
    stop.set()
    # Whatever the old leader sent before its pause arrived long before it resumed
    # (a lease and an election later): a confirm that arrives after is one it made
    # after its lease ran out.
    assert resumed_at - stopped_at > LEASE
    late = [(t, v) for t, v in confirms if t > resumed_at]
    assert not late, f"the paused leader confirmed {len(late)} message(s) after its lease"
    assert errors, "the old leader should have closed its clients' connections"
    # It rejoins as a follower and catches up.
    cluster.wait_in_sync({n.name for n in cluster.nodes}, timeout=60)
    assert cluster.leader_name() == new.name
    got = _drain(cluster.urls(new), "paused")
    confirmed = {v for _t, v in confirms}
    check_delivery(got, confirmed, set(range(max(confirmed | set(got), default=0) + 1)))


def test_etcd_restart_and_outage(cluster_dir: str) -> None:
    c = Cluster(cluster_dir, lease=3.0)
    try:
        leader = c.wait_leader()
        c.wait_in_sync({n.name for n in c.nodes})
        term = c._get("term")
        publisher = PikaPublisher(c.urls(leader), "etcd")
        for _ in range(50):
            publisher.publish_one()
        # A quick etcd restart: the cluster goes on with the same leader.
        c.etcd.stop()
        c.etcd.start()
        for _ in range(50):
            publisher.publish_one()
        assert c.leader_name() == leader.name
        assert c._get("term") == term
        assert publisher.retried == set()
        # etcd away for longer than the lease: the leader steps down (its clients are
        # disconnected, nothing is confirmed), and a leader is back once etcd is.
        c.etcd.stop()
        time.sleep(3.0 * 1.5)
        assert "stepping down" in leader.log_text() or "lost its lease" in leader.log_text()
        c.etcd.start()
        c.wait_leader()
        for _ in range(50):
            publisher.publish_one()
        publisher.close()
        got = _drain(c.urls(), "etcd")
        check_delivery(got, publisher.confirmed, set(range(publisher.next)))
    except AssertionError:
        print(c.logs())
        raise
    finally:
        c.close()
