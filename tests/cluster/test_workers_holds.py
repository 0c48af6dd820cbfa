"""A leader of workers answers a definition change only once its followers hold it:
three real nodes of `--workers 2` on a real etcd. While no follower runs, queues of
both workers are deleted over AMQP, a queue of worker 1 is declared over AMQP and one
over the management API of the leader's worker 0, and one is deleted there: none is
answered (delete-ok, declare-ok, 201, 204) until a follower is back and holds it.
Then the whole leader is SIGKILLed at once: on the new leader the deleted queues are
gone and the declared ones are there."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pika
import pika.exceptions
import pytest

from leveret.workers.mesh import placement

from .cluster_support import LEASE, Cluster, needs_etcd
from .test_failover import _connect
from .test_workers_failover import WORKERS, _kill_whole_node

pytestmark = [needs_etcd, pytest.mark.slow]


def _exists(urls: list[str], queue: str, deadline: float = 60.0) -> bool:
    """Whether the leader has `queue` (a passive declare: 404 when it does not). A new
    leader's workers start one by one, and a leader may still hand over after a
    failover: a connection cut or a queue whose worker is not up yet is asked again."""
    end = time.monotonic() + deadline
    while True:
        try:
            conn = _connect(urls, deadline=60)
            try:
                conn.channel().queue_declare(queue, passive=True)
                return True
            except pika.exceptions.ChannelClosedByBroker as exc:
                assert exc.reply_code == 404, exc
                if "is down or inaccessible" not in exc.reply_text:
                    return False
            finally:
                if conn.is_open:
                    conn.close()
        except pika.exceptions.AMQPConnectionError:
            pass
        assert time.monotonic() < end, f"no answer about {queue}"
        time.sleep(0.3)


def _queue_request(port: int, method: str, name: str) -> int:
    """PUT (a durable queue) or DELETE a queue through the management API; the HTTP
    status."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/queues/%2F/{name}",
        data=json.dumps({"durable": True}).encode() if method == "PUT" else None,
        method=method,
        headers={
            "Content-Type": "application/json",
            "Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q=",  # guest:guest
        },
    )
    with urllib.request.urlopen(req, timeout=60) as res:
        return res.status


def test_answers_of_a_leader_of_workers_wait_for_its_followers(cluster_dir: str) -> None:
    """With both followers down, no answer leaves; one follower back, they do; then the
    whole leader SIGKILLed: the new leader (that follower) has every answered change."""
    on = {w: _names(w) for w in range(WORKERS)}
    deleted = [on[0][0], on[1][0]]  # one queue of each worker
    declared = on[1][1]  # declared over AMQP
    put = on[1][2]  # declared over the management API of worker 0
    removed = on[1][3]  # deleted over the management API of worker 0
    cluster = Cluster(cluster_dir, extra=("--workers", str(WORKERS)), management=True)
    try:
        names = {n.name for n in cluster.nodes}
        leader = cluster.wait_leader(timeout=60)
        cluster.wait_in_sync(names, timeout=60)
        conn = _connect([leader.url], deadline=60)
        ch = conn.channel()
        for queue in deleted:
            ch.queue_declare(queue, durable=True)
            ch.basic_publish("", queue, b"x")
        ch.queue_declare(removed, durable=True)
        conn.close()
        cluster.wait_in_sync(names, timeout=60)
        followers = [n for n in cluster.nodes if n is not leader]
        for node in followers:
            node.kill()
        answers: dict[str, object] = {}
        changes = [
            *(threading.Thread(target=_delete, args=(leader.url, q, answers)) for q in deleted),
            threading.Thread(target=_declare, args=(leader.url, declared, answers)),
            threading.Thread(target=_http, args=(leader.management_port, "PUT", put, answers)),
            threading.Thread(
                target=_http, args=(leader.management_port, "DELETE", removed, answers)
            ),
        ]
        for thread in changes:
            thread.start()
        time.sleep(3 * LEASE)
        # No follower holds them: nothing is answered (and nothing fails either).
        assert answers == {}
        back = next((n for n in followers if n.name not in cluster.in_sync()), followers[0])
        back.start()
        for thread in changes:
            thread.join(60)
        assert answers == {
            deleted[0]: ("delete-ok", 1),
            deleted[1]: ("delete-ok", 1),
            declared: "declare-ok",
            put: 201,
            removed: 204,
        }, cluster.logs()[-5000:]
        _kill_whole_node(leader)  # at once, right after the answers
        new = cluster.wait_leader(other_than=leader.name, timeout=60)
        assert new is back  # the only node whose copy holds what was answered
        for queue in deleted:
            assert not _exists([new.url], queue), f"{queue} was deleted (delete-ok) before"
        assert _exists([new.url], declared), "declare-ok'd before the kill"
        assert _exists([new.url], put), "201 from the management API before the kill"
        assert not _exists([new.url], removed), "204 from the management API before the kill"
    finally:
        cluster.close()


def _delete(url: str, queue: str, answers: dict[str, object]) -> None:
    try:
        conn = _connect([url], deadline=60)
        ok = conn.channel().queue_delete(queue)
        answers[queue] = ("delete-ok", ok.method.message_count)
        conn.close()
    except Exception as exc:  # noqa: BLE001 - the test's assertion shows it
        answers[queue] = exc


def _declare(url: str, queue: str, answers: dict[str, object]) -> None:
    try:
        conn = _connect([url], deadline=60)
        ok = conn.channel().queue_declare(queue, durable=True)
        answers[queue] = "declare-ok" if ok.method.queue == queue else ok.method
        conn.close()
    except Exception as exc:  # noqa: BLE001 - the test's assertion shows it
        answers[queue] = exc


def _http(port: int, method: str, queue: str, answers: dict[str, object]) -> None:
    try:
        answers[queue] = _queue_request(port, method, queue)
    except Exception as exc:  # noqa: BLE001 - the test's assertion shows it
        answers[queue] = exc


def _names(worker: int) -> list[str]:
    """Four queue names that workers place on `worker`."""
    names = (f"wk-hold-{i}" for i in range(1000))
    return [n for n in names if placement("/", n, WORKERS) == worker][:4]
