"""SIGKILL of one worker of `leveret server --workers 2` under confirmed publishing.

Publishers with confirms send persistent messages to durable classic, quorum and
stream queues placed on both workers (by `placement`), and one publishes to a fanout
exchange bound to a classic queue on each worker, so its messages cross workers;
consumers ack on the classic queues; with `--worker-affinity off` every client may
cross workers, and a consumer whose queue's worker is killed gets basic.cancel and
consumes again, as a RabbitMQ client does when a queue's node goes down. Each round SIGKILLs one worker (each in turn);
the supervisor restarts it, every client reconnects and carries on. At the end every
queue is drained, and every message the broker confirmed must be there or have been
consumed: none lost, and a publisher's messages keep their order in each queue
(a message seen twice is counted when it is not marked redelivered).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pika
import pika.exceptions
import pytest

from workers.procs import Workers, kill_and_wait, name_on, wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers: Linux")

FANOUT = "wk-kill-fan"
#: errors of a connection the broker lost or closed: the client reconnects
LOST = (pika.exceptions.AMQPError, OSError)


class Load:
    """The clients and what they saw: confirmed ids per queue, deliveries per queue."""

    def __init__(self, broker: Workers, kinds: tuple[str, ...]) -> None:
        self.broker = broker
        self.kinds = kinds
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.queues: dict[str, str] = {}  # name -> kind
        self.confirmed: dict[str, list[str]] = {}  # queue -> confirmed ids in send order
        self.seen: dict[str, list[tuple[str, bool]]] = {}  # queue -> (id, redelivered)
        self.progress: dict[str, int] = {}  # client -> count of confirms / deliveries
        self.in_doubt = 0  # publishes whose confirm never came (connection lost)
        self.nacked: dict[str, int] = {}  # publisher -> nacks and unroutable returns
        self.reconnects = 0
        self.cancels = 0  # basic.cancel from the broker: the queue's worker went down
        self.doing: dict[str, str] = {}  # client -> what it waits for now (diagnostics)
        self.threads: list[threading.Thread] = []

    def connect(self, name: str) -> pika.BlockingConnection:
        self.doing[name] = "connecting"
        while True:
            try:
                return self.broker.connect(name)
            except LOST:
                if self.stop.is_set():
                    raise
                with self.lock:
                    self.reconnects += 1
                time.sleep(0.1)

    def declare(self) -> None:
        conn = self.broker.connect("wk-kill-setup")
        ch = conn.channel()
        ch.exchange_declare(FANOUT, "fanout", durable=True)
        for worker in (0, 1):
            for kind in self.kinds:
                name = name_on(worker, f"wk-kill-{kind}-w{worker}")
                ch.queue_declare(name, durable=True, arguments={"x-queue-type": kind})
                self.queues[name] = kind
                self.confirmed[name] = []
                self.seen[name] = []
                if kind == "classic":
                    ch.queue_bind(name, FANOUT)
        conn.close()

    def start(self) -> None:
        for name in self.queues:
            self._thread(self.publisher, name, [name], "", name)
        classic = [n for n, k in self.queues.items() if k == "classic"]
        self._thread(self.publisher, "fan", classic, FANOUT, "")
        for name in classic:
            self._thread(self.consumer, name)

    def _thread(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self.threads.append(thread)
        thread.start()

    def publisher(self, pub: str, queues: list[str], exchange: str, key: str) -> None:
        seq = 0
        props = pika.BasicProperties(delivery_mode=2)
        while not self.stop.is_set():
            try:
                conn = self.connect(f"wk-kill-pub-{pub}")
            except LOST:
                return
            try:
                self.doing[f"wk-kill-pub-{pub}"] = "channel.open-ok, confirm.select-ok"
                ch = conn.channel()
                ch.confirm_delivery()
                while not self.stop.is_set():
                    seq += 1
                    msg_id = f"{pub}:{seq}"
                    props.message_id = msg_id
                    self.doing[f"wk-kill-pub-{pub}"] = f"confirm of {msg_id}"
                    try:
                        ch.basic_publish(exchange, key, msg_id.encode(), props, mandatory=True)
                    except (pika.exceptions.NackError, pika.exceptions.UnroutableError):
                        with self.lock:
                            self.nacked[pub] = self.nacked.get(pub, 0) + 1
                        time.sleep(0.01)  # the queue's worker is down: try again shortly
                        continue
                    except LOST:
                        with self.lock:
                            self.in_doubt += 1
                        raise
                    with self.lock:
                        for q in queues:
                            self.confirmed[q].append(msg_id)
                        self.progress[pub] = self.progress.get(pub, 0) + 1
                    time.sleep(0.003)
            except LOST:
                pass
            finally:
                _close(conn)

    def consumer(self, queue: str) -> None:
        while not self.stop.is_set():
            try:
                conn = self.connect(f"wk-kill-sub-{queue}")
            except LOST:
                return
            try:
                self.doing[f"wk-kill-sub-{queue}"] = "channel.open-ok"
                ch = conn.channel()
                self.doing[f"wk-kill-sub-{queue}"] = "basic.qos-ok"
                ch.basic_qos(prefetch_count=20)

                def on_message(ch, method, props, body) -> None:
                    with self.lock:
                        self.seen[queue].append((props.message_id, method.redelivered))
                        key = f"sub-{queue}"
                        self.progress[key] = self.progress.get(key, 0) + 1
                    ch.basic_ack(method.delivery_tag)

                self.doing[f"wk-kill-sub-{queue}"] = "basic.consume-ok"
                ch.basic_consume(queue, on_message)
                self.doing[f"wk-kill-sub-{queue}"] = "deliveries"
                while not self.stop.is_set():
                    conn.process_data_events(time_limit=0.2)
                    if not ch.consumer_tags:
                        # basic.cancel from the broker (the queue's worker went down, as
                        # RabbitMQ cancels when a queue's node goes): consume again.
                        with self.lock:
                            self.cancels += 1
                        break
            except LOST:
                time.sleep(0.05)  # a consume of a queue whose worker is down: 404
            finally:
                _close(conn)

    def moved_on(self, since: dict[str, int], by: int = 20) -> bool:
        """every client made `by` more confirms / deliveries than in `since`"""
        with self.lock:
            return all(n >= since.get(k, 0) + by for k, n in self.progress.items())

    def stalled(self, since: dict[str, int], by: int = 20) -> dict[str, str]:
        """The clients that did not move on: what they count and wait for."""
        with self.lock:
            return {
                k: f"{since.get(k, 0)} -> {n}, waiting for {self.doing.get(_client(k), '?')}"
                for k, n in self.progress.items()
                if n < since.get(k, 0) + by
            }

    def halt(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
            assert not thread.is_alive(), "a client did not stop"

    def drain(self) -> None:
        """Reads what each queue holds now: basic.get on classic and quorum queues,
        a consumer from the first offset on a stream."""
        for name, kind in self.queues.items():
            conn = self.broker.connect(f"wk-kill-drain-{name}")
            ch = conn.channel()
            if kind == "stream":
                self._drain_stream(conn, ch, name)
            else:
                while True:
                    method, props, _body = ch.basic_get(name, auto_ack=True)
                    if method is None:
                        break
                    self.seen[name].append((props.message_id, method.redelivered))
            conn.close()

    def _drain_stream(self, conn, ch, name: str) -> None:
        want = set(self.confirmed[name])
        got: list[tuple[str, bool]] = []
        ch.basic_qos(prefetch_count=200)

        def on_message(ch, method, props, body) -> None:
            got.append((props.message_id, method.redelivered))
            ch.basic_ack(method.delivery_tag)

        ch.basic_consume(name, on_message, arguments={"x-stream-offset": "first"})
        idle_since = time.monotonic()
        count = 0
        while time.monotonic() - idle_since < 5 and not want <= {m for m, _ in got}:
            conn.process_data_events(time_limit=0.2)
            if len(got) != count:
                count, idle_since = len(got), time.monotonic()
        self.seen[name].extend(got)


def _client(key: str) -> str:
    """The connection name of the client that counts under `key` in `progress`."""
    return f"wk-kill-{key}" if key.startswith("sub-") else f"wk-kill-pub-{key}"


def stall_report(broker: Workers, load: Load, since: dict[str, int], victim: int) -> str:
    """What a failed wait shows: the clients that stopped, where each connection is,
    the workers' status file and the end of the broker's log."""
    lines = [f"after SIGKILL of worker {victim}, stalled: {load.stalled(since)}"]
    for worker in (0, 1):
        try:
            lines.append(f"worker {worker} connections: {sorted(broker.connection_names(worker))}")
        except Exception as exc:  # a worker that does not answer is a finding too
            lines.append(f"worker {worker} connections: no answer ({exc!r})")
    try:
        lines.append(f"status: {broker.status()}")
    except (OSError, ValueError) as exc:
        lines.append(f"status: unreadable ({exc!r})")
    lines.append("log:\n" + "\n".join(broker.text().splitlines()[-60:]))
    return "\n".join(lines)


def _close(conn: pika.BlockingConnection) -> None:
    try:
        if conn.is_open:
            conn.close()
    except LOST:
        pass


@pytest.mark.soak
@pytest.mark.parametrize("affinity", ["on", "off"])
@pytest.mark.parametrize(
    "kinds",
    [("classic", "stream"), ("classic", "quorum", "stream")],
    ids=["classic-stream", "with-quorum"],
)
def test_sigkill_of_a_worker_under_confirmed_publishing_loses_nothing(
    tmp_path: Path, soak_rounds: int, affinity: str, kinds: tuple[str, ...]
) -> None:
    """With affinity on, a publisher or consumer of one queue moves to its queue's
    worker and only the fanout's messages cross; with it off, about half of every
    client's messages cross too."""
    broker = Workers(tmp_path, 2, "--worker-affinity", affinity).wait_listening()
    load = Load(broker, kinds)
    try:
        load.declare()
        load.start()
        wait_for(lambda: len(load.progress) == len(load.threads) and load.moved_on({}))
        for round_ in range(soak_rounds):
            victim = round_ % 2
            kill_and_wait(broker, victim)
            with load.lock:
                since = dict(load.progress)

            def moved_on(since=since):
                """every publisher and consumer carries on after the restart"""
                return load.moved_on(since)

            try:
                wait_for(moved_on, timeout=90)
            except AssertionError as exc:
                raise AssertionError(
                    f"{exc}\n{stall_report(broker, load, since, victim)}"
                ) from None
        load.halt()
        load.drain()
    finally:
        load.stop.set()
        broker.kill()

    lost: dict[str, list[str]] = {}
    for name in load.queues:
        seen_ids = {m for m, _ in load.seen[name]}
        missing = [m for m in load.confirmed[name] if m not in seen_ids]
        if missing:
            lost[name] = missing
    total = sum(len(ids) for ids in load.confirmed.values())
    print(
        f"affinity={affinity} rounds={soak_rounds} confirmed={total} nacked={sorted(load.nacked.items())} "
        f"in_doubt={load.in_doubt} reconnects={load.reconnects} cancels={load.cancels} "
        f"lost={sum(len(v) for v in lost.values())}"
    )
    assert lost == {}, {
        q: f"{len(ids)} of {len(load.confirmed[q])} confirmed lost ({ids[0]} .. {ids[-1]}), "
        f"{len(load.seen[q])} seen"
        for q, ids in lost.items()
    }

    unflagged = 0
    for name in load.queues:
        first: set[str] = set()
        last_seq: dict[str, int] = {}
        for msg_id, redelivered in load.seen[name]:
            if msg_id in first:
                # An ack the killed worker had not made durable brings its message
                # back; it does not always come back marked redelivered (docs/workers.md).
                unflagged += not redelivered
                continue
            first.add(msg_id)
            pub, seq = msg_id.rsplit(":", 1)
            assert int(seq) > last_seq.get(pub, 0), f"{name}: {msg_id} out of order"
            last_seq[pub] = int(seq)
    print(f"seen again without redelivered: {unflagged}")
