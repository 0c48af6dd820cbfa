#!/usr/bin/env python3
"""MQTT: Leveret against RabbitMQ's MQTT plugin, side by side, as one Markdown table.

Scenarios (each broker with its defaults, MQTT 3.1.1, clean sessions, --size-byte payloads):

- ``fanin0``: --publishers connections publish QoS 0 as fast as TCP lets them, each to its
  own topic; one QoS 0 subscriber (``mqtt-bench/fanin/#``). Figure: messages the
  subscriber receives per second.
- ``fanin1``: the same at QoS 1: each publisher keeps --window PUBLISHes waiting for their
  PUBACK; the subscriber's subscription is QoS 1 and it acknowledges every delivery.
  Figure: messages received per second (each one was acknowledged to its publisher).
- ``fanout``: one QoS 0 publisher, --subscribers QoS 0 subscribers of its topic. Figure:
  deliveries per second, all subscribers together.
- ``idle``: N connections that sent CONNECT (keepalive --keepalive s) and nothing more.
  Figure: the broker's RSS growth per connection, KB (RSS read from /proc, children
  included; N from --idle-conns). Source addresses 127.0.X.Y so that 50,000 connections
  do not run out of ephemeral ports.

The brokers alternate which goes first in each round; the table gives the median of
--rounds rounds and the min-max of the per-round ratios. The load generator is a lean
asyncio client on the broker's own sans-IO codec (leveret.mqtt.codec), publishers and
subscribers in separate processes (--procs each); its clocks are CLOCK_MONOTONIC, shared
by all processes. Progress goes to stderr, the table to stdout (and --output).

    bench/mqtt.py                                   # all scenarios, 3 rounds of 5 s
    bench/mqtt.py --scenarios fanin0,fanout --rounds 5 --seconds 5
    bench/mqtt.py --only leveret --scenarios idle --idle-conns 10000,50000

RabbitMQ's MQTT listener is --rabbitmq-port (1884, the reference broker here; it is
shared, so it is never paused or restarted). It refuses sockets past its own limit
(`sockets_total` in its management API, from its `ulimit -n`): the idle rows say how
many connections it took. Leveret is started from this tree on a fresh data dir
(`--leveret-mqtt-port` uses one already running instead).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

from compare_lib import (  # noqa: E402  (path set up just above)
    Outcome,
    Row,
    find_rabbitmq_pid,
    log,
    machine,
    markdown_table,
    median_outcome,
    notes_for,
    ratio_spread,
)

from leveret.mqtt import packets as pk  # noqa: E402
from leveret.mqtt.codec import Decoder, encode  # noqa: E402

SCENARIOS = ("fanin0", "fanin1", "fanout", "idle")
TOPIC_PREFIX = "mqtt-bench"  # every topic and client id this script uses starts with it
FD_LIMIT = 200_000
IDLE_PER_PROC = 15_000  # idle connections a load-generator process holds at most


# -- the load generator ------------------------------------------------------------------


def raise_fd_limit(target: int = FD_LIMIT) -> int:
    """As many descriptors as the idle scenario needs (root may raise the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for limit in ((target, max(hard, target)), (hard, hard)):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, limit)
            break
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class Client(asyncio.Protocol):
    """One MQTT 3.1.1 connection: CONNECT, then counts what comes back.

    Deliveries are decoded by the broker's own codec; a QoS 1 delivery is acknowledged
    at once (the PUBACKs of one read go out in one write)."""

    def __init__(self) -> None:
        self.decoder = Decoder("client", pk.MQTT_3_1_1)
        self.transport: asyncio.Transport | None = None
        self.waiting: dict[type, asyncio.Future[Any]] = {}
        self.received = 0
        # fan-in: received per publisher process (topics end in /<process>/<publisher>)
        self.by_source: list[int] | None = None
        self.on_progress: Any = None
        self.acked = 0
        self.ack_event = asyncio.Event()
        self.writable = asyncio.Event()
        self.writable.set()
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        acks = []
        by_source = self.by_source
        for packet in self.decoder.feed(data):
            if type(packet) is pk.Publish:
                self.received += 1
                if by_source is not None:
                    by_source[int(packet.topic.rsplit("/", 2)[1])] += 1
                if packet.qos:
                    acks.append(b"\x40\x02" + packet.packet_id.to_bytes(2, "big"))
            elif type(packet) is pk.PubAck:
                self.acked += 1
                self.ack_event.set()
            else:
                future = self.waiting.pop(type(packet), None)
                if future is not None and not future.done():
                    future.set_result(packet)
        if acks and self.transport is not None:
            self.transport.write(b"".join(acks))
        if self.on_progress is not None:
            self.on_progress()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.writable.set()
        self.ack_event.set()
        if not self.closed.done():
            self.closed.set_result(exc)
        for future in self.waiting.values():
            if not future.done():
                future.set_exception(ConnectionError("closed by the broker"))

    async def request(self, data: bytes, answer: type, timeout: float = 30.0) -> Any:
        future = asyncio.get_running_loop().create_future()
        self.waiting[answer] = future
        assert self.transport is not None
        self.transport.write(data)
        return await asyncio.wait_for(future, timeout)


