"""kill -9 the broker while several clients publish persistent messages with confirms.

(Named test_broker_crash.py, not test_crash.py: tests/store/test_crash.py already owns
that module name, and without __init__.py files pytest refuses two of them.)

Each round: publish from several connections at once into three durable queues (two
bound to a durable direct exchange with the same key, so each message there is one
FANOUT record for both; one through the default exchange), with some messages acked
and some delivered-but-unacked beforehand, differently in each queue, SIGKILL at a
random moment, restart on the same data dir and check what came back.

The broker keeps only RAM messages of a queue as objects, so every queue pages, and
the second exchange queue is a priority queue (its levels page apart): messages
through the exchange carry priorities 0-3, and there the order is kept per
publisher within each priority.

A fourth queue is a quorum queue, published to with transient messages (a quorum
queue keeps them all), where some messages were returned and redelivered before
the kill: each comes back with x-delivery-count equal to the times it went out
(the delivery a consumer held counts as returned), never less.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import pika
import pika.exceptions
import pytest
from durability_support import (
    PERSISTENT,
    TRANSIENT,
    Brokers,
    assert_exit_ok,
    check_body,
    close_quietly,
    drain_queue,
    make_body,
    tail,
)

pytestmark = [pytest.mark.leveret_only, pytest.mark.soak]

EXCHANGE = "crash.x"
QUEUE_X = "crash.via-exchange"  # bound to EXCHANGE with key "a"
QUEUE_X2 = "crash.via-exchange-2"  # bound with the same key: the body is written once
QUEUE_D = "crash.via-default"  # published through the default exchange
QUEUE_Q = "crash.quorum"  # a quorum queue (returns go to the front: a delivery limit)
QUORUM = {"x-queue-type": "quorum", "x-delivery-limit": 1000}
# Where a message published for a queue ends up.
ROUTES = {QUEUE_X: (QUEUE_X, QUEUE_X2), QUEUE_D: (QUEUE_D,), QUEUE_Q: (QUEUE_Q,)}
QUEUES = (QUEUE_X, QUEUE_X2, QUEUE_D, QUEUE_Q)
PUBLISHERS = 4
PRE = 60  # messages per queue before the publishing storm
RAM = 100  # --queue-ram-messages: past this many, a queue (or its levels) pages
PRIORITIES = 3  # x-max-priority of QUEUE_X2


def _priority(seq: int) -> int:
    return seq // 2 % (PRIORITIES + 1)


class Publisher(threading.Thread):
    """Publishes confirmed persistent messages until the broker dies (or `stop`)."""

    def __init__(self, broker, index: int, rnd: random.Random, stop: threading.Event) -> None:
        super().__init__(name=f"publisher-{index}", daemon=True)
        self.broker = broker
        self.index = index
        self.rnd = rnd
        self.stop_event = stop
        self.confirmed: dict[str, str] = {}  # tag -> queue
        self.attempted: dict[str, str] = {}
        self.unconfirmed: set[str] = set()
        self.error: BaseException | None = None
        self.connected = threading.Event()

    def run(self) -> None:
        conn = None
        try:
            conn = self.broker.connect()
            ch = conn.channel()
            ch.confirm_delivery()
            self.connected.set()
            seq = 0
            while not self.stop_event.is_set():
                tag = f"{self.index}-{seq}"
                size = self.rnd.choice((0, 16, 200, 1500, 9000, 70000, 200000))
                body = make_body(tag, size)
                props = PERSISTENT
                if seq % 2:
                    queue, args = QUEUE_X, (EXCHANGE, "a")
                    props = pika.BasicProperties(delivery_mode=2, priority=_priority(seq))
                elif seq % 4 == 2:
                    queue, args = QUEUE_Q, ("", QUEUE_Q)
                    props = TRANSIENT  # a quorum queue stores it all the same
                else:
                    queue, args = QUEUE_D, ("", QUEUE_D)
                self.attempted[tag] = queue
                self.unconfirmed.add(tag)
                ch.basic_publish(*args, body=body, properties=props, mandatory=True)
                self.unconfirmed.discard(tag)
                self.confirmed[tag] = queue
                seq += 1
        except (pika.exceptions.AMQPError, OSError) as exc:
            if not self.stop_event.is_set():
                self.error = exc  # expected once the broker is killed
        finally:
            self.connected.set()
            if conn is not None:
                close_quietly(conn)


def _setup_topology(broker) -> None:
    conn = broker.connect()
    ch = conn.channel()
    ch.exchange_declare(EXCHANGE, "direct", durable=True)
    for queue in QUEUES:
        arguments = {"x-max-priority": PRIORITIES} if queue == QUEUE_X2 else None
        ch.queue_declare(queue, durable=True, arguments=QUORUM if queue == QUEUE_Q else arguments)
    ch.queue_bind(QUEUE_X, EXCHANGE, "a")
    ch.queue_bind(QUEUE_X2, EXCHANGE, "a")
    conn.close()


def _prephase(broker, round_no: int):
    """Publish PRE messages per route; in each queue ack some, hold some
    delivered-but-unacked (QUEUE_X2 acks more and holds fewer than QUEUE_X, which
    shares its records).

    In the quorum queue some held messages were returned 1-3 times first, and the
    last message taken there is returned, not held.

    Returns (open holder connection, and per queue: acked tags, held tags, remaining
    pre tags; the quorum queue's expected delivery counts).
    """
    conn = broker.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    pre: dict[str, list[str]] = {queue: [] for queue in QUEUES}
    for queue, args in (
        (QUEUE_X, (EXCHANGE, "a")),
        (QUEUE_D, ("", QUEUE_D)),
        (QUEUE_Q, ("", QUEUE_Q)),
    ):
        for i in range(PRE):
            tag = f"pre{round_no}-{queue[-3:]}-{i}"
            ch.basic_publish(*args, body=make_body(tag, 300), properties=PERSISTENT)
            for target in ROUTES[queue]:
                pre[target].append(tag)
    acked: dict[str, set[str]] = {queue: set() for queue in QUEUES}
    held: dict[str, set[str]] = {queue: set() for queue in QUEUES}
    # First part of each queue: get and ack. Next few: get and hold unacked.
    for queue in pre:
        n_ack, n_hold = (PRE // 2, 2) if queue == QUEUE_X2 else (PRE // 3, 5)
        for _ in range(n_ack):
            method, _props, body = ch.basic_get(queue)
            assert method is not None
            acked[queue].add(check_body(body))
            ch.basic_ack(method.delivery_tag)
        for _ in range(n_hold):
            method, _props, body = ch.basic_get(queue)
            assert method is not None
            held[queue].add(check_body(body))
    counts: dict[str, int] = {tag: 1 for tag in held[QUEUE_Q]}
    for returns in (1, 2, 3):  # returned to the front, taken again, then held
        for _ in range(returns):
            method, _props, body = ch.basic_get(QUEUE_Q)
            ch.basic_nack(method.delivery_tag, requeue=True)
        method, _props, body = ch.basic_get(QUEUE_Q)
        tag = check_body(body)
        held[QUEUE_Q].add(tag)
        counts[tag] = returns + 1
    method, _props, body = ch.basic_get(QUEUE_Q)
    ch.basic_nack(method.delivery_tag, requeue=True)  # returned once, not held
    returned = check_body(body)
    counts[returned] = 1
    # A confirmed publish after the acks: the committer writes in submission order,
    # so once it is confirmed the ACK and DELIVERED records are on disk too.
    ch.basic_publish("", "crash.fence", body=b"fence", properties=PERSISTENT)
    remaining = {
        q: [t for t in tags if t not in acked[q] and t not in held[q]] for q, tags in pre.items()
    }
    return conn, acked, held, remaining, counts


def _round(broker, round_no: int, rnd: random.Random) -> dict[str, int]:
    _setup_topology(broker)
    fence_conn = broker.connect()
    fence_conn.channel().queue_declare("crash.fence", durable=True)
    fence_conn.close()
    holder, acked, held, remaining, expected_counts = _prephase(broker, round_no)

    stop = threading.Event()
    publishers = [
        Publisher(broker, i, random.Random(rnd.random()), stop) for i in range(PUBLISHERS)
    ]
    for p in publishers:
        p.start()
    for p in publishers:
        p.connected.wait(10)
    time.sleep(rnd.uniform(0.2, 1.5))
    broker.kill()  # SIGKILL in the middle of the publishing
    stop.set()
    for p in publishers:
        p.join(20)
        assert not p.is_alive(), f"{p.name} hung after the broker was killed"
    close_quietly(holder)

    broker.start(recovered=False)  # listens before its messages are back: the drain waits
    conn = broker.connect()
    ch = conn.channel()
    got = {q: drain_queue(ch, q) for q in QUEUES}
    drain_queue(ch, "crash.fence")
    conn.close()
    recovered = [line for line in broker.run_log().splitlines() if "recovered" in line]
    assert any("messages in" in line for line in recovered), tail(broker.run_log())

    confirmed = {}
    attempted = {}
    unconfirmed: set[str] = set()
    for p in publishers:
        confirmed.update(p.confirmed)
        attempted.update(p.attempted)
        unconfirmed |= p.unconfirmed
    assert confirmed, "no publish was confirmed before the kill; the round proved nothing"

    for queue, messages in got.items():
        tags = [check_body(body) for body, _r, _p in messages]  # raises on corruption
        counts = Counter(tags)
        redelivered = {check_body(b): r for b, r, _p in messages}
        # Nothing that was never published (or was published to another queue).
        for tag in counts:
            if tag.startswith("pre"):
                assert tag in remaining[queue] or tag in held[queue], f"{queue}: unexpected {tag}"
            else:
                route = ROUTES.get(attempted.get(tag, ""), ())
                assert queue in route, f"{queue}: never published here: {tag}"
        # Acked messages never come back.
        back = acked[queue] & counts.keys()
        assert not back, f"{queue}: acked came back: {back}"
        # Delivered-but-unacked come back, flagged redelivered.
        for tag in held[queue]:
            assert counts[tag] == 1, f"{queue}: unacked {tag} seen {counts[tag]} times"
            assert redelivered[tag] is True, f"{queue}: {tag} not marked redelivered"
        for tag in remaining[queue]:
            assert counts[tag] == 1, f"{queue}: pre-crash message {tag} seen {counts[tag]}x"
            was_out = queue == QUEUE_Q and tag in expected_counts
            assert redelivered[tag] is was_out, f"{queue}: {tag} redelivered={redelivered[tag]}"
        if queue == QUEUE_Q:
            delivered = {
                check_body(b): (p.headers or {}).get("x-delivery-count", 0) for b, _r, p in messages
            }
            for tag, seen in delivered.items():
                want = expected_counts.get(tag, 0)
                assert seen == want, f"{queue}: {tag} x-delivery-count {seen}, expected {want}"
        # Every confirmed message, exactly once; duplicates only among unconfirmed ones.
        for tag, q in confirmed.items():
            if queue in ROUTES[q]:
                assert counts[tag] == 1, f"{queue}: confirmed {tag} seen {counts[tag]} times"
        dups = {t: n for t, n in counts.items() if n > 1 and t not in unconfirmed}
        assert not dups, f"{queue}: duplicates of confirmed messages: {dups}"
        # Per publisher (and priority, in the priority queue), publish order is kept.
        last: dict[tuple[str, int], int] = {}
        for tag in tags:
            if tag.startswith("pre"):
                continue
            pub, seq = tag.split("-")
            key = (pub, _priority(int(seq)) if queue == QUEUE_X2 else 0)
            assert int(seq) > last.get(key, -1), f"{queue}: {tag} out of order"
            last[key] = int(seq)

    assert_exit_ok(broker)
    return {
        "confirmed": len(confirmed),
        "unconfirmed": len(unconfirmed),
        "recovered": sum(len(m) for m in got.values()),
    }


def test_kill_9_while_publishing_with_confirms(tmp_path, soak_rounds):
    rnd = random.Random()
    seed = rnd.randrange(1 << 30)
    rnd.seed(seed)
    with Brokers(tmp_path) as brokers:
        broker = brokers.new(name="crash", extra=("--queue-ram-messages", str(RAM)))
        broker.start()
        stats = []
        for round_no in range(soak_rounds):
            try:
                stats.append(_round(broker, round_no, rnd))
            except AssertionError as exc:
                raise AssertionError(
                    f"round {round_no} (seed {seed}): {exc}\n--- broker log ---\n"
                    f"{tail(broker.log(), 60)}"
                ) from exc
            if round_no + 1 < soak_rounds:
                broker.start()
        print(f"seed {seed}: {stats}")
