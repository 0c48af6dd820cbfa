"""Queues with message TTLs page like plain ones: past --queue-ram-messages a message
is a disk position plus its deadline, and it still expires (and is dead-lettered)
in order, after a restart too. Real broker process, pika, the management API."""

from __future__ import annotations

import time

import pika
import pika.exceptions
import pytest
from durability_support import (
    Brokers,
    close_quietly,
    drain_queue,
    fast_publish,
    make_body,
    management_request,
    message_count,
    queue_info,
    start_paging_broker,
    tail,
)

pytestmark = [pytest.mark.leveret_only]

RAM = 50  # --queue-ram-messages


@pytest.fixture
def brokers(tmp_path):
    with Brokers(tmp_path) as b:
        yield b


def _start(brokers, name: str):
    return start_paging_broker(brokers, name, RAM)


def _wait_count(ch, queue: str, want: int, timeout: float = 60.0) -> int:
    """Poll the count until it is `want` (no timing is asserted: the deadline only
    keeps a broken broker from hanging the test)."""
    deadline = time.monotonic() + timeout
    count = message_count(ch, queue)
    while count != want and time.monotonic() < deadline:
        time.sleep(0.05)
        count = message_count(ch, queue)
    return count


def test_long_ttl_queue_pages_and_dead_letters_in_order(brokers):
    count = 3000
    broker = _start(brokers, "ttl-paging")
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare("ttl.dead", durable=True)
    arguments = {
        "x-message-ttl": 1500,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "ttl.dead",
    }
    ch.queue_declare("ttl.long", durable=True, arguments=arguments)
    bodies = (make_body(str(i), 512) for i in range(count))
    assert fast_publish(broker.port, "ttl.long", bodies, persistent=True) == count
    # A TTL long enough that nothing expires during the test: all but the queue's
    # head are positions only.
    ch.queue_declare("ttl.hour", durable=True, arguments={"x-message-ttl": 3_600_000})
    bodies = (make_body(str(i), 512) for i in range(count))
    assert fast_publish(broker.port, "ttl.hour", bodies, persistent=True) == count
    info = queue_info(broker, "ttl.hour")
    assert (info["messages"], info["messages_paged_out"]) == (count, count - RAM), info
    assert info["messages_ready_ram"] == RAM, info

    assert _wait_count(ch, "ttl.dead", count) == count
    assert message_count(ch, "ttl.long") == 0
    got = drain_queue(ch, "ttl.dead")
    assert [body for body, _r, _p in got] == [make_body(str(i), 512) for i in range(count)]
    deaths = {p.headers["x-death"][0]["reason"] for _b, _r, p in got}
    queues = {p.headers["x-death"][0]["queue"] for _b, _r, p in got}
    assert (deaths, queues) == ({"expired"}, {"ttl.long"})
    close_quietly(conn)
    assert "Traceback" not in broker.log(), tail(broker.log())


def test_per_message_expiration_pages_and_expires_at_the_head(brokers):
    broker = _start(brokers, "exp-paging")
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare("exp.long", durable=True)
    ch.confirm_delivery()
    short = pika.BasicProperties(delivery_mode=2, expiration="1000")
    keep = pika.BasicProperties(delivery_mode=2)
    for i in range(400):
        ch.basic_publish("", "exp.long", b"short-%d" % i, short)
    for i in range(20):
        ch.basic_publish("", "exp.long", b"keep-%d" % i, keep)
    info = queue_info(broker, "exp.long")
    assert info["messages_paged_out"] > 0, info
    assert _wait_count(ch, "exp.long", 20) == 20
    got = drain_queue(ch, "exp.long")
    assert [body for body, _r, _p in got] == [b"keep-%d" % i for i in range(20)]
    close_quietly(conn)