async def connect(
    host: str, port: int, client_id: str, keepalive: int = 60, source: str | None = None
) -> Client:
    loop = asyncio.get_running_loop()
    local = (source, 0) if source else None
    _, client = await loop.create_connection(Client, host, port, local_addr=local)
    packet = pk.Connect(client_id, keepalive=keepalive, username="guest", password=b"guest")
    connack = await client.request(encode(packet), pk.Connack)
    if connack.reason_code != 0:
        raise ConnectionError(f"CONNACK {connack.reason_code}")
    return client


async def subscribe(client: Client, topic_filter: str, qos: int) -> None:
    packet = pk.Subscribe(1, [pk.Subscription(topic_filter, qos)])
    suback = await client.request(encode(packet), pk.Suback)
    if suback.reason_codes[0] not in (0, 1):
        raise ConnectionError(f"SUBACK {suback.reason_codes}")


def split_publish(topic: str, payload: bytes) -> tuple[bytes, bytes]:
    """A QoS 1 PUBLISH as (bytes before the packet id, bytes after): the codec encodes
    it once, the publisher splices each packet id in."""
    data = encode(pk.Publish(topic, payload, 1, packet_id=1))
    cut = len(data) - len(payload) - 2
    return data[:cut], data[cut + 2 :]


@dataclass
class Marks:
    """Counters read at the start and at the end of the measured window."""

    t0: float
    warmup: float
    seconds: float
    at: list[tuple[float, int]] = field(default_factory=list)

    def schedule(self, count: Any) -> None:
        loop = asyncio.get_running_loop()
        delay = self.t0 - time.monotonic()
        for offset in (self.warmup, self.warmup + self.seconds):
            loop.call_later(delay + offset, lambda: self.at.append((time.monotonic(), count())))


class Gate:
    """Bounds what a publisher process has sent and its subscribers have not yet
    received (--backlog): without it a broker that takes messages in faster than it
    delivers them builds a queue that the measured window never sees drain, and the
    figure says how the broker shares its time between the two, not its throughput.
    The subscriber processes write their counts into a shared file (`Counters`)."""

    def __init__(self, counters: Counters, slots: list[int], limit: int) -> None:
        self.counters = counters
        self.slots = slots
        self.limit = limit
        self.sent = 0

    def open(self) -> bool:
        return self.sent - min(self.counters.get(i) for i in self.slots) < self.limit

    async def wait(self) -> None:
        while not self.open():
            await asyncio.sleep(0.001)


class Counters:
    """Counters shared between processes: a file of 64-bit integers, mapped."""

    def __init__(self, path: str, slots: int) -> None:
        import mmap

        with open(path, "r+b") as f:
            self.map = mmap.mmap(f.fileno(), slots * 8)
        self.view = memoryview(self.map).cast("q")

    def get(self, slot: int) -> int:
        return self.view[slot]

    def set(self, slot: int, value: int) -> None:
        self.view[slot] = value


