"""Delayed messages across restarts and kill -9.

A persistent message on a durable x-delayed-message exchange is fsynced before its
publisher confirm; from then on a SIGKILL or a restart does not lose it, and it is
routed when due (not before). Transient messages, and messages on a non-durable
exchange, are gone after a restart, as in a queue.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time

import pika
import pika.exceptions
import pytest
from durability_support import (
    Brokers,
    assert_exit_ok,
    check_body,
    close_quietly,
    drain_queue,
    free_port,
    make_body,
    management_request,
    tail,
    test_workers,
)

pytestmark = pytest.mark.leveret_only

X = "x-delayed-message"


def _start(brokers: Brokers, data_dir=None):
    mport = free_port()
    broker = brokers.new(data_dir, extra=("--management-port", str(mport)))
    broker.management = f"http://127.0.0.1:{mport}"
    return broker.start()


def _delayed(broker, exchange: str) -> int:
    return management_request(broker, "GET", f"exchanges/%2F/{exchange}")[1]["messages_delayed"]


def _delayed_reaches(broker, exchange: str, count: int) -> int:
    """messages_delayed once it is `count`, or as it is after 20 s. With workers it adds
    the answers of the workers linked to worker 0, and a worker not linked yet (just
    started) or busy counts nothing for a moment: ask again, asserting no timing."""
    deadline = time.monotonic() + 20
    while (held := _delayed(broker, exchange)) != count and time.monotonic() < deadline:
        time.sleep(0.2)
    return held


def _props(delay: int, persistent: bool = True) -> pika.BasicProperties:
    return pika.BasicProperties(headers={"x-delay": delay}, delivery_mode=2 if persistent else 1)


def test_confirmed_delayed_messages_survive_sigkill_and_a_clean_restart(tmp_path):
    with Brokers(tmp_path) as brokers:
        broker = _start(brokers)
        conn = broker.connect()
        ch = conn.channel()
        ch.exchange_declare("dx", X, durable=True, arguments={"x-delayed-type": "direct"})
        ch.exchange_declare("dx.transient", X, arguments={"x-delayed-type": "direct"})
        ch.queue_declare("dq", durable=True)
        ch.queue_bind("dq", "dx", "k")
        ch.queue_bind("dq", "dx.transient", "k")
        ch.confirm_delivery()
        rng = random.Random(5)
        sent = {}  # body -> (published at, delay)
        for n in range(200):
            delay = rng.randrange(5000, 6500)
            body = make_body(f"p{n}", rng.randrange(10, 3000))
            sent[body] = (time.time(), delay)
            ch.basic_publish("dx", "k", body, _props(delay))
        for n in range(20):  # due while the broker is down: routed right after it starts
            body = make_body(f"d{n}")
            sent[body] = (time.time(), 1000)
            ch.basic_publish("dx", "k", body, _props(1000))
        for n in range(20):
            ch.basic_publish("dx", "k", make_body(f"t{n}"), _props(5000, persistent=False))
            ch.basic_publish("dx.transient", "k", make_body(f"n{n}"), _props(5000))
        for n in range(10):
            ch.basic_publish("dx", "k", make_body(f"long{n}"), _props(600_000 + n))
        # (On a loaded machine some may be due already; the ten long ones are not. With
        # workers the count adds the other workers' answers, which a busy worker may
        # miss for a moment: ask again, asserting no timing.)
        deadline = time.monotonic() + 20
        while _delayed(broker, "dx") < 10 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _delayed(broker, "dx") >= 10
        broker.kill()  # every publish above was confirmed
        time.sleep(1.0)

        broker.start()
        conn = broker.connect()
        ch = conn.channel()
        got: dict[bytes, float] = {}
        deadline = time.time() + 30
        while len(got) < len(sent) and time.time() < deadline:
            method, _props_, body = ch.basic_get("dq", auto_ack=True)
            if method is None:
                conn.sleep(0.02)
                continue
            assert body not in got, f"{check_body(body)} delivered twice"
            got[body] = time.time()
        assert set(got) == set(sent), tail(broker.run_log())
        for body, arrived in got.items():
            published, delay = sent[body]
            assert arrived >= published + delay / 1000, check_body(body)
        conn.sleep(0.3)
        assert ch.queue_declare("dq", passive=True).method.message_count == 0
        assert _delayed_reaches(broker, "dx", 10) == 10
        close_quietly(conn)

        assert_exit_ok(broker)  # a clean stop: the clean-shutdown index
        broker.start()
        assert "from the clean-shutdown index" in broker.run_log()
        assert _delayed_reaches(broker, "dx", 10) == 10
        conn = broker.connect()
        ch = conn.channel()
        ch.exchange_delete("dx")
        close_quietly(conn)
        broker.kill()
        broker.start()
        conn = broker.connect()
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):
            ch.exchange_declare("dx", X, passive=True)
        assert "kept" not in broker.run_log()  # nothing left behind on disk
        close_quietly(conn)


def _declare_dx_into_dq(broker) -> None:
    """The durable delayed exchange `dx` (direct) and the durable queue `dq` bound to it
    with `k`, which the soak tests' publishers keep busy."""
    conn = broker.connect()
    ch = conn.channel()
    ch.exchange_declare("dx", X, durable=True, arguments={"x-delayed-type": "direct"})
    ch.queue_declare("dq", durable=True)
    ch.queue_bind("dq", "dx", "k")
    close_quietly(conn)


