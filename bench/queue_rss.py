#!/usr/bin/env python3
"""RAM of a long durable queue with given arguments, two source trees side by side.

Fills one durable queue (declared with `--arguments`, JSON) with `--messages`
persistent messages of `--size` bytes, with confirms and no consumer, against
`leveret server` started from each tree on a fresh data dir; then reports the
broker's RSS growth over its idle RSS, per queued message, and the fill rate.
The trees alternate each round; the figures are medians.

    git worktree add --detach /tmp/before <commit>
    python bench/queue_rss.py --a /tmp/before --arguments '{"x-message-ttl": 3600000}'
"""

from __future__ import annotations

import argparse
import json
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


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def run_once(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    from leveret.client.blocking import connect

    port = _free_port()
    data_dir = tempfile.mkdtemp(prefix="leveret-queue-rss-")
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
        time.sleep(0.5)
        idle = _rss_kb(proc.pid)
        with connect(f"amqp://guest:guest@127.0.0.1:{port}/%2F") as conn:
            ch = conn.channel()
            ch.declare_queue("bench.long", durable=True, arguments=json.loads(args.arguments))
            body = b"x" * args.size
            t0 = time.monotonic()
            sent = ch.publish_many(
                (body for _ in range(args.messages)), "bench.long", persistent=True
            )
            elapsed = time.monotonic() - t0
        time.sleep(0.5)
        grown = _rss_kb(proc.pid) - idle
        return {
            "bytes_per_msg": grown * 1024 / sent,
            "rss_mb": grown / 1024,
            "rate": sent / elapsed,
        }
    finally:
        proc.terminate()
        proc.wait(60)
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--a", type=Path, required=True, help="source tree A (before)")
    p.add_argument("--b", type=Path, default=HERE.parent, help="source tree B (default: this)")
    p.add_argument("--arguments", default='{"x-message-ttl": 3600000}', help="queue arguments")
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--size", type=int, default=16)
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    trees = {"A": args.a.resolve(), "B": args.b.resolve()}
    results: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    for r in range(args.rounds):
        for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
            res = run_once(trees[name], args)
            results[name].append(res)
            print(f"round {r + 1} {name}: {res}", flush=True)
    print(
        f"\n{args.messages:,} persistent messages of {args.size} B in one durable queue with "
        f"arguments {args.arguments}, no consumer; median of {args.rounds} round(s)\n"
    )
    print("| | A (before) | B (after) | B/A |\n|---|---:|---:|---:|")
    for key, label in (
        ("rss_mb", "RSS growth, MB"),
        ("bytes_per_msg", "RSS growth per queued message, B"),
        ("rate", "confirmed messages/s while filling"),
    ):
        a = statistics.median(x[key] for x in results["A"])
        b = statistics.median(x[key] for x in results["B"])
        print(f"| {label} | {a:,.1f} | {b:,.1f} | {b / a:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
