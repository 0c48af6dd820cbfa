#!/usr/bin/env python3
"""Stream queues side by side: Leveret and RabbitMQ 3.10.8's streams over AMQP 0-9-1.

Same client (leveret.client) for both brokers, brokers alternating per round,
median of the rounds:

- publish: persistent 100 B messages with confirms, a window of 1,000 unconfirmed;
- consume from `first`: 1 consumer, and 4 consumers reading the same stream at once,
  prefetch 1,000, one ack per message.

    bench/streams.py --messages 200000 --rounds 3 \
        --rabbitmq amqp://guest:guest@127.0.0.1:5673/%2F

Starts a Leveret broker (fsync batch, its own data directory) from this checkout.

    bench/streams.py --uri amqp://guest:guest@127.0.0.1:5682/%2F --messages 200000 --json

measures one broker once and prints one JSON line; `bench/compare --scenarios ST`
runs it that way, alternating the brokers, for the stream rows of its table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from leveret.client import connect  # noqa: E402

BODY = b"x" * 100
STREAM = {"x-queue-type": "stream"}


async def publish(url: str, name: str, n: int) -> float:
    conn = await connect(url)
    ch = await conn.channel()
    await ch.declare_queue(name, durable=True, arguments=STREAM)
    start = time.perf_counter()
    sent = 0
    while sent < n:
        k = min(10_000, n - sent)
        sent += await ch.publish_many([BODY] * k, routing_key=name, window=1000, delivery_mode=2)
    rate = n / (time.perf_counter() - start)
    await conn.close()
    return rate


async def consume(url: str, name: str, n: int, consumers: int) -> float:
    async def one() -> None:
        conn = await connect(url)
        ch = await conn.channel()
        got = 0
        async for message in ch.consume(name, prefetch=1000, offset="first"):
            message.ack()
            got += 1
            if got == n:
                break
        await conn.close()

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(consumers)))
    return consumers * n / (time.perf_counter() - start)


async def cleanup(url: str, name: str) -> None:
    conn = await connect(url)
    ch = await conn.channel()
    await ch.delete_queue(name)
    await conn.close()


async def measure(url: str, n: int) -> dict[str, float]:
    name = f"bench-stream-{uuid.uuid4().hex[:8]}"
    out = {"publish": await publish(url, name, n)}
    out["consume x1"] = await consume(url, name, n, 1)
    out["consume x4"] = await consume(url, name, n, 4)
    await cleanup(url, name)
    return out


def start_leveret(data_dir: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "leveret",
            "server",
            "--workers",
            "1",
            "--mqtt-port",
            "0",
            "--web-mqtt-port",
            "0",
            "--port",
            str(port),
            "--data-dir",
            data_dir,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"amqp://guest:guest@127.0.0.1:{port}/%2F"
        time.sleep(0.1)
    raise SystemExit("Leveret did not start")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rabbitmq", default="amqp://guest:guest@127.0.0.1:5673/%2F")
    parser.add_argument("--uri", help="measure this one broker once (no broker is started)")
    parser.add_argument("--json", action="store_true", help="with --uri: one JSON line")
    args = parser.parse_args()
    if args.uri:
        rates = asyncio.run(measure(args.uri, args.messages))
        if args.json:
            print(json.dumps({k.replace(" ", "_"): v for k, v in rates.items()}))
        else:
            for key, rate in rates.items():
                print(f"{key:12} {rate:10,.0f} msg/s")
        return 0
    results: dict[str, dict[str, list[float]]] = {"Leveret": {}, "RabbitMQ": {}}
    with tempfile.TemporaryDirectory() as data:
        proc, url = start_leveret(data)
        try:
            for r in range(args.rounds):
                order = [("Leveret", url), ("RabbitMQ", args.rabbitmq)]
                if r % 2:
                    order.reverse()
                for broker, target in order:
                    for key, rate in asyncio.run(measure(target, args.messages)).items():
                        results[broker].setdefault(key, []).append(rate)
        finally:
            proc.terminate()
            proc.wait()
    print(f"{args.messages:,} x 100 B persistent, median of {args.rounds} alternating rounds")
    print(f"{'msg/s':12} {'Leveret':>10} {'RabbitMQ':>10} {'ratio':>6}")
    for key in results["Leveret"]:
        lev = statistics.median(results["Leveret"][key])
        rmq = statistics.median(results["RabbitMQ"][key])
        print(f"{key:12} {lev:10,.0f} {rmq:10,.0f} {lev / rmq:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
