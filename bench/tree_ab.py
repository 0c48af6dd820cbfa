"""Two Leveret source trees side by side, for benchmarks that drive the broker with
their own client code (bench/fanout_disk.py, bench/queue_rss.py).

`leveret_from(tree)` starts `leveret server` from a tree on a fresh data dir;
`alternate` runs a measurement against both trees, alternating which goes first
each round; `print_medians` prints the medians as a Markdown table.
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


def workers_flag(tree: str | Path) -> list[str]:
    """`--workers 1` for a tree whose `leveret server` has the option (none for an
    older one): every broker a benchmark starts runs one process, whatever
    `leveret server`'s default."""
    try:
        cli = (Path(tree) / "src" / "leveret" / "cli.py").read_text()
    except OSError:
        return []
    return ["--workers", "1"] if '"--workers"' in cli else []


@dataclass
class Running:
    pid: int
    port: int
    data_dir: str

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def leveret_from(tree: Path) -> Iterator[Running]:
    """`leveret server` from `tree` on a fresh data dir, without HTTP servers."""
    port = _free_port()
    data_dir = tempfile.mkdtemp(prefix="leveret-ab-")
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    argv = [sys.executable, "-m", "leveret", "server", *workers_flag(tree), "--port", str(port)]
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
        yield Running(proc.pid, port, data_dir)
    finally:
        proc.terminate()
        proc.wait(60)
        shutil.rmtree(data_dir, ignore_errors=True)


def add_tree_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--a", type=Path, required=True, help="source tree A (before)")
    p.add_argument("--b", type=Path, default=HERE.parent, help="source tree B (default: this)")
    p.add_argument("--rounds", type=int, default=3)


def alternate(
    args: argparse.Namespace, run_once: Callable[[Path], dict[str, float]]
) -> dict[str, list[dict[str, float]]]:
    """run_once(tree) for trees A and B, `args.rounds` times, alternating the order."""
    trees = {"A": args.a.resolve(), "B": args.b.resolve()}
    results: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    for r in range(args.rounds):
        for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
            res = run_once(trees[name])
            results[name].append(res)
            print(f"round {r + 1} {name}: {res}", flush=True)
    return results


def print_medians(
    title: str, results: dict[str, list[dict[str, float]]], rows: list[tuple[str, str]]
) -> None:
    """A Markdown table of the medians: one row per (result key, label)."""
    print(f"\n{title}\n")
    print("| | A (before) | B (after) | B/A |\n|---|---:|---:|---:|")
    for key, label in rows:
        a = statistics.median(x[key] for x in results["A"])
        b = statistics.median(x[key] for x in results["B"])
        print(f"| {label} | {a:,.1f} | {b:,.1f} | {b / a:.2f} |")
