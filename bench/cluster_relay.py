#!/usr/bin/env python3
"""What relaying replication through the supervisor costs (docs/workers.md, "In a
cluster"): CPU per persistent confirmed message on the leader of three nodes that run
`--workers 1` (one process: the broker writes the replication stream itself) and
`--workers 2` (each worker's store writes go worker -> supervisor (WorkerTap, Relay)
-> followers).

    PYTHONPATH=src python bench/cluster_relay.py --rounds 5 --seconds 8
    PYTHONPATH=src python bench/cluster_relay.py --rounds 1 --profile /tmp/sup.txt

Two clusters (each its own etcd and three nodes) run side by side, so that the
rounds alternate between them without restarts. Each round, for each cluster in
turn (the order alternates) and each load, `leveret perf` runs against the leader's
own port: persistent messages, confirms (window 1000), prefetch 500, one producer and
one consumer per queue, 1 queue or 2 queues (named so that on two workers each has
its own worker; affinity takes each client to its queue's worker). CPU is user +
system from /proc/<pid>/stat of every process of the leader node (its supervisor and
its workers), and of each follower, taken before and after the run, divided by the
messages confirmed in the run (perf with no warm-up: the window is the whole run).
Prints every run and the medians; `--json` the whole record.

`--profile FILE`: py-spy samples the leader's supervisor of the `--workers 2`
cluster during its runs of the first round and writes its collapsed stacks (py-spy's
raw format) to FILE, the top frames by own time printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from cluster import wait_all_in_sync  # noqa: E402
from leveret.cluster.local import EtcdProcess, NodeProcess  # noqa: E402
from leveret.examples.cluster import leader_name, wait_leader  # noqa: E402
from leveret.workers.mesh import placement  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of one process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def children(pid: int) -> list[int]:
    """Every descendant of `pid` (a node's workers), from /proc's children lists."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def queue_prefixes(queues: int) -> list[str]:
    """One perf queue-name prefix per queue, whose queue (<prefix>0) lies on its own
    worker of two. (One perf run with `--queues 2` does not do: the names <p>0 and
    <p>1 differ in one bit at the same place, so their CRC-32s differ by a constant
    and they always fall on the same worker of two.)"""
    out: list[str] = []
    for i in range(1000):
        prefix = f"relay{i}.q"
        if placement("/", f"{prefix}0", 2) == len(out) % 2:
            out.append(prefix)
            if len(out) == queues:
                return out
    raise RuntimeError("no prefixes spread the queues")


class BenchCluster:
    def __init__(self, directory: str, workers: int) -> None:
        self.workers = workers
        self.name = f"relay{workers}"
        self.directory = os.path.join(directory, self.name)
        self.etcd = EtcdProcess(os.path.join(self.directory, "etcd"))
        os.makedirs(self.etcd.directory)
        self.etcd.start()
        extra = ("--workers", str(workers))
        self.nodes = [
            NodeProcess(
                f"n{i}", self.etcd.url, self.directory, cluster=self.name, lease=5, extra=extra
            ).start()
            for i in range(3)
        ]

    def ready(self) -> None:
        wait_leader(self.etcd.url, self.name, self.nodes)
        wait_all_in_sync(self.etcd.url, self.name, {n.name for n in self.nodes})

    def leader(self) -> NodeProcess:
        name = leader_name(self.etcd.url, self.name)
        return next(n for n in self.nodes if n.name == name)

    def close(self) -> None:
        for n in self.nodes:
            n.stop()
        self.etcd.stop()


def perf(port: int, queues: int, seconds: float) -> dict:
    """`queues` perf processes side by side, each one producer and one consumer on a
    queue of its own: their totals."""
    procs = []
    for prefix in queue_prefixes(queues):
        argv = [
            sys.executable, "-m", "leveret", "perf",
            "--uri", f"amqp://guest:guest@127.0.0.1:{port}/%2F",
            "--queue-name", prefix,
            "--persistent", "--confirm", "1000", "--prefetch", "500", "--size", "16",
            "--duration", str(seconds), "--warmup", "0", "--json", "--quiet",
        ]  # fmt: skip
        procs.append(
            subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    total = {"confirmed": 0, "confirmed_per_s": 0.0, "errors": []}
    for proc in procs:
        out, err = proc.communicate(timeout=seconds + 120)
        if proc.returncode != 0:
            raise RuntimeError(f"leveret perf failed: {err[-2000:]}")
        doc = json.loads(out.strip().splitlines()[-1])
        total["confirmed"] += doc["confirmed"]
        total["confirmed_per_s"] += doc["confirmed_per_s"]
        total["errors"] += doc.get("errors", [])
    return total


def measure(c: BenchCluster, queues: int, seconds: float, profile: str | None) -> dict:
    leader = c.leader()
    sup = leader.proc.pid  # type: ignore[union-attr]
    workers = children(sup)
    followers = [n.proc.pid for n in c.nodes if n is not leader]  # type: ignore[union-attr]
    pids = [sup, *workers, *followers]
    before = {p: cpu_seconds(p) for p in pids}
    spy = None
    if profile:
        spy = subprocess.Popen(
            ["py-spy", "record", "-p", str(sup), "-f", "raw", "-o", profile, "-r", "200",
             "-d", str(int(seconds) + 1), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    result = perf(leader.port, queues, seconds)
    if spy is not None:
        spy.wait(60)
    used = {p: cpu_seconds(p) - before[p] for p in pids}
    confirmed = max(1, int(result["confirmed"]))
    us = 1e6 / confirmed
    return {
        "workers": c.workers,
        "queues": queues,
        "confirmed": confirmed,
        "confirmed_per_s": result["confirmed_per_s"],
        "leader_us": sum(used[p] for p in [sup, *workers]) * us,
        "supervisor_us": used[sup] * us if workers else None,
        "workers_us": sum(used[p] for p in workers) * us if workers else None,
        "follower_us": statistics.mean(used[p] for p in followers) * us,
        "errors": result.get("errors", []),
    }


def top_frames(path: str, n: int = 15) -> tuple[float, list[tuple[str, float]], list]:
    """py-spy's raw (collapsed) stacks: the share of samples waiting in the selector
    (idle), and of the others (busy) each leaf frame's share and each innermost
    leveret frame's (where the time goes in Leveret's own code, the library calls it
    makes included)."""
    leaf: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    idle = busy = 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            if not count.isdigit():
                continue
            frames = stack.split(";")
            if "select (selectors.py" in frames[-1]:
                idle += int(count)
                continue
            busy += int(count)
            leaf[frames[-1]] += int(count)
            mine = [f for f in frames if "leveret/" in f]
            ours[mine[-1] if mine else "(no leveret frame)"] += int(count)
    total = max(1, busy)
    share = 100.0 * idle / max(1, idle + busy)
    return (
        share,
        [(frame, 100.0 * k / total) for frame, k in leaf.most_common(n)],
        [(frame, 100.0 * k / total) for frame, k in ours.most_common(n)],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--queues", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--profile", help="py-spy raw stacks of the supervisor to FILE")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="leveret-bench-relay-")
    clusters = [BenchCluster(directory, 1), BenchCluster(directory, 2)]
    runs: list[dict] = []
    try:
        for c in clusters:
            c.ready()
        for r in range(args.rounds):
            order = clusters if r % 2 == 0 else clusters[::-1]
            for c in order:
                for q in args.queues:
                    profile = None
                    if args.profile and r == 0 and c.workers == 2:
                        profile = f"{args.profile}.{q}q"
                    run = measure(c, q, args.seconds, profile)
                    run["round"] = r + 1
                    runs.append(run)
                    split = ""
                    if run["supervisor_us"] is not None:
                        split = (
                            f" (supervisor {run['supervisor_us']:.1f}, "
                            f"workers {run['workers_us']:.1f})"
                        )
                    print(
                        f"round {r + 1} workers {c.workers} queues {q}: "
                        f"{run['confirmed_per_s']:,.0f} confirmed/s; CPU us/msg leader "
                        f"{run['leader_us']:.1f}{split}, each follower "
                        f"{run['follower_us']:.1f}",
                        flush=True,
                    )
                    time.sleep(1)
    finally:
        for c in clusters:
            c.close()
        shutil.rmtree(directory, ignore_errors=True)
    print("\nmedians (CPU us per confirmed message):")
    for q in args.queues:
        for w in (1, 2):
            mine = [x for x in runs if x["workers"] == w and x["queues"] == q]
            if not mine:
                continue

            def med(key: str, mine: list[dict] = mine) -> str:
                vals = [x[key] for x in mine if x[key] is not None]
                return f"{statistics.median(vals):.1f}" if vals else "-"

            print(
                f"  workers {w} queues {q}: leader {med('leader_us')} (supervisor "
                f"{med('supervisor_us')}, workers {med('workers_us')}), follower "
                f"{med('follower_us')}, {med('confirmed_per_s')} confirmed/s"
            )
    if args.profile:
        for q in args.queues:
            path = f"{args.profile}.{q}q"
            if os.path.exists(path):
                idle, leaves, ours = top_frames(path)
                print(f"\nsupervisor, {q} queue(s) (py-spy, {path}): {idle:.0f}% of samples idle")
                print("  busy samples by leaf frame:")
                for frame, share in leaves:
                    print(f"    {share:5.1f}%  {frame}")
                print("  busy samples by innermost leveret frame:")
                for frame, share in ours:
                    print(f"    {share:5.1f}%  {frame}")
    if args.json:
        print(json.dumps(runs))


if __name__ == "__main__":
    main()
