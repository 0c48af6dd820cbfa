"""Streams across a failover: every node holds the same log, so offsets stay the same."""

from __future__ import annotations

import signal
import time

import pika
import pytest

from .cluster_support import LEASE, Cluster, needs_etcd
from .test_failover import PikaPublisher, _connect

pytestmark = [needs_etcd, pytest.mark.slow]


def _read_stream(urls: list[str], queue: str, want: set[int]) -> list[tuple[int, int]]:
    """Everything from the first offset, until `want` is all there and nothing more comes."""
    conn = _connect(urls)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=500)
    got: list[tuple[int, int]] = []

    def on_message(channel, method, props, body):  # noqa: ANN001
        got.append((props.headers["x-stream-offset"], int(body)))
        channel.basic_ack(method.delivery_tag)

    ch.basic_consume(queue, on_message, arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + 30
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        count = len(got)
        conn.process_data_events(0.05)
        if len(got) != count:
            quiet_since = time.monotonic()
        elif want <= {v for _, v in got} and time.monotonic() - quiet_since > 0.5:
            break
    conn.close()
    return got


def test_stream_offsets_survive_leader_sigkill(cluster: Cluster) -> None:
    publisher = PikaPublisher(cluster.urls(), "events", {"x-queue-type": "stream"})
    for _ in range(300):
        publisher.publish_one()
    before = _read_stream(cluster.urls(), "events", set(range(300)))
    old = cluster.wait_leader()
    old.kill()
    for _ in range(300):
        publisher.publish_one()
    cluster.wait_leader(other_than=old.name)
    publisher.close()
    got = _read_stream(cluster.urls(), "events", publisher.confirmed)
    offsets = [o for o, _ in got]
    assert offsets == list(range(len(got))), "stream offsets are not 0, 1, 2, ... after failover"
    assert got[:300] == before, "the new leader's log does not start as the old one's did"
    values = [v for _, v in got]
    assert publisher.confirmed <= set(values), "a confirmed stream message was lost"
    seen: set[int] = set()
    for value in values:
        assert value not in seen or value in publisher.retried, f"duplicate of confirmed {value}"
        seen.add(value)


def test_stream_delivers_only_what_the_followers_hold(cluster: Cluster) -> None:
    """A record the followers do not hold yet (a failover could take it back, and give
    its offset to another message) is not delivered, nor counted by the tail offsets;
    it is once they hold it."""
    leader = cluster.wait_leader()
    followers = [n for n in cluster.nodes if n is not leader]
    publisher = PikaPublisher([leader.url], "held", {"x-queue-type": "stream"})
    for _ in range(5):
        publisher.publish_one()
    for node in followers:
        node.signal(signal.SIGSTOP)
    try:
        conn = pika.BlockingConnection(pika.URLParameters(leader.url))
        ch = conn.channel()
        for value in range(5, 10):  # no confirms: they are written on the leader only
            ch.basic_publish("", "held", str(value).encode(), pika.BasicProperties(delivery_mode=2))
        ch.basic_qos(prefetch_count=100)
        got: list[tuple[int, int]] = []

        def on_message(channel, method, props, body):  # noqa: ANN001
            got.append((props.headers["x-stream-offset"], int(body)))
            channel.basic_ack(method.delivery_tag)

        ch.basic_consume("held", on_message, arguments={"x-stream-offset": "first"})
        end = time.monotonic() + 2 * LEASE
        while time.monotonic() < end:
            conn.process_data_events(0.1)
        assert got == [(i, i) for i in range(5)], "a record the followers lack was delivered"
    finally:
        for node in followers:
            node.signal(signal.SIGCONT)
    deadline = time.monotonic() + 30
    while len(got) < 10 and time.monotonic() < deadline:
        conn.process_data_events(0.1)
    conn.close()
    publisher.close()
    assert got == [(i, i) for i in range(10)], "held records not delivered once replicated"
