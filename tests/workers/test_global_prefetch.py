"""basic.qos global=true across workers: a channel's window bounds its unacked
deliveries across all its consumers, also when their queues are on other workers
(the channel's worker grants the owners credit from what is left of the window).
"""

from __future__ import annotations

import time
from typing import Any

import pika
import pytest

from workers.inprocess import in_process_workers
from workers.placing import place


@pytest.fixture
def workers():
    with in_process_workers(2) as w:
        yield w


def settle(conn: pika.BlockingConnection, seconds: float = 0.5) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        conn.process_data_events(0.02)


def wait(conn: pika.BlockingConnection, done: Any, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        conn.process_data_events(0.02)
    return bool(done())


@pytest.mark.parametrize("owners", [(0, 1), (1, 1)], ids=["local-and-remote", "both-remote"])
def test_global_window_spans_workers(workers, owners: tuple[int, int]) -> None:
    w = workers
    names = [place(w, owner, f"gq{i}") for i, owner in enumerate(owners)]
    conn = pika.BlockingConnection(pika.URLParameters(w.url(0)))
    try:
        ch = conn.channel()
        for name in names:
            for i in range(5):
                ch.basic_publish("", name, str(i).encode())
        ch.basic_qos(prefetch_count=3, global_qos=True)
        got: list[Any] = []
        for name in names:
            ch.basic_consume(name, lambda c, m, p, b: got.append(m))
        assert wait(conn, lambda: len(got) >= 3)
        settle(conn)
        assert len(got) == 3
        ch.basic_ack(max(m.delivery_tag for m in got), multiple=True)
        assert wait(conn, lambda: len(got) >= 6)
        settle(conn)
        assert len(got) == 6
        # one at a time: each ack frees one place in the window
        for expected in range(7, 11):
            ch.basic_ack(got[expected - 4].delivery_tag)
            assert wait(conn, lambda n=expected: len(got) >= n)
            settle(conn, 0.2)
            assert len(got) == expected
        # everything acked: the rest of the ten messages arrive
        ch.basic_ack(0, multiple=True)
        assert wait(conn, lambda: len(got) == 10)
    finally:
        conn.close()


def test_per_consumer_prefetch_still_applies_with_a_global_window(workers) -> None:
    w = workers
    name = place(w, 1, "pq")
    conn = pika.BlockingConnection(pika.URLParameters(w.url(0)))
    try:
        ch = conn.channel()
        for i in range(10):
            ch.basic_publish("", name, str(i).encode())
        ch.basic_qos(prefetch_count=2)
        ch.basic_qos(prefetch_count=5, global_qos=True)
        got: list[Any] = []
        ch.basic_consume(name, lambda c, m, p, b: got.append(m))
        assert wait(conn, lambda: len(got) >= 2)
        settle(conn)
        assert len(got) == 2
    finally:
        conn.close()