async def publisher(
    client: Client, topic: str, args: dict[str, Any], end: float, gate: Gate
) -> int:
    """Publish until `end`, within the gate; then wait for every PUBACK (QoS 1) or for a
    PINGRESP (QoS 0: the broker has read everything before it). Returns how many were
    sent."""
    payload = b"x" * args["size"]
    transport = client.transport
    assert transport is not None
    sent = 0
    if args["qos"] == 0:
        batch_size = 50
        batch = encode(pk.Publish(topic, payload, 0)) * batch_size
        while time.monotonic() < end and not client.closed.done():
            if not client.writable.is_set():
                await client.writable.wait()
            if not gate.open():
                await gate.wait()
                continue
            transport.write(batch)
            sent += batch_size
            gate.sent += batch_size
            await asyncio.sleep(0)
        await client.request(encode(pk.PingReq()), pk.PingResp, 120)
        return sent
    head, tail = split_publish(topic, payload)
    window = args["window"]
    while time.monotonic() < end and not client.closed.done():
        room = window - (sent - client.acked)
        if room > 0 and gate.open():
            parts = []
            for _ in range(room):
                sent += 1
                parts.append(head + (sent % 65535 or 65535).to_bytes(2, "big") + tail)
            transport.write(b"".join(parts))
            gate.sent += room
        elif room > 0:
            await gate.wait()
            continue
        client.ack_event.clear()
        await client.ack_event.wait()
    deadline = time.monotonic() + 120
    while client.acked < sent and time.monotonic() < deadline and not client.closed.done():
        client.ack_event.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(client.ack_event.wait(), 1)
    return sent


async def read_command() -> list[str]:
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    return line.split()


def say(obj: Any) -> None:
    print(json.dumps(obj), flush=True)


async def worker(role: str, args: dict[str, Any]) -> None:
    """One load-generator process: connects its clients, says "ready", runs on "go T0",
    and prints its counts as JSON (subscribers after "stop EXPECTED", when all came in
    or nothing more came for --drain seconds)."""
    host, port, tag = args["host"], args["port"], args["tag"]
    clients = []
    for i in range(args["count"]):
        clients.append(await connect(host, port, f"{TOPIC_PREFIX}-{tag}-{role}-{i}"))
    if role == "sub":
        for c in clients:
            await subscribe(c, args["filter"], args["qos"])
    counters = Counters(args["shm"], args["slots"])
    fanout = args["same_topic"]
    me = args["proc"]
    if role == "sub" and fanout:

        def progress() -> None:
            counters.set(me, min(c.received for c in clients))

        for c in clients:
            c.on_progress = progress
    elif role == "sub":
        (sub,) = clients
        sub.by_source = [0] * args["slots"]

        def progress_fanin() -> None:
            for i, n in enumerate(sub.by_source or ()):
                counters.set(i, n)

        sub.on_progress = progress_fanin
    say({"ready": True})
    _, t0 = await read_command()
    cpu0 = time.process_time()
    if role == "pub":
        gate = Gate(counters, list(range(args["slots"])) if fanout else [me], args["backlog"])
        end = float(t0) + args["warmup"] + args["seconds"]
        await asyncio.sleep(max(0.0, float(t0) - time.monotonic()))
        topics = [f"{args['topic']}/{me}/{i}" for i in range(len(clients))]
        if fanout:
            topics = [args["topic"]] * len(clients)
        sent = await asyncio.gather(
            *(publisher(c, t, args, end, gate) for c, t in zip(clients, topics, strict=True))
        )
        result = {"sent": sum(sent), "acked": sum(c.acked for c in clients)}
        result["cpu"] = time.process_time() - cpu0
        say(result)
        await read_command()  # the subscribers have drained
    else:
        marks = Marks(float(t0), args["warmup"], args["seconds"])
        marks.schedule(lambda: sum(c.received for c in clients))
        _, expected = await read_command()
        want = int(expected)
        last, quiet_since = -1, time.monotonic()
        while True:
            got = sum(c.received for c in clients)
            if got >= want:
                break
            if got != last:
                last, quiet_since = got, time.monotonic()
            elif time.monotonic() - quiet_since > args["drain"]:
                break
            await asyncio.sleep(0.05)
        (ta, ca), (tb, cb) = marks.at[0], marks.at[1]
        say({
            "received": sum(c.received for c in clients), "rate": (cb - ca) / (tb - ta),
            "cpu": time.process_time() - cpu0,
        })  # fmt: skip
    for c in clients:
        if c.transport is not None:
            c.transport.write(encode(pk.Disconnect()))
            c.transport.close()
    await asyncio.sleep(0.1)


