#!/usr/bin/env python3
"""Python AMQP clients side by side: leveret.client, aio-pika and pika, one broker.

Two workloads, each client written the way its documentation suggests:

- publish with confirms: every message confirmed by the broker before it counts.
  "one by one" awaits each confirm before the next publish (the only way with
  pika's BlockingConnection); "pipelined" keeps a window of 1000 unconfirmed
  (leveret.client's publish_many, aio-pika with asyncio.gather over windows).
- consume with acks: a pre-filled queue drained with prefetch 1000 and one
  basic.ack per message.

Every measurement runs in a fresh interpreter, the clients take turns (order
rotated per round), and the table gives the median of the rounds. By default a
Leveret broker is started from this checkout; --url points at another broker
(e.g. the reference RabbitMQ).

    bench/client_compare.py --seconds 5 --rounds 3
    bench/client_compare.py --url amqp://guest:guest@127.0.0.1:5673/%2F
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

BODY = b"x" * 64
WINDOW = 1000
PREFETCH = 1000

# -- workers: one client, one workload, in a fresh process; print {"rate": msg/s} -------


async def leveret_publish(url: str, queue: str, seconds: float, pipelined: bool) -> float:
    from leveret.client import connect

    conn = await connect(url)
    ch = await conn.channel()
    await ch.declare_queue(queue)
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        if pipelined:
            count += await ch.publish_many([BODY] * WINDOW, routing_key=queue, window=WINDOW)
        else:
            await ch.publish(BODY, routing_key=queue)
            count += 1
    rate = count / (time.perf_counter() - start)
    await ch.delete_queue(queue)
    await conn.close()
    return rate


async def leveret_consume(url: str, queue: str, total: int) -> float:
    from leveret.client import connect

    conn = await connect(url)
    ch = await conn.channel()
    got = 0
    start = time.perf_counter()
    async for message in ch.consume(queue, prefetch=PREFETCH):
        message.ack()
        got += 1
        if got == total:
            break
    rate = got / (time.perf_counter() - start)
    await ch.delete_queue(queue)
    await conn.close()
    return rate


def leveret_blocking_publish(url: str, queue: str, seconds: float, pipelined: bool) -> float:
    from leveret.client.blocking import connect

    with connect(url) as conn:
        ch = conn.channel()
        ch.declare_queue(queue)
        count = 0
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            if pipelined:
                count += ch.publish_many([BODY] * WINDOW, routing_key=queue, window=WINDOW)
            else:
                ch.publish(BODY, routing_key=queue)
                count += 1
        rate = count / (time.perf_counter() - start)
        ch.delete_queue(queue)
    return rate


def leveret_blocking_consume(url: str, queue: str, total: int) -> float:
    from leveret.client.blocking import connect

    with connect(url) as conn:
        ch = conn.channel()
        got = 0
        start = time.perf_counter()
        for message in ch.consume(queue, prefetch=PREFETCH):
            message.ack()
            got += 1
            if got == total:
                break
        rate = got / (time.perf_counter() - start)
        ch.delete_queue(queue)
    return rate


async def aio_pika_publish(url: str, queue: str, seconds: float, pipelined: bool) -> float:
    import aio_pika

    conn = await aio_pika.connect(url)
    ch = await conn.channel(publisher_confirms=True)
    await ch.declare_queue(queue)
    exchange = ch.default_exchange
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        if pipelined:
            await asyncio.gather(
                *(
                    exchange.publish(aio_pika.Message(BODY), routing_key=queue)
                    for _ in range(WINDOW)
                )
            )
            count += WINDOW
        else:
            await exchange.publish(aio_pika.Message(BODY), routing_key=queue)
            count += 1
    rate = count / (time.perf_counter() - start)
    await ch.queue_delete(queue)
    await conn.close()
    return rate


async def aio_pika_consume(url: str, queue: str, total: int) -> float:
    import aio_pika

    conn = await aio_pika.connect(url)
    ch = await conn.channel()
    await ch.set_qos(prefetch_count=PREFETCH)
    q = await ch.declare_queue(queue, passive=True)
    got = 0
    start = time.perf_counter()
    async with q.iterator() as it:
        async for message in it:
            await message.ack()
            got += 1
            if got == total:
                break
    rate = got / (time.perf_counter() - start)
    await ch.queue_delete(queue)
    await conn.close()
    return rate


def pika_publish(url: str, queue: str, seconds: float, pipelined: bool) -> float:
    import pika

    if pipelined:
        raise NotImplementedError("pika's BlockingConnection waits for each confirm")
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(queue)
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        ch.basic_publish("", queue, BODY)
        count += 1
    rate = count / (time.perf_counter() - start)
    ch.queue_delete(queue)
    conn.close()
    return rate


def pika_consume(url: str, queue: str, total: int) -> float:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=PREFETCH)
    got = 0
    start = time.perf_counter()

    def on_message(channel, method, _properties, _body) -> None:
        nonlocal got
        channel.basic_ack(method.delivery_tag)
        got += 1
        if got == total:
            channel.stop_consuming()

    ch.basic_consume(queue, on_message)
    ch.start_consuming()
    rate = got / (time.perf_counter() - start)
    ch.queue_delete(queue)
    conn.close()
    return rate


def fill(url: str, queue: str, total: int) -> None:
    """Pre-fill a queue for a consume run (with leveret.client, confirmed)."""
    from leveret.client import connect

    async def go() -> None:
        conn = await connect(url)
        ch = await conn.channel()
        await ch.declare_queue(queue)
        await ch.purge_queue(queue)
        for start in range(0, total, 10000):
            await ch.publish_many([BODY] * min(10000, total - start), routing_key=queue)
        await conn.close()

    asyncio.run(go())


PUBLISHERS = {
    "leveret.client": leveret_publish,
    "leveret.client.blocking": leveret_blocking_publish,
    "aio-pika": aio_pika_publish,
    "pika": pika_publish,
}
CONSUMERS = {
    "leveret.client": leveret_consume,
    "leveret.client.blocking": leveret_blocking_consume,
    "aio-pika": aio_pika_consume,
    "pika": pika_consume,
}


def worker(args: argparse.Namespace) -> None:
    queue = f"client-compare.{uuid.uuid4().hex[:8]}"
    if args.workload == "consume":
        fill(args.url, queue, args.messages)
        fn = CONSUMERS[args.client]
        call = (args.url, queue, args.messages)
    else:
        fn = PUBLISHERS[args.client]
        call = (args.url, queue, args.seconds, args.workload == "pipelined")
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    result = asyncio.run(fn(*call)) if asyncio.iscoroutinefunction(fn) else fn(*call)
    print(json.dumps({"rate": result}))


# -- driver ---------------------------------------------------------------------------------

WORKLOADS = {
    "one-by-one": "publish with confirms, one by one: msg/s",
    "pipelined": "publish with confirms, window 1000: msg/s",
    "consume": "consume with acks, prefetch 1000: msg/s",
}


def measure(args: argparse.Namespace, url: str, client: str, workload: str) -> float | None:
    if client == "pika" and workload == "pipelined":
        return None
    argv = [
        sys.executable,
        __file__,
        "--worker",
        "--url",
        url,
        "--client",
        client,
        "--workload",
        workload,
        "--seconds",
        str(args.seconds),
        "--messages",
        str(args.messages),
    ]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        print(f"{client} {workload} failed:\n{out.stderr}", file=sys.stderr)
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])["rate"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", help="broker to use (default: start Leveret from this checkout)")
    p.add_argument("--seconds", type=float, default=5.0, help="publish run length (5)")
    p.add_argument("--messages", type=int, default=50000, help="messages per consume run")
    p.add_argument("--rounds", type=int, default=3, help="rounds; the median is reported (3)")
    p.add_argument("--clients", default=",".join(PUBLISHERS), help="comma-separated subset")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset")
    p.add_argument("--leveret-port", type=int, default=5684)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--client", help=argparse.SUPPRESS)
    p.add_argument("--workload", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    clients = [c for c in args.clients.split(",") if c]
    workloads = [w for w in args.workloads.split(",") if w]
    for name in clients:
        if name not in PUBLISHERS:
            p.error(f"unknown client {name!r}; choose from {', '.join(PUBLISHERS)}")
    for name in workloads:
        if name not in WORKLOADS:
            p.error(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    broker = None
    url = args.url
    if url is None:
        from compare_lib import start_leveret

        broker = start_leveret(
            args.leveret_port,
            "{python} -m leveret server --workers 1 --mqtt-port 0 --web-mqtt-port 0 --port {port} --data-dir {data_dir}",
            sys.executable,
        )
        if broker.error:
            print(broker.error, file=sys.stderr)
            return 1
        url = f"amqp://guest:guest@127.0.0.1:{args.leveret_port}/%2F"
    results: dict[tuple[str, str], list[float]] = {}
    try:
        for rnd in range(args.rounds):
            order = clients[rnd % len(clients) :] + clients[: rnd % len(clients)]
            for workload in workloads:
                for client in order:
                    rate = measure(args, url, client, workload)
                    if rate is not None:
                        results.setdefault((client, workload), []).append(rate)
                        print(
                            f"round {rnd + 1}: {client:24} {workload:11} {rate:>10,.0f} msg/s",
                            file=sys.stderr,
                            flush=True,
                        )
    finally:
        if broker is not None and broker.process is not None:
            broker.process.terminate()
            broker.process.wait(30)
    where = args.url or "Leveret (this checkout)"
    print(f"Broker: {where}; median of {args.rounds} rounds; msg/s (higher is better)\n")
    print("| workload | " + " | ".join(clients) + " |")
    print("|---|" + "---:|" * len(clients))
    for workload in workloads:
        cells = []
        for client in clients:
            runs = results.get((client, workload))
            cells.append(f"{statistics.median(runs):,.0f}" if runs else "n/a")
        print(f"| {WORKLOADS[workload]} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
