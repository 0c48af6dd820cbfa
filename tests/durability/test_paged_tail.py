"""Long queues keep their tail as disk locations only.

Each broker here runs with a small `--queue-ram-messages`, so a few hundred
messages are enough to put most of a queue in its paged tail. The tests check
that everything that works on a short queue still works across the boundary:
order, bodies, requeue to the original place, restart, purge, per-message TTL,
length limits added by a policy, and dead-lettering. Memory is checked from
/proc (no timing is asserted).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pika
import pytest
from durability_support import (
    PERSISTENT,
    TRANSIENT,
    Brokers,
    assert_exit_ok,
    check_body,
    close_quietly,
    drain_queue,
    fast_publish,
    make_body,
    message_count,
    queue_info,
    rss_kb,
    start_paging_broker,
)

pytestmark = [pytest.mark.leveret_only]

RAM = 50  # --queue-ram-messages for these brokers


@pytest.fixture
def brokers(tmp_path):
    with Brokers(tmp_path) as b:
        yield b


def _start(brokers, name="tail", ram=RAM, data_dir=None, extra=()):
    return brokers.start(data_dir, name=name, extra=("--queue-ram-messages", str(ram), *extra))


def _publish(ch, queue, tags, props):
    ch.confirm_delivery()
    for tag in tags:
        ch.basic_publish("", queue, make_body(tag, 300), props)


def _tags(rows):
    return [check_body(body) for body, _redelivered, _props in rows]


@pytest.mark.parametrize("props", [PERSISTENT, TRANSIENT], ids=["persistent", "transient"])
def test_order_and_bodies_across_the_tail(brokers, props):
    broker = _start(brokers)
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare("long", durable=True)
    tags = [str(i) for i in range(1000)]
    _publish(ch, "long", tags, props)
    assert message_count(ch, "long") == 1000
    # basic.get for the first few, then a consumer for the rest: both read the tail.
    got = []
    for _ in range(10):
        _m, _p, body = ch.basic_get("long", auto_ack=True)
        got.append(check_body(body))
    got += _tags(drain_queue(ch, "long"))
    assert got == tags
    assert message_count(ch, "long") == 0
    close_quietly(conn)
    assert broker.stop() == 0


def test_requeue_goes_back_to_the_original_place(brokers):
    broker = _start(brokers)
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare("rq", durable=True)
    tags = [str(i) for i in range(400)]
    _publish(ch, "rq", tags, PERSISTENT)
    # Take 120 (beyond the RAM head, so some came from the tail), requeue every
    # third one, ack the rest; then the requeued ones must come first, in order.
    ch.basic_qos(prefetch_count=120)
    taken = []
    for method, _props, body in ch.consume("rq", inactivity_timeout=5):
        assert method is not None, "deliveries stopped early"
        taken.append((method.delivery_tag, check_body(body)))
        if len(taken) == 120:
            break
    ch.cancel()
    requeued = []
    for i, (tag, name) in enumerate(taken):
        if i % 3 == 0:
            ch.basic_nack(tag, requeue=True)
            requeued.append(name)
        else:
            ch.basic_ack(tag)
    rows = drain_queue(ch, "rq")
    assert _tags(rows) == requeued + tags[120:]
    assert [r for _b, r, _p in rows[: len(requeued)]] == [True] * len(requeued)
    assert not any(r for _b, r, _p in rows[len(requeued) :])
    close_quietly(conn)


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_restart_reads_no_message_until_consumers_reach_it(brokers, how):
    broker = start_paging_broker(brokers, f"restart-{how}", RAM)
    conn = broker.connect()
    conn.channel().queue_declare("kept", durable=True)
    close_quietly(conn)
    tags = [str(i) for i in range(3000)]
    published = fast_publish(
        broker.port, "kept", (make_body(t, 200) for t in tags), persistent=True
    )
    assert published == len(tags)
    conn = broker.connect()
    ch = conn.channel()
    # Deliver (and requeue) the first five, so they come back redelivered.
    ch.basic_qos(prefetch_count=5)
    for method, _props, _body in ch.consume("kept", inactivity_timeout=5):
        if method.delivery_tag == 5:
            break
    close_quietly(conn)
    if how == "sigterm":
        assert_exit_ok(broker)
    else:
        time.sleep(0.5)  # the DELIVERED records reach the disk (fsync batch)
        broker.kill()
    broker.start()
    conn = broker.connect()
    ch = conn.channel()
    assert message_count(ch, "kept") == 3000  # correct before anything is read back
    # All of it is the paged tail: a restart reads no message (with many long
    # queues, reading each one's head made the restart wait on the queue count).
    assert queue_info(broker, "kept")["messages_paged_out"] == 3000
    rows = drain_queue(ch, "kept")
    assert _tags(rows) == tags
    redelivered = [r for _b, r, _p in rows]
    if how == "sigterm":
        assert redelivered[:5] == [True] * 5
    assert not any(redelivered[5:])
    close_quietly(conn)
    assert "recovered 3000 messages" in broker.log()


def test_purge_and_delete_of_a_paged_queue(brokers):
    broker = _start(brokers)
    conn = broker.connect()
    ch = conn.channel()
    for q in ("p", "d"):
        ch.queue_declare(q, durable=True)
        _publish(ch, q, [str(i) for i in range(500)], PERSISTENT)
    assert ch.queue_purge("p").method.message_count == 500
    assert ch.queue_delete("d").method.message_count == 500
    ch.queue_declare("d", durable=True)
    _publish(ch, "p", ["after"], PERSISTENT)
    close_quietly(conn)
    assert_exit_ok(broker)
    broker.start()
    conn = broker.connect()
    ch = conn.channel()
    # Nothing purged or deleted comes back after the restart.
    assert _tags(drain_queue(ch, "p")) == ["after"]
    assert message_count(ch, "d") == 0
    close_quietly(conn)


def test_per_message_ttl_inside_the_tail(brokers):
    broker = _start(brokers)
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare("ttl", durable=True)
    ch.confirm_delivery()
    expected = []
    for i in range(300):
        if i % 10 == 5:  # a few expire while they wait in the tail
            props = pika.BasicProperties(delivery_mode=2, expiration="200")
        else:
            props = PERSISTENT
            expected.append(str(i))
        ch.basic_publish("", "ttl", make_body(str(i), 100), props)
    time.sleep(0.5)
    assert _tags(drain_queue(ch, "ttl", limit=len(expected))) == expected
    assert message_count(ch, "ttl") == 0
    close_quietly(conn)


def test_dead_lettering_from_the_tail(brokers):
    broker = _start(brokers)
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare("dlq", durable=True)
    ch.queue_declare(
        "src",
        durable=True,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"},
    )
    tags = [str(i) for i in range(200)]
    _publish(ch, "src", tags, PERSISTENT)
    for tag in tags:
        method, _props, body = ch.basic_get("src")
        assert check_body(body) == tag
        ch.basic_reject(method.delivery_tag, requeue=False)
    assert _tags(drain_queue(ch, "dlq")) == tags
    close_quietly(conn)


def test_a_length_limit_policy_on_a_paged_queue(brokers):
    broker = _start(brokers)
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare("lim", durable=True)
    tags = [str(i) for i in range(400)]
    _publish(ch, "lim", tags, PERSISTENT)
    close_quietly(conn)
    # A policy makes it a max-length queue: the oldest go, from the head and tail.
    _ctl(broker, "set_policy", "cap", "^lim$", json.dumps({"max-length": 100}))
    conn = broker.connect()
    ch = conn.channel()
    assert message_count(ch, "lim") == 100
    _publish(ch, "lim", ["new"], PERSISTENT)
    assert _tags(drain_queue(ch, "lim")) == tags[301:] + ["new"]
    close_quietly(conn)


def _ctl(broker, *args):
    out = subprocess.run(
        [sys.executable, "-m", "leveret", "ctl", "--data-dir", str(broker.data_dir), *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr


@pytest.mark.slow
def test_ram_per_paged_message(brokers):
    """x 1 KB transient messages into a durable queue, no consumer: once the queue
    pages, each further message costs a few hundred bytes of RAM, not its body.
    Measured as the RSS added by the second 100,000 (the first pays for the head
    and the broker's buffers)."""
    broker = _start(brokers, name="rss", ram=8192)
    conn = broker.connect()
    conn.channel().queue_declare("big", durable=True)
    close_quietly(conn)
    step = 100_000
    rss = []
    for k in range(2):
        bodies = (make_body(str(k * step + i), 1024) for i in range(step))
        assert fast_publish(broker.port, "big", bodies, persistent=False) == step
        time.sleep(0.3)
        rss.append(rss_kb(broker.owner_pid("big")))
    conn = broker.connect()
    assert message_count(conn.channel(), "big") == 2 * step
    close_quietly(conn)
    per_message = (rss[1] - rss[0]) * 1024 / step
    print(f"RSS {rss[0] / 1024:.1f} MB -> {rss[1] / 1024:.1f} MB: {per_message:.0f} B a message")
    # In RAM, a 1 KB message costs about 1.4 KB; paged, its location only.
    assert per_message < 400, f"{per_message:.0f} B of RAM per paged message"
