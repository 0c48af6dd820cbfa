#!/usr/bin/env python3
"""Two versions of Leveret side by side: the referee's and `leveret perf`'s figures.

Starts `leveret server` from two source trees (A: an older checkout, B: this one) and
runs each scenario with the referee amqbench.py against both brokers and with each
tree's own `leveret perf` against its own broker, alternating A and B each round so
neither always runs on a warmer machine. Prints the median of the rounds as a table.

    git worktree add --detach /tmp/before 8caa1c2^
    bench/broker_ab.py --a /tmp/before --rounds 5 --seconds 5 --scenarios S1,S3

The same tree compiled (B) and as pure Python (A):

    bench/broker_ab.py --a . --b . --a-env LEVERET_PURE_PYTHON=1 --scenarios S1,S2,S5

The same tree twice, with and without the management API and metrics:

    bench/broker_ab.py --a . --b . --b-args "--management-port 15680 --prometheus-port 15681"
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import socket  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

from compare_lib import SCENARIOS, pick, run_json_command  # noqa: E402
from tree_ab import workers_flag  # noqa: E402

HERE = Path(__file__).resolve().parent
#: the listeners a measured broker does without: two brokers side by side (and a
#: reference RabbitMQ with its Web MQTT on 15675) cannot share the default ports
QUIET = "--management-port 0 --prometheus-port 0 --mqtt-port 0 --web-mqtt-port 0 --mqtt-tls-port 0"
AMQBENCH = Path(os.environ.get("AMQBENCH", "/work/shared/tools/amqbench.py"))


def _env(tree: Path, extra: list[str] | None = None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    env.update(item.split("=", 1) for item in extra or [])
    return env


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--a", type=Path, required=True, help="source tree A (before)")
    p.add_argument("--b", type=Path, default=HERE.parent, help="source tree B (default: this)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--scenarios", default="S1,S3")
    p.add_argument("--tools", default="amqbench,leveret perf")
    p.add_argument(
        "--a-args",
        default=QUIET,
        help="extra `leveret server` arguments for A (default: no HTTP or MQTT listeners)",
    )
    p.add_argument("--b-args", default=QUIET,
                   help="the same for B; e.g. '--management-port 15680 --prometheus-port 15681'"
                   " to measure what the management API costs")  # fmt: skip
    p.add_argument(
        "--a-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment of A's broker, e.g. LEVERET_PURE_PYTHON=1 (repeatable)",
    )
    p.add_argument("--b-env", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    scenarios = [SCENARIOS[s] for s in args.scenarios.split(",")]
    tools = args.tools.split(",")
    results: dict[tuple[str, str, str], list] = {}
    trees = {"A": args.a.resolve(), "B": args.b.resolve()}
    with tempfile.TemporaryDirectory() as tmp:
        extra = {"A": args.a_args.split(), "B": args.b_args.split()}
        envs = {"A": args.a_env, "B": args.b_env}
        brokers = {
            name: _start(tree, f"{tmp}/{name}", extra[name], envs[name])
            for name, tree in trees.items()
        }
        try:
            for r in range(args.rounds):
                order = ["A", "B"] if r % 2 == 0 else ["B", "A"]
                for scenario in scenarios:
                    for tool in tools:
                        if tool not in scenario.tools:
                            continue
                        for name in order:
                            port = brokers[name][1]
                            if tool == "amqbench":
                                argv = [sys.executable, str(AMQBENCH), "--port", str(port),
                                        "--seconds", str(args.seconds)]  # fmt: skip
                                env = None
                            else:
                                argv = [sys.executable, "-m", "leveret.perf", "--uri",
                                        f"amqp://guest:guest@127.0.0.1:{port}/%2F", "--json",
                                        "--quiet", "--duration", str(args.seconds),
                                        *scenario.perf_extra]  # fmt: skip
                                env = _env(trees[name])
                            argv += ["--warmup", "1", *scenario.flags]
                            data = run_json_command(argv, args.seconds + 120, env)
                            value = pick(
                                data, scenario.figure, "amqbench" if tool == "amqbench" else "perf"
                            )
                            results.setdefault((scenario.key, tool, name), []).append(value)
                            print(
                                f"round {r + 1} {scenario.key} {tool} {name}: {value}",
                                file=sys.stderr,
                            )
        finally:
            for proc, _port in brokers.values():
                proc.terminate()
                proc.wait(20)
    print(f"| scenario | tool | A ({trees['A'].name}) | B ({trees['B'].name}) | B/A |")
    print("|---|---|---|---|---|")
    for scenario in scenarios:
        for tool in tools:
            if tool not in scenario.tools:
                continue
            a = results[(scenario.key, tool, "A")]
            b = results[(scenario.key, tool, "B")]
            if scenario.figure == "latency":
                ma = (statistics.median(x[0] for x in a), statistics.median(x[1] for x in a))
                mb = (statistics.median(x[0] for x in b), statistics.median(x[1] for x in b))
                cells = f"{ma[0]:.2f} / {ma[1]:.2f} ms | {mb[0]:.2f} / {mb[1]:.2f} ms | p99 {mb[1] / ma[1]:.2f}"
            else:
                ma, mb = statistics.median(a), statistics.median(b)
                cells = f"{ma:,.0f} | {mb:,.0f} | {mb / ma:.2f}"
            print(f"| {scenario.key} {scenario.title} | {tool} | {cells} |")
    print(f"\nmedian of {args.rounds} rounds of {args.seconds:g} s, A and B alternating")
    return 0


def _start(
    tree: Path, data_dir: str, extra: list[str], env: list[str]
) -> tuple[subprocess.Popen, int]:
    """`leveret server` from `tree` (its src/ alone on the path), once its port listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "leveret", "server", *workers_flag(tree), "--port", str(port),
         "--data-dir", data_dir, "--log-level", "warning", *extra],
        env=_env(tree, env), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the broker from {tree} did not start")


if __name__ == "__main__":
    sys.exit(main())
