"""`leveret reshard`: a stopped broker's data dir moved to another worker count.

Real processes throughout: a broker (`leveret server --workers N`) fills a data dir
with durable queues of every type (classic, a long classic queue read back in
batches, priority, quorum, stream) and a delayed exchange's pending messages, some
messages delivered and not acked when it stops. The data dir is copied: the copy
is started again with its own count and drained (the control), the original is
re-sharded (`leveret reshard`) and started with the new count and drained. Every
queue must give what the control gives, in the same order: bodies, properties,
the redelivered flag and quorum queues' `x-delivery-count`, streams' offsets.
The re-shard is also SIGKILLed at its steps (`workers/reshard.py` names each): the
data dir must then open, under the old count before the switch and the new one
after, with nothing lost or doubled.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pika
import pytest

from leveret.workers.mesh import placement
from serverproc import QUIET_PORTS, server_argv
from workers.procs import Workers, wait_for

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="a broker of workers needs Linux"
)

ONE_PROCESS = re.compile(r"leveret\.server: Leveret listening for AMQP 0-9-1 on 127\.0\.0\.1:(\d+)")
WORKERS = re.compile(r"leveret\.workers: Leveret listening for AMQP 0-9-1 on 127\.0\.0\.1:(\d+)")

# Names placed on both workers of 2 and on all of 3 (test_names_spread_over_the_workers).
CLASSIC = ["rs-classic-a", "rs-classic-d", "rs-classic-f"]
LONG = "rs-classic-long-d"  # more messages than the re-shard moves in one batch
PRIORITY = ["rs-priority-a", "rs-priority-g"]
QUORUM = ["rs-quorum-a", "rs-quorum-d"]
STREAM = ["rs-stream-a", "rs-stream-g"]
DELAYED_TARGET = "rs-delayed-target"
DELAY_EXCHANGE = "rs-delayed"
DELAY_MS = 20_000
QUEUES = [*CLASSIC, LONG, *PRIORITY, *QUORUM]


class Broker(Workers):
    """`leveret server --workers <count>` on `data` (count 1: one process)."""

    def __init__(self, tmp: Path, count: int, data: Path, *extra: str) -> None:
        self.count = count
        self.data = data
        self.log = tmp / f"server-{len(list(tmp.glob('server-*.log')))}.log"
        base = ["--port", "0", "--data-dir", str(data), *extra]
        argv = (
            server_argv(*base, workers=count)
            if count > 1
            else [sys.executable, "-m", "leveret", "server", *QUIET_PORTS, "--workers", "1", *base]
        )
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self.port = 0

    def wait(self) -> Broker:
        pattern = WORKERS if self.count > 1 else ONE_PROCESS

        def listening():
            """the broker's listening line"""
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode}:\n{self.text()}")
            return pattern.search(self.text())

        self.port = int(wait_for(listening, timeout=120).group(1))
        return self


def props(i: int, **extra) -> pika.BasicProperties:
    fields = {
        "delivery_mode": 2,
        "message_id": f"m{i}",
        "content_type": "text/plain",
        "headers": {"i": i, "tag": f"t{i % 7}"},
    }
    return pika.BasicProperties(**{**fields, **extra})


def fill(broker: Broker, delayed: bool) -> None:
    """Durable queues of every type, and messages delivered but not acked at the stop."""
    conn = broker.connect("rs-fill")
    ch = conn.channel()
    ch.confirm_delivery()
    for name in CLASSIC + [LONG]:
        ch.queue_declare(name, durable=True)
    for name in PRIORITY:
        ch.queue_declare(name, durable=True, arguments={"x-max-priority": 5})
    for name in QUORUM:
        ch.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    for name in STREAM:
        ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    for name in CLASSIC + QUORUM + STREAM:
        for i in range(40):
            ch.basic_publish("", name, f"{name} {i}".encode(), props(i))
    for i in range(2500):
        ch.basic_publish("", LONG, f"{LONG} {i}".encode() * 3, props(i))
    for name in PRIORITY:
        for i in range(60):
            ch.basic_publish("", name, f"{name} {i}".encode(), props(i, priority=i % 7))
    if delayed:
        ch.exchange_declare(
            DELAY_EXCHANGE, "x-delayed-message", durable=True,
            arguments={"x-delayed-type": "direct"},
        )  # fmt: skip
        ch.queue_declare(DELAYED_TARGET, durable=True)
        ch.queue_bind(DELAYED_TARGET, DELAY_EXCHANGE, "d")
        for i in range(12):
            ch.basic_publish(
                DELAY_EXCHANGE, "d", f"delayed {i}".encode(),
                props(i, headers={"x-delay": DELAY_MS + i, "i": i}),
            )  # fmt: skip
    # Quorum: returned twice, then held unacked (delivery counts 1..3 after the stop).
    for _ in range(2):
        for name in QUORUM:
            for _k in range(3):
                method, _p, _b = ch.basic_get(name)
                assert method is not None
                ch.basic_nack(method.delivery_tag, requeue=True)
    # Held unacked at the stop: redelivered afterwards.
    held = conn.channel()
    held.basic_qos(prefetch_count=5)
    got: list[int] = []
    for name in [CLASSIC[0], LONG, PRIORITY[0], *QUORUM]:
        held.basic_consume(name, lambda _c, m, _p, _b: got.append(m.delivery_tag))
    wait_for(lambda: conn.process_data_events(0.1) or len(got) >= 25)
    assert broker.stop() == 0, broker.text()
    try:
        conn.close()
    except Exception:  # the broker closed it (320) as it stopped
        pass


