"""Queues with x-max-length-bytes page too: their paged tails count the bodies' bytes
exactly (as RabbitMQ counts them), so the limit drops or rejects the same messages as
when every message was in RAM, before and after a restart (clean and SIGKILL), and
when a policy sets the limit on a queue that has paged already. Real broker process,
pika, the management API."""

from __future__ import annotations

import random

import pika
import pika.exceptions
import pytest
from durability_support import (
    Brokers,
    close_quietly,
    management_request,
    message_count,
    start_paging_broker,
)

pytestmark = [pytest.mark.leveret_only]

RAM = 50  # --queue-ram-messages


@pytest.fixture
def brokers(tmp_path):
    with Brokers(tmp_path) as b:
        yield b


def _start(brokers, name: str):
    return start_paging_broker(brokers, name, RAM)


def _api(broker, method: str, path: str, body: dict | None = None) -> dict | None:
    return management_request(broker, method, path, body)[1]


def _info(broker, name: str) -> dict:
    return _api(broker, "GET", f"queues/%2F/{name}")  # type: ignore[return-value]


def _body(tag: str, size: int) -> bytes:
    return (tag.encode() + b"." * size)[:size]


def _publish(ch, queue: str, bodies: list[bytes]) -> list[bool]:
    """Confirmed publishes; True for each the broker took, False for each it nacked."""
    ch.confirm_delivery()
    taken = []
    for body in bodies:
        try:
            ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
            taken.append(True)
        except pika.exceptions.NackError:
            taken.append(False)
    return taken


def _drain(ch, queue: str) -> list[bytes]:
    out = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append(body)


def _newest_within(bodies: list[bytes], limit: int) -> list[bytes]:
    """What drop-head keeps: the newest messages whose bodies fit in `limit` bytes."""
    kept: list[bytes] = []
    total = 0
    for body in reversed(bodies):
        if total + len(body) > limit:
            break
        kept.append(body)
        total += len(body)
    return kept[::-1]


@pytest.mark.parametrize("restart", ["sigterm", "sigkill"])
def test_drop_head_keeps_the_newest_bytes_exactly_across_a_restart(brokers, restart):
    rng = random.Random(7)
    limit = 60_000
    broker = _start(brokers, f"bytes-{restart}")
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare("bytes.q", durable=True, arguments={"x-max-length-bytes": limit})
    bodies = [_body(f"m{i}", rng.randrange(1, 300)) for i in range(2000)]
    assert all(_publish(ch, "bytes.q", bodies))
    kept = _newest_within(bodies, limit)
    info = _info(broker, "bytes.q")
    assert (info["messages"], info["message_bytes_ready"]) == (len(kept), sum(map(len, kept)))
    # Dropping the head reads the tail back a batch (256) at a time.
    assert info["messages_paged_out"] > 0, "the queue did not page"
    assert info["messages_ram"] <= RAM + 256
    close_quietly(conn)
    if restart == "sigterm":
        broker.restart()
    else:
        broker.kill()
        broker.start()
    info = _info(broker, "bytes.q")
    assert (info["messages"], info["message_bytes_ready"]) == (len(kept), sum(map(len, kept)))
    conn = broker.connect()
    ch = conn.channel()
    more = [_body(f"n{i}", rng.randrange(1, 300)) for i in range(100)]
    assert all(_publish(ch, "bytes.q", more))
    want = _newest_within(bodies + more, limit)
    assert message_count(ch, "bytes.q") == len(want)
    assert _drain(ch, "bytes.q") == want
    close_quietly(conn)


def test_reject_publish_turns_away_what_does_not_fit_after_a_restart(brokers):
    limit = 100 * 400
    broker = _start(brokers, "bytes-reject")
    conn = broker.connect()
    ch = conn.channel()
    arguments = {"x-max-length-bytes": limit, "x-overflow": "reject-publish"}
    ch.queue_declare("bytes.r", durable=True, arguments=arguments)
    bodies = [_body(f"m{i}", 100) for i in range(450)]
    assert _publish(ch, "bytes.r", bodies) == [True] * 400 + [False] * 50
    close_quietly(conn)
    broker.kill()
    broker.start()
    conn = broker.connect()
    ch = conn.channel()
    assert _publish(ch, "bytes.r", [_body("late", 1)]) == [False]
    assert _drain(ch, "bytes.r") == bodies[:400]
    close_quietly(conn)


def test_a_policy_limit_on_a_paged_queue_counts_bodies_exactly(brokers):
    rng = random.Random(11)
    broker = _start(brokers, "bytes-policy")
    conn = broker.connect()
    ch = conn.channel()
    ch.queue_declare("bytes.p", durable=True)
    bodies = [_body(f"m{i}", rng.randrange(1, 300)) for i in range(1500)]
    assert all(_publish(ch, "bytes.p", bodies))
    assert _info(broker, "bytes.p")["messages_paged_out"] > 1000
    limit = 50_000
    _api(
        broker,
        "PUT",
        "policies/%2F/bytes-limit",
        {"pattern": "^bytes\\.p$", "definition": {"max-length-bytes": limit}, "apply-to": "queues"},
    )
    kept = _newest_within(bodies, limit)
    info = _info(broker, "bytes.p")
    assert (info["messages"], info["message_bytes_ready"]) == (len(kept), sum(map(len, kept)))
    more = [_body(f"n{i}", rng.randrange(1, 300)) for i in range(300)]
    assert all(_publish(ch, "bytes.p", more))
    assert _drain(ch, "bytes.p") == _newest_within(bodies + more, limit)
    close_quietly(conn)
