"""Parts of a worker stuck while its event loop runs (and answers pings): a link to
another worker whose reader is stuck is found by the round trips the liveness
check makes over each link, and one worker of the pair is killed and restarted; a
store writer that does not come back from the disk is reported, and not killed.

The rules run on given times (`Liveness.stuck_parts`); the faults are injected into
real `leveret server --workers 2` processes with their test hooks
(`STUCK_LINK_ENV`: a worker stops reading one link; `STUCK_FILE_ENV`: the store's
writer waits while a file exists)."""

from __future__ import annotations

import sys
import threading

import pika
import pytest

from leveret.store.committer import STUCK_FILE_ENV
from leveret.worker import STUCK_LINK_ENV
from leveret.workers.liveness import Liveness, Probes
from workers.procs import name_on, wait_for
from workers.procs import workers as workers  # the fixture  # noqa: PLC0414

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers: Linux")


def _two(timeout: float = 10.0) -> Liveness:
    liveness = Liveness(timeout)
    liveness.ready(0, 0.0)
    liveness.ready(1, 0.0)
    liveness.tick(0.0)  # ping 1 to each
    return liveness


def test_a_link_that_answers_no_round_trip_while_both_loops_run_kills_the_higher_index() -> None:
    liveness = _two()
    liveness.answered(0, 1, 9.0, {1: 9.0})
    liveness.answered(1, 1, 9.0, {0: 9.0})
    assert liveness.stuck_parts() == ([], [])  # 9 s: not yet
    liveness.answered(0, 1, 12.0, {1: 12.0})
    liveness.answered(1, 1, 12.0, {0: 12.0})
    assert liveness.stuck_parts() == ([(1, 0, 12.0)], [])  # once for the pair
    assert liveness.stuck_parts() == ([], [])  # reported once: the caller kills it


def test_a_probe_to_a_peer_whose_loop_stopped_is_left_to_the_loop_rule() -> None:
    liveness = _two()
    liveness.answered(1, 1, 2.0)  # worker 1's last answer: then it stops
    liveness.answered(0, 1, 12.0, {1: 11.0})  # its probe went out at 1 s
    assert liveness.stuck_parts() == ([], [])  # counted to 2 s only
    hung: list = []
    for now in (1.5, 3.0, 4.5, 6.0, 7.5, 9.0, 10.5, 12.0, 12.5):
        hung += liveness.tick(now)[1]
    assert hung == [(1, 10.5)]  # the loop rule finds it


def test_a_probe_counts_only_from_the_peers_start() -> None:
    liveness = Liveness(10.0)
    liveness.ready(0, 0.0)
    liveness.tick(0.0)
    liveness.ready(1, 8.0)  # it read its store back until 8 s: its links came then
    liveness.tick(8.0)
    liveness.answered(1, 1, 15.0, {})
    liveness.answered(0, 1, 15.0, {1: 15.0})
    assert liveness.stuck_parts() == ([], [])  # 7 s since worker 1 was up


def test_a_stuck_store_writer_is_reported_once_and_again_when_it_moves_on() -> None:
    liveness = _two()
    liveness.answered(1, 1, 5.0, {}, store=4.0)
    assert liveness.stuck_parts() == ([], [])
    liveness.answered(1, 1, 11.0, {}, store=10.5)
    assert liveness.stuck_parts() == ([], [(1, 10.5, True)])
    liveness.answered(1, 1, 13.0, {}, store=12.5)
    assert liveness.stuck_parts() == ([], [])  # no kill, no second report
    liveness.answered(1, 1, 14.0, {}, store=0.0)
    assert liveness.stuck_parts() == ([], [(1, 0.0, False)])
    assert not liveness.watches[1].hung


def test_probes_keep_one_out_per_link() -> None:
    probes = Probes()
    assert probes.due([1, 2]) == [1, 2]
    first, second = object(), object()
    probes.sent(1, first, 1.0)
    probes.sent(2, second, 1.0)
    assert probes.due([1, 2]) == []
    assert probes.waits(3.5) == {1: 2.5, 2: 2.5}
    probes.done(1, object())  # not the one out
    probes.done(2, second)
    assert probes.due([1, 2]) == [2]
    assert probes.waits(4.0) == {1: 3.0}


@linux
def test_a_link_stuck_while_both_loops_run_gets_a_worker_killed_and_restarted(
    workers, tmp_path, monkeypatch
) -> None:
    flag = tmp_path / "stuck-link"
    monkeypatch.setenv(STUCK_LINK_ENV, str(flag))
    broker = workers(
        2, "--worker-liveness-timeout", "3", "--worker-affinity", "off"
    ).wait_listening()
    before = broker.status()["workers"][1]
    flag.write_text("1 0")  # worker 1 stops reading its link to worker 0

    def restarted():
        """worker 1 running again, with a new pid, ready"""
        w = broker.status()["workers"][1]
        return w["pid"] != before["pid"] and w["state"] == "running" and w["ready"] and w

    again = wait_for(restarted)
    assert not flag.exists()  # the hook acted (once)
    assert again["hangs"] == 1
    text = broker.text()
    assert "test fault: the link to worker 0 stops reading" in text
    assert f"worker 1 (pid {before['pid']}) is stuck: its link with worker 0 answered" in text
    assert "is hung" not in text  # its loop answered every ping
    assert broker.status()["workers"][0]["hangs"] == 0
    # the new link carries messages: a queue of worker 1 through a client of worker 0
    conn = broker.connect_to(0, "wk-resilience-link")
    ch = conn.channel()
    ch.confirm_delivery()
    queue = name_on(1, "wk-resilience-link")
    ch.queue_declare(queue)
    ch.basic_publish("", queue, b"after", mandatory=True)
    assert ch.basic_get(queue, auto_ack=True)[2] == b"after"
    conn.close()


@linux
def test_a_stuck_store_writer_is_reported_not_killed(workers, tmp_path, monkeypatch) -> None:
    flag = tmp_path / "stuck-store"
    monkeypatch.setenv(STUCK_FILE_ENV, str(flag))
    broker = workers(
        2, "--worker-liveness-timeout", "3", "--worker-affinity", "off"
    ).wait_listening()
    queue = name_on(1, "wk-resilience-store")
    conn = broker.connect_to(1, "wk-resilience-store")
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(queue, durable=True)
    pid = broker.status()["workers"][1]["pid"]
    flag.write_text("")
    confirmed: list[object] = []

    def publish() -> None:
        try:
            ch.basic_publish(
                "", queue, b"kept", pika.BasicProperties(delivery_mode=2), mandatory=True
            )
            confirmed.append(True)
        except Exception as exc:  # noqa: BLE001 - the assertion below shows it
            confirmed.append(exc)

    publisher = threading.Thread(target=publish)
    publisher.start()
    try:
        wait_for(lambda: broker.status()["workers"][1]["store_stuck"])
        assert "worker 1's store writer has been on one write and fsync for" in broker.text()
        assert confirmed == []  # its confirm waits for the disk
    finally:
        flag.unlink()
        publisher.join(60)
    assert confirmed == [True]
    wait_for(lambda: not broker.status()["workers"][1]["store_stuck"])
    w = broker.status()["workers"][1]
    assert w["pid"] == pid and w["hangs"] == 0 and w["restarts"] == 0
    assert "worker 1's store writer moves on again" in broker.text()
    assert ch.basic_get(queue, auto_ack=True)[2] == b"kept"
    conn.close()
