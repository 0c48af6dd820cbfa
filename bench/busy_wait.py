#!/usr/bin/env python3
"""S3's latency and the broker's CPU with and without busy waiting (--busy-wait-us).

Starts one Leveret per window (0 is the default, off), and runs amqbench's S3 (a fixed
rate, one message a write) against each in turn, alternating the order every round and
pausing the brokers not being measured. Reference RabbitMQ nodes can run beside them,
e.g. the default one (Erlang `+sbwt none`) and one started with busy waiting on:

    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+sbwt very_long +sbwtdcpu very_long +sbwtdio very_long" \\
        /work/tools/rabbitmq-at.sh start 5674
    bench/busy_wait.py --windows 0,2000 --rabbitmq default=5673 --rabbitmq sbwt-very-long=5674

CPU is the broker process's user and system time while traffic flows (warm-up and
measured seconds), as a share of one core (from /proc/PID/stat), so the price of the latency is in the same table.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_lib import Broker, others_paused, run_json_command, start_leveret  # noqa: E402

AMQBENCH = Path(os.environ.get("AMQBENCH", "/work/shared/tools/amqbench.py"))
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system time of the whole process (every thread), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def listener_pid(port: int) -> int | None:
    out = subprocess.run(
        ["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True, check=False
    ).stdout
    match = re.search(r"pid=(\d+)", out)
    return int(match.group(1)) if match else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--windows", default="0,2000", help="--busy-wait-us values, 0 = off")
    p.add_argument("--rabbitmq", action="append", default=[], metavar="LABEL=PORT")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--rate", type=int, default=5000)
    p.add_argument("--first-port", type=int, default=5720)
    args = p.parse_args()

    brokers: dict[str, Broker] = {}
    for i, window in enumerate(int(w) for w in args.windows.split(",")):
        label = f"Leveret --busy-wait-us {window}" if window else "Leveret (default: off)"
        command = (
            "{python} -m leveret server --workers 1 --mqtt-port 0 --web-mqtt-port 0 --port {port} --data-dir {data_dir} "
            f"--management-port 0 --prometheus-port 0 --busy-wait-us {window}"
        )
        brokers[label] = start_leveret(args.first_port + i, command, sys.executable)
    for item in args.rabbitmq:
        label, _, port = item.partition("=")
        broker = Broker(f"RabbitMQ {label}", int(port))
        broker.pid = listener_pid(broker.port)
        if broker.pid is None:
            broker.error = f"nothing listens on port {port}"
        brokers[f"RabbitMQ {label}"] = broker
    failed = {k: b.error for k, b in brokers.items() if b.error}
    if failed:
        for b in brokers.values():
            b.stop()
        print(f"cannot start: {failed}", file=sys.stderr)
        return 1

    rows: dict[str, list[tuple[float, float, float]]] = {k: [] for k in brokers}
    try:
        for rnd in range(args.rounds):
            order = list(brokers) if rnd % 2 == 0 else list(reversed(brokers))
            for key in order:
                broker = brokers[key]
                with others_paused(brokers, key):
                    before = cpu_seconds(broker.pid)
                    data = run_json_command(
                        [sys.executable, str(AMQBENCH), "--port", str(broker.port),
                         "--seconds", str(args.seconds), "--warmup", str(args.warmup),
                         "--rate", str(args.rate)],
                        timeout=args.seconds + args.warmup + 60,
                    )  # fmt: skip
                    # per second of traffic (warm-up and measured seconds), not of
                    # the tool's start-up and teardown
                    cpu = (cpu_seconds(broker.pid) - before) / (args.warmup + args.seconds) * 100
                if data.get("errors"):
                    raise RuntimeError(f"{key}: {data['errors']}")
                rows[key].append((data["lat_ms_p50"], data["lat_ms_p99"], cpu))
                print(
                    f"round {rnd + 1} {key}: p50 {data['lat_ms_p50']:.3f} p99 "
                    f"{data['lat_ms_p99']:.3f} ms, CPU {cpu:.0f}%",
                    file=sys.stderr,
                )
    finally:
        for b in brokers.values():
            b.stop()

    print("| broker | p50 ms | p99 ms | p99, each round | CPU, % of a core |")
    print("|---|---:|---:|---|---:|")
    for key, runs in rows.items():
        p50 = statistics.median(r[0] for r in runs)
        p99 = statistics.median(r[1] for r in runs)
        cpu = statistics.median(r[2] for r in runs)
        each = ", ".join(f"{r[1]:.2f}" for r in runs)
        print(f"| {key} | {p50:.3f} | {p99:.3f} | {each} | {cpu:.0f} |")
    print(
        f"\nS3: {args.rate} msg/s, medians of {args.rounds} rounds of {args.seconds:g} s, "
        "brokers alternating, the others paused"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
