"""A worker that hangs without exiting (SIGSTOP), under `leveret server --workers 2`
with a short `--worker-liveness-timeout`: the supervisor finds it, kills it and
restarts it, and the other worker's clients get what they get when a worker dies."""

from __future__ import annotations

import os
import signal
import sys
import threading

import pika
import pika.exceptions
import pytest

from leveret.workers.mesh import placement
from workers.procs import alive, wait_for
from workers.procs import workers as workers  # the fixture  # noqa: PLC0414

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers: Linux")


def on_worker(owner: int, prefix: str) -> str:
    """A queue name that worker `owner` of two owns."""
    return next(f"{prefix}-{n}" for n in range(1000) if placement("/", f"{prefix}-{n}", 2) == owner)


def test_a_stopped_worker_is_killed_restarted_and_keeps_its_durable_messages(workers) -> None:
    # Affinity off: the client on worker 0 keeps crossing to worker 1's queues.
    broker = workers(
        2, "--worker-liveness-timeout", "3", "--worker-affinity", "off"
    ).wait_listening()
    kept, consumed = on_worker(1, "wk-live-kept"), on_worker(1, "wk-live-consumed")
    client = broker.connect_to(0, "wk-live-client")
    ch = client.channel()
    ch.confirm_delivery()
    for queue in (kept, consumed):
        ch.queue_declare(queue, durable=True)
    for n in range(20):
        ch.basic_publish(
            "", kept, f"m{n}".encode(), pika.BasicProperties(delivery_mode=2), mandatory=True
        )
    cancelled: list[str] = []
    consumer = client.channel()
    consumer.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = consumer.basic_consume(consumed, lambda *a: None)

    declarer = broker.connect_to(0, "wk-live-declarer")
    made = on_worker(0, "wk-live-made")
    declared: list[object] = []

    def declare() -> None:
        # A metadata change waits for every live worker to apply it: worker 1 too.
        try:
            declared.append(declarer.channel().queue_declare(made, durable=True).method.queue)
        except Exception as exc:  # noqa: BLE001 - the assertion below shows it
            declared.append(exc)

    hung = broker.status()["workers"][1]
    os.kill(hung["pid"], signal.SIGSTOP)
    meta = threading.Thread(target=declare)
    meta.start()
    try:
        # The link to worker 1 is up but nothing answers: this confirm waits until the
        # supervisor kills worker 1, and is then nacked as for a worker that died.
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish(
                "", kept, b"in-flight", pika.BasicProperties(delivery_mode=2), mandatory=True
            )

        def restarted():
            """worker 1 running again, with a new pid, ready"""
            w = broker.status()["workers"][1]
            return w["pid"] != hung["pid"] and w["state"] == "running" and w["ready"] and w

        again = wait_for(restarted)
    finally:
        if alive(hung["pid"]):
            os.kill(hung["pid"], signal.SIGKILL)
        meta.join(60)
    assert declared == [made]  # completed without the hung worker
    declarer.close()
    assert again["restarts"] == 1
    assert again["hangs"] == 1
    assert again["last_exit"] == -signal.SIGKILL
    assert broker.status()["workers"][0]["restarts"] == 0
    log = broker.text()
    assert f"worker 1 (pid {hung['pid']}) is hung: it answered no liveness ping" in log
    assert "killing it with SIGKILL to restart it" in log

    # the consumer on worker 1's queue was cancelled, as when a worker dies
    wait_for(lambda: client.process_data_events(time_limit=0.05) or cancelled)
    assert cancelled == [tag]

    # worker 1's queue serves again (once worker 0's link to the new worker 1 is up),
    # with the 20 confirmed persistent messages it held
    def back():
        """the kept queue's 20 messages, through worker 0"""
        try:
            conn = broker.connect_to(0, "wk-live-after")
        except pika.exceptions.AMQPError:
            return None
        try:
            got = conn.channel().queue_declare(kept, passive=True).method.message_count
            return conn if got == 20 else None
        except pika.exceptions.AMQPError:
            conn.close()
            return None

    after = wait_for(back)
    ch = after.channel()
    bodies = []
    while (got := ch.basic_get(kept, auto_ack=True))[0] is not None:
        bodies.append(got[2])
    assert bodies == [f"m{n}".encode() for n in range(20)]
    ch.confirm_delivery()
    ch.basic_publish("", consumed, b"again", pika.BasicProperties(delivery_mode=2))
    assert ch.queue_declare(made, passive=True).method.queue == made
    for queue in (kept, consumed, made):
        ch.queue_delete(queue)
    after.close()
    assert broker.stop() == 0
