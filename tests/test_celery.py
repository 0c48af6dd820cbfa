"""Celery and kombu patterns that rely on RabbitMQ's extensions."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
from urllib.parse import quote

import kombu
import pytest
import requests

from celery_app import BROKER_ENV, QUEUE_ENV, QUORUM_ENV, make_app
from conftest import EXTERNAL_URL, TEST_WORKERS, TESTS_DIR


@pytest.fixture
def own_vhost_url(amqp_url, request):
    """`amqp_url` on a vhost of this test's own. At one process each test's broker is
    its own already; the broker of workers (LEVERET_TEST_WORKERS) is shared by the
    run, where Celery's broker-wide names (kombu's `celery_delayed_*` queues and
    exchange) and kombu's process-wide connection pools, keyed by URL and closed by an
    earlier test's app, would otherwise carry over from test to test."""
    if not TEST_WORKERS or EXTERNAL_URL:
        yield amqp_url
        return
    api = request.getfixturevalue("workers_broker_api")
    vhost = f"leveret-test-celery-{uuid.uuid4().hex[:8]}"
    auth = ("guest", "guest")
    response = requests.put(f"{api}/vhosts/{vhost}", auth=auth, timeout=30)
    assert response.status_code == 201, response.text
    everything = {"configure": ".*", "write": ".*", "read": ".*"}
    response = requests.put(
        f"{api}/permissions/{vhost}/guest", json=everything, auth=auth, timeout=30
    )
    assert response.status_code in (201, 204), response.text  # 204: the creator has them
    try:
        yield amqp_url.rsplit("/", 1)[0] + "/" + quote(vhost, safe="")
    finally:
        requests.delete(f"{api}/vhosts/{vhost}", auth=auth, timeout=30)


@contextlib.contextmanager
def celery_worker(broker_url: str, queue: str, quorum: bool = False):
    """A real `celery worker` subprocess consuming ``queue``; always terminated."""
    env = dict(os.environ)
    env[BROKER_ENV] = broker_url
    env[QUEUE_ENV] = queue
    env[QUORUM_ENV] = "1" if quorum else ""
    env["PYTHONPATH"] = os.pathsep.join([TESTS_DIR, env.get("PYTHONPATH", "")])
    cmd = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "celery_app",
        "worker",
        "--pool=solo",
        "--concurrency=1",
        "-Q",
        queue,
        "--loglevel=INFO",
        "--without-gossip",
        "--without-mingle",
        "-n",
        f"leveret-test-{queue}@%h",
    ]
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(
            cmd, cwd=TESTS_DIR, env=env, stdout=log, stderr=subprocess.STDOUT, text=True
        )
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
            # shown by pytest when the test fails
            print(f"--- celery worker output (exit {proc.returncode}) ---")
            print(log.read())


def test_celery_worker_runs_tasks_with_rpc_backend(amqp_url, names):
    queue = names.queue("celery")
    app = make_app(amqp_url, queue)
    try:
        with celery_worker(amqp_url, queue) as worker:
            add = app.tasks["celery_app.add"]
            mul = app.tasks["celery_app.mul"]
            assert add.delay(2, 3).get(timeout=30) == 5
            assert worker.poll() is None
            results = [add.delay(i, i) for i in range(5)]
            assert [r.get(timeout=30) for r in results] == [0, 2, 4, 6, 8]
            assert mul.apply_async((6, 7)).get(timeout=30) == 42
            failing = app.tasks["celery_app.fail"].delay("boom")
            with pytest.raises(ValueError, match="boom"):
                failing.get(timeout=30)
            assert failing.state == "FAILURE"
    finally:
        _close_app(app)


