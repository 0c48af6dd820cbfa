#!/usr/bin/env python3
"""How much CPU a broker spends per message in one amqbench scenario, thread by thread.

    python bench/cpu_share.py --port 5672 --pid PID --scenario S2 [--seconds 8]

Reads every thread's user+system time of process PID from /proc before and after
one referee amqbench.py run, and prints the broker's cores used (CPU seconds per
second), microseconds of CPU per message, and the busiest threads. Works for any
broker (a Leveret server, RabbitMQ's beam.smp). A broker that uses more than one
core gains from a second core that a one-thread broker cannot use: on two cores
shared with the load generator that is what separates machines.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_lib import SCENARIOS  # noqa: E402

AMQBENCH = Path(os.environ.get("AMQBENCH", "/work/shared/tools/amqbench.py"))
TICK = os.sysconf("SC_CLK_TCK")


def threads(pid: int) -> dict[str, float]:
    """thread name (and id) -> CPU seconds so far."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[f"{name}/{task.name}"] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--scenario", default="S2", choices=sorted(SCENARIOS))
    p.add_argument("--seconds", type=float, default=8.0)
    args = p.parse_args()
    sc = SCENARIOS[args.scenario]
    argv = [sys.executable, str(AMQBENCH), "--port", str(args.port), "--seconds",
            str(args.seconds), "--warmup", "0", *sc.flags]  # fmt: skip
    before, t0 = threads(args.pid), time.monotonic()
    res = subprocess.run(argv, capture_output=True, text=True, check=True)
    after, wall = threads(args.pid), time.monotonic() - t0
    data = json.loads(res.stdout.strip().splitlines()[-1])
    figure = data[f"{sc.figure}_per_s"] if sc.figure != "latency" else data["consumed_per_s"]
    messages = figure * args.seconds
    used = {k: after[k] - before.get(k, 0.0) for k in after}
    total = sum(used.values())
    busiest = sorted(used.items(), key=lambda kv: -kv[1])[:4]
    result = {
        "scenario": args.scenario,
        "msg_per_s": figure,
        "cores_used": round(total / wall, 2),
        "cpu_us_per_message": round(total / messages * 1e6, 2) if messages else None,
        "busiest_threads_cores": {k: round(v / wall, 2) for k, v in busiest},
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
