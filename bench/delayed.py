#!/usr/bin/env python3
"""The delayed-message exchange at scale: RAM, restarts and on-time delivery with
`--messages` pending, and the publish rate into it beside a plain exchange.

    python bench/delayed.py pending --messages 1000000      # RSS, restarts, lateness
    python bench/delayed.py rate --messages 100000 --rounds 3
    python bench/delayed.py short --delay 20 --rate 2000

`pending` publishes `--messages` persistent messages (`--size` B bodies, confirmed)
into a durable x-delayed-message exchange whose one binding goes to a durable
queue. Every message is due at FIRE + k * spread / messages: FIRE is `--fire-after`
seconds after the start, so all of them are pending once publishing is done. It
reports the broker's RSS then (over its idle RSS), restarts it cleanly and after
kill -9 (time until the log says it recovered, and RSS after), then consumes as
the messages come due and reports lateness: arrival at the consumer minus due
time, as percentiles. The due time is the one the publisher asked for (publish
time + x-delay), so lateness includes the publish pipeline (a few ms) as well as
the broker's timer and delivery. None may arrive early.

`rate` publishes `--messages` confirmed persistent messages with an x-delay of an
hour into a delayed exchange, and the same into a direct exchange bound to a
durable queue, alternating which goes first, `--rounds` rounds, and prints the
medians. Each run gets a fresh broker and data dir.

The machine is shared and noisy (other people's benchmarks and tests run beside
this): compare figures from one run only, and name the machine (`lscpu`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
sys.path.insert(0, str(SRC))

from leveret.client import BasicProperties, OutgoingMessage, connect  # noqa: E402

DUE = struct.Struct(">q")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_kb(pid: int, field: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class Broker:
    """`leveret server` from this tree, on one data dir across restarts."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.port = _free_port()
        self.mport = _free_port()
        self.log_path = os.path.join(data_dir + "-log.txt")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def start(self) -> float:
        """Start; returns the seconds until the log says the messages are back."""
        env = {**os.environ, "PYTHONPATH": str(SRC)}
        argv = [
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
            str(self.port),
        ]
        argv += ["--data-dir", self.data_dir, "--management-port", str(self.mport)]
        argv += ["--prometheus-port", "0", "--log-level", "info"]
        offset = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=log)
        while True:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                if re.search(rb"recovered \d+ messages in", f.read()):
                    return time.monotonic() - t0
            if self.proc.poll() is not None or time.monotonic() - t0 > 600:
                raise RuntimeError(f"broker did not start; see {self.log_path}")
            time.sleep(0.01)

    def stop(self, kill: bool = False) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        self.proc.wait(600)

    def delayed(self, exchange: str) -> int:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.mport}/api/exchanges/%2F/{exchange}"
        )
        request.add_header("authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
        with urllib.request.urlopen(request, timeout=60) as response:
            import json

            return json.loads(response.read())["messages_delayed"]


async def _setup(url: str, exchange_type: str) -> None:
    async with await connect(url) as conn:
        ch = await conn.channel()
        args = {"x-delayed-type": "direct"} if exchange_type == "x-delayed-message" else None
        await ch.declare_exchange("bench.x", exchange_type, durable=True, arguments=args)
        queue = await ch.declare_queue("bench.q", durable=True)
        await ch.bind_queue(queue, "bench.x", "k")


async def _publish(url: str, n: int, size: int, delay_of, window: int = 2000) -> float:
    """Publish n confirmed persistent messages; returns the rate (messages/s)."""
    pad = b"x" * max(0, size - DUE.size)

    def messages():
        for k in range(n):
            due, delay = delay_of(k)
            props = BasicProperties(delivery_mode=2, headers={"x-delay": delay})
            yield OutgoingMessage(DUE.pack(due) + pad, properties=props)

    async with await connect(url) as conn:
        ch = await conn.channel()
        t0 = time.monotonic()
        await ch.publish_many(messages(), "k", "bench.x", window=window)
        return n / (time.monotonic() - t0)


async def _consume(url: str, n: int, timeout: float) -> list[int]:
    """Lateness in ms of n messages (arrival minus the due time in the body)."""
    late: list[int] = []
    async with await connect(url) as conn:
        ch = await conn.channel()
        consumer = ch.consume("bench.q", prefetch=5000, no_ack=True)
        deadline = time.monotonic() + timeout
        async for message in consumer:
            now = time.time_ns() // 1_000_000
            late.append(now - DUE.unpack_from(message.body)[0])
            if len(late) >= n or time.monotonic() > deadline:
                break
    return late


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process."""
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def _pct(values: list[int], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def pending(args: argparse.Namespace) -> None:
    root = tempfile.mkdtemp(prefix="leveret-delayed-")
    broker = Broker(os.path.join(root, "data"))
    try:
        broker.start()
        time.sleep(1.0)
        idle = _rss_kb(broker.proc.pid)  # type: ignore[union-attr]
        kind = "direct" if args.plain else "x-delayed-message"
        asyncio.run(_setup(broker.url, kind))
        n = args.messages
        fire = time.time_ns() // 1_000_000 + int(args.fire_after * 1000)
        spread = int(args.spread * 1000)

        def delay_of(k: int) -> tuple[int, int]:
            due = fire + k * spread // n
            return due, due - time.time_ns() // 1_000_000

        # A small window: the x-delay is reckoned from when the message is sent, and
        # the broker from when it reads it; unconfirmed messages are the difference.
        rate = asyncio.run(_publish(broker.url, n, args.size, delay_of, window=300))
        time.sleep(2.0)
        pid = broker.proc.pid  # type: ignore[union-attr]
        full = _rss_kb(pid)
        peak = _rss_kb(pid, "VmHWM")
        if args.plain:
            print(f"published {n:,} into a durable queue (direct exchange) at {rate:,.0f} msg/s")
            print(f"RSS idle {idle / 1024:.1f} MB, with {n:,} queued {full / 1024:.1f} MB")
            print(
                f"  growth {(full - idle) / 1024:.1f} MB = {(full - idle) * 1024 / n:.1f} B/message"
            )
            broker.stop()
            return
        count = broker.delayed("bench.x")
        print(f"published {n:,} at {rate:,.0f} msg/s; pending now: {count:,}")
        print(f"RSS idle {idle / 1024:.1f} MB, with {count:,} pending {full / 1024:.1f} MB")
        print(f"  growth {(full - idle) / 1024:.1f} MB = {(full - idle) * 1024 / n:.1f} B/message")
        print(f"  peak while publishing (VmHWM) {peak / 1024:.1f} MB")
        disk = sum(p.stat().st_size for p in Path(broker.data_dir, "msgs").glob("*"))
        print(f"  on disk {disk / 1e6:.1f} MB")
        for kill in (False, True):
            broker.stop(kill=kill)
            took = broker.start()
            time.sleep(0.5)
            rss = _rss_kb(broker.proc.pid)  # type: ignore[union-attr]
            how = "after kill -9" if kill else "clean restart"
            print(
                f"{how}: recovered in {took:.2f} s, RSS {rss / 1024:.1f} MB, "
                f"pending {broker.delayed('bench.x'):,}"
            )
        wait = (fire - time.time_ns() // 1_000_000) / 1000
        if wait < 0:
            print(f"WARNING: the first messages came due {-wait:.1f} s before consuming began")
        pid = broker.proc.pid  # type: ignore[union-attr]
        cpu0, wall0, load0 = _cpu_s(pid), time.monotonic(), os.getloadavg()[0]
        late = asyncio.run(_consume(broker.url, n, max(wait, 0) + args.spread + 300))
        cpu = _cpu_s(pid) - cpu0
        wall = time.monotonic() - wall0 - max(wait, 0)
        print(f"consumed {len(late):,} of {n:,} as they came due over {args.spread} s")
        print(
            f"  broker CPU {cpu:.1f} s in {wall:.1f} s ({cpu / wall:.0%} of a core; "
            f"{cpu / len(late) * 1e6:.0f} us a message); load average {load0:.1f} -> "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
        )
        print(f"  early (before due): {sum(1 for v in late if v < 0)}")
        print(
            "  lateness ms: "
            + ", ".join(f"p{p} {_pct(late, p):.0f}" for p in (50, 90, 99, 99.9))
            + f", max {max(late)}"
        )
        print(f"  RSS at the end {_rss_kb(broker.proc.pid) / 1024:.1f} MB")  # type: ignore[union-attr]
        broker.stop()
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.stop(kill=True)
        shutil.rmtree(root, ignore_errors=True)


def rate(args: argparse.Namespace) -> None:
    results: dict[str, list[float]] = {"x-delayed-message": [], "direct": []}
    for r in range(args.rounds):
        kinds = ("x-delayed-message", "direct") if r % 2 == 0 else ("direct", "x-delayed-message")
        for kind in kinds:
            root = tempfile.mkdtemp(prefix="leveret-delayed-rate-")
            broker = Broker(os.path.join(root, "data"))
            try:
                broker.start()
                asyncio.run(_setup(broker.url, kind))
                got = asyncio.run(
                    _publish(broker.url, args.messages, args.size, lambda k: (0, 3_600_000))
                )
                results[kind].append(got)
                print(f"round {r + 1} {kind}: {got:,.0f} msg/s", flush=True)
                broker.stop()
            finally:
                if broker.proc is not None and broker.proc.poll() is None:
                    broker.stop(kill=True)
                shutil.rmtree(root, ignore_errors=True)
    d = statistics.median(results["x-delayed-message"])
    p = statistics.median(results["direct"])
    print(
        f"\n{args.messages:,} confirmed persistent {args.size} B messages with x-delay 1 h, "
        f"median of {args.rounds}:\n"
        f"| exchange | msg/s |\n|---|---:|\n| direct -> durable queue | {p:,.0f} |\n"
        f"| x-delayed-message (direct) | {d:,.0f} |\n| ratio | {d / p:.2f} |"
    )


async def _paced(url: str, n: int, rate_: float, delay: int, size: int) -> list[int]:
    """Publish n messages at `rate_`/s with x-delay `delay` while consuming them;
    returns each one's lateness: arrival minus (send time + delay), ms."""
    pad = b"x" * max(0, size - DUE.size)
    late: list[int] = []
    async with await connect(url) as conn:
        pub = await conn.channel(confirms=False)
        sub = await conn.channel()
        consumer = sub.consume("bench.q", prefetch=5000, no_ack=True)
        done = asyncio.Event()

        async def consume() -> None:
            async for message in consumer:
                late.append(time.time_ns() // 1_000_000 - DUE.unpack_from(message.body)[0])
                if len(late) >= n:
                    done.set()
                    return

        task = asyncio.create_task(consume())
        t0 = time.monotonic()
        step = 100
        for k in range(0, n, step):
            now = time.time_ns() // 1_000_000
            props = BasicProperties(delivery_mode=2, headers={"x-delay": delay})
            for _ in range(min(step, n - k)):
                await pub.publish(DUE.pack(now + delay) + pad, "k", "bench.x", properties=props)
            ahead = t0 + (k + step) / rate_ - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
        try:
            await asyncio.wait_for(done.wait(), 120)
        finally:
            task.cancel()
    return late


def short(args: argparse.Namespace) -> None:
    """Short delays at a steady rate, against x-delay 0 (routed at once) on the same
    broker: what holding a message back adds beyond its delay."""
    root = tempfile.mkdtemp(prefix="leveret-delayed-short-")
    broker = Broker(os.path.join(root, "data"))
    try:
        broker.start()
        asyncio.run(_setup(broker.url, "x-delayed-message"))
        rows = {}
        for r in range(args.rounds):
            for delay in (0, args.delay) if r % 2 == 0 else (args.delay, 0):
                late = asyncio.run(_paced(broker.url, args.messages, args.rate, delay, args.size))
                rows.setdefault(delay, []).append(late)
                print(f"round {r + 1} x-delay {delay}: p50 {_pct(late, 50)} p99 {_pct(late, 99)}")
        print(
            f"\n{args.messages:,} persistent messages per run at {args.rate:,.0f}/s, "
            f"{args.rounds} rounds; ms past send time + x-delay (all runs pooled):\n"
            "| x-delay | p50 | p90 | p99 | max | early |\n|---:|---:|---:|---:|---:|---:|"
        )
        for delay, runs in sorted(rows.items()):
            late = [v for run in runs for v in run]
            print(
                f"| {delay} ms | {_pct(late, 50)} | {_pct(late, 90)} | {_pct(late, 99)} | "
                f"{max(late)} | {sum(1 for v in late if v < 0)} |"
            )
        broker.stop()
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.stop(kill=True)
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    a = sub.add_parser("pending")
    a.add_argument("--messages", type=int, default=1_000_000)
    a.add_argument("--size", type=int, default=64)
    a.add_argument("--fire-after", type=float, default=300.0, help="s from start to first due")
    a.add_argument("--spread", type=float, default=120.0, help="s over which they come due")
    a.add_argument(
        "--plain", action="store_true", help="RSS only, of a direct exchange's durable queue"
    )
    b = sub.add_parser("rate")
    b.add_argument("--messages", type=int, default=100_000)
    b.add_argument("--size", type=int, default=64)
    b.add_argument("--rounds", type=int, default=3)
    c = sub.add_parser("short")
    c.add_argument("--messages", type=int, default=20_000)
    c.add_argument("--rate", type=float, default=2000.0, help="messages/s")
    c.add_argument("--delay", type=int, default=20, help="x-delay, ms")
    c.add_argument("--size", type=int, default=64)
    c.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    {"pending": pending, "rate": rate, "short": short}[args.mode](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