def test_a_restarted_ttl_queue_keeps_its_tail_and_expires_it(brokers):
    count = 1000
    broker = _start(brokers, "ttl-restart")
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare("ttl.restart", durable=True, arguments={"x-message-ttl": 3000})
    close_quietly(conn)
    bodies = (make_body(str(i), 256) for i in range(count))
    assert fast_publish(broker.port, "ttl.restart", bodies, persistent=True) == count
    broker.stop()
    broker.start()
    # A recovered message's TTL counts from the restart, as for a short queue.
    conn = broker.connect()
    ch = conn.channel()
    assert message_count(ch, "ttl.restart") == count
    info = queue_info(broker, "ttl.restart")
    # A restart reads no message: at most the one batch (REFILL_BATCH, 256) the
    # expiry timer reads to see the oldest message's deadline.
    assert count - 256 <= info["messages_paged_out"] <= count, info
    method, _props, body = ch.basic_get("ttl.restart", auto_ack=True)
    assert body == make_body("0", 256)
    assert _wait_count(ch, "ttl.restart", 0) == 0
    close_quietly(conn)
    assert "Traceback" not in broker.log(), tail(broker.log())


def test_a_long_max_length_queue_pages_and_drops_its_head(brokers):
    """x-max-length (a count) pages too: drop-head reads the oldest messages back
    from disk to dead-letter them, in order, and reject-publish nacks past the limit."""
    count, limit = 2000, 500
    broker = _start(brokers, "maxlen-paging")
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare("maxlen.dead", durable=True)
    arguments = {
        "x-max-length": limit,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "maxlen.dead",
    }
    ch.queue_declare("maxlen.long", durable=True, arguments=arguments)
    bodies = (make_body(str(i), 300) for i in range(count))
    assert fast_publish(broker.port, "maxlen.long", bodies, persistent=True) == count
    info = queue_info(broker, "maxlen.long")
    # Dropping the head reads the tail back 256 at a time (REFILL_BATCH).
    assert info["messages"] == limit and info["messages_paged_out"] >= limit - RAM - 256, info
    dead = drain_queue(ch, "maxlen.dead")
    assert [b for b, _r, _p in dead] == [make_body(str(i), 300) for i in range(count - limit)]
    assert {p.headers["x-death"][0]["reason"] for _b, _r, p in dead} == {"maxlen"}
    kept = drain_queue(ch, "maxlen.long")
    assert [b for b, _r, _p in kept] == [
        make_body(str(i), 300) for i in range(count - limit, count)
    ]

    ch.queue_declare(
        "maxlen.reject",
        durable=True,
        arguments={"x-max-length": limit, "x-overflow": "reject-publish"},
    )
    ch.confirm_delivery()
    nacked = 0
    for i in range(limit + 100):
        try:
            ch.basic_publish("", "maxlen.reject", b"r%d" % i, pika.BasicProperties(delivery_mode=2))
        except pika.exceptions.NackError:
            nacked += 1
    assert nacked == 100
    assert queue_info(broker, "maxlen.reject")["messages_paged_out"] == limit - RAM
    got = drain_queue(ch, "maxlen.reject")
    assert [b for b, _r, _p in got] == [b"r%d" % i for i in range(limit)]
    close_quietly(conn)
    assert "Traceback" not in broker.log(), tail(broker.log())


def test_a_ttl_policy_spares_paged_messages_queued_before_it(brokers):
    """A message's expiry is fixed when it is enqueued (as RabbitMQ): a TTL policy
    set while a long queue has a paged tail leaves the tail's messages alone when
    they are read back. (Only messages recovered at startup, which have no deadline
    on disk, start their TTL from the restart.)"""
    count = 200
    broker = _start(brokers, "ttl-policy")
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare("pol.long", durable=True)
    bodies = (make_body(str(i), 100) for i in range(count))
    assert fast_publish(broker.port, "pol.long", bodies, persistent=True) == count
    assert queue_info(broker, "pol.long")["messages_paged_out"] == count - RAM
    status, _ = management_request(
        broker,
        "PUT",
        "policies/%2F/ttl-zero",
        {"pattern": "^pol\\.", "definition": {"message-ttl": 0}, "apply-to": "queues"},
    )
    assert status in (201, 204)
    # With workers, another worker's queue shows as of its last report (refreshed at
    # most once a second): wait for one taken after the policy (no timing asserted).
    deadline = time.monotonic() + 30
    while queue_info(broker, "pol.long").get("policy") is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert queue_info(broker, "pol.long").get("policy") == "ttl-zero"
    got = drain_queue(ch, "pol.long")
    assert [b for b, _r, _p in got] == [make_body(str(i), 100) for i in range(count)]
    close_quietly(conn)
