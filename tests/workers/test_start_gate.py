"""A broker of workers serves no client before every worker is linked and in sync.

Real processes (`leveret server --workers N`), real sockets, pika. At a whole-broker
start no worker accepts a client until every worker recovered its store, runs its
link to every other worker and is in sync with worker 0: a client that connects
early waits in the listening socket's backlog, and never finds a queue of another
worker "down". A worker restarted alone while the others serve waits the same way
for its own links and sync before it accepts.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
from pathlib import Path

import pika
import pika.exceptions
import pytest

from leveret.workers.mesh import placement
from workers.procs import Workers, alive, wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers: Linux")


@pytest.fixture
def brokers():
    made: list[Workers] = []

    def start(tmp: Path, count: int, *args: str, **kw) -> Workers:
        tmp.mkdir(parents=True, exist_ok=True)
        broker = Workers(tmp, count, *args, **kw)
        made.append(broker)
        return broker

    yield start
    for broker in reversed(made):  # the last on a data dir first: they share its status file
        broker.kill()


def name_on(owner: int, count: int, prefix: str) -> str:
    """A queue name that worker `owner` of `count` owns by placement."""
    for i in range(10_000):
        name = f"{prefix}-{i}"
        if placement("/", name, count) == owner:
            return name
    raise AssertionError(f"no name from {prefix!r} for worker {owner}")


def kill_every_process(broker: Workers) -> None:
    """SIGKILL every worker and the supervisor, as a machine that loses power would
    (the supervisor held stopped meanwhile: it would restart a killed worker, and a
    worker whose supervisor is gone stops cleanly)."""
    pids = [w["pid"] for w in broker.status()["workers"] if w.get("pid")]
    broker.proc.send_signal(signal.SIGSTOP)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    broker.proc.kill()
    broker.proc.wait()
    for pid in pids:
        wait_for(lambda pid=pid: not alive(pid))


def test_clients_connecting_through_a_whole_broker_restart_never_see_another_worker_down(
    brokers, tmp_path: Path
) -> None:
    count = 2
    first = brokers(tmp_path / "first", count).wait_listening()
    port = first.port
    queues = [name_on(owner, count, "wk-ready-gate") for owner in range(count)]
    conn = first.connect("setup")
    ch = conn.channel()
    ch.confirm_delivery()
    for queue in queues:
        ch.queue_declare(queue, durable=True)
        ch.basic_publish("", queue, b"kept", pika.BasicProperties(delivery_mode=2))
    conn.close()
    kill_every_process(first)

    # Clients connect in a loop from before the restart until after its listening
    # line, and declare every queue, as applications do when they start (worker 0
    # checks that each queue's owner is linked and in sync, and the owner gives its
    # counts: a queue of a worker not linked yet would answer 404 "home node ... is
    # down or inaccessible"). The supervisor writes its status file once it bound
    # the port: a connection tried after that must get in.
    status = first.data / "workers-status.json"
    status.unlink()
    log = tmp_path / "second" / "server.log"
    outcomes: list[tuple[bool, bool, str, object]] = []  # (bound, logged, kind, detail)
    done = threading.Event()
    lock = threading.Lock()

    def listening() -> bool:
        try:
            return "Leveret listening for AMQP" in log.read_text()
        except FileNotFoundError:
            return False

    def client() -> None:
        after = 0
        while not done.is_set() and after < 5:
            bound, logged = status.exists(), listening()
            params = pika.ConnectionParameters(
                "127.0.0.1",
                port,
                heartbeat=0,
                socket_timeout=60,
                stack_timeout=120,
                blocked_connection_timeout=60,
                connection_attempts=1,
            )
            try:
                c = pika.BlockingConnection(params)
            except pika.exceptions.AMQPConnectionError as exc:
                # Before the bind: refused (or, rarely, a connect from the very port
                # it connects to, which the kernel may pick while the port is free)
                with lock:
                    outcomes.append((bound, logged, "no connection", exc))
                done.wait(0.005)
                continue
            try:
                channel = c.channel()
                counts = [
                    channel.queue_declare(q, durable=True).method.message_count for q in queues
                ]
                with lock:
                    outcomes.append((bound, logged, "ok", counts))
            except pika.exceptions.AMQPError as exc:
                with lock:
                    outcomes.append((bound, logged, "error", exc))
            finally:
                try:
                    c.close()
                except pika.exceptions.AMQPError:
                    pass
            if logged:
                after += 1

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: any(kind == "no connection" for _, _, kind, _ in outcomes))
        second = brokers(tmp_path / "second", count, "--port", str(port), data=str(first.data))
        second.wait_listening()
        assert second.port == port
        for t in threads:
            t.join(120)
    finally:
        done.set()
        for t in threads:
            t.join(120)

    # every client that got in found every queue, with its recovered message: no 404
    got_in = [(kind, detail) for _, _, kind, detail in outcomes if kind != "no connection"]
    assert got_in and all(kind == "ok" for kind, _ in got_in), got_in
    assert all(detail == [1] * count for _, detail in got_in), got_in
    # once the port was bound, the kernel held every connection until a worker took it
    after_bind = [(kind, detail) for bound, _, kind, detail in outcomes if bound]
    assert after_bind and all(kind == "ok" for kind, _ in after_bind), after_bind
    # and some of them were made before the broker said it listens: they waited
    assert any(not logged and kind == "ok" for _, logged, kind, _ in outcomes), outcomes
    assert second.stop() == 0


def positions(text: str, pattern: str) -> list[int]:
    return [m.start() for m in re.finditer(pattern, text)]


def test_the_listening_line_comes_once_every_worker_is_linked_and_in_sync(
    brokers, tmp_path: Path
) -> None:
    count = 3
    broker = brokers(tmp_path, count).wait_listening()
    text = broker.text()
    listening = text.index("Leveret listening for AMQP")
    for worker in range(count):
        for peer in range(count):
            if peer != worker:
                links = positions(
                    text, rf" worker {worker} leveret\.workers: link to worker {peer} up"
                )
                assert links and links[0] < listening, (worker, peer)
        accepting = positions(text, rf" worker {worker} leveret\.server: accepting AMQP")
        assert accepting and accepting[0] < listening
        if worker:
            synced = positions(
                text, rf" worker {worker} \S+: worker {worker} in sync with worker 0"
            )
            assert synced and synced[0] < accepting[0], worker
    # no worker accepts before every worker is linked and in sync
    gate = text.index("every worker is linked to every other and in sync: serving")
    assert all(p > gate for p in positions(text, r"accepting AMQP"))
    for worker in range(1, count):
        assert positions(text, rf"worker {worker} in sync with worker 0")[0] < gate
    assert broker.stop() == 0


@pytest.mark.parametrize("victim", [0, 1])
def test_a_restarted_worker_accepts_only_once_linked_and_in_sync(
    brokers, tmp_path: Path, victim: int
) -> None:
    count = 2
    broker = brokers(tmp_path, count).wait_listening()
    other = 1 - victim
    queue = name_on(other, count, "wk-ready-restart")
    conn = broker.connect("setup")
    conn.channel().queue_declare(queue, durable=True)
    conn.close()
    before = broker.status()["workers"][victim]
    os.kill(before["pid"], signal.SIGKILL)

    def back():
        """the victim running again, with a new pid, serving"""
        w = broker.status()["workers"][victim]
        return w["pid"] != before["pid"] and w["ready"] and w

    wait_for(back)
    text = broker.text()
    restart = text.index(f"worker {victim} exited (signal SIGKILL)")
    after = text[restart:]
    accepting = after.index(f" worker {victim} leveret.server: accepting AMQP")
    assert after.index(f" worker {victim} leveret.workers: link to worker {other} up") < accepting
    if victim:
        assert after.index(f"worker {victim} in sync with worker 0") < accepting
    else:
        # worker 0 accepts once the other worker asked it for its snapshot, which
        # the other logs as it applies it
        wait_for(lambda: f"worker {other} in sync with worker 0" in broker.text()[restart:])
    # clients of every worker find the other worker's queue
    for _ in range(8):
        c = broker.connect("after")
        c.channel().queue_declare(queue, passive=True)
        c.close()
    assert broker.stop() == 0
