"""Durable fan-out writes the body once: one FANOUT record for every plain durable
queue a persistent message reaches, and each queue still acks, delivers, purges and
recovers on its own (real broker process, pika, SIGKILL)."""

from __future__ import annotations

import time
from pathlib import Path

import pika
import pytest
from durability_support import (
    Brokers,
    close_quietly,
    drain_queue,
    message_count,
    segment_files,
    store_dir,
    store_dirs,
    tail,
)

pytestmark = [pytest.mark.leveret_only]

COUNT = 600
SIZE = 4096
PLAIN = ["fan.a", "fan.b", "fan.c"]


@pytest.fixture
def brokers(tmp_path):
    with Brokers(tmp_path) as b:
        yield b


def _body(i: int) -> bytes:
    tag = b"m%d:" % i
    return tag + b"x" * (SIZE - len(tag))


def _declare(ch) -> None:
    ch.exchange_declare("fan", "fanout", durable=True)
    for name in PLAIN:
        ch.queue_declare(name, durable=True)
    # A TTL queue shares the record too (the deadline stays in RAM with the
    # position), and so does a queue with a byte limit (its tail counts bodies); a
    # deduplicating queue, which cannot page, writes its own; a transient queue none.
    ch.queue_declare("fan.ttl", durable=True, arguments={"x-message-ttl": 3_600_000})
    ch.queue_declare("fan.limited", durable=True, arguments={"x-max-length-bytes": 10**9})
    ch.queue_declare("fan.dedup", durable=True, arguments={"x-message-deduplication": True})
    ch.queue_declare("fan.transient", durable=False)
    for name in (*PLAIN, "fan.ttl", "fan.limited", "fan.dedup", "fan.transient"):
        ch.queue_bind(name, "fan")


def _disk_bytes(broker) -> int:
    """The segment bytes of every store (with workers, each owner writes its own)."""
    return sum(p.stat().st_size for d in store_dirs(broker.data_dir) for p in segment_files(d))


def _stores(*queues: str) -> int:
    """How many stores hold `queues`: a shared record is written once per store."""
    return len({store_dir(Path("."), q) for q in queues})


