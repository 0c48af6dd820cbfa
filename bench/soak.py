#!/usr/bin/env python3
"""A steady-load soak: does the broker's RSS stay flat under constant traffic?

    python bench/soak.py --minutes 10 --rate 5000 --size 1024

Starts a fresh `leveret server` (its own data directory), then runs the referee
load generator (../shared/tools/amqbench.py) at a fixed publish rate with one
consumer, persistent messages and confirms, for the whole duration, sampling the
broker's RSS every --every seconds. Prints the samples, the growth from the end
of the first minute to the end, and one JSON line. Not a test: no pass/fail.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from durability import AMQBENCH, Server, rss_kb  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--rate", type=int, default=5000, help="publishes per second")
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--every", type=float, default=10.0, help="seconds between RSS samples")
    p.add_argument("--port", type=int, default=5696)
    p.add_argument("--amqbench", default=AMQBENCH)
    args = p.parse_args()
    seconds = args.minutes * 60
    samples: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as work:
        server = Server(args.port, f"{work}/data", f"{work}/log", "batch")
        server.start()
        assert server.proc is not None
        load = subprocess.Popen(
            [sys.executable, args.amqbench, "--port", str(args.port), "--seconds", str(seconds),
             "--warmup", "0", "--size", str(args.size), "--rate", str(args.rate),
             "--persistent", "--confirm", "1000"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        start = time.monotonic()
        while load.poll() is None:
            samples.append((time.monotonic() - start, rss_kb(server.proc.pid) / 1024))
            print(f"{samples[-1][0]:7.0f} s  RSS {samples[-1][1]:7.1f} MB", flush=True)
            time.sleep(args.every)
        out = load.stdout.read() if load.stdout else ""
        server.stop()
    result = json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])
    after_first_minute = [mb for t, mb in samples if t >= 60] or [samples[-1][1]]
    summary = {
        "minutes": args.minutes,
        "rate": args.rate,
        "size": args.size,
        "consumed_per_s": result.get("consumed_per_s"),
        "lat_ms_p99": result.get("lat_ms_p99"),
        "errors": result.get("errors"),
        "rss_mb_at_1_min": round(after_first_minute[0], 1),
        "rss_mb_max": round(max(mb for _, mb in samples), 1),
        "rss_mb_end": round(samples[-1][1], 1),
        "growth_mb_after_1_min": round(samples[-1][1] - after_first_minute[0], 1),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
