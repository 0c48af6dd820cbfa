#!/usr/bin/env python3
"""CPU time per message of a broker of two workers, with connection affinity on and off.

    PYTHONPATH=src python bench/workers_affinity.py [--seconds 4] [--runs 3]
        [--size 16] [--confirm 200] [--prefetch 500] [--churn N]

A real `leveret server --workers 2` (one supervisor, two worker processes) per run.
One client connection, as most applications have one per queue: it publishes with
confirms and consumes (acking every 100) on the same connection, to a queue owned
by worker 1, and the connection is one the kernel gave worker 0 (the client
reconnects until worker 0's ctl socket lists it there).

- `affinity on`: the connection's first queue.declare hands it to worker 1; its
  messages cross no worker boundary.
- `affinity off` (`--worker-affinity off`): it stays on worker 0; each message is
  a PUBLISH record to worker 1, a DELIVER back, an ACK to worker 1 again (this
  needs the cross-worker message path; without it the queue is worker 0's own).
- `one process` (`--workers 1`): the same client on today's one-process broker, the
  baseline both are compared with.

The figure is the CPU time (user + system, /proc/PID/stat) of both worker
processes together over the measured window, divided by the messages consumed in
it; the client's CPU is its own (this process). Medians of `--runs` runs, the two
settings taking turns.

`--churn N` measures what a move costs instead: N short connections (pika), each
opening a channel, declaring the queue and closing, one after another; both
workers' CPU time per connection. The kernel puts about half of them on worker 0,
and those move.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from pamqp import commands as C  # noqa: E402

from leveret.ctl import call  # noqa: E402
from leveret.protocol import connection as pc  # noqa: E402
from leveret.protocol.properties import EMPTY_PROPERTIES  # noqa: E402
from leveret.workers.mesh import placement  # noqa: E402
from serverproc import server_argv  # noqa: E402

LISTENING = re.compile(r"Leveret listening for AMQP 0-9-1 on 127\.0\.0\.1:(\d+)")
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(") ", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


class Client(asyncio.Protocol):
    """One AMQP connection on the sans-IO core: publish with a confirm window and
    consume on the same channel."""

    def __init__(self, name: str, queue: str, size: int, window: int, prefetch: int) -> None:
        self.core = pc.Connection(pc.CLIENT, client_properties={"connection_name": name})
        self.queue = queue
        self.body = b"x" * size
        self.window = window
        self.prefetch = prefetch
        self.opened = asyncio.get_running_loop().create_future()
        self.consuming = asyncio.get_running_loop().create_future()
        self.published = 0
        self.confirmed = 0
        self.consumed = 0
        self.acked = 0
        self.ch = 0

    def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
        self.transport = transport
        self.core.initiate()
        self._flush()

    def _flush(self) -> None:
        data = self.core.data_to_send()
        if data:
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        for event in self.core.receive_data(data):
            kind = type(event)
            if kind is pc.Deliver:
                self.consumed += 1
                if self.consumed - self.acked >= 100:
                    self.core.send_ack(self.ch, event.delivery_tag, True)
                    self.acked = self.consumed
            elif kind is pc.Ack:
                self.confirmed = event.delivery_tag if event.multiple else self.confirmed + 1
                self._publish()
            elif kind is pc.ConnectionOpened:
                self.ch = self.core.open_channel()
            elif kind is pc.ChannelOpened:
                if not self.opened.done():
                    self.opened.set_result(None)
            elif kind is pc.MethodReceived and isinstance(event.method, C.Basic.ConsumeOk):
                self.consuming.set_result(None)
        self._flush()

    def start(self) -> None:
        core, ch = self.core, self.ch
        core.send_method(ch, C.Basic.Qos(prefetch_count=self.prefetch))
        core.send_method(ch, C.Confirm.Select())
        core.send_method(ch, C.Queue.Declare(queue=self.queue))
        core.send_method(ch, C.Basic.Consume(queue=self.queue))
        self._flush()

    def _publish(self) -> None:
        while self.published - self.confirmed < self.window:
            self.core.send_publish(self.ch, "", self.queue, self.body, EMPTY_PROPERTIES)
            self.published += 1

    def go(self) -> None:
        self._publish()
        self._flush()


async def measure(port: int, data: Path, pids: list[int], args, queue: str) -> float:
    loop = asyncio.get_running_loop()
    ctl0 = str(data / "worker-0" / "ctl.sock")
    if not os.path.exists(ctl0):
        ctl0 = str(data / "ctl.sock")  # one process
    for attempt in range(64):
        name = f"bench-{attempt}"
        _, client = await loop.create_connection(
            lambda name=name: Client(name, queue, args.size, args.confirm, args.prefetch),
            "127.0.0.1",
            port,
        )
        await client.opened
        rows = call(ctl0, "list_connections", {})
        if any(r["connection_name"] == name and r.get("worker", 0) == 0 for r in rows):
            break
        client.transport.close()
    else:
        raise SystemExit("no connection landed on worker 0")
    client.start()
    await client.consuming
    client.go()
    await asyncio.sleep(1.0)  # warm-up
    cpu0, n0, t0 = cpu_seconds(pids), client.consumed, time.monotonic()
    await asyncio.sleep(args.seconds)
    cpu1, n1, t1 = cpu_seconds(pids), client.consumed, time.monotonic()
    rows = call(ctl0, "list_connections", {})
    where = [r.get("worker", 0) for r in rows if r["connection_name"] == name]
    client.transport.close()
    messages = n1 - n0
    per = (cpu1 - cpu0) / messages * 1e6
    print(
        f"    {messages / (t1 - t0):9.0f} msg/s  {per:7.1f} us CPU/msg  "
        f"(connection on worker {where}; published {client.published}, "
        f"confirmed {client.confirmed}, consumed {client.consumed})",
        file=sys.stderr,
    )
    return per


def churn(port: int, pids: list[int], args, queue: str) -> float:
    """`--churn N`: N connections one after another, each opening a channel,
    declaring the queue (the decision: on, about half of them move) and closing;
    both workers' CPU time per connection."""
    import pika

    params = pika.ConnectionParameters("127.0.0.1", port, heartbeat=0)
    pika.BlockingConnection(params).channel().queue_declare(queue)  # declared once
    cpu0, t0 = cpu_seconds(pids), time.monotonic()
    for _ in range(args.churn):
        conn = pika.BlockingConnection(params)
        conn.channel().queue_declare(queue)
        conn.close()
    cpu1, t1 = cpu_seconds(pids), time.monotonic()
    per = (cpu1 - cpu0) / args.churn * 1e6
    print(
        f"    {args.churn / (t1 - t0):7.1f} conn/s  {per:7.0f} us CPU/connection", file=sys.stderr
    )
    return per