def drain(broker: Broker, delayed: bool) -> dict[str, list]:
    """Everything each queue holds, in order, as a client sees it."""
    out: dict[str, list] = {}
    conn = broker.connect("rs-drain")
    ch = conn.channel()
    for name in QUEUES:
        rows = out[name] = []
        while True:
            method, p, body = ch.basic_get(name, auto_ack=True)
            if method is None:
                break
            rows.append((body, method.redelivered, p.priority, p.message_id, p.headers))
    ch.basic_qos(prefetch_count=100)
    for name in STREAM:
        rows = out[name] = []
        for method, p, body in ch.consume(
            name, arguments={"x-stream-offset": "first"}, inactivity_timeout=3
        ):
            if method is None:
                break
            rows.append((body, p.message_id, p.headers))
            ch.basic_ack(method.delivery_tag)
        ch.cancel()
    if delayed:
        rows = out[DELAYED_TARGET] = []

        def arrived():
            """the delayed messages, once due"""
            while True:
                method, p, body = ch.basic_get(DELAYED_TARGET, auto_ack=True)
                if method is None:
                    return len(rows) >= 12
                rows.append((body, p.message_id, p.headers.get("i")))

        wait_for(arrived, timeout=120)
        time.sleep(1)  # nothing more comes (a message twice would show here)
        arrived()
        rows.sort(key=lambda r: r[2])  # their due times differ by 1 ms: order is the clock's
    conn.close()
    return out


def cluster_name(broker: Broker) -> str:
    conn = broker.connect("rs-name")
    try:
        return conn._impl.server_properties["cluster_name"]
    finally:
        conn.close()


def reshard(data: Path, count: int) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "leveret", "reshard", "--data-dir", str(data), "--workers", str(count)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    return done.stdout


def copy(data: Path, to: Path) -> Path:
    shutil.copytree(data, to, ignore=shutil.ignore_patterns("*.sock"))
    return to


def check_control(expected: dict[str, list], delayed: bool) -> None:
    """The control holds what `fill` left: the test compares something."""
    assert len(expected[CLASSIC[1]]) == 40
    assert len(expected[LONG]) == 2500
    assert [r[1] for r in expected[CLASSIC[0]][:5]] == [True] * 5
    assert not any(r[1] for r in expected[CLASSIC[0]][5:])
    assert {r[2] for r in expected[PRIORITY[1]]} == set(range(7))  # as published
    counts = [r[4].get("x-delivery-count") for r in expected[QUORUM[0]]]
    assert any(counts) and not all(counts), counts  # delivered ones carry their count
    assert len(expected[STREAM[0]]) == 40
    assert [r[2]["x-stream-offset"] for r in expected[STREAM[1]]] == list(range(40))
    if delayed:
        assert [r[0] for r in expected[DELAYED_TARGET]] == [b"delayed %d" % i for i in range(12)]


@pytest.fixture
def made(tmp_path: Path):
    started: list[Broker] = []

    def start(count: int, data: Path, *extra: str) -> Broker:
        broker = Broker(tmp_path, count, data, *extra)
        started.append(broker)
        return broker.wait()

    yield start
    failed: list[BaseException] = []
    for broker in reversed(started):  # a later one on the same data dir first
        try:
            broker.kill()
        except BaseException as exc:  # every broker is stopped, then the first failure told
            failed.append(exc)
    if failed:
        raise failed[0]


def owners(names: list[str], count: int) -> set[int]:
    return {placement("/", name, count) for name in names}


