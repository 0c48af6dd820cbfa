#!/usr/bin/env python3
"""Start-up time and RSS of a broker that holds a long stream.

    python bench/stream_recovery.py --messages 1000000 --size 100

Fills one stream through a fresh `leveret server` (publish with confirms), stops it
with SIGTERM (or SIGKILL with --kill), starts it again and reports: the time from
start until the port accepts connections, the time until a consumer at `first` gets its first delivery and at `last` its
delivery, and the RSS after the restart. Not a test: no pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from durability import Server, rss_kb  # noqa: E402
from leveret.client import connect  # noqa: E402

STREAM = {"x-queue-type": "stream"}


async def fill(url: str, n: int, size: int) -> float:
    conn = await connect(url)
    ch = await conn.channel()
    await ch.declare_queue("long-stream", durable=True, arguments=STREAM)
    body = b"s" * size
    start = time.perf_counter()
    sent = 0
    while sent < n:
        k = min(20_000, n - sent)
        sent += await ch.publish_many([body] * k, routing_key="long-stream", window=2000,
                                      delivery_mode=2)  # fmt: skip
    rate = n / (time.perf_counter() - start)
    await conn.close()
    return rate


async def first_delivery(url: str, offset: object) -> tuple[float, int]:
    start = time.perf_counter()
    conn = await connect(url)
    ch = await conn.channel()
    async for message in ch.consume("long-stream", prefetch=10, offset=offset):
        got = message.headers["x-stream-offset"]
        message.ack()
        break
    elapsed = time.perf_counter() - start
    await conn.close()
    return elapsed, got


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--port", type=int, default=5698)
    p.add_argument("--kill", action="store_true", help="stop with SIGKILL, not SIGTERM")
    args = p.parse_args()
    url = f"amqp://guest:guest@127.0.0.1:{args.port}/%2F"
    out: dict[str, float | int] = {"messages": args.messages, "size": args.size}
    with tempfile.TemporaryDirectory() as work:
        server = Server(args.port, f"{work}/data", f"{work}/log", "batch")
        server.start()
        out["fill_msg_per_s"] = round(asyncio.run(fill(url, args.messages, args.size)))
        out["rss_mb_after_fill"] = round(rss_kb(server.proc.pid) / 1024, 1)
        if args.kill:
            server.proc.send_signal(signal.SIGKILL)
            server.proc.wait()
        else:
            server.stop()
        out["to_listening_s"] = round(server.start(), 3)
        out["rss_mb_after_restart"] = round(rss_kb(server.proc.pid) / 1024, 1)
        t, off = asyncio.run(first_delivery(url, "first"))
        out["first_delivery_at_first_s"], out["first_offset"] = round(t, 3), off
        t, off = asyncio.run(first_delivery(url, "last"))
        out["first_delivery_at_last_s"], out["last_offset"] = round(t, 3), off
        server.stop()
    for key, value in out.items():
        print(f"{key:28} {value}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