def test_fan_out_body_is_written_once_and_each_queue_recovers_alone(brokers):
    # 100 messages in RAM per queue, the rest in paged tails: both kinds of holder.
    broker = brokers.start(name="fanout", extra=("--queue-ram-messages", "100"))
    conn = broker.connect()
    ch = conn.channel()
    _declare(ch)
    ch.confirm_delivery()
    before = _disk_bytes(broker)
    props = pika.BasicProperties(delivery_mode=2)
    for i in range(COUNT):
        ch.basic_publish("fan", "", _body(i), props)
    written = _disk_bytes(broker) - before
    # Per message: one FANOUT record for the plain, TTL and limited durable queues, one
    # record of its own for the deduplicating queue, and past its first 100 the transient queue pages
    # the body out as a record that recovery ignores. Without the shared record the
    # four queues would write three bodies more per message.
    shared = _stores(*PLAIN, "fan.ttl", "fan.limited")  # one store each without workers
    expected = ((shared + 1) * COUNT + (COUNT - 100)) * SIZE
    assert expected <= written < 1.1 * expected, f"{written} bytes on disk, {expected} expected"

    # fan.a: all acked; fan.b: the first half acked; fan.c: 10 delivered, not acked.
    assert len(drain_queue(ch, "fan.a")) == COUNT
    for i in range(COUNT // 2):
        method, _props, body = ch.basic_get("fan.b", auto_ack=False)
        assert body == _body(i) and not method.redelivered
        ch.basic_ack(method.delivery_tag)
    unacked = [ch.basic_get("fan.c", auto_ack=False) for _ in range(10)]
    assert [m[2] for m in unacked] == [_body(i) for i in range(10)]
    ch.queue_purge("fan.limited")
    ch.queue_purge("fan.dedup")
    # ACKs and purges are written after their replies: a confirmed publish behind
    # them (the log keeps order) makes sure they are on disk before the SIGKILL.
    ch.queue_declare("fence", durable=True)
    ch.basic_publish("", "fence", b"fence", props)
    broker.kill()

    broker.start()
    conn = broker.connect()
    ch = conn.channel()
    names = (*PLAIN, "fan.ttl", "fan.limited", "fan.dedup")
    counts = {name: message_count(ch, name) for name in names}
    want = {"fan.a": 0, "fan.b": COUNT // 2, "fan.c": COUNT, "fan.ttl": COUNT}
    want |= {"fan.limited": 0, "fan.dedup": 0}
    assert counts == want, counts
    got = drain_queue(ch, "fan.b")
    assert [body for body, _r, _p in got] == [_body(i) for i in range(COUNT // 2, COUNT)]
    assert not any(redelivered for _b, redelivered, _p in got)
    got = drain_queue(ch, "fan.c")
    assert [body for body, _r, _p in got] == [_body(i) for i in range(COUNT)]
    assert [redelivered for _b, redelivered, _p in got] == [True] * 10 + [False] * (COUNT - 10)
    got = drain_queue(ch, "fan.ttl")
    assert [body for body, _r, _p in got] == [_body(i) for i in range(COUNT)]
    close_quietly(conn)
    assert "Traceback" not in broker.log(), tail(broker.log())


def test_dead_letters_to_several_queues_share_a_record_and_nest_safely(brokers):
    """Dead-lettering to several durable queues writes the copy once too. And when
    a queue taking a shared message dead-letters another one (drop-head) in the
    middle of the fan-out, that copy is written on its own and every queue still
    gets what it should, after a SIGKILL too."""
    n = 300
    broker = brokers.start(name="fanout-dlx", extra=("--queue-ram-messages", "100"))
    conn = broker.connect()
    ch = conn.channel()
    ch.exchange_declare("dlx.fan", "fanout", durable=True)
    for name in ("dlx.c", "dlx.d"):
        ch.queue_declare(name, durable=True)
        ch.queue_bind(name, "dlx.fan")
    # Expired messages of dlx.src go to dlx.c and dlx.d through dlx.fan.
    ttl = {"x-message-ttl": 1, "x-dead-letter-exchange": "dlx.fan"}
    ch.queue_declare("dlx.src", durable=True, arguments=ttl)
    ch.confirm_delivery()
    before = _disk_bytes(broker)
    props = pika.BasicProperties(delivery_mode=2)
    for i in range(n):
        ch.basic_publish("", "dlx.src", _body(i), props)
    deadline = time.monotonic() + 60
    while message_count(ch, "dlx.d") < n and time.monotonic() < deadline:
        time.sleep(0.05)
    assert message_count(ch, "dlx.c") == message_count(ch, "dlx.d") == n
    # One record into dlx.src and one shared by dlx.c and dlx.d (in each store that
    # holds one of them), per message.
    written = _disk_bytes(broker) - before
    records = 1 + _stores("dlx.c", "dlx.d")
    assert records * n * SIZE <= written < (records + 0.5) * n * SIZE, written

    # Nested: fan.x feeds fan.keep and fan.one (x-max-length 1, drop-head, dead-
    # lettering into dlx.fan): each publish into fan.one drops its head into dlx.c
    # and dlx.d while fan.x's shared record is still being taken.
    ch.exchange_declare("fan.x", "fanout", durable=True)
    ch.queue_declare("fan.keep", durable=True)
    one = {"x-max-length": 1, "x-dead-letter-exchange": "dlx.fan"}
    ch.queue_declare("fan.one", durable=True, arguments=one)
    for name in ("fan.one", "fan.keep"):
        ch.queue_bind(name, "fan.x")
    for i in range(n, 2 * n):
        ch.basic_publish("fan.x", "", _body(i), props)
    broker.kill()

    broker.start()
    conn = broker.connect()
    ch = conn.channel()
    counts = {q: message_count(ch, q) for q in ("dlx.c", "dlx.d", "fan.keep", "fan.one")}
    assert counts == {"dlx.c": 2 * n - 1, "dlx.d": 2 * n - 1, "fan.keep": n, "fan.one": 1}
    for q in ("dlx.c", "dlx.d"):
        got = drain_queue(ch, q)
        assert [b for b, _r, _p in got] == [_body(i) for i in range(2 * n - 1)], q
        reasons = [p.headers["x-death"][0]["reason"] for _b, _r, p in got]
        assert reasons == ["expired"] * n + ["maxlen"] * (n - 1), q
    assert [b for b, _r, _p in drain_queue(ch, "fan.one")] == [_body(2 * n - 1)]
    assert [b for b, _r, _p in drain_queue(ch, "fan.keep")] == [_body(i) for i in range(n, 2 * n)]
    close_quietly(conn)
    assert "Traceback" not in broker.log(), tail(broker.log())
