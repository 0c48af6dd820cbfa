#!/usr/bin/env python3
"""The cluster's figures (docs/cluster.md): failover time, and what replication costs.

    bench/cluster.py failover --kills 20 --lease 5     # SIGKILL of the leader, 20 times
    bench/cluster.py s2 --rounds 5 --seconds 5         # S2: one plain node vs three nodes
    bench/cluster.py vs-rabbitmq --rabbitmq amqp://guest:guest@127.0.0.1:5683/%2F
                                                       # S2: three Leveret vs three RabbitMQ
    bench/cluster.py cpu --rounds 3                    # CPU per message of each node, S2

failover: etcd and three nodes on loopback; a leveret.client publisher (persistent,
confirms, every node's URL) publishes; the leader is SIGKILLed and the time to the
first confirmed publish after it is taken; the killed node restarts and the next
kill waits until all three are in sync again. Median and worst over the kills.

s2: amqbench's S2 (persistent, durable queue, confirm window 1000: confirmed/s)
against a single `leveret server` without clustering, and against the leader of a
three-node cluster (the leader's own port, and through a follower's proxy),
alternating each round. Prints the medians and the ratio.

cpu: S2 on the leader of three nodes, and the CPU time (user + system, from /proc)
each node's process spent per 100,000 confirmed messages: a finer measure than the
rate of what a change to replication costs, as the rate follows the shared machine's
load. Run it with PYTHONPATH at each version to compare, alternating.

vs-rabbitmq: S2 with `leveret perf` (it declares quorum queues; amqbench cannot) on
the leader of three Leveret nodes (quorum queue, and classic durable queue) and on
one node of a three-node RabbitMQ cluster you started (quorum queue: three members),
alternating each round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from compare_lib import SCENARIOS, pick, run_json_command  # noqa: E402

from leveret.cluster.local import EtcdProcess, NodeProcess, free_port  # noqa: E402
from leveret.examples.cluster import leader_name, wait_leader  # noqa: E402

AMQBENCH = Path(os.environ.get("AMQBENCH", "/work/shared/tools/amqbench.py"))


def _status(etcd_url: str, cluster: str) -> dict:
    import base64
    import urllib.request

    key = base64.b64encode(f"leveret/{cluster}/status".encode()).decode()
    req = urllib.request.Request(
        etcd_url + "/v3/kv/range", data=json.dumps({"key": key}).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=2) as res:
        kvs = json.loads(res.read()).get("kvs") or []
    return json.loads(base64.b64decode(kvs[0]["value"])) if kvs else {}


def wait_all_in_sync(etcd_url: str, cluster: str, names: set[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = _status(etcd_url, cluster)
        if (
            status.get("leader") == leader_name(etcd_url, cluster)
            and set(status.get("in_sync", [])) == names
        ):
            if all(n.get("lag_bytes") == 0 for n in status.get("nodes", [])):
                return
        time.sleep(0.1)
    raise RuntimeError("the cluster did not get back in sync")


def failover(args: argparse.Namespace) -> None:
    from leveret.client import connect

    directory = tempfile.mkdtemp(prefix="leveret-bench-cluster-")
    etcd = EtcdProcess(os.path.join(directory, "etcd"))
    os.makedirs(etcd.directory)
    etcd.start()
    nodes = [
        NodeProcess(f"n{i}", etcd.url, directory, cluster="bench", lease=args.lease).start()
        for i in range(3)
    ]
    figures: list[float] = []
    try:
        wait_leader(etcd.url, "bench", nodes)
        wait_all_in_sync(etcd.url, "bench", {n.name for n in nodes})

        async def run() -> None:
            conn = await connect(
                [n.url for n in nodes], reconnect_delay=0.05, reconnect_max_delay=0.2
            )
            ch = await conn.channel()
            await ch.declare_queue("bench.failover", durable=True)
            for kill in range(args.kills):
                for _ in range(200):
                    await ch.publish(b"x" * 16, "bench.failover", persistent=True)
                name = wait_leader(etcd.url, "bench", nodes)
                node = next(n for n in nodes if n.name == name)
                node.kill()
                t0 = time.monotonic()
                await ch.publish(b"x" * 16, "bench.failover", persistent=True)
                took = time.monotonic() - t0
                figures.append(took)
                print(f"kill {kill + 1}: {name}; first confirm after {took:.2f} s", flush=True)
                node.start()
                await asyncio.get_running_loop().run_in_executor(
                    None, wait_all_in_sync, etcd.url, "bench", {n.name for n in nodes}
                )
                await ch.purge_queue("bench.failover")
            await conn.close()

        logging_quiet()
        asyncio.run(run())
    finally:
        for n in nodes:
            n.stop()
        etcd.close()
    print(
        f"failover over {len(figures)} kills (lease {args.lease:g} s): "
        f"median {statistics.median(figures):.2f} s, worst {max(figures):.2f} s, "
        f"best {min(figures):.2f} s"
    )


def logging_quiet() -> None:
    import logging

    logging.getLogger("leveret.client").setLevel(logging.ERROR)


def _amqbench(port: int, seconds: float) -> float:
    s2 = SCENARIOS["S2"]
    argv = [sys.executable, str(AMQBENCH), "--port", str(port), "--seconds", str(seconds)]
    argv += ["--warmup", "2", *s2.flags]
    data = run_json_command(argv, seconds + 120)
    return float(pick(data, s2.figure, "amqbench"))  # type: ignore[arg-type]


def s2(args: argparse.Namespace) -> None:
    directory = tempfile.mkdtemp(prefix="leveret-bench-s2-")
    etcd = EtcdProcess(os.path.join(directory, "etcd"))
    os.makedirs(etcd.directory)
    etcd.start()
    nodes = [
        NodeProcess(f"n{i}", etcd.url, directory, cluster="bench", lease=5).start()
        for i in range(3)
    ]
    results: dict[str, list[float]] = {"one node": [], "three nodes": [], "three, via proxy": []}
    single = None
    try:
        wait_leader(etcd.url, "bench", nodes)
        wait_all_in_sync(etcd.url, "bench", {n.name for n in nodes})
        port = free_port()
        single = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "leveret",
                "server",
                "--workers",
                "1",
                "--port",
                str(port),
                "--data-dir",
                os.path.join(directory, "single"),
                "--management-port",
                "0",
                "--prometheus-port",
                "0",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.5)
        for r in range(args.rounds):
            leader = next(n for n in nodes if n.name == leader_name(etcd.url, "bench"))
            follower = next(n for n in nodes if n is not leader)
            order = [("one node", port), ("three nodes", leader.port)]
            order.append(("three, via proxy", follower.port))
            if r % 2:
                order.reverse()
            for label, p in order:
                value = _amqbench(p, args.seconds)
                results[label].append(value)
                print(f"round {r + 1} {label}: {value:.0f} confirmed/s", flush=True)
    finally:
        if single is not None:
            single.terminate()
            single.wait()
        for n in nodes:
            n.stop()
        etcd.close()
    base = statistics.median(results["one node"])
    for label, values in results.items():
        med = statistics.median(values)
        print(f"S2 {label}: median {med:.0f} confirmed/s ({med / base:.2f} of one node)")


def _perf(uri: str, queue_type: str, seconds: float, queue: str) -> float:
    """S2 with `leveret perf` (amqbench declares classic queues only): 1 producer,
    1 consumer, persistent 16 B messages, confirm window 1000: confirmed/s."""
    argv = [sys.executable, "-m", "leveret.perf", "--uri", uri, "--json", "--quiet"]
    argv += ["--duration", str(seconds), "--warmup", "2", "--persistent", "--confirm", "1000"]
    argv += ["--queue-type", queue_type, "--queue-name", queue]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(HERE.parent / "src"), env.get("PYTHONPATH")])
    )
    data = run_json_command(argv, seconds + 120, env)
    if data.get("errors"):
        print(f"  ({uri}: {data['errors'][:2]})", flush=True)
    return float(pick(data, "confirmed", "leveret perf"))  # type: ignore[arg-type]


def vs_rabbitmq(args: argparse.Namespace) -> None:
    """S2 on three Leveret nodes and on three RabbitMQ nodes (quorum queues on both,
    and Leveret's replicated classic durable queue too), alternating each round."""
    directory = tempfile.mkdtemp(prefix="leveret-bench-vs-")
    etcd = EtcdProcess(os.path.join(directory, "etcd"))
    os.makedirs(etcd.directory)
    etcd.start()
    nodes = [
        NodeProcess(f"n{i}", etcd.url, directory, cluster="bench", lease=5).start()
        for i in range(3)
    ]
    results: dict[str, list[float]] = {
        "Leveret, 3 nodes, quorum queue": [],
        "Leveret, 3 nodes, classic durable queue": [],
        "RabbitMQ 3.10, 3 nodes, quorum queue": [],
    }
    try:
        wait_leader(etcd.url, "bench", nodes)
        wait_all_in_sync(etcd.url, "bench", {n.name for n in nodes})
        for r in range(args.rounds):
            leader = next(n for n in nodes if n.name == leader_name(etcd.url, "bench"))
            runs = [
                ("Leveret, 3 nodes, quorum queue", leader.url, "quorum"),
                ("Leveret, 3 nodes, classic durable queue", leader.url, "classic"),
                ("RabbitMQ 3.10, 3 nodes, quorum queue", args.rabbitmq, "quorum"),
            ]
            runs = runs[r % 3 :] + runs[: r % 3]
            for label, uri, kind in runs:
                value = _perf(uri, kind, args.seconds, f"bench.s2.{kind}.")
                results[label].append(value)
                print(f"round {r + 1} {label}: {value:.0f} confirmed/s", flush=True)
    finally:
        for n in nodes:
            n.stop()
        etcd.close()
    base = statistics.median(results["RabbitMQ 3.10, 3 nodes, quorum queue"])
    for label, values in results.items():
        med = statistics.median(values)
        print(f"S2 {label}: median {med:.0f} confirmed/s ({med / base:.2f} of RabbitMQ's)")


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu(args: argparse.Namespace) -> None:
    directory = tempfile.mkdtemp(prefix="leveret-bench-cpu-")
    etcd = EtcdProcess(os.path.join(directory, "etcd"))
    os.makedirs(etcd.directory)
    etcd.start()
    nodes = [
        NodeProcess(f"n{i}", etcd.url, directory, cluster="bench", lease=5).start()
        for i in range(3)
    ]
    try:
        wait_leader(etcd.url, "bench", nodes)
        wait_all_in_sync(etcd.url, "bench", {n.name for n in nodes})
        leader = next(n for n in nodes if n.name == leader_name(etcd.url, "bench"))
        for r in range(args.rounds):
            before = {n.name: _cpu_seconds(n.proc.pid) for n in nodes}  # type: ignore[union-attr]
            rate = _amqbench(leader.port, args.seconds)
            after = {n.name: _cpu_seconds(n.proc.pid) for n in nodes}  # type: ignore[union-attr]
            # amqbench publishes through its 2 s warm-up too, at about the same rate
            per = 1e5 / (rate * (args.seconds + 2))
            own = (after[leader.name] - before[leader.name]) * per
            others = [after[n.name] - before[n.name] for n in nodes if n is not leader]
            print(
                f"round {r + 1}: {rate:.0f} confirmed/s; CPU s per 100k confirmed: leader "
                f"{own:.2f}, each follower {statistics.mean(others) * per:.2f}",
                flush=True,
            )
    finally:
        for n in nodes:
            n.stop()
        etcd.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    f = sub.add_parser("failover")
    f.add_argument("--kills", type=int, default=20)
    f.add_argument("--lease", type=float, default=5.0)
    s = sub.add_parser("s2")
    s.add_argument("--rounds", type=int, default=5)
    s.add_argument("--seconds", type=float, default=5.0)
    v = sub.add_parser("vs-rabbitmq")
    v.add_argument(
        "--rabbitmq",
        required=True,
        help="AMQP URL of one node of a three-node RabbitMQ cluster (its quorum queues "
        "get three members)",
    )
    v.add_argument("--rounds", type=int, default=5)
    v.add_argument("--seconds", type=float, default=10.0)
    c = sub.add_parser("cpu")
    c.add_argument("--rounds", type=int, default=3)
    c.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    {"failover": failover, "s2": s2, "vs-rabbitmq": vs_rabbitmq, "cpu": cpu}[args.what](args)


if __name__ == "__main__":
    main()
