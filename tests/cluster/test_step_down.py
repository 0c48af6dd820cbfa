"""A leader that stops leading confirms nothing more, however long its broker takes to
stop: a write it confirmed then would be on its own disk only, to be replaced when it
follows. The node closes its clients first, keeps the stopped tap the store's until
the broker has stopped, and a stopped tap releases nothing."""

from __future__ import annotations

import asyncio
import base64
import signal
import socket
import threading
import time

import pika
import pytest

from leveret.cluster.leader import Tap
from leveret.store.replica import NotLeading

from .cluster_support import Cluster, needs_etcd
from .test_failover import _connect, _drain, check_delivery

STEPPING_DOWN = "stepping down"  # what a leader logs as it gives the lead up


def _hold_management(port: int) -> socket.socket:
    """An HTTP request to a node's management API whose body never comes.

    Its handler waits for the body, and a broker that stops waits for the handlers
    in progress: so the node's stop lasts until the socket closes. (Any slow client
    of the management API does the same; this one is slow for as long as the test
    wants.)"""
    auth = base64.b64encode(b"guest:guest").decode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(
        (
            "PUT /api/vhosts/step-down-held HTTP/1.1\r\n"
            "Host: 127.0.0.1\r\n"
            f"Authorization: Basic {auth}\r\n"
            "Content-Type: application/json\r\n"
            "Content-Length: 64\r\n\r\n{"
        ).encode()
    )
    return sock


def _wait_log(node, text: str, timeout: float = 30.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while text not in node.log_text():
        assert time.monotonic() < deadline, node.log_text()[-3000:]
        time.sleep(0.02)


@needs_etcd
@pytest.mark.slow
def test_deposed_leader_confirms_nothing_while_it_stops(cluster_dir: str) -> None:
    """The leader is paused past its lease; another node leads. Resumed, the old
    leader steps down while a management request in progress holds its broker's
    stop, and a client connected to it straight publishes. That publish is not
    confirmed (it is on no other node; the old leader's copy is replaced when it
    follows): the connection is closed, and every message that was confirmed is on
    the new leader."""
    cluster = Cluster(cluster_dir, management=True)
    held: socket.socket | None = None
    try:
        old = cluster.wait_leader()
        cluster.wait_in_sync({n.name for n in cluster.nodes})
        conn = _connect([old.url])
        ch = conn.channel()
        ch.confirm_delivery()
        queue = "step-down"
        ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        confirmed: set[int] = set()
        for value in range(10):
            ch.basic_publish("", queue, str(value).encode(), pika.BasicProperties(delivery_mode=2))
            confirmed.add(value)
        cluster.wait_in_sync({n.name for n in cluster.nodes})
        held = _hold_management(old.management_port)

        old.signal(signal.SIGSTOP)
        try:
            new = cluster.wait_leader(other_than=old.name)
        finally:
            old.signal(signal.SIGCONT)
        _wait_log(old, STEPPING_DOWN)

        # The old leader is stopping (its management API holds the stop): publish on
        # this client's connection to it, open or being closed.
        outcome: list[str] = []

        def publish() -> None:
            try:
                ch.basic_publish("", queue, b"10", pika.BasicProperties(delivery_mode=2))
                outcome.append("confirmed")
            except (pika.exceptions.AMQPError, OSError) as exc:
                outcome.append(f"failed: {exc.__class__.__name__}")

        publisher = threading.Thread(target=publish, daemon=True)
        publisher.start()
        # A confirm, if the old leader gives one, comes at its next fsync; nothing else
        # is to come before the stop goes on.
        publisher.join(5)
        held.close()  # the management request ends: the old leader's stop goes on
        held = None
        publisher.join(30)
        assert outcome, "the publish neither confirmed nor failed once the old leader stopped"
        if outcome == ["confirmed"]:
            confirmed.add(10)
        got = _drain(cluster.urls(new), queue)
        check_delivery(got, confirmed, set(range(11)))
        assert outcome != ["confirmed"], (
            "the old leader confirmed a publish after it stopped leading\n" + cluster.logs()
        )
        try:
            conn.close()
        except Exception:
            pass
    except Exception:
        print(cluster.logs())
        raise
    finally:
        if held is not None:
            held.close()
        cluster.close()


def test_a_stopped_tap_releases_nothing(tmp_path) -> None:
    """Confirms held when the tap stops never run, nor do those handed to it later
    (the store's writer hands it every batch while the broker stops); a wait for the
    followers fails with NotLeading, at once or when the tap stops."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        tap = Tap(str(tmp_path), loop)
        safe = -1
        tap.safe = lambda: safe
        ran: list[str] = []

        def batch(name: str) -> list:
            return [(lambda exc: ran.append(name), None)]

        tap.write(str(tmp_path / "seg"), 0, [b"one"])
        tap.release(tap.position, batch("live"))
        waiting = asyncio.ensure_future(tap.wait_safe(tap.position))
        await asyncio.sleep(0.05)
        assert ran == [] and not waiting.done()  # held: the followers lack it
        safe = tap.position
        tap.check()
        await asyncio.sleep(0.05)
        assert ran == ["live"] and waiting.done()  # they hold it: released

        tap.write(str(tmp_path / "seg"), 3, [b"two"])
        tap.release(tap.position, batch("held"))
        waiting = asyncio.ensure_future(tap.wait_safe(tap.position))
        await asyncio.sleep(0.05)
        tap.stop()
        with pytest.raises(NotLeading):
            await asyncio.wait_for(waiting, 10)  # (a bound: it fails at once)
        tap.write(str(tmp_path / "seg"), 6, [b"three"])
        tap.release(tap.position, batch("after"))
        tap.when_safe(tap.position, lambda: ran.append("when_safe"))
        safe = tap.position  # even where the followers held it
        tap.check()
        await asyncio.sleep(0.05)
        assert ran == ["live"]
        assert not tap.reached(tap.position)
        with pytest.raises(NotLeading):
            await tap.wait_safe(tap.position)

    asyncio.run(main())
