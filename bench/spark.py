#!/usr/bin/env python
"""Spark read throughput from a Leveret super stream, next to one raw AMQP consumer.

    python bench/spark.py                          # 1,000,000 x 100 B, 4 partitions, local[2]
    python bench/spark.py --messages 200000 --runs 1

Starts `leveret server` as a subprocess (or uses --uri), fills a super stream, then
measures, alternating the order each run:

- raw: one connection consuming every partition from `first` (leveret.client's asyncio
  stream consumer, as a Spark task uses it, without Spark), messages per second;
- batch: `spark.read.format("leveret")...load()` aggregated over every row;
- streaming: `readStream` with Trigger.AvailableNow into the `noop` sink.

Spark's figures are from the start of the action to its end (the session is warm); the
target is batch >= raw x cores / 2 (docs/benchmarks.md#spark). Prints a Markdown table
with medians.

To compare two versions of the connector, fill once and point both at the same broker:
`--uri URL --no-fill --messages N` (the super stream holds N messages), each run with
PYTHONPATH on the version's `src` (its Spark workers import the same).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from leveret.client import OutgoingMessage, connect
from leveret.client.blocking import connect as blocking_connect

SUPER = "bench-spark"


def start_broker(data_dir: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
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
            str(data_dir),
            "--log-level",
            "warning",
        ],
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("leveret server did not start") from None
            time.sleep(0.05)
    return proc, f"amqp://guest:guest@127.0.0.1:{port}/%2F"


def fill(uri: str, messages: int, size: int, partitions: int) -> float:
    """Declare the super stream and publish `messages` bodies round-robin; returns msg/s."""
    with blocking_connect(uri) as conn:
        ch = conn.channel()
        ch.declare_exchange(SUPER, "direct", durable=True)
        for i in range(partitions):
            ch.declare_queue(f"{SUPER}-{i}", durable=True, arguments={"x-queue-type": "stream"})
            ch.bind_queue(f"{SUPER}-{i}", SUPER, str(i), {"x-stream-partition-order": i})
        body = b"x" * size
        keys = [str(i) for i in range(partitions)]
        began = time.perf_counter()
        for start in range(0, messages, 10000):
            batch = (
                OutgoingMessage(body, keys[n % partitions])
                for n in range(start, min(start + 10000, messages))
            )
            ch.publish_many(batch, exchange=SUPER, window=5000)
        return messages / (time.perf_counter() - began)


def raw_consume(uri: str, partitions: int, per_partition: int, prefetch: int) -> float:
    """One connection, partition after partition from offset 0: msg/s."""

    async def run() -> float:
        began = time.perf_counter()
        conn = await connect(uri, heartbeat=0)
        channel = await conn.channel(confirms=False)
        got = 0
        for i in range(partitions):
            done = asyncio.get_running_loop().create_future()
            seen = unacked = 0

            def on_message(m, done=done) -> None:  # noqa: ANN001
                nonlocal seen, unacked
                m.offset  # noqa: B018 - what a task reads of every delivery
                seen += 1
                unacked += 1
                if unacked >= prefetch // 2:
                    m.ack(multiple=True)
                    unacked = 0
                if seen == per_partition and not done.done():
                    done.set_result(None)

            consumer = channel.consume(
                f"{SUPER}-{i}", prefetch=prefetch, offset=0, on_message=on_message
            )
            await consumer.start()
            await done
            await consumer.cancel()
            got += seen
        await conn.close()
        return got / (time.perf_counter() - began)

    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(run())
    finally:
        loop.close()


def task_read(uri: str, partitions: int, per_partition: int) -> tuple[float, float]:
    """What one Spark task runs (leveret.spark.reader.read_range, Arrow batches out), over
    every partition in turn, without Spark: (msg/s, CPU microseconds per message of this
    process). The CPU figure is the steadier one on a shared machine."""
    from leveret.spark.options import parse_read
    from leveret.spark.reader import read_range

    opts = parse_read({"uri": uri, "superStream": SUPER}, streaming=False)
    began, cpu = time.perf_counter(), time.process_time()
    n = 0
    for i in range(partitions):
        for batch in read_range(opts, f"{SUPER}-{i}", 0, per_partition):
            n += batch.num_rows
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    assert n == partitions * per_partition, (n, partitions * per_partition)
    return n / wall, cpu / n * 1e6


def spark_session(cores: int):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from leveret.spark import LeveretDataSource

    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(LeveretDataSource)
    return spark


def spark_batch(spark, uri: str, messages: int, extra: dict) -> float:
    from pyspark.sql import functions as F

    began = time.perf_counter()
    reader = spark.read.format("leveret").option("uri", uri).option("superStream", SUPER)
    for k, v in extra.items():
        reader = reader.option(k, v)
    n, total = reader.load().agg(F.count("*"), F.sum(F.length("body"))).collect()[0]
    took = time.perf_counter() - began
    assert n == messages, (n, messages)
    return messages / took


def spark_stream(spark, uri: str, messages: int, checkpoint: Path, extra: dict) -> float:
    began = time.perf_counter()
    reader = (
        spark.readStream.format("leveret")
        .option("uri", uri)
        .option("superStream", SUPER)
        .option("startingOffsets", "earliest")
    )
    for k, v in extra.items():
        reader = reader.option(k, v)
    query = (
        reader.load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    took = time.perf_counter() - began
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    assert rows == messages, (rows, messages)
    return messages / took


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--uri", help="a running Leveret (default: start one)")
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--cores", type=int, default=2, help="Spark local[N]")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--prefetch", type=int, default=2000)
    p.add_argument("--no-fill", action="store_true", help="the super stream is filled already")
    p.add_argument(
        "--only",
        help="comma-separated subset of raw,batch,streaming; or task: one Spark task's "
        "read function without Spark (msg/s and CPU per message)",
    )
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="leveret-bench-spark-"))
    proc = None
    uri = args.uri
    if not uri:
        proc, uri = start_broker(work / "data")
    try:
        if not args.no_fill:
            publish_rate = fill(uri, args.messages, args.size, args.partitions)
            print(
                f"filled {args.messages} x {args.size} B into {args.partitions} partitions: "
                f"{publish_rate:,.0f} msg/s published with confirms",
                flush=True,
            )
        per = args.messages // args.partitions
        if args.only == "task":
            for run in range(args.runs):
                rate, cpu = task_read(uri, args.partitions, per)
                print(
                    f"run {run + 1}      task: {rate:,.0f} msg/s, {cpu:.2f} us CPU/msg", flush=True
                )
            return
        spark = spark_session(args.cores)
        extra = {"prefetch": str(args.prefetch)}
        spark_batch(spark, uri, args.messages, extra)  # warm-up: workers, JIT of the planner
        results: dict[str, list[float]] = {"raw": [], "batch": [], "streaming": []}
        for run in range(args.runs):
            order = ["raw", "batch", "streaming"]
            order = order[run % 3 :] + order[: run % 3]
            if args.only:
                order = [n for n in order if n in args.only.split(",")]
            for name in order:
                if name == "raw":
                    rate = raw_consume(uri, args.partitions, per, args.prefetch)
                elif name == "batch":
                    rate = spark_batch(spark, uri, args.messages, extra)
                else:
                    rate = spark_stream(spark, uri, args.messages, work / f"ck{run}", extra)
                results[name].append(rate)
                print(f"run {run + 1} {name:>9}: {rate:,.0f} msg/s", flush=True)
        med = {k: statistics.median(v) if v else 0.0 for k, v in results.items()}
        bar = med["raw"] * args.cores / 2
        print()
        print(
            f"| {args.messages:,} x {args.size} B, {args.partitions} partitions, "
            f"local[{args.cores}], median of {args.runs} | msg/s |"
        )
        print("|---|---:|")
        print(f"| raw: one connection consuming every partition | {med['raw']:,.0f} |")
        print(f"| Spark batch read (spark.read ... agg) | {med['batch']:,.0f} |")
        print(f"| Spark streaming read (AvailableNow -> noop) | {med['streaming']:,.0f} |")
        print(f"| bar: raw x {args.cores} cores / 2 | {bar:,.0f} |")
        spark.stop()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
