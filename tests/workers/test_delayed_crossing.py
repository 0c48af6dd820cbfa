"""A delayed exchange whose due messages go to a queue another worker owns.

The worker that holds a delayed message fires nothing while its link to another
worker is down (such a publish would be dropped), and keeps the message's record
until the owner confirmed it. Real clients (pika) against an in-process broker of
two workers with persistence (tests/workers/inprocess.py); the link is cut and
joined again as a restarted worker's would be.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pika

from leveret.workers.mesh import socket_pair
from workers.inprocess import InProcessWorkers, in_process_workers
from workers.placing import owned, place


def wait_for(what: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = what()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.01)


def held(w: InProcessWorkers, index: int, exchange: str) -> int:
    """How many messages worker `index`'s delayed exchange still holds."""
    return w.call(lambda: len(w.nodes[index].broker.vhosts["/"].exchanges[exchange].router.pending))


def ready(w: InProcessWorkers, owner: int, name: str) -> int:
    return w.call(lambda: owned(w, owner, name).message_count)


def delayed_exchange_into_worker_1(
    w: InProcessWorkers,
) -> tuple[pika.BlockingConnection, Any, str]:
    """A connection to worker 0 with confirms on, the durable x-delayed-message exchange
    `wk-delayed-x` (direct) and a durable queue worker 1 owns, bound to it with `k`:
    (connection, channel, queue)."""
    conn = pika.BlockingConnection(pika.URLParameters(w.url(0)))
    ch = conn.channel()
    ch.exchange_declare(
        "wk-delayed-x",
        "x-delayed-message",
        durable=True,
        arguments={"x-delayed-type": "direct"},
    )
    queue = place(w, 1, "wk-delayed-q", durable=True, bind=("wk-delayed-x", "k"))
    ch.confirm_delivery()
    return conn, ch, queue


def publish_delayed(ch: Any, count: int) -> None:
    """`count` persistent messages d0, d1, ... to `wk-delayed-x` with key `k`, each
    due in 50 ms (confirmed one by one: the channel has confirms on)."""
    props = pika.BasicProperties(delivery_mode=2, headers={"x-delay": 50})
    for i in range(count):
        ch.basic_publish("wk-delayed-x", "k", f"d{i}".encode(), props)


def relink(w: InProcessWorkers, a: int, b: int) -> None:
    """Join workers a and b with a new link, as for a worker that restarted."""

    async def go() -> None:
        sa, sb = socket_pair()
        await w.meshes[a].connect(b, sa)
        await w.meshes[b].connect(a, sb)

    w.run(go())


def test_due_messages_wait_for_the_owners_link_and_arrive_once_it_is_up(
    tmp_path: Path,
) -> None:
    with in_process_workers(2, tmp_path) as w:
        conn, ch, queue = delayed_exchange_into_worker_1(w)

        w.call(w.meshes[0].links[1].close)
        assert wait_for(lambda: w.call(lambda: not w.meshes[0].peers))
        publish_delayed(ch, 20)
        time.sleep(0.5)  # well past the due time: nothing may have been fired into the void
        assert held(w, 0, "wk-delayed-x") == 20

        relink(w, 0, 1)
        assert wait_for(lambda: ready(w, 1, queue) == 20), ready(w, 1, queue)
        # The records go once the owner confirmed.
        assert wait_for(lambda: held(w, 0, "wk-delayed-x") == 0)
        bodies = []
        for _ in range(20):
            _method, _props, body = ch.basic_get(queue, auto_ack=True)
            bodies.append(body)
        assert sorted(bodies) == sorted(f"d{i}".encode() for i in range(20))
        conn.close()


def kept(w: InProcessWorkers, index: int, exchange: str) -> int:
    """How many taken records worker `index`'s store keeps for a later ack."""

    def count() -> int:
        store = w.nodes[index].broker.vhosts["/"].exchanges[exchange].router.pending.store
        return sum(len(k) for k in store.messages.delays._kept.values())

    return w.call(count)


def test_a_fired_message_counts_and_keeps_its_record_until_the_owner_confirms(
    tmp_path: Path,
) -> None:
    """Fired into another worker's queue, a message is not gone from the exchange
    until the owner's confirm: it counts in messages_delayed, and its record is kept
    (compaction leaves it, a clean stop puts it back). A link lost meanwhile routes
    it again once the link is back."""
    with in_process_workers(2, tmp_path) as w:
        conn, ch, queue = delayed_exchange_into_worker_1(w)

        w.call(w.meshes[1].links[0].pause_reading)  # the owner reads none of it yet
        publish_delayed(ch, 20)
        assert wait_for(lambda: kept(w, 0, "wk-delayed-x") == 20)  # fired, not confirmed
        assert held(w, 0, "wk-delayed-x") == 20
        assert ready(w, 1, queue) == 0

        w.call(w.meshes[0].links[1].close)  # lost before the owner confirmed
        assert wait_for(lambda: w.call(lambda: not w.meshes[0].peers))
        assert held(w, 0, "wk-delayed-x") == 20 and kept(w, 0, "wk-delayed-x") == 20
        relink(w, 0, 1)
        assert wait_for(lambda: held(w, 0, "wk-delayed-x") == 0)
        assert kept(w, 0, "wk-delayed-x") == 0
        bodies = set()
        while True:
            method, _props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                break
            bodies.add(body)
        assert bodies == {f"d{i}".encode() for i in range(20)}
        conn.close()
