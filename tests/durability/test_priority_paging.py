"""Priority queues page like plain ones: past --queue-ram-messages each priority level
keeps its newest messages as disk positions, and the store keeps each level as a queue
of its own. Delivery stays by priority, first in first out within one, after a clean
restart (the clean-shutdown index) and after SIGKILL (the scan). Real broker process,
pika, the management API."""

from __future__ import annotations

import sqlite3

import pika
import pytest
from durability_support import (
    Brokers,
    close_quietly,
    message_count,
    queue_info,
    start_paging_broker,
    store_dirs,
)

from leveret.store.definitions import encode_arguments

pytestmark = [pytest.mark.leveret_only]

RAM = 50  # --queue-ram-messages
MAX = 5  # x-max-priority


@pytest.fixture
def brokers(tmp_path):
    with Brokers(tmp_path) as b:
        yield b


def _start(brokers, name: str, data_dir=None):
    return start_paging_broker(brokers, name, RAM, data_dir)


def _priority(i: int) -> int:
    """A spread of priorities, some above x-max-priority (they count as MAX) and
    some without one (0)."""
    return (i * 7) % 9 if i % 11 else -1


def _publish(ch, queue: str, count: int, tag: str = "m") -> None:
    ch.confirm_delivery()
    for i in range(count):
        p = _priority(i)
        props = pika.BasicProperties(delivery_mode=2, priority=None if p < 0 else p)
        ch.basic_publish("", queue, f"{tag}{i}".encode(), props)


def _expected(count: int, tag: str = "m") -> list[str]:
    """Delivery order: highest level first, publish order within a level."""
    level = [min(max(_priority(i), 0), MAX) for i in range(count)]
    return [f"{tag}{i}" for i in sorted(range(count), key=lambda i: (-level[i], i))]


def _drain(ch, queue: str) -> list[tuple[str, bool]]:
    out = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append((body.decode(), method.redelivered))


@pytest.mark.parametrize("restart", ["none", "sigterm", "sigkill"])
def test_long_priority_queue_pages_and_keeps_its_order(brokers, restart):
    count = 2000
    broker = _start(brokers, f"prio-{restart}")
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare("prio", durable=True, arguments={"x-max-priority": MAX})
    _publish(ch, "prio", count)
    info = queue_info(broker, "prio")
    assert info["messages"] == count
    # All but the head are positions only, spread over the levels.
    assert info["messages_paged_out"] >= count - RAM
    assert info["messages_ram"] <= RAM
    expected = _expected(count)
    # Take 30 from the top and give 10 of them back: they return to their places.
    ch.basic_qos(prefetch_count=30)
    taken = []
    for method, _props, body in ch.consume("prio", inactivity_timeout=10):
        assert method is not None
        taken.append((method.delivery_tag, body.decode()))
        if len(taken) == 30:
            break
    ch.cancel()
    assert [b for _t, b in taken] == expected[:30]
    for tag, _body in taken[:20]:
        ch.basic_ack(tag)
    for tag, _body in taken[20:]:
        ch.basic_nack(tag, requeue=True)
    # ACKs are written after their replies: a confirmed publish behind them (the log
    # keeps order; the channel is in confirm mode) puts them on disk before a SIGKILL.
    ch.queue_declare("fence", durable=True)
    ch.basic_publish("", "fence", b"fence", pika.BasicProperties(delivery_mode=2))
    close_quietly(conn)
    if restart == "sigterm":
        broker.restart()
    elif restart == "sigkill":
        broker.kill()
        broker.start()
    conn = broker.connect()
    ch = conn.channel()
    assert message_count(ch, "prio") == count - 20
    got = _drain(ch, "prio")
    assert [b for b, _r in got] == expected[20:]
    assert [b for b, r in got if r] == expected[20:30]
    close_quietly(conn)


def test_new_messages_after_a_restart_join_their_levels_behind_the_recovered(brokers):
    count = 600
    broker = _start(brokers, "prio-more")
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare("prio", durable=True, arguments={"x-max-priority": MAX})
    _publish(ch, "prio", count, "a")
    close_quietly(conn)
    broker.kill()
    broker.start()
    conn = broker.connect()
    ch = conn.channel()
    _publish(ch, "prio", count, "b")
    got = [b for b, _r in _drain(ch, "prio")]
    level = {f"{t}{i}": min(max(_priority(i), 0), MAX) for t in "ab" for i in range(count)}
    # By level, highest first; within a level every "a" (older) before every "b".
    want = sorted(level, key=lambda b: (-level[b], b[0], int(b[1:])))
    assert got == want
    close_quietly(conn)