async def idle_worker(args: dict[str, Any]) -> None:
    """Opens up to `count` idle connections (at most 200 CONNECTs in flight), says how
    many the broker took, then holds them until stdin says "close"."""
    host, port, count = args["host"], args["port"], args["count"]
    sources = [f"127.{args['net']}.{i // 250}.{i % 250 + 1}" for i in range(args["sources"])]
    clients: list[Client] = []
    errors: list[str] = []
    gate = asyncio.Semaphore(200)

    async def one(i: int) -> None:
        async with gate:
            if len(errors) >= 20:
                return
            try:
                clients.append(
                    await connect(
                        host, port, f"{TOPIC_PREFIX}-idle-{args['tag']}-{i}",
                        args["keepalive"], sources[i % len(sources)],
                    )
                )  # fmt: skip
            except (OSError, TimeoutError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")

    started = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(count)))
    await asyncio.sleep(1)
    alive = [c for c in clients if not c.closed.done()]
    say({"opened": len(alive), "errors": errors[:3], "seconds": time.monotonic() - started})
    await read_command()
    for c in clients:
        if c.transport is not None:
            c.transport.close()
    await asyncio.sleep(0.5)


def worker_main(role: str, spec: str) -> None:
    raise_fd_limit()
    args = json.loads(spec)
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    asyncio.run(idle_worker(args) if role == "idle" else worker(role, args))


# -- the driver ------------------------------------------------------------------------------


