#!/usr/bin/env python3
"""Durable fan-out: bytes written and publish rate, two source trees side by side.

Publishes `--messages` persistent messages of `--size` bytes, with confirms (window
1000), through a fanout exchange into `--queues` durable queues with no consumers,
against `leveret server` started from each tree on a fresh data dir. Reports, per
tree, the median over the rounds (trees alternate each round) of:

- disk: segment-file bytes in the data dir per published message;
- written: what the broker process wrote (/proc/PID/io write_bytes) per message;
- rate: confirmed messages per second.

    git worktree add --detach /tmp/before <commit>
    python bench/fanout_disk.py --a /tmp/before --rounds 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    raise RuntimeError(f"no write_bytes in /proc/{pid}/io")


def _segment_bytes(data_dir: str) -> int:
    msgs = Path(data_dir) / "msgs"
    return sum(p.stat().st_size for p in msgs.glob("*.seg"))


def run_once(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    from leveret.client.blocking import connect

    port = _free_port()
    data_dir = tempfile.mkdtemp(prefix="leveret-fanout-")
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    argv = [sys.executable, "-m", "leveret", "server", "--port", str(port)]
    argv += ["--data-dir", data_dir, "--management-port", "0", "--prometheus-port", "0"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"leveret from {tree} did not start") from None
                time.sleep(0.05)
        with connect(f"amqp://guest:guest@127.0.0.1:{port}/%2F") as conn:
            ch = conn.channel()
            ch.declare_exchange("bench.fan", "fanout", durable=True)
            for i in range(args.queues):
                ch.declare_queue(f"bench.fan.{i}", durable=True)
                ch.bind_queue(f"bench.fan.{i}", "bench.fan")
            body = b"x" * args.size
            disk0, wrote0 = _segment_bytes(data_dir), _write_bytes(proc.pid)
            t0 = time.monotonic()
            sent = ch.publish_many(
                (body for _ in range(args.messages)), "", "bench.fan", persistent=True
            )
            elapsed = time.monotonic() - t0
            disk, wrote = _segment_bytes(data_dir) - disk0, _write_bytes(proc.pid) - wrote0
        return {"disk": disk / sent, "written": wrote / sent, "rate": sent / elapsed}
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--a", type=Path, required=True, help="source tree A (before)")
    p.add_argument("--b", type=Path, default=HERE.parent, help="source tree B (default: this)")
    p.add_argument("--queues", type=int, default=10)
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    trees = {"A": args.a.resolve(), "B": args.b.resolve()}
    results: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    for r in range(args.rounds):
        for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
            res = run_once(trees[name], args)
            results[name].append(res)
            print(f"round {r + 1} {name}: {res}", flush=True)
    print(
        f"\n{args.messages} persistent messages of {args.size} B, fanout to {args.queues} "
        f"durable queues, confirms; median of {args.rounds} rounds\n"
    )
    print("| | A (before) | B (after) | B/A |\n|---|---:|---:|---:|")
    for key, label in (
        ("disk", "segment bytes per message"),
        ("written", "bytes written per message"),
        ("rate", "confirmed messages/s"),
    ):
        a = statistics.median(x[key] for x in results["A"])
        b = statistics.median(x[key] for x in results["B"])
        print(f"| {label} | {a:,.0f} | {b:,.0f} | {b / a:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
