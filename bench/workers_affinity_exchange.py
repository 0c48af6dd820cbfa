#!/usr/bin/env python3
"""CPU time per message of a producer to a named exchange on a broker of two workers,
with connection affinity on and off.

    PYTHONPATH=src python bench/workers_affinity_exchange.py [--seconds 4] [--runs 3]
        [--size 16]

A real `leveret server --workers 2` per run. One producer connection, as a
Celery/kombu producer with publisher confirms: it publishes to the direct exchange
`bench-x`, whose binding leads to a queue of worker 1, and waits for each confirm
before the next publish (kombu's `confirm_publish`). The connection is one the
kernel gave worker 0 (the client reconnects until worker 0's ctl socket lists it
there); nothing consumes.

- `affinity on`: the first publish is routed on worker 0, and the connection moves
  to worker 1 once its confirm was sent; its messages then cross no worker boundary.
- `affinity off` (`--worker-affinity off`): it stays on worker 0; each message is
  a PUBLISH record to worker 1 and a confirm back.

The figure is the CPU time (user + system) of both worker processes together over
the measured window (after 200 messages), divided by the messages confirmed in it.
Medians of `--runs` runs, the two settings taking turns.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import pika  # noqa: E402
from pamqp import commands as C  # noqa: E402
from workers_affinity import LISTENING, cpu_seconds  # noqa: E402

from leveret.ctl import call  # noqa: E402
from leveret.protocol import connection as pc  # noqa: E402
from leveret.protocol.properties import EMPTY_PROPERTIES  # noqa: E402
from leveret.workers.mesh import placement  # noqa: E402
from serverproc import server_argv  # noqa: E402

EXCHANGE = "bench-x"


class Producer(asyncio.Protocol):
    """One AMQP connection on the sans-IO core: confirm mode, one publish at a time."""

    def __init__(self, name: str, key: str, size: int) -> None:
        self.core = pc.Connection(pc.CLIENT, client_properties={"connection_name": name})
        self.key = key
        self.body = b"x" * size
        self.opened = asyncio.get_running_loop().create_future()
        self.confirmed = 0
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
            if kind is pc.Ack:
                self.confirmed += 1
                self.publish()
            elif kind is pc.ConnectionOpened:
                self.ch = self.core.open_channel()
            elif kind is pc.ChannelOpened:
                self.core.send_method(self.ch, C.Confirm.Select())
            elif kind is pc.MethodReceived and isinstance(event.method, C.Confirm.SelectOk):
                self.opened.set_result(None)
        self._flush()

    def publish(self) -> None:
        self.core.send_publish(self.ch, EXCHANGE, self.key, self.body, EMPTY_PROPERTIES)
        self._flush()


async def measure(port: int, data: Path, pids: list[int], args, key: str) -> float:
    loop = asyncio.get_running_loop()
    ctl0 = str(data / "worker-0" / "ctl.sock")
    for attempt in range(64):
        name = f"bench-producer-{attempt}"
        transport, client = await loop.create_connection(
            lambda name=name: Producer(name, key, args.size), "127.0.0.1", port
        )
        await client.opened
        rows = call(ctl0, "list_connections", {})
        if any(r["connection_name"] == name and r.get("worker", 0) == 0 for r in rows):
            break
        transport.close()
    else:
        raise SystemExit("no connection on worker 0")
    client.publish()
    while client.confirmed < 200:
        await asyncio.sleep(0.05)
    cpu0, n0 = cpu_seconds(pids), client.confirmed
    await asyncio.sleep(args.seconds)
    cpu1, n1 = cpu_seconds(pids), client.confirmed
    rows = call(ctl0, "list_connections", {})
    where = [r.get("worker", 0) for r in rows if r["connection_name"] == name]
    print(f"  {n1 - n0} messages, producer on worker {where}", file=sys.stderr)
    transport.close()
    return (cpu1 - cpu0) / (n1 - n0) * 1e6


def run_once(affinity: str, args) -> float:
    with tempfile.TemporaryDirectory(prefix="leveret-affinity-x-") as tmp:
        data = Path(tmp) / "data"
        log_path = Path(tmp) / "server.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                server_argv(
                    "--port", "0", "--data-dir", str(data), "--worker-affinity", affinity, workers=2
                ),
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
            port = int(m.group(1))
            status = json.loads((data / "workers-status.json").read_text())
            pids = [w["pid"] for w in status["workers"]]
            queue = next(f"bench-q-{n}" for n in range(100) if placement("/", f"bench-q-{n}", 2))
            setup = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
            ch = setup.channel()
            ch.exchange_declare(EXCHANGE, "direct")
            ch.queue_declare(queue)
            ch.queue_bind(queue, EXCHANGE, "task")
            setup.close()
            return asyncio.run(measure(port, data, pids, args, "task"))
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", type=int, default=16)
    args = parser.parse_args()
    results: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(args.runs):
        for affinity in results:
            print(f"run {r + 1}, affinity {affinity}", file=sys.stderr)
            results[affinity].append(run_once(affinity, args))
    for affinity, values in results.items():
        print(
            f"affinity {affinity:3}: {statistics.median(values):7.1f} us CPU/msg "
            f"(median of {len(values)}: {', '.join(f'{v:.1f}' for v in values)})"
        )


if __name__ == "__main__":
    main()
