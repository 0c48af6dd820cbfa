"""Restart time with many long durable queues (bench/durability.py has one queue).

    python bench/many_queues_restart.py --queues 200 --messages 10000 [--tree DIR]

Starts `leveret server` from a source tree (default: this one) on a fresh data dir,
declares the durable queues and fills each with persistent 16 B messages (one
pika connection; a confirmed publish fences the rest), then restarts it twice:
after SIGTERM, and after SIGKILL. For each restart it prints the time to the port
accepting connections and to a passive queue.declare of the last queue answering
with its full count, and at the end the broker's RSS. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pika
from tree_ab import workers_flag


def _start(tree: str, port: int, data: str) -> tuple[subprocess.Popen, float, float]:
    env = {**os.environ, "PYTHONPATH": os.path.join(tree, "src")}
    started = time.monotonic()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "leveret",
            "server",
            *workers_flag(tree),
            "--mqtt-port",
            "0",
            "--web-mqtt-port",
            "0",
            "--port",
            str(port),
            "--data-dir",
            data,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"the broker exited with {proc.returncode}") from None
            time.sleep(0.01)
    return proc, time.monotonic() - started, started


def main() -> None:
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--queues", type=int, default=200)
    p.add_argument("--messages", type=int, default=10_000, help="per queue")
    p.add_argument("--tree", default=here, help="source tree to run (default: this)")
    p.add_argument("--port", type=int, default=5711)
    args = p.parse_args()
    data = tempfile.mkdtemp(prefix="leveret-manyq-")
    try:
        proc, _, _ = _start(args.tree, args.port, data)
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", args.port))
        fence = conn.channel()
        fence.confirm_delivery()
        ch = conn.channel()
        props = pika.BasicProperties(delivery_mode=2)
        names = [f"q{i}" for i in range(args.queues)]
        for name in names:
            ch.queue_declare(name, durable=True)
        body = b"x" * 16
        t = time.monotonic()
        for name in names:
            for _ in range(args.messages):
                ch.basic_publish("", name, body, props)
        # Confirmed after everything the other channel sent on this connection.
        fence.basic_publish("", names[0], body, props)
        conn.close()
        result: dict = {
            "queues": args.queues,
            "messages_per_queue": args.messages,
            "fill_s": round(time.monotonic() - t, 1),
        }
        for how, sig in (("sigterm", signal.SIGTERM), ("sigkill", signal.SIGKILL)):
            proc.send_signal(sig)
            proc.wait()
            proc, listen, started = _start(args.tree, args.port, data)
            c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", args.port))
            count = c.channel().queue_declare(names[-1], passive=True).method.message_count
            result[how] = {
                "listening_s": round(listen, 2),
                "last_queue_declared_s": round(time.monotonic() - started, 2),
                "its_count": count,
            }
            c.close()
        with open(f"/proc/{proc.pid}/status") as f:
            rss_kb = int(f.read().split("VmRSS:")[1].split()[0])
        result["rss_mb_after_restart"] = round(rss_kb / 1024, 1)
        proc.send_signal(signal.SIGTERM)
        proc.wait()
        print(json.dumps(result))
    finally:
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