def test_purge_and_delete_of_a_paged_priority_queue_stay_done_after_restart(brokers):
    count = 800
    broker = _start(brokers, "prio-purge")
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare("prio.purged", durable=True, arguments={"x-max-priority": MAX})
    ch.queue_declare("prio.deleted", durable=True, arguments={"x-max-priority": MAX})
    _publish(ch, "prio.purged", count)
    _publish(ch, "prio.deleted", count)
    assert ch.queue_purge("prio.purged").method.message_count == count
    ch.queue_delete("prio.deleted")
    ch.queue_declare("prio.deleted", durable=True, arguments={"x-max-priority": MAX})
    _publish(ch, "prio.purged", 3, "after")
    close_quietly(conn)
    broker.kill()
    broker.start()
    conn = broker.connect()
    ch = conn.channel()
    assert message_count(ch, "prio.deleted") == 0
    assert [b for b, _r in _drain(ch, "prio.purged")] == _expected(3, "after")
    close_quietly(conn)


def test_priority_ttl_and_dead_lettering_still_apply_when_paged(brokers):
    """Messages of a paged priority queue still expire and dead-letter."""
    count = 500
    broker = _start(brokers, "prio-ttl")
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare("prio.dead", durable=True)
    arguments = {
        "x-max-priority": MAX,
        "x-message-ttl": 300,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "prio.dead",
    }
    ch.queue_declare("prio.ttl", durable=True, arguments=arguments)
    _publish(ch, "prio.ttl", count)
    assert queue_info(broker, "prio.ttl")["messages_paged_out"] > 0
    deadline_count = 0
    for _ in range(200):  # bounded wait for the expiry; nothing about timing is asserted
        deadline_count = message_count(ch, "prio.dead")
        if deadline_count == count:
            break
        conn.sleep(0.05)
    assert deadline_count == count
    assert message_count(ch, "prio.ttl") == 0
    assert sorted(b for b, _r in _drain(ch, "prio.dead")) == sorted(f"m{i}" for i in range(count))
    close_quietly(conn)


def test_priority_queue_data_of_an_older_build_is_read_whole(brokers, tmp_path):
    """Before levels were kept apart, a priority queue's records were stored under the
    queue's own key, every level mixed. Such records are read back as objects and
    join their levels; new messages page into the levels behind them."""
    data_dir = tmp_path / "older"
    broker = _start(brokers, "prio-old", data_dir=data_dir)
    conn = broker.connect()
    ch = conn.channel()
    # A plain durable queue's records are stored under the queue's own key, as a
    # priority queue's were; declared again with priorities on the same data, they
    # are what an older build would have left.
    ch.queue_declare("prio.old", durable=True)
    for i in range(100):
        p = _priority(i)
        ch.basic_publish(
            "",
            "prio.old",
            f"o{i}".encode(),
            pika.BasicProperties(delivery_mode=2, priority=None if p < 0 else p),
        )
    close_quietly(conn)
    broker.stop()
    for store in store_dirs(data_dir):  # every worker's catalog holds every queue
        db = sqlite3.connect(store / "definitions.db")
        db.execute(
            "UPDATE queues SET arguments = ? WHERE name = 'prio.old'",
            (encode_arguments({"x-max-priority": MAX}),),
        )
        db.commit()
        db.close()
    broker.start()
    conn = broker.connect()
    ch = conn.channel()
    _publish(ch, "prio.old", 200, "n")
    got = [b for b, _r in _drain(ch, "prio.old")]
    level = {f"o{i}": min(max(_priority(i), 0), MAX) for i in range(100)}
    level.update({f"n{i}": min(max(_priority(i), 0), MAX) for i in range(200)})
    want = sorted(level, key=lambda b: (-level[b], b[0] != "o", int(b[1:])))
    assert got == want
    close_quietly(conn)