class Proc:
    """A worker process, spoken to by lines on stdin/stdout."""

    def __init__(self, role: str, spec: dict[str, Any]) -> None:
        self.p = subprocess.Popen(
            [sys.executable, __file__, "--worker", role, json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def send(self, line: str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def read(self) -> dict[str, Any]:
        assert self.p.stdout is not None
        line = self.p.stdout.readline()
        if not line:
            self.p.wait(10)
            raise RuntimeError(f"load-generator worker exited with status {self.p.returncode}")
        return json.loads(line)

    def finish(self) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            self.send("close")
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(5)


def split(total: int, parts: int) -> list[int]:
    parts = max(1, min(parts, total))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


@dataclass
class Broker:
    name: str
    port: int
    pid: int | None
    process: subprocess.Popen[bytes] | None = None
    data_dir: str | None = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        if self.data_dir:
            import shutil

            shutil.rmtree(self.data_dir, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_leveret(extra: list[str]) -> Broker:
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="leveret-bench-mqtt-")
    argv = [
        sys.executable, "-m", "leveret", "server", "--workers", "1", "--port", "0", "--mqtt-port", str(port),
        "--web-mqtt-port", "0", "--mqtt-tls-port", "0", "--management-port", "0",
        "--prometheus-port", "0", "--data-dir", data_dir, *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(HERE.parent / "src")}
    log(f"starting Leveret: {' '.join(argv[1:])}")
    with open(os.path.join(data_dir, "server.log"), "wb") as out:
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    broker = Broker("Leveret", port, process.pid, process, data_dir)
    deadline = time.monotonic() + 60
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return broker
        if process.poll() is not None or time.monotonic() > deadline:
            broker.stop()
            raise RuntimeError("Leveret did not start listening for MQTT")
        time.sleep(0.1)


def rss_kb(pid: int) -> int:
    """VmRSS of `pid` and its children (RabbitMQ's beam.smp has helpers)."""
    pids = [pid]
    with contextlib.suppress(OSError, ValueError):
        pids += [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    total = 0
    for p in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of `pid` (its threads together)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Result:
    value: float | None = None
    error: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


def run_throughput(broker: Broker, scenario: str, a: argparse.Namespace, tag: str) -> Result:
    """One round of fanin0, fanin1 or fanout against one broker."""
    base = {
        "host": "127.0.0.1", "port": broker.port, "size": a.size, "window": a.window,
        "warmup": a.warmup, "seconds": a.seconds, "drain": a.drain,
        "same_topic": scenario == "fanout",
    }  # fmt: skip
    topic = f"{TOPIC_PREFIX}/{tag}"
    shm = tempfile.NamedTemporaryFile(prefix="mqtt-bench-", dir="/dev/shm", delete=False)
    shm.write(b"\0" * 8 * 64)
    shm.close()
    base["shm"], base["backlog"] = shm.name, a.backlog
    if scenario == "fanout":
        qos, pubs, subs = 0, [1], split(a.subscribers, a.procs)
        sub_filter, pub_topic = topic, topic
    else:
        qos = 1 if scenario == "fanin1" else 0
        pubs, subs = split(a.publishers, a.procs), [1]
        sub_filter, pub_topic = f"{topic}/#", topic
    # Counter slots: fan-out, one per subscriber process; fan-in, one per publisher process.
    base["slots"] = len(subs) if scenario == "fanout" else len(pubs)
    base["qos"] = qos
    subscribers = [
        Proc("sub", {**base, "tag": f"{tag}-{i}", "count": n, "filter": sub_filter, "proc": i})
        for i, n in enumerate(subs)
    ]
    publishers = [
        Proc("pub", {**base, "tag": f"{tag}-{i}", "count": n, "topic": pub_topic, "proc": i})
        for i, n in enumerate(pubs)
    ]
    procs = subscribers + publishers
    try:
        for proc in procs:
            proc.read()  # ready
        cpu0 = cpu_seconds(broker.pid) if broker.pid else 0.0
        t0 = time.monotonic() + 0.3
        for proc in procs:
            proc.send(f"go {t0}")
        sent = [proc.read() for proc in publishers]
        cpu = (cpu_seconds(broker.pid) if broker.pid else 0.0) - cpu0
        total = sum(s["sent"] for s in sent)
        acked = sum(s["acked"] for s in sent)
        for proc, n in zip(subscribers, subs, strict=True):
            proc.send(f"stop {total * n if scenario == 'fanout' else total}")
        got = [proc.read() for proc in subscribers]
        for proc in publishers:
            proc.send("done")
        received = sum(g["received"] for g in got)
        expected = total * (a.subscribers if scenario == "fanout" else 1)
        detail = {
            "sent": total, "acked": acked, "received": received, "expected": expected,
            "broker_cpu_s": round(cpu, 1),
            "pub_cpu_s": [round(s["cpu"], 1) for s in sent],
            "sub_cpu_s": [round(g["cpu"], 1) for g in got],
        }  # fmt: skip
        return Result(sum(g["rate"] for g in got), detail=detail)
    except (RuntimeError, OSError, ValueError, KeyError) as exc:
        return Result(error=f"{type(exc).__name__}: {exc}")
    finally:
        for proc in procs:
            proc.finish()
        os.unlink(shm.name)


def fd_room(pid: int) -> tuple[int, int] | None:
    """(soft open-file limit, descriptors open) of `pid`, from /proc."""
    try:
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                return int(line.split()[3]), len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError, IndexError):
        pass
    return None


def run_idle(broker: Broker, count: int, asked: int, a: argparse.Namespace, net: int) -> Result:
    """Open `count` idle connections; the broker's RSS growth per connection, KB.
    (`asked`: what the row is for, when the broker's limits allow fewer.)"""
    if broker.pid is None:
        return Result(error="broker PID unknown")
    # A process of ours holds at most IDLE_PER_PROC (the open-file limit here may be
    # a hard one, 20,000 in a container without CAP_SYS_RESOURCE).
    procs_n = split(count, max(a.procs, -(-count // IDLE_PER_PROC)))
    time.sleep(1)
    before = rss_kb(broker.pid)
    procs = [
        Proc(
            "idle",
            {
                "host": "127.0.0.1",
                "port": broker.port,
                "count": n,
                "keepalive": a.keepalive,
                "tag": f"{net}-{i}",
                "net": net,
                "sources": n // 5000 + 1,
            },
        )  # fmt: skip
        for i, n in enumerate(procs_n)
    ]
    try:
        answers = [proc.read() for proc in procs]
        time.sleep(a.settle)
        after = rss_kb(broker.pid)
        opened = sum(ans["opened"] for ans in answers)
        errors = [e for ans in answers for e in ans["errors"]]
        detail = {
            "opened": opened, "asked": asked, "tried": count, "rss_before_mb": round(before / 1024, 1),
            "rss_after_mb": round(after / 1024, 1), "errors": errors[:2],
            "connect_s": round(max(ans["seconds"] for ans in answers), 1),
        }  # fmt: skip
        if not opened:
            return Result(error=f"no connection opened: {errors[:1]}", detail=detail)
        return Result((after - before) / opened, detail=detail)
    except (RuntimeError, OSError, ValueError) as exc:
        return Result(error=f"{type(exc).__name__}: {exc}")
    finally:
        for proc in procs:
            proc.finish()
        time.sleep(2)


def rabbitmq_sockets(port: int) -> tuple[int, int] | None:
    """RabbitMQ's (sockets_total, sockets_used) from its management API."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/nodes")
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            node = json.load(response)[0]
        return int(node["sockets_total"]), int(node["sockets_used"])
    except (OSError, ValueError, KeyError, IndexError):
        return None


LABELS = {
    "fanin0": "fan-in QoS 0, {p} publishers → 1 subscriber: msg/s received",
    "fanin1": "fan-in QoS 1, {p} publishers (window {w}) → 1 subscriber: msg/s received",
    "fanout": "fan-out QoS 0, 1 publisher → {s} subscribers: deliveries/s",
    "idle": "{n} idle connections: RSS KB per connection",
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds per round (5)")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--size", type=int, default=64, help="payload bytes (64)")
    p.add_argument("--publishers", type=int, default=10)
    p.add_argument("--subscribers", type=int, default=10)
    p.add_argument("--window", type=int, default=50, help="QoS 1 PUBLISHes in flight each")
    p.add_argument("--procs", type=int, default=2, help="load-generator processes per side")
    p.add_argument(
        "--backlog", type=int, default=2000,
        help="messages a publisher process may have sent and not yet seen received (2000)",
    )  # fmt: skip
    p.add_argument("--drain", type=float, default=3.0, help="subscribers stop after this quiet")
    p.add_argument("--idle-conns", default="1000,10000,50000")
    p.add_argument("--keepalive", type=int, default=600)
    p.add_argument("--settle", type=float, default=3.0, help="seconds before reading RSS")
    p.add_argument("--only", choices=("leveret", "rabbitmq"))
    p.add_argument("--rabbitmq-port", type=int, default=1884)
    p.add_argument("--rabbitmq-pid", type=int)
    p.add_argument("--rabbitmq-management-port", type=int, default=15673)
    p.add_argument("--leveret-mqtt-port", type=int, help="use a Leveret already running")
    p.add_argument("--leveret-pid", type=int)
    p.add_argument("--leveret-arg", action="append", default=[], help="extra server argument")
    p.add_argument("--json", help="also write every round's figures here")
    p.add_argument("--output", help="also write the table here")
    a = p.parse_args(argv)
    scenarios = [s for s in a.scenarios.split(",") if s]
    bad = set(scenarios) - set(SCENARIOS)
    if bad:
        p.error(f"unknown scenarios {sorted(bad)}; choose from {','.join(SCENARIOS)}")
    raise_fd_limit()
    load_start = os.getloadavg()

    brokers: dict[str, Broker] = {}
    try:
        if a.only != "rabbitmq":
            if a.leveret_mqtt_port:
                brokers["leveret"] = Broker("Leveret", a.leveret_mqtt_port, a.leveret_pid)
            else:
                brokers["leveret"] = start_leveret(a.leveret_arg)
        if a.only != "leveret":
            pid = a.rabbitmq_pid or find_rabbitmq_pid(a.rabbitmq_port)
            brokers["rabbitmq"] = Broker("RabbitMQ", a.rabbitmq_port, pid)
        rounds: dict[tuple[str, str], list[Result]] = {}
        notes: list[str] = []
        # Idle first: RSS growth is clearest on a broker that has not yet served load.
        if "idle" in scenarios:
            net = 10
            for n in [int(x) for x in a.idle_conns.split(",") if x]:
                for key, broker in brokers.items():
                    if key == "leveret" and broker.process is not None:
                        # A fresh broker each time: memory an earlier run freed would
                        # be reused and hide part of the growth.
                        broker.stop()
                        broker = brokers[key] = start_leveret(a.leveret_arg)
                    want = n
                    room = fd_room(broker.pid) if broker.pid else None
                    if room is not None and room[0] - room[1] - 64 < want:
                        want = room[0] - room[1] - 64
                        notes.append(
                            f"idle {n:,}: {broker.name}'s open-file limit is {room[0]:,} "
                            f"({room[1]} in use): asked for {want:,}"
                        )
                    if key == "rabbitmq":
                        sockets = rabbitmq_sockets(a.rabbitmq_management_port)
                        if sockets is not None and sockets[0] - sockets[1] - 16 < want:
                            want = max(0, sockets[0] - sockets[1] - 16)
                            notes.append(
                                f"idle {n:,}: RabbitMQ takes at most {sockets[0]} sockets "
                                f"(its sockets_total, from its open-file limit), {sockets[1]} "
                                f"in use: asked for {want}"
                            )
                    log(f"idle {n}: {broker.name}, {want} connections")
                    net += 1
                    res = run_idle(broker, want, n, a, net) if want > 0 else Result(error="no room")
                    log(f"  -> {res.value} {res.error or ''} {res.detail}")
                    rounds[(f"idle:{n}", key)] = [res]
        for scenario in [s for s in scenarios if s != "idle"]:
            for r in range(a.rounds):
                order = list(brokers) if r % 2 == 0 else list(reversed(brokers))
                for key in order:
                    tag = f"{scenario}-{r}-{key}-{os.getpid()}"
                    res = run_throughput(brokers[key], scenario, a, tag)
                    log(f"{scenario} round {r + 1} {brokers[key].name}: {res.value} "
                        f"{res.error or ''} {res.detail}")  # fmt: skip
                    rounds.setdefault((scenario, key), []).append(res)
        load_end = os.getloadavg()
    finally:
        for broker in brokers.values():
            broker.stop()

    def figure(res: Result, cpu: bool) -> float | None:
        """The round's figure, or (`cpu`) the broker's CPU microseconds per message
        received: on a shared machine the rate moves with what else runs, the CPU
        cost much less."""
        if not cpu or res.value is None:
            return res.value
        received = res.detail.get("received")
        return res.detail["broker_cpu_s"] * 1e6 / received if received else None

    def outcome(key: tuple[str, str], cpu: bool = False) -> Outcome | None:
        results = rounds.get(key)
        if results is None:
            return None
        outs = []
        for res in results:
            warnings = []
            d = res.detail
            if "expected" in d and d["received"] != d["expected"]:
                warnings.append(f"received {d['received']:,} of {d['expected']:,}")
            if "opened" in d and d["opened"] != d["asked"]:
                why = f": {d['errors'][0]}" if d["errors"] else ""
                warnings.append(f"opened {d['opened']:,} of {d['asked']:,}{why}")
            outs.append(Outcome(value=figure(res, cpu), error=res.error, warnings=warnings))
        return median_outcome(outs)

    rows: list[Row] = []
    for scenario in scenarios:
        keys = [scenario] if scenario != "idle" else [f"idle:{n}" for n in a.idle_conns.split(",")]
        for key in keys:
            n = int(key.split(":")[1]) if ":" in key else 0
            label = LABELS[scenario].format(p=a.publishers, w=a.window, s=a.subscribers, n=f"{n:,}")
            for cpu in (False, True) if scenario != "idle" else (False,):
                pairs = zip(
                    rounds.get((key, "leveret"), []),
                    rounds.get((key, "rabbitmq"), []),
                    strict=False,
                )
                spread = ratio_spread(
                    [(Outcome(figure(x, cpu), x.error), Outcome(figure(y, cpu), y.error))
                     for x, y in pairs]
                )  # fmt: skip
                rows.append(
                    Row(
                        "  the same: broker CPU µs per message" if cpu else label,
                        outcome((key, "leveret"), cpu),
                        outcome((key, "rabbitmq"), cpu),
                        digits=1 if scenario == "idle" or cpu else 0,
                        spread=spread,
                    )
                )
    for (key, who), results in rounds.items():
        if key.startswith("idle:") and results and results[0].detail.get("opened"):
            d = results[0].detail
            notes.append(f"{key.replace(':', ' ')} {who}: {d['opened']:,} connections opened "
                         f"in {d['connect_s']} s, RSS {d['rss_before_mb']} → {d['rss_after_mb']} MB")  # fmt: skip
    header = ["scenario", "Leveret", "RabbitMQ", "Leveret ÷ RabbitMQ", "single rounds' ratios"]
    lines = [
        f"Machine: {machine()}",
        f"Load average: {load_start[0]:.1f} at the start, {load_end[0]:.1f} at the end",
        f"Rounds: median of {a.rounds} × {a.seconds:g} s (after {a.warmup:g} s warm-up), "
        f"{a.size} B payloads, brokers alternating; command: bench/mqtt.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "",
        markdown_table(header, [row.cells() for row in rows]),
        "",
        *[f"- {n}" for n in notes + notes_for(rows)],
    ]
    text = "\n".join(lines)
    print(text)
    if a.output:
        Path(a.output).write_text(text + "\n")
    if a.json:
        Path(a.json).write_text(json.dumps(
            {f"{k[0]}|{k[1]}": [r.__dict__ for r in v] for k, v in rounds.items()}, indent=1
        ))  # fmt: skip
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2], sys.argv[3])
    else:
        sys.exit(main())
