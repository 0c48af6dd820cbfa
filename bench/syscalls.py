#!/usr/bin/env python3
"""System calls per confirmed message under S2, and what one group commit holds.

    python bench/syscalls.py [--seconds 5] [--tree DIR] [--fsync batch]

Starts `leveret server` from a source tree (default: this one) with its Prometheus
endpoint on a free port, attaches `strace -c -f` to it (every thread), runs the
referee amqbench.py's S2 (persistent 16 B, confirm window 1000, one producer and
one consumer) with no warm-up, detaches, and divides strace's counts by the
messages confirmed. The store's own histograms (/metrics) give the group commits:
how many, how long their fsync took, how many submissions each made durable.
strace slows the broker down, so the rates here are not S2's; the counts per
message are what to compare. Prints a Markdown table and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tree_ab import workers_flag

HERE = Path(__file__).resolve().parent
AMQBENCH = Path(os.environ.get("AMQBENCH", "/work/shared/tools/amqbench.py"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("the broker exited")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise SystemExit("the broker did not listen")


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--tree", type=Path, default=HERE.parent)
    p.add_argument("--fsync", default="batch")
    args = p.parse_args()
    port, prom = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(args.tree.resolve() / "src")}
    with tempfile.TemporaryDirectory() as data:
        broker = subprocess.Popen(
            [sys.executable, "-m", "leveret", "server", *workers_flag(args.tree), "--mqtt-port", "0", "--web-mqtt-port", "0", "--port", str(port), "--data-dir", data,
             "--management-port", "0", "--prometheus-port", str(prom), "--fsync", args.fsync,
             "--log-level", "warning"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            wait_port(port, broker)
            out = os.path.join(data, "strace.txt")
            tracer = subprocess.Popen(
                ["strace", "-c", "-f", "-o", out, "-p", str(broker.pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(1.0)  # strace attaches to every thread
            before = urllib.request.urlopen(f"http://127.0.0.1:{prom}/metrics").read().decode()
            res = subprocess.run(
                [sys.executable, str(AMQBENCH), "--port", str(port), "--seconds", str(args.seconds),
                 "--warmup", "0", "--persistent", "--confirm", "1000"],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            after = urllib.request.urlopen(f"http://127.0.0.1:{prom}/metrics").read().decode()
            tracer.send_signal(signal.SIGINT)
            tracer.wait(30)
            bench = json.loads(res.stdout.strip().splitlines()[-1])
            table = Path(out).read_text()
        finally:
            broker.terminate()
            broker.wait(30)
    # amqbench counts confirms over exactly --seconds; strace saw a little more (the
    # second before, the queue's deletion after), which only adds to the counts.
    confirmed = bench["confirmed_per_s"] * args.seconds
    calls: dict[str, int] = {}
    for line in table.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
            calls[parts[-1]] = int(parts[3])
    commits = metric(after, "leveret_store_fsync_seconds_count") - metric(
        before, "leveret_store_fsync_seconds_count"
    )
    fsync_s = metric(after, "leveret_store_fsync_seconds_sum") - metric(
        before, "leveret_store_fsync_seconds_sum"
    )
    writes = metric(after, "leveret_store_group_commit_writes_sum") - metric(
        before, "leveret_store_group_commit_writes_sum"
    )
    result = {
        "confirmed": round(confirmed),
        "confirmed_per_s_under_strace": bench["confirmed_per_s"],
        "syscalls_per_confirmed": round(sum(calls.values()) / confirmed, 4),
        "per_confirmed": {k: round(v / confirmed, 4) for k, v in sorted(calls.items(), key=lambda kv: -kv[1])},
        "group_commits": round(commits),
        "messages_per_group_commit": round(confirmed / commits, 1) if commits else None,
        "submissions_per_group_commit": round(writes / commits, 1) if commits else None,
        "fsync_ms_mean": round(fsync_s / commits * 1000, 3) if commits else None,
        "fsync": args.fsync,
    }  # fmt: skip
    print("| system call | per confirmed message |")
    print("|---|---:|")
    for name, per in list(result["per_confirmed"].items())[:10]:
        print(f"| {name} | {per:.4f} |")
    print(f"| all | {result['syscalls_per_confirmed']:.4f} |")
    print(
        f"\n{result['confirmed']:,} confirmed; {result['group_commits']:,} group commits, "
        f"{result['messages_per_group_commit']} messages and "
        f"{result['submissions_per_group_commit']} submissions each, fsync "
        f"{result['fsync_ms_mean']} ms on average"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
