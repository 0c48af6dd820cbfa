"""Loss test: SIGKILL the destination in the middle of a 100,000-message shovel.

    python bench/shovel_loss.py [--messages 100000] [--kills 1] [--rabbitmq-port PORT]

Two `leveret server` subprocesses (fsync batch). The source queue is filled with
persistent 1 KB messages, each body numbered. A shovel (on-confirm) runs in the
source broker and moves them to the destination; when about half have arrived (each
further kill: the next fraction) the destination is killed with SIGKILL and
restarted on the same port and data dir. When the source holds nothing (ready or
unacked) the destination is drained and every number counted: the run fails if one
is missing, and prints the duplicates (messages the destination had stored but whose
confirm was lost with it).

With --rabbitmq-port the same is done with RabbitMQ's own shovel (running in
RabbitMQ, from the source Leveret to the destination Leveret), for comparison.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, HERE)

from shovel_throughput import Leveret as Broker  # noqa: E402
from shovel_throughput import count, http  # noqa: E402

from leveret.client.blocking import connect  # noqa: E402

logging.getLogger("leveret.client").setLevel(logging.CRITICAL)  # the kills' reconnects


def body(i: int) -> bytes:
    return (b"%08d|" % i).ljust(1024, b".")


def total(broker: Broker, queue: str) -> int:
    """Ready plus unacked messages of a queue (the management API's `messages`)."""
    status, info = http(broker.api, "GET", f"/api/queues/%2F/{queue}")
    return info.get("messages", 0) if status == 200 and isinstance(info, dict) else -1


def fill(url: str, queue: str, n: int) -> None:
    with connect(url) as conn:
        ch = conn.channel()
        ch.declare_queue(queue, durable=True)
        for start in range(0, n, 10_000):
            ch.publish_many(
                [body(i) for i in range(start, min(n, start + 10_000))],
                routing_key=queue,
                persistent=True,
            )


def wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def one(runner: str, n: int, kills: int, rabbit_api: str | None) -> dict:
    root = tempfile.mkdtemp(prefix="shovel-loss-")
    src, dest = Broker("src", root), Broker("dest", root)
    try:
        src.start()
        dest.start()
        fill(src.url, "jobs", n)
        with connect(dest.url) as conn:
            conn.channel().declare_queue("jobs", durable=True)
        if runner == "leveret":
            api, value = src.api, {"src-uri": "amqp://", "src-queue": "jobs",
                                   "dest-uri": dest.url, "dest-queue": "jobs",
                                   "reconnect-delay": 1}  # fmt: skip
        else:
            assert rabbit_api is not None
            api, value = rabbit_api, {"src-uri": src.url, "src-queue": "jobs",
                                      "dest-uri": dest.url, "dest-queue": "jobs",
                                      "reconnect-delay": 1}  # fmt: skip
        name = f"loss-{runner}-{int(time.time())}"
        started = time.monotonic()
        status, answer = http(api, "PUT", f"/api/parameters/shovel/%2F/{name}", {"value": value})
        assert status in (201, 204), answer
        for k in range(kills):
            target = n * (k + 1) // (kills + 1)
            wait(lambda t=target: count(dest.url, "jobs") >= t, 600, f"{target} at the destination")
            dest.kill()
            killed_at = count(src.url, "jobs")
            dest.start()
            print(f"  {runner}: killed the destination with {n - killed_at} moved", flush=True)
        # Drained: nothing ready and nothing unacked (in flight) at the source.
        wait(lambda: total(src, "jobs") == 0, 900, "the source to drain")
        seconds = time.monotonic() - started
        http(api, "DELETE", f"/api/parameters/shovel/%2F/{name}")
        time.sleep(2)
        left_at_source = count(src.url, "jobs")
        seen: collections.Counter = collections.Counter()
        with connect(dest.url) as conn:
            ch = conn.channel()
            with ch.consume("jobs", prefetch=2000) as consumer:
                while True:
                    try:
                        message = consumer.next_message(15)
                    except TimeoutError:
                        break
                    seen[message.body[:8]] += 1
                    message.ack()
        missing = [i for i in range(n) if b"%08d" % i not in seen]
        duplicates = sum(seen.values()) - len(seen)
        return {"runner": runner, "messages": n, "kills": kills, "missing": len(missing),
                "duplicates": duplicates, "left_at_source": left_at_source,
                "seconds": round(seconds, 1)}  # fmt: skip
    finally:
        src.stop()
        dest.stop()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--kills", type=int, default=1)
    parser.add_argument("--rabbitmq-port", type=int, default=None)
    args = parser.parse_args()
    rabbit_api = f"http://127.0.0.1:{args.rabbitmq_port + 10000}" if args.rabbitmq_port else None
    results = [one("leveret", args.messages, args.kills, None)]
    if rabbit_api:
        results.append(one("rabbitmq", args.messages, args.kills, rabbit_api))
    for r in results:
        print(json.dumps(r))
    if any(r["missing"] for r in results):
        raise SystemExit("messages were lost")


if __name__ == "__main__":
    main()