def _drain_into(broker, arrived: dict[str, int]) -> None:
    """Every message `dq` holds now, each checked intact, counted by tag in `arrived`."""
    conn = broker.connect()
    for body, _redelivered, _p in drain_queue(conn.channel(), "dq"):
        tag = check_body(body)
        arrived[tag] = arrived.get(tag, 0) + 1
    close_quietly(conn)


def _assert_every_confirmed_arrives(broker, confirmed: set[str], arrived: dict[str, int]) -> None:
    """Every confirmed message arrived at least once (duplicates are counted, printed),
    and enough were confirmed for the round to mean something. messages_delayed may
    read 0 for a moment while a worker that holds some is not linked to worker 0 yet
    (just restarted): what it fires then arrives after the last drain. So drain until
    everything came, or 30 s passed."""
    deadline = time.time() + 30
    while confirmed - set(arrived) and time.time() < deadline:
        time.sleep(0.2)
        _drain_into(broker, arrived)
    lost = confirmed - set(arrived)
    assert not lost, f"{len(lost)} confirmed delayed messages lost, e.g. {sorted(lost)[:5]}"
    duplicates = sum(n - 1 for n in arrived.values())
    print(f"{len(confirmed)} confirmed, {len(arrived)} arrived, {duplicates} duplicates")
    assert len(confirmed) > 100


class Publisher(threading.Thread):
    """Confirmed persistent delayed messages, short delays, until the broker (or the
    worker its connection is on) dies, or until `stop` is set."""

    def __init__(self, broker, start: int, rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.broker = broker
        self.n = start
        self.rng = rng
        self.confirmed: set[str] = set()
        self.connected = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            conn = self.broker.connect()
            ch = conn.channel()
            ch.confirm_delivery()
            self.connected.set()
            while not self.stop.is_set():
                tag = f"m{self.n}"
                self.n += 1
                ch.basic_publish(
                    "dx",
                    "k",
                    make_body(tag, self.rng.randrange(10, 2000)),
                    _props(self.rng.randrange(0, 600)),
                )
                self.confirmed.add(tag)
            close_quietly(conn)
        except Exception:
            self.connected.set()  # the broker was killed


def _publishers_running(broker, start: int, rng: random.Random, count: int) -> list[Publisher]:
    """`count` Publishers (tags from `start`, a million apart), each connected, then
    left to publish for 0.5 to 1.5 s."""
    publishers = [Publisher(broker, start + k * 1_000_000, rng) for k in range(count)]
    for p in publishers:
        p.start()
        p.connected.wait(10)
    time.sleep(rng.uniform(0.5, 1.5))
    return publishers


@pytest.mark.soak
def test_sigkill_while_delayed_messages_are_written_and_fired(tmp_path, soak_rounds):
    """Publishers keep the exchange busy storing and firing; kill -9 at a random moment.
    After each restart every confirmed message arrives at least once (its ACK in the
    delay queue may not have been written: a duplicate then, counted), intact."""
    rng = random.Random(99)
    with Brokers(tmp_path) as brokers:
        broker = _start(brokers)
        _declare_dx_into_dq(broker)
        confirmed: set[str] = set()
        arrived: dict[str, int] = {}
        start = 0
        for _round in range(soak_rounds):
            publishers = _publishers_running(broker, start, rng, 2)
            start += 10_000_000
            broker.kill()
            for p in publishers:
                p.join(10)
                confirmed |= p.confirmed
            broker.start()
            deadline = time.time() + 30
            while _delayed(broker, "dx") and time.time() < deadline:
                time.sleep(0.05)
            _drain_into(broker, arrived)
        _assert_every_confirmed_arrives(broker, confirmed, arrived)


def _workers_status(broker) -> list[dict]:
    return json.loads((broker.data_dir / "workers-status.json").read_text())["workers"]


@pytest.mark.soak
@pytest.mark.skipif(test_workers() < 2, reason="kills one worker of a broker of workers")
def test_sigkill_of_one_worker_while_delayed_messages_are_written_and_fired(tmp_path, soak_rounds):
    """A broker of workers: publishers on both workers keep the exchange busy (each
    worker holds what its clients publish; the queue's owner gets the others' over
    their link); each round kill -9 one worker, in turn the queue's owner and the
    other one, and let the supervisor start it again. Every confirmed message arrives
    at least once: the killed worker's from its store, the other's routed again once
    the owner is back."""
    rng = random.Random(7)
    with Brokers(tmp_path) as brokers:
        broker = _start(brokers)
        _declare_dx_into_dq(broker)
        owner = int(broker.store_dir("dq").name.rsplit("-", 1)[1])
        confirmed: set[str] = set()
        arrived: dict[str, int] = {}
        start = 0
        for round_ in range(max(2, soak_rounds)):
            victim = owner if round_ % 2 == 0 else (owner + 1) % test_workers()
            # Four connections: the kernel spreads them over the workers.
            publishers = _publishers_running(broker, start, rng, 4)
            start += 10_000_000
            before = _workers_status(broker)[victim]
            os.kill(before["pid"], signal.SIGKILL)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # started again, and serving
                now = _workers_status(broker)[victim]
                if now["pid"] != before["pid"] and now["ready"] and now["state"] == "running":
                    break
                time.sleep(0.05)
            else:
                pytest.fail(f"worker {victim} did not come back:\n{tail(broker.run_log())}")
            time.sleep(rng.uniform(0.0, 0.5))  # the other worker's publishers go on
            for p in publishers:
                p.stop.set()
            for p in publishers:
                p.join(10)
                confirmed |= p.confirmed
            _delayed_reaches(broker, "dx", 0)
            _drain_into(broker, arrived)
        _assert_every_confirmed_arrives(broker, confirmed, arrived)
