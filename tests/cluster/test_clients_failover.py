"""The leader SIGKILLed under load, with aio-pika and with a Celery worker and producer.

(pika with several hosts and leveret.client are in test_failover.py.) The claims: no
confirmed message is lost, the first copies come in publish order, and the only
duplicates are of messages whose publish was not confirmed; for Celery, every task
whose publish was confirmed runs at least once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aio_pika
import pytest

from .cluster_support import Cluster, needs_etcd
from .test_failover import _drain, check_delivery

pytestmark = [needs_etcd, pytest.mark.slow]

HERE = Path(__file__).resolve().parent


def test_leader_sigkill_aio_pika(cluster: Cluster) -> None:
    """aio-pika takes one URL: it is given a follower's, which passes the connection to
    whichever node leads (a load balancer in front of the nodes works the same)."""
    leader = cluster.wait_leader()
    entry = next(n for n in cluster.nodes if n is not leader)
    confirmed: set[int] = set()
    retried: set[int] = set()
    consumed: list[tuple[int, bool]] = []  # (value, redelivered)

    async def run() -> None:
        conn = await aio_pika.connect_robust(entry.url, reconnect_interval=0.2)
        pub = await conn.channel(publisher_confirms=True)
        await pub.declare_queue("aio", durable=True)
        sub = await conn.channel()
        await sub.set_qos(prefetch_count=50)
        queue = await sub.declare_queue("aio", durable=True)

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            consumed.append((int(message.body), message.redelivered))
            await message.ack()

        await queue.consume(on_message)
        for value in range(900):
            if value == 300:
                leader.kill()
            while True:
                try:
                    await pub.default_exchange.publish(
                        aio_pika.Message(
                            str(value).encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT
                        ),
                        routing_key="aio",
                        timeout=10,
                    )
                    break
                except Exception:  # noqa: BLE001 - lost, not confirmed: publish again
                    retried.add(value)
                    await asyncio.sleep(0.1)
            confirmed.add(value)
        deadline = time.monotonic() + 60
        while not confirmed <= {v for v, _ in consumed} and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await conn.close()

    asyncio.run(run())
    assert cluster.leader_name() != leader.name
    rest = _drain(cluster.urls(), "aio")
    # A delivery whose ack died with the old leader comes again, marked redelivered
    # (at least once); every other copy of a value is a message of its own, and only
    # a publish that was not confirmed may have made two.
    check_delivery([v for v, _ in consumed] + rest, confirmed, set(range(900)))
    fresh = [v for v, redelivered in consumed if not redelivered] + rest
    twice = {v for v in fresh if fresh.count(v) > 1}
    assert twice <= retried, f"duplicates of confirmed messages: {sorted(twice - retried)}"


@contextlib.contextmanager
def celery_worker(broker_url: str, record: str):
    env = dict(os.environ)
    env["LEVERET_CELERY_BROKER_URL"] = broker_url
    env["LEVERET_CELERY_RECORD"] = record
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    cmd = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "celery_failover",
        "worker",
        "--pool=solo",
        "--loglevel=INFO",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-n",
        "failover@%h",
    ]
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(cmd, cwd=str(HERE), env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            log.seek(0)
            print(f"--- celery worker output (exit {proc.returncode}) ---")
            print(log.read()[-20000:])


def test_leader_sigkill_celery(cluster: Cluster, tmp_path: Path) -> None:
    sys.path.insert(0, str(HERE))
    try:
        from celery_failover import make_app
    finally:
        sys.path.remove(str(HERE))

    broker_url = ";".join(cluster.urls())
    record = tmp_path / "ran.txt"
    record.touch()
    app = make_app(broker_url)
    confirmed: set[int] = set()
    failed: set[int] = set()
    try:
        with celery_worker(broker_url, str(record)) as worker:
            leader = cluster.wait_leader()
            for i in range(400):
                if i == 150:
                    leader.kill()
                try:
                    app.send_task("celery_failover.record", (i,))
                    confirmed.add(i)
                except Exception:  # noqa: BLE001 - not confirmed: it may or may not run
                    failed.add(i)
            assert len(confirmed) > 300, f"{len(failed)} publishes failed: {sorted(failed)[:10]}"
            deadline = time.monotonic() + 120
            ran: set[int] = set()
            while time.monotonic() < deadline:
                ran = {int(line) for line in record.read_text().split()}
                if confirmed <= ran:
                    break
                assert worker.poll() is None, "the celery worker exited"
                time.sleep(0.5)
            lost = confirmed - ran
            assert not lost, f"{len(lost)} confirmed task(s) never ran, e.g. {sorted(lost)[:10]}"
            assert cluster.leader_name() != leader.name
    finally:
        with contextlib.suppress(Exception):
            app.pool.force_close_all()
        app.close()
