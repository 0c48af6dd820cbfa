"""Failures beyond a dead process: a full disk on the leader, a node removed for good,
a lost etcd, and a network partition cut by a TCP proxy."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest

from leveret.client import MessageNacked, connect
from leveret.cluster.leader import keepalive_interval
from leveret.cluster.local import NodeProcess
from leveret.cluster.wire import SILENT_INTERVALS

from .cluster_support import LEASE, Cluster, needs_etcd
from .test_failover import PikaPublisher, _connect, _drain, check_delivery

pytestmark = [needs_etcd, pytest.mark.slow]

LINK_DEAD = "the link is dead"  # what a node that drops a silent link logs


def _ctl(node, *args: str) -> subprocess.CompletedProcess[str]:  # noqa: ANN001
    return subprocess.run(
        [sys.executable, "-m", "leveret", "ctl", "--data-dir", node.data_dir, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@contextlib.contextmanager
def small_disk(path: str, size: str) -> Iterator[None]:
    """A tmpfs of `size` at `path` (skips where mounting is not allowed)."""
    os.makedirs(path, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", path], capture_output=True)


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "workers-2"])
def test_leader_with_a_full_disk_hands_over(cluster_dir: str, workers: int) -> None:
    """n0's data dir is a 24 MB tmpfs; once it leads, publishing fills it. The failed
    write makes it hand the lead over and leave the in-sync set; no confirmed message
    is lost, and the publisher carries on on the new leader. With `--workers 2` the
    write fails in the worker that owns the queue, whose tap reports it to the node's
    supervisor (cluster/workertap.py, relay.py), which hands over as one process does."""
    with small_disk(os.path.join(cluster_dir, "n0"), "24m"):
        extra = ("--disk-free-limit", "0", "--workers", str(workers))
        cluster = Cluster(cluster_dir, extra=extra)
        try:
            cluster.wait_leader()
            cluster.wait_in_sync({n.name for n in cluster.nodes})
            small = cluster.node("n0")
            leader = cluster.wait_leader()
            if leader is not small:
                out = _ctl(leader, "transfer_leadership", "n0")
                assert out.returncode == 0, out.stderr + cluster.logs()
                cluster.wait_in_sync({n.name for n in cluster.nodes})
            assert cluster.leader_name() == "n0"
            body = os.urandom(64 * 1024)
            nacked: set[int] = set()
            total = 600  # 38 MB: more than n0 holds

            async def run() -> set[int]:
                conn = await connect(cluster.urls(), reconnect_delay=0.05, reconnect_max_delay=0.5)
                ch = await conn.channel()
                await ch.declare_queue("full", durable=True)
                confirmed: set[int] = set()
                for i in range(total):
                    while True:
                        try:
                            await ch.publish(str(i).encode() + b":" + body, "full", persistent=True)
                            break
                        except MessageNacked:  # n0 could not store it: publish again
                            nacked.add(i)
                            await asyncio.sleep(0.05)
                    confirmed.add(i)
                await conn.close()
                return confirmed

            confirmed = asyncio.run(run())
            new = cluster.wait_leader(other_than="n0")
            assert "could not write its data dir" in small.log_text(), small.log_text()[-3000:]
            assert "n0" not in cluster.in_sync()
            assert nacked, "no publish failed: the disk never filled?"
            got = [int(v) for v in _drain_keys(cluster.urls(new), "full")]
            check_delivery(got, confirmed, set(range(total)))
        finally:
            cluster.close()


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "workers-2"])
def test_follower_with_a_full_disk_leaves_and_rejoins(cluster_dir: str, workers: int) -> None:
    """n2's data dir is a 24 MB tmpfs and n2 follows; publishing fills it. n2 stops
    acknowledging and leaves the in-sync set; the leader goes on confirming with the
    other follower. Once the tmpfs grows (the operator freed space), n2 catches up and
    rejoins the set, and its copy holds every confirmed message: it leads afterwards
    and serves them (with `--workers 2`, its workers start over the copy of every
    `worker-<i>/`)."""
    path = os.path.join(cluster_dir, "n2")
    with small_disk(path, "24m"):
        cluster = Cluster(cluster_dir, extra=("--workers", str(workers)))
        try:
            cluster.wait_leader()
            cluster.wait_in_sync({n.name for n in cluster.nodes})
            small = cluster.node("n2")
            leader = cluster.wait_leader()
            if leader is small:
                out = _ctl(leader, "transfer_leadership", "n0")
                assert out.returncode == 0, out.stderr + cluster.logs()
                cluster.wait_in_sync({n.name for n in cluster.nodes})
                leader = cluster.wait_leader()
            assert leader is not small
            others = {n.name for n in cluster.nodes if n is not small}
            body = os.urandom(64 * 1024)
            total = 600  # 38 MB: more than n2 holds

            async def publish(first: int, count: int) -> set[int]:
                # To the leader only: a failover would be another test. Each publish
                # must be confirmed (not nacked, not stuck) while n2 cannot keep up.
                conn = await connect([leader.url], recovery=False)
                ch = await conn.channel()
                await ch.declare_queue("fdisk", durable=True)
                confirmed: set[int] = set()
                for i in range(first, first + count):
                    await ch.publish(
                        str(i).encode() + b":" + body, "fdisk", persistent=True, timeout=60
                    )
                    confirmed.add(i)
                await conn.close()
                return confirmed

            confirmed = asyncio.run(publish(0, total))
            cluster.wait_in_sync(others, timeout=60)
            assert "No space left on device" in small.log_text(), small.log_text()[-3000:]
            assert "n2" not in cluster.in_sync()
            assert cluster.leader_name() == leader.name
            assert small.running, "a full disk is not a crash: the follower keeps running"
            confirmed |= asyncio.run(publish(total, 50))  # still confirming without n2
            # It keeps trying, each time after a longer pause (0.2, 0.4, 0.8 s, ...).
            deadline = time.monotonic() + 60
            while "retries following in 0.8 s" not in small.log_text():
                assert time.monotonic() < deadline, small.log_text()[-3000:]
                time.sleep(0.2)
            assert "could not write its copy of the data dir" in small.log_text()
            # Space comes back: n2 syncs and rejoins the in-sync set.
            grown = subprocess.run(
                ["mount", "-o", "remount,size=512m", path], capture_output=True, text=True
            )
            assert grown.returncode == 0, grown.stderr
            cluster.wait_in_sync({n.name for n in cluster.nodes}, timeout=90)
            assert cluster.leader_name() == leader.name
            # Its copy holds every confirmed message: let it lead and read them there.
            out = _ctl(leader, "transfer_leadership", small.name)
            assert out.returncode == 0, out.stderr + cluster.logs()
            assert cluster.wait_leader(other_than=leader.name).name == small.name
            got = [int(v) for v in _drain_keys(cluster.urls(small), "fdisk")]
            check_delivery(got, confirmed, set(range(total + 50)))
            assert len(got) == len(confirmed)
        except AssertionError:
            print(cluster.logs())
            raise
        finally:
            cluster.close()


def _drain_keys(urls: list[str], queue: str) -> list[str]:
    """The `N` of every `N:...` body left in `queue`."""
    conn = _connect(urls)
    ch = conn.channel()
    got = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            break
        got.append(body.split(b":", 1)[0].decode())
    conn.close()
    return got


def test_forget_cluster_node(cluster: Cluster) -> None:
    """Two of three nodes lost for good: confirms stop (safety first) until the operator
    removes them with `leveret ctl forget_cluster_node`; then the majority is of one."""
    leader = cluster.wait_leader()
    gone = [n for n in cluster.nodes if n is not leader]
    refused = _ctl(leader, "forget_cluster_node", gone[0].name)
    assert refused.returncode != 0 and f"node '{gone[0].name}' is running" in refused.stderr
    refused = _ctl(leader, "forget_cluster_node", leader.name)
    assert refused.returncode != 0 and "cannot forget itself" in refused.stderr
    refused = _ctl(leader, "forget_cluster_node", "nosuch")
    assert refused.returncode != 0 and "no node 'nosuch'" in refused.stderr

    async def run() -> None:
        conn = await connect([leader.url], recovery=False)
        ch = await conn.channel()
        await ch.declare_queue("forget", durable=True)
        await ch.publish(b"0", "forget", persistent=True)
        for node in gone:
            node.kill()
        pending = asyncio.ensure_future(ch.publish(b"1", "forget", persistent=True))
        await asyncio.sleep(3 * LEASE)
        assert not pending.done(), "confirmed with one node of three"
        for node in gone:
            deadline = time.monotonic() + 30
            while True:  # until its registration (under its lease) is gone
                out = await asyncio.to_thread(_ctl, leader, "forget_cluster_node", node.name)
                if out.returncode == 0:
                    assert f"{node.name} removed from the cluster" in out.stdout
                    break
                assert "is running" in out.stderr, out.stderr
                assert time.monotonic() < deadline, out.stderr
                await asyncio.sleep(0.5)
        await asyncio.wait_for(pending, 30)  # the majority of one node holds it
        await ch.publish(b"2", "forget", persistent=True)
        await conn.close()

    asyncio.run(run())
    status = json.loads(_ctl(leader, "--formatter", "json", "cluster_status").stdout)
    assert [n["name"] for n in status["nodes"]] == [leader.name], status
    assert cluster.in_sync() == [leader.name]
    assert _drain([leader.url], "forget") == [0, 1, 2]


def test_etcd_that_lost_its_data(cluster_dir: str) -> None:
    """etcd comes back empty: no node leads or follows on its own (a new, empty node
    must not start a cluster the others would sync to), until `force_boot` names the
    copy that wins; then every confirmed message is there."""
    cluster = Cluster(cluster_dir)
    try:
        leader = cluster.wait_leader()
        cluster.wait_in_sync({n.name for n in cluster.nodes})
        publisher = PikaPublisher(cluster.urls(), "kept")
        for _ in range(100):
            publisher.publish_one()
        publisher.close()
        cluster.etcd.stop()
        shutil.rmtree(os.path.join(cluster.etcd.directory, "etcd"))
        cluster.etcd.start()
        newcomer = NodeProcess(
            "n9", cluster.etcd.url, cluster_dir, cluster=cluster.name, lease=LEASE
        ).start()
        cluster.nodes.append(newcomer)
        time.sleep(5 * LEASE)
        assert cluster.leader_name() is None, "a node led a cluster etcd forgot\n" + cluster.logs()
        assert "did etcd lose its data?" in leader.log_text()
        refused = _ctl(newcomer, "force_boot")
        assert refused.returncode != 0 and "never belonged to cluster" in refused.stderr
        out = _ctl(leader, "force_boot")
        assert out.returncode == 0, out.stderr + cluster.logs()
        assert cluster.wait_leader().name == leader.name
        cluster.wait_in_sync({n.name for n in cluster.nodes}, timeout=60)
        again = _ctl(leader, "force_boot")
        assert again.returncode != 0 and "nothing to force" in again.stderr
        got = _drain(cluster.urls(), "kept")
        check_delivery(got, publisher.confirmed, set(range(publisher.next)), publisher.retried)
    finally:
        cluster.close()


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "workers-2"])
def test_leader_cut_off_from_etcd(cluster_dir: str, workers: int) -> None:
    """A network partition, not a pause: the leader keeps running and serving its
    clients, but its link to etcd goes silent. It stops confirming and steps down (with
    `--workers 2`: stops its workers, whose clients' connections close), a follower
    takes over, no confirmed message is lost; healed, it follows."""
    cluster = Cluster(cluster_dir, partitionable=True, extra=("--workers", str(workers)))
    try:
        old = cluster.wait_leader()
        cluster.wait_in_sync({n.name for n in cluster.nodes})
        confirmed: list[int] = []
        stop = threading.Event()
        errors: list[BaseException] = []

        def publish_direct() -> None:  # to the old leader only: no failover here
            try:
                conn = pika.BlockingConnection(pika.URLParameters(old.url))
                ch = conn.channel()
                ch.confirm_delivery()
                ch.queue_declare("cut", durable=True)
                i = 0
                while not stop.is_set():
                    ch.basic_publish(
                        "", "cut", str(i).encode(), pika.BasicProperties(delivery_mode=2)
                    )
                    confirmed.append(i)
                    i += 1
            except Exception as exc:  # the old leader closed the connection: expected
                errors.append(exc)

        thread = threading.Thread(target=publish_direct, daemon=True)
        thread.start()
        time.sleep(0.5)
        cluster.etcd_proxies[old.name].cut()
        new = cluster.wait_leader(other_than=old.name)
        thread.join(30)
        stop.set()
        assert errors, "the cut-off leader should have closed its clients' connections"
        assert "lost its lease" in old.log_text() or "stepping down" in old.log_text()
        assert old.running, "a partition is not a crash: the node keeps running"
        cluster.etcd_proxies[old.name].heal()
        cluster.wait_in_sync({n.name for n in cluster.nodes}, timeout=60)
        assert cluster.leader_name() == new.name
        got = _drain(cluster.urls(new), "cut")
        check_delivery(got, set(confirmed), set(range(max([*confirmed, *got], default=0) + 1)))
    finally:
        cluster.close()


def test_a_node_that_lost_its_disk_does_not_lead(cluster: Cluster) -> None:
    """A follower's data dir is wiped and it comes back under its old name while etcd's
    in-sync set still names it. It must not lead (the others would sync to its empty
    copy): it waits for a leader, syncs, and only then counts as in sync."""
    leader = cluster.wait_leader()
    wiped, other = [n for n in cluster.nodes if n is not leader]
    publisher = PikaPublisher(cluster.urls(leader), "disk")
    for _ in range(100):
        publisher.publish_one()
    publisher.close()
    wiped.kill()
    leader.kill()  # at once: no time to take `wiped` out of the in-sync set
    other.signal(signal.SIGSTOP)  # the only other candidate is away for now
    try:
        assert wiped.name in cluster.in_sync()
        shutil.rmtree(wiped.data_dir)
        wiped.start()
        time.sleep(6 * LEASE)
        assert cluster.leader_name() is None, "the wiped node led\n" + wiped.log_text()[-3000:]
    finally:
        other.signal(signal.SIGCONT)
    assert cluster.wait_leader().name == other.name
    leader.start()
    cluster.wait_in_sync({n.name for n in cluster.nodes}, timeout=60)
    got = _drain(cluster.urls(other), "disk")
    check_delivery(got, publisher.confirmed, set(range(publisher.next)), publisher.retried)


def test_follower_cut_from_the_leader_but_not_from_etcd(cluster_dir: str) -> None:
    """Every node advertises its replication listener behind a proxy of its own
    (--cluster-advertise); one follower's link through the leader's proxy goes silent
    while it still reaches etcd. The leader takes it out of the in-sync set after the
    lag timeout and confirms with the other follower; healed, it catches up, rejoins,
    and its copy holds every confirmed message (it leads, and serves them)."""
    cluster = Cluster(cluster_dir, replication_proxies=True)
    try:
        leader = cluster.wait_leader()
        cluster.wait_in_sync({n.name for n in cluster.nodes})
        cut, other = [n for n in cluster.nodes if n is not leader]
        assert f"reached at 127.0.0.1:{cluster.replication_proxies[leader.name].port}" in (
            leader.log_text()
        )
        publisher = PikaPublisher(cluster.urls(leader), "cutlink")
        for _ in range(100):
            publisher.publish_one()
        cluster.replication_proxies[leader.name].cut_node(cut.name)
        for _ in range(300):
            publisher.publish_one()  # confirmed: the leader and `other` hold them
        cluster.wait_in_sync({leader.name, other.name})
        assert cluster.leader_name() == leader.name
        assert cut.running
        assert cluster._get(f"nodes/{cut.name}") is not None, "cut from etcd too?"
        for _ in range(100):
            publisher.publish_one()
        cluster.replication_proxies[leader.name].heal_node(cut.name)
        cluster.wait_in_sync({n.name for n in cluster.nodes}, timeout=60)
        assert cluster.leader_name() == leader.name
        assert publisher.retried == set(), "a publish failed: the leader was not to change"
        publisher.close()
        out = _ctl(leader, "transfer_leadership", cut.name)
        assert out.returncode == 0, out.stderr + cluster.logs()
        assert cluster.wait_leader(other_than=leader.name).name == cut.name
        got = _drain(cluster.urls(cut), "cutlink")
        check_delivery(got, publisher.confirmed, set(range(publisher.next)), set())
        assert len(got) == publisher.next
    except AssertionError:
        print(cluster.logs())
        raise
    finally:
        cluster.close()


def _wait_log(node: NodeProcess, text: str, count: int, cluster: Cluster, timeout: float = 60):  # noqa: ANN202
    """Until `node`'s log holds `text` `count` times; returns the last line holding it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [line for line in node.log_text().splitlines() if text in line]
        if len(lines) >= count:
            return lines[-1]
        time.sleep(0.1)
    raise AssertionError(f"{node.name} did not log {text!r} {count} time(s)\n{cluster.logs()}")


def _cut_until_noticed(
    cluster: Cluster, node: NodeProcess, text: str, cut: Callable[[], None], what: str
) -> str:
    """Cut, then wait for `node` to log `text` once more; prints how long after the cut
    (a figure for the docs, not an assertion: the machine is shared)."""
    import datetime

    seen = node.log_text().count(text)
    cut_at = time.time()
    cut()
    line = _wait_log(node, text, seen + 1, cluster)
    logged = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    print(f"cut ({what}) noticed after {logged - cut_at:.2f} s: {line[24:]}")
    return line


@contextlib.contextmanager
def _publishing_throughout(publisher: PikaPublisher, cluster: Cluster) -> Iterator[Any]:
    """`publisher` publishes (confirmed, one at a time) in a thread until the block
    ends; the block gets `confirmed_more()`, which waits for 20 more confirms."""
    stop = threading.Event()

    def publish() -> None:
        while not stop.is_set():
            publisher.publish_one()

    def confirmed_more(n: int = 20) -> None:
        want = len(publisher.confirmed) + n
        deadline = time.monotonic() + 30
        while len(publisher.confirmed) < want:
            assert thread.is_alive() and time.monotonic() < deadline, cluster.logs()
            time.sleep(0.05)

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    try:
        yield confirmed_more
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive()


def _rejoined_with_everything(
    cluster: Cluster, leader: NodeProcess, cut: NodeProcess, publisher: PikaPublisher
) -> None:
    """Healed, `cut` is in sync again under the same leader, no publish ever failed, and
    its copy holds every confirmed message: it leads, and serves them."""
    cluster.wait_in_sync({n.name for n in cluster.nodes}, timeout=60)
    assert cluster.leader_name() == leader.name
    assert publisher.retried == set(), "a publish failed: the leader was not to change"
    publisher.close()
    out = _ctl(leader, "transfer_leadership", cut.name)
    assert out.returncode == 0, out.stderr + cluster.logs()
    assert cluster.wait_leader(other_than=leader.name).name == cut.name
    got = _drain(cluster.urls(cut), publisher.queue)
    check_delivery(got, publisher.confirmed, set(range(publisher.next)), set())
    assert len(got) == publisher.next


def test_follower_that_hears_nothing_from_the_leader_drops_the_link(cluster_dir: str) -> None:
    """An asymmetric partition: the leader's side of one follower's replication link
    goes silent (its advertised proxy drops leader → follower bytes) while the
    follower's own frames, acknowledgements included, still reach the leader, and
    TCP never gives up on the connection. The leader's keepalives let the follower tell
    this from an idle leader: an idle healthy cluster keeps every link for several
    bounds, and a follower cut this way (idle, then under confirmed publishing) logs
    why, drops the link and connects again; the leader confirms with the other
    follower throughout; healed, the follower rejoins the in-sync set, and its copy
    holds every confirmed message (it leads, and serves them)."""
    cluster = Cluster(cluster_dir, replication_proxies=True)
    interval = keepalive_interval(LEASE)
    try:
        leader = cluster.wait_leader()
        everyone = {n.name for n in cluster.nodes}
        cluster.wait_in_sync(everyone)
        cut, other = [n for n in cluster.nodes if n is not leader]
        proxy = cluster.replication_proxies[leader.name]
        publisher = PikaPublisher(cluster.urls(leader), "oneway")
        for _ in range(100):
            publisher.publish_one()
        cluster.wait_in_sync(everyone)

        # Idle and healthy: nothing but keepalives on the links, for three bounds.
        def drops() -> list[int]:
            return [
                leader.log_text().count("disconnected"),
                *(n.log_text().count(LINK_DEAD) for n in cluster.nodes),
            ]

        before = drops()
        time.sleep(3 * SILENT_INTERVALS * interval)
        assert drops() == before, cluster.logs()
        assert set(cluster.in_sync()) == everyone

        # Idle, cut one way: only the keepalives' absence tells the follower.
        line = _cut_until_noticed(
            cluster, cut, LINK_DEAD, lambda: proxy.cut_node(cut.name, "to_node"), "idle"
        )
        assert f"{SILENT_INTERVALS} keepalive intervals of {interval:g} s" in line, line
        cluster.wait_in_sync({leader.name, other.name})
        proxy.heal_node(cut.name)
        cluster.wait_in_sync(everyone, timeout=60)

        # Cut one way again, under confirmed publishing that never stops.
        with _publishing_throughout(publisher, cluster) as confirmed_more:
            confirmed_more()
            _cut_until_noticed(
                cluster, cut, LINK_DEAD, lambda: proxy.cut_node(cut.name, "to_node"), "busy"
            )
            confirmed_more()
            cluster.wait_in_sync({leader.name, other.name}, caught_up=False)
            confirmed_more()
            assert cut.running and cluster.leader_name() == leader.name
            assert cluster._get(f"nodes/{cut.name}") is not None, "cut from etcd too?"
            proxy.heal_node(cut.name)
            cluster.wait_in_sync(everyone, timeout=60, caught_up=False)
            confirmed_more()
        _rejoined_with_everything(cluster, leader, cut, publisher)
    except AssertionError:
        print(cluster.logs())
        raise
    finally:
        cluster.close()


def test_leader_that_hears_nothing_from_a_follower_drops_the_link(cluster_dir: str) -> None:
    """The other asymmetric partition: the follower's side of its replication link goes
    silent (its acknowledgements and keepalives lost) while the leader's frames still
    reach it. The leader takes it out of the in-sync set at the lag timeout and
    confirms with the other follower throughout; with the follower's keepalives gone
    too it logs why and drops the link (rather than streaming to a follower it cannot
    hear until TCP gives up); healed, the follower rejoins with every confirmed
    message."""
    cluster = Cluster(cluster_dir, replication_proxies=True)
    try:
        leader = cluster.wait_leader()
        everyone = {n.name for n in cluster.nodes}
        cluster.wait_in_sync(everyone)
        cut, other = [n for n in cluster.nodes if n is not leader]
        proxy = cluster.replication_proxies[leader.name]
        publisher = PikaPublisher(cluster.urls(leader), "oneway-back")
        with _publishing_throughout(publisher, cluster) as confirmed_more:
            confirmed_more()
            line = _cut_until_noticed(
                cluster,
                leader,
                f"nothing from follower {cut.name}",
                lambda: proxy.cut_node(cut.name, "from_node"),
                "follower to leader",
            )
            assert "the link is dead; dropping it" in line, line
            confirmed_more()
            cluster.wait_in_sync({leader.name, other.name}, caught_up=False)
            confirmed_more()
            proxy.heal_node(cut.name)
            cluster.wait_in_sync(everyone, timeout=60, caught_up=False)
            confirmed_more()
        _rejoined_with_everything(cluster, leader, cut, publisher)
    except AssertionError:
        print(cluster.logs())
        raise
    finally:
        cluster.close()