def test_celery_on_quorum_queues_with_retries_and_countdown(own_vhost_url, names):
    """Celery 5.5+ with task_default_queue_type = "quorum": the worker sees quorum queues,
    consumes without global QoS (which a quorum queue refuses) and declares kombu's
    native delayed delivery: 28 levels of quorum queues with x-message-ttl,
    x-overflow reject-publish and at-least-once dead-lettering into the next level.
    Retries and countdowns travel through them. On a vhost of its own: the delay levels
    it checks are the ones its worker declared."""
    amqp_url = own_vhost_url
    queue = names.queue("celery-qq")
    app = make_app(amqp_url, queue, quorum=True)
    try:
        with celery_worker(amqp_url, queue, quorum=True) as worker:
            add = app.tasks["celery_app.add"]
            assert add.delay(2, 3).get(timeout=30) == 5
            assert [r.get(timeout=30) for r in [add.delay(i, i) for i in range(5)]] == [
                0,
                2,
                4,
                6,
                8,
            ]
            # Retried twice, 1 s apart, through the delay levels.
            assert app.tasks["celery_app.flaky"].delay(2).get(timeout=60) == 2
            # A countdown of 3 s (binary 11: levels 1 and 0) arrives, and not early.
            sent = time.monotonic()
            result = add.apply_async((40, 2), countdown=3)
            assert result.get(timeout=60) == 42
            assert time.monotonic() - sent >= 3
            with pytest.raises(ValueError, match="boom"):
                app.tasks["celery_app.fail"].delay("boom").get(timeout=30)
            assert worker.poll() is None
        with kombu.Connection(amqp_url, connect_timeout=5) as conn:
            ch = conn.channel()
            for level in (0, 13, 27):
                ch.queue_declare(f"celery_delayed_{level}", passive=True)
            # The task queue is a quorum queue: declaring it as classic is inequivalent.
            with pytest.raises(Exception, match="x-queue-type"):
                kombu.Queue(queue, durable=True)(conn.channel()).declare()
    finally:
        _close_app(app)


def _close_app(app) -> None:
    """Close the app's connections, the rpc backend's result consumer's included."""
    consumer = app.backend.result_consumer
    with contextlib.suppress(Exception):
        consumer.stop()
    if consumer._connection is not None:
        with contextlib.suppress(Exception):
            consumer._connection.close()
    with contextlib.suppress(Exception):
        app.pool.force_close_all()
    app.close()


# --- kombu's retry-with-delay through TTL and dead-lettering -----------------------


def _retry_topology(names):
    work_exchange = kombu.Exchange(names.exchange("work"), "direct", durable=False)
    work = kombu.Queue(names.queue("work"), work_exchange, routing_key="work", durable=False)
    retry = kombu.Queue(
        names.queue("retry"),
        kombu.Exchange("", "direct"),
        routing_key=None,
        durable=False,
        queue_arguments={
            "x-message-ttl": 100,
            "x-dead-letter-exchange": work_exchange.name,
            "x-dead-letter-routing-key": "work",
        },
    )
    retry.routing_key = retry.name
    return work_exchange, work, retry


@pytest.mark.parametrize("how", ["republish", "reject"])
def test_kombu_retry_with_delay(amqp_url, names, how):
    work_exchange, work, retry = _retry_topology(names)
    if how == "reject":
        # rejecting from the work queue dead-letters into the retry queue
        work.queue_arguments = {
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": retry.name,
        }
    attempts = []
    with kombu.Connection(amqp_url, connect_timeout=5) as conn:
        ch = conn.channel()
        work(ch).declare()
        retry(ch).declare()
        producer = kombu.Producer(ch)

        def on_message(body, message):
            headers = message.headers or {}
            deaths = headers.get("x-death") or []
            retry_count = next((d["count"] for d in deaths if d["queue"] == retry.name), 0)
            attempts.append((body, retry_count, time.monotonic(), deaths))
            if len(attempts) < 3:
                if how == "republish":
                    producer.publish(
                        body,
                        exchange="",
                        routing_key=retry.name,
                        headers=headers,
                        serializer="json",
                    )
                    message.ack()
                else:
                    message.reject(requeue=False)
            else:
                message.ack()

        producer.publish({"job": 1}, exchange=work_exchange, routing_key="work", serializer="json")
        with kombu.Consumer(ch, [work], callbacks=[on_message], accept=["json"]):
            deadline = time.monotonic() + 15
            while len(attempts) < 3 and time.monotonic() < deadline:
                with contextlib.suppress(TimeoutError):
                    conn.drain_events(timeout=0.5)
    assert [(body, count) for body, count, _t, _d in attempts] == [
        ({"job": 1}, 0),
        ({"job": 1}, 1),
        ({"job": 1}, 2),
    ]
    last_deaths = attempts[-1][3]
    assert last_deaths[0]["queue"] == retry.name
    assert last_deaths[0]["reason"] == "expired"
    assert last_deaths[0]["exchange"] == ""
    assert last_deaths[0]["routing-keys"] == [retry.name]
    if how == "reject":
        assert [(d["queue"], d["reason"], d["count"]) for d in last_deaths] == [
            (retry.name, "expired", 2),
            (work.name, "rejected", 2),
        ]
        assert last_deaths[1]["exchange"] == work_exchange.name
        assert last_deaths[1]["routing-keys"] == ["work"]
    else:
        assert len(last_deaths) == 1
