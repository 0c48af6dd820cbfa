#!/usr/bin/env python3
"""The management API under load: /api/overview and a paged /api/queues with many
queues and connections, while S1 (amqbench) runs against the same broker.

    bench/management_load.py --queues 10000 --connections 1000 --requests 30

Starts `leveret server` from this tree with the API on, declares the queues, opens the
idle connections (leveret.client), starts amqbench S1, then times the HTTP calls one
after another and prints the median and 95th percentile of each, with S1's rate.
Timings are for reading, not for asserting: the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
AMQBENCH = Path(os.environ.get("AMQBENCH", "/work/shared/tools/amqbench.py"))
sys.path.insert(0, str(ROOT / "src"))

from leveret.client import connect  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str) -> tuple[float, int]:
    request = urllib.request.Request(url)
    request.add_header("authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as response:
        body = response.read()
    return (time.perf_counter() - started) * 1000, len(body)


async def populate(url: str, queues: int, connections: int) -> list:
    conn = await connect(url)
    channel = await conn.channel()
    for i in range(queues):
        await channel.declare_queue(f"load-{i:05d}")
    await conn.close()
    idle = []
    for _ in range(connections):
        idle.append(await connect(url))
    return idle


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--queues", type=int, default=10000)
    p.add_argument("--connections", type=int, default=1000)
    p.add_argument("--requests", type=int, default=30)
    p.add_argument("--s1-seconds", type=float, default=40.0)
    args = p.parse_args()
    amqp_port, http_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with tempfile.TemporaryDirectory() as tmp:
        broker = subprocess.Popen(
            [sys.executable, "-m", "leveret", "server", "--workers", "1", "--mqtt-port", "0", "--web-mqtt-port", "0", "--port", str(amqp_port),
             "--management-port", str(http_port), "--prometheus-port", "0",
             "--data-dir", tmp, "--log-level", "warning"],
            env=env,
        )  # fmt: skip
        try:
            for _ in range(300):
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", amqp_port)) == 0:
                        break
                time.sleep(0.1)
            url = f"amqp://guest:guest@127.0.0.1:{amqp_port}/%2F"
            loop = asyncio.new_event_loop()
            started = time.monotonic()
            idle = loop.run_until_complete(populate(url, args.queues, args.connections))
            print(
                f"{args.queues} queues and {len(idle)} idle connections in "
                f"{time.monotonic() - started:.1f} s",
                file=sys.stderr,
            )
            s1 = subprocess.Popen(
                [sys.executable, str(AMQBENCH), "--port", str(amqp_port), "--seconds",
                 str(args.s1_seconds), "--size", "16", "--prefetch", "500"],
                stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            time.sleep(3)  # S1 under way
            api = f"http://127.0.0.1:{http_port}/api"
            results = {}
            for name, path in (
                ("/api/overview", "/overview"),
                ("/api/queues?page=1&page_size=100", "/queues?page=1&page_size=100"),
                (
                    "/api/queues?page=5&page_size=100&name=load-0",
                    "/queues?page=5&page_size=100&name=load-0",
                ),  # noqa: E501
            ):
                times = []
                for _ in range(args.requests):
                    ms, size = http_get(api + path)
                    times.append(ms)
                    loop.run_until_complete(asyncio.sleep(0.05))  # keep the idle clients served
                times.sort()
                results[name] = (statistics.median(times), times[int(len(times) * 0.95) - 1], size)
            out, _ = s1.communicate(timeout=args.s1_seconds + 120)
            s1_rate = json.loads(out.strip().splitlines()[-1]).get("consumed_per_s")
            for conn in idle:
                loop.run_until_complete(conn.close())
        finally:
            broker.terminate()
            broker.wait(30)
    print(f"| call ({args.queues} queues, {args.connections} connections, S1 running) "
          "| median ms | p95 ms | bytes |")  # fmt: skip
    print("|---|---|---|---|")
    for name, (median, p95, size) in results.items():
        print(f"| `{name}` | {median:.1f} | {p95:.1f} | {size:,} |")
    print(f"\nS1 during the calls: {s1_rate:,.0f} msg/s consumed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
