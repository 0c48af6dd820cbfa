"""Shovel throughput: Leveret's shovel beside RabbitMQ's own, on the same pair of brokers.

    python bench/shovel_throughput.py --rabbitmq-port 5680 [--messages 50000] [--runs 3]

Two pairs, each source queue filled with `--messages` persistent 1 KB messages, then
moved with ack-mode on-confirm (the default) and a prefetch of 1000 (RabbitMQ's):

- Leveret → Leveret: two `leveret server` subprocesses (fsync batch). Leveret's
  shovel runs in the destination broker (src-uri the source, dest-uri amqp://);
  RabbitMQ's shovel runs in RabbitMQ (src-uri and dest-uri the two Leveret brokers).
- RabbitMQ queue → Leveret: Leveret's shovel runs in Leveret (src-uri RabbitMQ);
  RabbitMQ's runs in RabbitMQ (src-uri amqp://, dest-uri Leveret).

A run is timed from the shovel's definition (PUT /api/parameters/shovel) to the
destination queue holding every message (a passive queue.declare every 20 ms), so it
includes connecting. Runs alternate between the two shovels; each prints its rate and
the medians come last, with the machine (lscpu) and the note that it is shared.
Needs a RabbitMQ 3.10 with the shovel plugin (../shared/tools/rabbitmq.sh start PORT).
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

from leveret.client.blocking import connect  # noqa: E402
from leveret.client.errors import NotFound  # noqa: E402

logging.getLogger("leveret.client").setLevel(logging.ERROR)  # the count polls' 404s

BODY = b"x" * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(base: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data, method=method)
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


class Leveret:
    """A `leveret server` subprocess with its management API; `start()` it, and start
    it again after `kill()` (bench/shovel_loss.py restarts brokers under a shovel)."""

    def __init__(self, name: str, root: str) -> None:
        self.name = name
        self.port, self.mport = free_port(), free_port()
        self.data = os.path.join(root, name)
        self.proc: subprocess.Popen | None = None
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"
        self.api = f"http://127.0.0.1:{self.mport}"

    def start(self) -> Leveret:
        env = {**os.environ, "PYTHONPATH": os.path.join(HERE, "..", "src")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "leveret", "server", "--workers", "1", "--mqtt-port", "0", "--web-mqtt-port", "0", "--port", str(self.port),
             "--management-port", str(self.mport), "--prometheus-port", "0",
             "--data-dir", self.data, "--log-level", "warning"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.mport), 0.2).close()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"leveret {self.name} did not start") from None
                time.sleep(0.05)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(60)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)


def fill(url: str, queue: str, n: int) -> None:
    with connect(url) as conn:
        ch = conn.channel()
        ch.declare_queue(queue, durable=True)
        for start in range(0, n, 10_000):
            ch.publish_many([BODY] * min(10_000, n - start), routing_key=queue, persistent=True)


def count(url: str, queue: str) -> int:
    with connect(url) as conn:
        try:
            return conn.channel().declare_queue(queue, passive=True).message_count
        except NotFound:
            return 0


def delete_queue(url: str, queue: str) -> None:
    with connect(url) as conn:
        conn.channel().delete_queue(queue)


def run_once(runner_api: str, value: dict, dest_url: str, queue: str, n: int) -> float:
    """Seconds from the shovel's definition to `n` messages at the destination."""
    name = f"bench-{int(time.time() * 1000)}"
    with connect(dest_url) as conn:
        ch = conn.channel()
        started = time.monotonic()
        status, body = http(
            runner_api, "PUT", f"/api/parameters/shovel/%2F/{name}", {"value": value}
        )
        assert status in (201, 204), body
        while True:
            try:
                got = ch.declare_queue(queue, passive=True).message_count
            except NotFound:
                ch = conn.channel()
                got = 0
            if got >= n:
                break
            time.sleep(0.02)
        seconds = time.monotonic() - started
    http(runner_api, "DELETE", f"/api/parameters/shovel/%2F/{name}")
    return seconds


def pair(label: str, shovels: dict[str, tuple[str, dict]], src_url: str, dest_url: str,
         n: int, runs: int) -> dict[str, list[float]]:  # fmt: skip
    rates: dict[str, list[float]] = {k: [] for k in shovels}
    for i in range(runs):
        for who, (runner_api, value) in shovels.items():
            queue = value["src-queue"]
            fill(src_url, queue, n)
            seconds = run_once(runner_api, value, dest_url, value["dest-queue"], n)
            rate = n / seconds
            rates[who].append(rate)
            print(
                f"{label} run {i + 1} {who}: {n} in {seconds:.2f} s = {rate:,.0f} msg/s", flush=True
            )
            time.sleep(1)  # the shovel's connections close
            delete_queue(dest_url, value["dest-queue"])
            delete_queue(src_url, queue)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rabbitmq-port", type=int, required=True)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rabbit_url = f"amqp://guest:guest@127.0.0.1:{args.rabbitmq_port}/%2F"
    rabbit_api = f"http://127.0.0.1:{args.rabbitmq_port + 10000}"
    root = tempfile.mkdtemp(prefix="shovel-bench-")
    src, dest = Leveret("src", root).start(), Leveret("dest", root).start()
    results: dict[str, dict[str, list[float]]] = {}
    try:
        common = {"ack-mode": "on-confirm", "src-prefetch-count": 1000}
        results["leveret->leveret"] = pair(
            "leveret->leveret",
            {
                "leveret shovel": (dest.api, {**common, "src-uri": src.url, "src-queue": "ll",
                                              "dest-uri": "amqp://", "dest-queue": "ll"}),
                "rabbitmq shovel": (rabbit_api, {**common, "src-uri": src.url, "src-queue": "ll",
                                                 "dest-uri": dest.url, "dest-queue": "ll"}),
            },
            src.url, dest.url, args.messages, args.runs,
        )  # fmt: skip
        results["rabbitmq->leveret"] = pair(
            "rabbitmq->leveret",
            {
                "leveret shovel": (dest.api, {**common, "src-uri": rabbit_url, "src-queue": "rl",
                                              "dest-uri": "amqp://", "dest-queue": "rl"}),
                "rabbitmq shovel": (rabbit_api, {**common, "src-uri": "amqp://", "src-queue": "rl",
                                                 "dest-uri": dest.url, "dest-queue": "rl"}),
            },
            rabbit_url, dest.url, args.messages, args.runs,
        )  # fmt: skip
    finally:
        src.stop()
        dest.stop()
        shutil.rmtree(root, ignore_errors=True)
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next(
        (ln.split(":", 1)[1].strip() for ln in cpu.splitlines() if "Model name" in ln), "?"
    )
    cpus = next(
        (ln.split(":", 1)[1].strip() for ln in cpu.splitlines() if ln.startswith("CPU(s)")), "?"
    )
    print(f"\nmachine: {model}, {cpus} CPUs, shared with other work (figures are noisy)")
    print(
        f"{args.messages} persistent 1 KB messages, on-confirm, prefetch 1000; medians of {args.runs}"
    )
    summary = {}
    for label, by in results.items():
        for who, rates in by.items():
            median = statistics.median(rates)
            summary[f"{label} {who}"] = round(median)
            print(
                f"  {label:18} {who:16} {median:10,.0f} msg/s  (runs: "
                + ", ".join(f"{r:,.0f}" for r in rates)
                + ")"
            )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
