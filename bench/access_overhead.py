#!/usr/bin/env python3
"""What permissions cost the publish path: S1 (and S3) before and after, side by side.

Starts `leveret server` from two source trees (e.g. a checkout of the commit before
the permission checks, and this one) and runs the referee load generator against
them in alternating order, several rounds, reporting the median of each:

  before        the older tree, user guest
  after/guest   this tree, guest (full access: no guard on the publish path)
  after/limited this tree, a user whose configure permission is limited (^bench\\.), so every
                publish passes the permission guard (write allowed by a cached check)

    bench/access_overhead.py --before /path/to/old/checkout --rounds 5 --seconds 5
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tree_ab import workers_flag

HERE = Path(__file__).resolve().parent
AMQBENCH = Path(os.environ.get("AMQBENCH", "/work/shared/tools/amqbench.py"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(src: Path, data_dir: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(src / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "leveret", "server", *workers_flag(src), "--port", str(port),
         "--data-dir", data_dir, "--log-level", "warning"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"broker from {src} did not start")


def ctl(src: Path, data_dir: str, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(src / "src")}
    subprocess.run(
        [sys.executable, "-m", "leveret", "ctl", "--data-dir", data_dir, *args],
        env=env, check=True, capture_output=True,
    )  # fmt: skip


def amqbench(port: int, user: str, password: str, seconds: float, extra: list[str]) -> dict:
    out = subprocess.run(
        [sys.executable, str(AMQBENCH), "--port", str(port), "--user", user, "--password",
         password, "--seconds", str(seconds), "--warmup", "1", *extra],
        capture_output=True, text=True, timeout=seconds * 4 + 60,
    )  # fmt: skip
    for line in reversed(out.stdout.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    raise SystemExit(f"amqbench printed no JSON: {out.stdout[-500:]} {out.stderr[-500:]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--before", type=Path, required=True, help="source tree of the older version")
    p.add_argument("--after", type=Path, default=HERE.parent, help="this source tree")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=5.0)
    args = p.parse_args()
    scenarios = {
        "S1 msg/s": (["--size", "16", "--prefetch", "500"], "consumed"),
    }
    variants = ["before", "after/guest", "after/limited"]
    results: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        brokers = {}
        brokers["before"] = start(args.before, f"{tmp}/before") + ("guest", "guest")
        proc, port = start(args.after, f"{tmp}/after")
        ctl(args.after, f"{tmp}/after", "add_user", "bench", "bench")
        ctl(args.after, f"{tmp}/after", "set_permissions", "bench", "^bench\\.", ".*", ".*")
        brokers["after/guest"] = (proc, port, "guest", "guest")
        brokers["after/limited"] = (proc, port, "bench", "bench")
        try:
            for r in range(args.rounds):
                order = variants if r % 2 == 0 else list(reversed(variants))
                for name, (extra, figure) in scenarios.items():
                    for variant in order:
                        _proc, port, user, password = brokers[variant]
                        data = amqbench(port, user, password, args.seconds, extra)
                        value = float(data[f"{figure}_per_s"])
                        results.setdefault((name, variant), []).append(value)
                        print(f"round {r + 1} {name} {variant}: {value:,.0f}", file=sys.stderr)
        finally:
            for proc, *_ in {id(b[0]): b for b in brokers.values()}.values():
                proc.terminate()
                proc.wait(20)
    print("| scenario | " + " | ".join(variants) + " |")
    print("|---|" + "---|" * len(variants))
    for name in scenarios:
        medians = [statistics.median(results[(name, v)]) for v in variants]
        print(
            f"| {name} (median of {args.rounds}) | "
            + " | ".join(f"{m:,.0f}" for m in medians)
            + " |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