def test_names_spread_over_the_workers() -> None:
    """The queues of the data set land on several workers at each count, and some
    change owner from 2 to 3 (else a re-shard would move nothing)."""
    names = [*QUEUES, *STREAM]
    assert owners(names, 2) == {0, 1} and owners(names, 3) == {0, 1, 2}
    assert any(placement("/", n, 2) != placement("/", n, 3) for n in names)


@pytest.mark.timeout(300)  # three brokers started and drained, on a loaded machine too
@pytest.mark.parametrize(("old", "new"), [(2, 3), (2, 1), (1, 2)])
def test_reshard_keeps_every_message(made, tmp_path: Path, old: int, new: int) -> None:
    data = tmp_path / "data"
    fill(made(old, data), delayed=True)
    control = copy(data, tmp_path / "control")
    out = reshard(data, new)
    assert "re-sharded from" in out and "12 delayed messages" in out, out
    before = made(old, control)
    expected = drain(before, delayed=True)
    check_control(expected, delayed=True)
    broker = made(new, data)
    assert drain(broker, delayed=True) == expected
    assert cluster_name(broker) == cluster_name(before)  # the broker keeps its name
    layout = data / "workers.json"
    if new == 1:
        assert not layout.exists() and (data / "definitions.db").exists()
        assert not list(data.glob("worker-*"))
    else:
        assert json.loads(layout.read_text())["workers"] == new
        assert sorted(p.name for p in data.glob("worker-*")) == [f"worker-{j}" for j in range(new)]
    assert not (data / "reshard.new").exists() and not (data / "reshard.old").exists()


def _mqtt_listens(port: int) -> None:
    import socket

    def connects() -> bool:
        """the MQTT port accepts"""
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    wait_for(connects, timeout=60)


def _retained(port: int, topic: str) -> bytes:
    """The retained message a fresh MQTT subscriber to `topic` gets."""
    import paho.mqtt.client as mqtt

    _mqtt_listens(port)
    got: list[bytes] = []
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="rs-retained-reader")
    client.on_message = lambda _c, _u, msg: got.append(msg.payload)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        client.subscribe(topic, qos=1)
        wait_for(lambda: got, timeout=30)
    finally:
        client.loop_stop()
        client.disconnect()
    return got[0]


@pytest.mark.timeout(300)
def test_reshard_keeps_mqtt_retained_messages(made, tmp_path: Path) -> None:
    """Retained messages live with the one process or worker 0; each re-shard
    carries them to the new layout's worker 0."""
    import socket

    import paho.mqtt.publish as publish

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = tmp_path / "data"
    broker = made(1, data, "--mqtt-port", str(port))
    _mqtt_listens(port)
    publish.single("rs/retained", b"kept", qos=1, retain=True, hostname="127.0.0.1", port=port)
    assert _retained(port, "rs/retained") == b"kept"
    assert broker.stop() == 0
    for count in (2, 3, 1):
        assert "1 MQTT retained messages" in reshard(data, count)
        broker = made(count, data, "--mqtt-port", str(port))
        assert _retained(port, "rs/retained") == b"kept", f"after the re-shard to {count}"
        assert broker.stop() == 0