def run_once(affinity: str, args) -> float:
    """One run: `affinity` on or off on two workers, or "one" for one process."""
    workers = 1 if affinity == "one" else 2
    extra = () if workers == 1 else ("--worker-affinity", affinity)
    with tempfile.TemporaryDirectory(prefix="leveret-affinity-") as tmp:
        data = Path(tmp) / "data"
        log_path = Path(tmp) / "server.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                server_argv("--port", "0", "--data-dir", str(data), *extra, workers=workers),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        try:
            deadline = time.monotonic() + 60
            while not (m := LISTENING.search(log_path.read_text())):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(log_path.read_text())
                time.sleep(0.1)
            if workers == 1:
                pids = [proc.pid]
            else:
                status = json.loads((data / "workers-status.json").read_text())
                pids = [w["pid"] for w in status["workers"]]
            queue = next(
                f"bench-affinity-{n}"
                for n in range(100)
                if placement("/", f"bench-affinity-{n}", 2)
            )
            if args.churn:
                return churn(int(m.group(1)), pids, args, queue)
            return asyncio.run(measure(int(m.group(1)), data, pids, args, queue))
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--confirm", type=int, default=200, help="confirm window")
    parser.add_argument("--prefetch", type=int, default=500)
    parser.add_argument(
        "--churn", type=int, default=0, metavar="N", help="measure N short connections instead"
    )
    args = parser.parse_args()
    results: dict[str, list[float]] = {"one": [], "on": [], "off": []}
    labels = {"one": "one process   ", "on": "affinity on   ", "off": "affinity off  "}
    for r in range(args.runs):
        for affinity in results:
            print(f"run {r + 1}, {labels[affinity].strip()}", file=sys.stderr)
            results[affinity].append(run_once(affinity, args))
    unit = "connection" if args.churn else "msg"
    for affinity, values in results.items():
        print(
            f"{labels[affinity]}: {statistics.median(values):7.1f} us CPU/{unit} "
            f"(median of {len(values)}: {', '.join(f'{v:.1f}' for v in values)})"
        )


if __name__ == "__main__":
    main()