def test_reshard_refuses_a_running_broker_and_bad_counts(made, tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = made(2, data)
    done = subprocess.run(
        [sys.executable, "-m", "leveret", "reshard", "--data-dir", str(data), "--workers", "3"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert "a broker runs on the data dir" in done.stderr and "stop it first" in done.stderr
    assert f"its supervisor, pid {broker.proc.pid}" in done.stderr, done.stderr
    status = json.loads((data / "workers-status.json").read_text())
    (data / "workers-status.json").unlink()  # the workers' ctl sockets still tell
    done = subprocess.run(
        [sys.executable, "-m", "leveret", "reshard", "--data-dir", str(data), "--workers", "3"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1 and "ctl.sock answers); stop it first" in done.stderr
    (data / "workers-status.json").write_text(json.dumps(status))
    assert broker.stop() == 0
    for bad in ("0", "auto", "x"):
        done = subprocess.run(
            [sys.executable, "-m", "leveret", "reshard", "--data-dir", str(data), "--workers", bad],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2 and "argument --workers" in done.stderr, done.stderr
    assert "nothing to do" in reshard(data, 2)


KILL_SCRIPT = """
import os, signal, sys
from leveret.workers.reshard import reshard
at = sys.argv[2]
seen = []
def step(name):
    seen.append(name)
    print(name, flush=True)
    if name == at:
        os.kill(os.getpid(), signal.SIGKILL)
reshard(sys.argv[1], int(sys.argv[3]), step=step)
"""


def killed_at(data: Path, at: str, count: int) -> list[str]:
    """Run the re-shard, SIGKILLed at the first step named `at` ("-": not killed);
    the steps it went through."""
    done = subprocess.run(
        [sys.executable, "-c", KILL_SCRIPT, str(data), at, str(count)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == (0 if at == "-" else -9), done.stderr
    return done.stdout.splitlines()


def _kill_points(steps: list[str], rounds: int | None) -> list[str]:
    if rounds is not None:
        seed = random.randrange(1 << 30)
        print(f"kill points drawn with seed {seed}")
        return random.Random(seed).sample(steps, min(rounds, len(steps)))
    # Before the switch (mid-copy, staged), the switch, and within and after each
    # phase of the roll-forward.
    first = ("queue-", "retired-", "placed-")
    points = [next(s for s in steps if s.startswith(prefix)) for prefix in first]
    points += ["staged", "manifest", "retired", "layout"]
    assert set(points) <= set(steps), steps
    return sorted(points, key=steps.index)


def _kill_rounds(made, tmp_path: Path, rounds: int | None) -> None:
    origin = tmp_path / "origin"
    fill(made(2, origin), delayed=False)
    expected = drain(made(2, copy(origin, tmp_path / "control")), delayed=False)
    check_control(expected, delayed=False)
    steps = killed_at(copy(origin, tmp_path / "dry"), "-", 3)
    assert "manifest" in steps and steps[-1] == "done", steps
    switch = steps.index("manifest")
    for n, at in enumerate(_kill_points(steps, rounds)):
        data = copy(origin, tmp_path / f"kill-{n}")
        killed_at(data, at, 3)
        decided = steps.index(at) >= switch
        if not decided:
            broker = made(2, data)  # the old count opens it as it was
        else:
            if at == "manifest":
                # Decided: a start with the old count completes the re-shard, then
                # refuses the count, naming the command that would change it back.
                refused = Broker(tmp_path, 2, data)
                assert refused.proc.wait(timeout=120) == 2, refused.text()
                assert (
                    "belongs to a broker of --workers 3" in refused.text()
                    and f"leveret reshard --data-dir {data} --workers 2" in refused.text()
                ), refused.text()
                assert json.loads((data / "workers.json").read_text())["workers"] == 3
            broker = made(3, data)  # the start completes the re-shard
        assert drain(broker, delayed=False) == expected, f"killed at {at}"
        broker.stop()
        assert not (data / "reshard.json").exists()
        assert not (data / "reshard.new").exists() and not (data / "reshard.old").exists()


@pytest.mark.timeout(600)  # seven kills, each data dir started and drained
def test_sigkill_of_the_reshard_loses_nothing(made, tmp_path: Path) -> None:
    _kill_rounds(made, tmp_path, None)


@pytest.mark.soak
def test_sigkill_of_the_reshard_at_random_steps(made, tmp_path: Path, soak_rounds: int) -> None:
    _kill_rounds(made, tmp_path, soak_rounds)


def test_reshard_refusals_name_the_problem(tmp_path: Path) -> None:
    """Data dirs it must not touch: each refused with the reason, nothing changed."""
    import fcntl

    from leveret.workers.reshard import reshard as run
    from leveret.workers.serve import WorkersError

    def refused(data: Path, count: int = 3) -> str:
        with pytest.raises(WorkersError) as caught:
            run(str(data), count)
        return str(caught.value)

    assert "does not exist" in refused(tmp_path / "nowhere")
    node = tmp_path / "node"
    node.mkdir()
    (node / "cluster-node.json").write_text("{}")
    assert "is a cluster node's" in refused(node)
    short = tmp_path / "short"
    (short / "worker-0").mkdir(parents=True)
    (short / "worker-1").mkdir()
    (short / "workers.json").write_text(json.dumps({"workers": 3}))
    assert "lacks worker-2/ of its 3 workers" in refused(short, 2)
    (short / "workers.json").write_text(json.dumps({"workers": "x"}))
    assert "names no worker count" in refused(short, 2)
    (short / "reshard.json").write_text("{not json")
    assert "reshard.json cannot be read" in refused(short, 2)
    (short / "reshard.json").unlink()
    with open(short / "reshard.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert f"another re-shard of {short} is running" in refused(short, 2)
    done = subprocess.run(
        [sys.executable, "-m", "leveret", "reshard", "--data-dir", str(node), "--workers", "2"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1 and "leveret reshard: the data dir" in done.stderr, done.stderr
    assert sorted(p.name for p in short.iterdir()) == [
        "reshard.lock", "worker-0", "worker-1", "workers.json",
    ]  # fmt: skip
