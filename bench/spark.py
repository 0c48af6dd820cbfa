#!/usr/bin/env python
"""Spark read throughput from a Leveret super stream, next to one raw AMQP consumer.

    python bench/spark.py                          # 1,000,000 x 100 B, 4 partitions, local[2]
    python bench/spark.py --messages 200000 --runs 1

Starts `leveret server` as a subprocess (or uses --uri), fills a super stream, then
measures, alternating the order each run:

- raw: one connection consuming every partition from `first` (the connector's own client,
  no Spark), messages per second;
- batch: `spark.read.format("leveret")...load()` aggregated over every row;
- streaming: `readStream` with Trigger.AvailableNow into the `noop` sink.

Spark's figures are from the start of the action to its end (the session is warm); the
bar of issue 9 is batch >= raw x cores / 2. Prints a Markdown table with medians.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pamqp import commands

from leveret.spark._amqp import Client

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
    with Client(uri, timeout=60).connect() as c:
        c.call(
            commands.Exchange.Declare(exchange=SUPER, exchange_type="direct", durable=True),
            commands.Exchange.DeclareOk,
        )
        for i in range(partitions):
            c.call(
                commands.Queue.Declare(
                    queue=f"{SUPER}-{i}", durable=True, arguments={"x-queue-type": "stream"}
                ),
                commands.Queue.DeclareOk,
            )
            c.call(
                commands.Queue.Bind(
                    queue=f"{SUPER}-{i}",
                    exchange=SUPER,
                    routing_key=str(i),
                    arguments={"x-stream-partition-order": i},
                ),
                commands.Queue.BindOk,
            )
        c.confirm_select()
        body = b"x" * size
        keys = [str(i) for i in range(partitions)]
        began = time.perf_counter()
        for n in range(messages):
            c.publish(SUPER, keys[n % partitions], body)
            if c.outstanding() >= 5000:
                c.flush()
                while c.outstanding() >= 2500:
                    c.read_one()
        c.wait_for_confirms(120)
        return messages / (time.perf_counter() - began)


def raw_consume(uri: str, partitions: int, per_partition: int, prefetch: int) -> float:
    """One connection, partition after partition from offset 0: msg/s."""
    got = 0
    began = time.perf_counter()
    with Client(uri, timeout=60).connect() as c:
        c.qos(prefetch)
        for i in range(partitions):
            c.consume(f"{SUPER}-{i}", {"x-stream-offset": 0}, tag=f"p{i}")
            seen = 0
            unacked = 0
            for d in c.deliveries():
                seen += 1
                unacked += 1
                if unacked >= prefetch // 2:
                    c.ack(d.delivery_tag, multiple=True)
                    unacked = 0
                if seen == per_partition:
                    break
            c.call(commands.Basic.Cancel(consumer_tag=f"p{i}"), commands.Basic.CancelOk)
            got += seen
    return got / (time.perf_counter() - began)


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
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="leveret-bench-spark-"))
    proc = None
    uri = args.uri
    if not uri:
        proc, uri = start_broker(work / "data")
    try:
        publish_rate = fill(uri, args.messages, args.size, args.partitions)
        print(
            f"filled {args.messages} x {args.size} B into {args.partitions} partitions: "
            f"{publish_rate:,.0f} msg/s published with confirms",
            flush=True,
        )
        spark = spark_session(args.cores)
        extra = {"prefetch": str(args.prefetch)}
        spark_batch(spark, uri, args.messages, extra)  # warm-up: workers, JIT of the planner
        results: dict[str, list[float]] = {"raw": [], "batch": [], "streaming": []}
        per = args.messages // args.partitions
        for run in range(args.runs):
            order = ["raw", "batch", "streaming"]
            order = order[run % 3 :] + order[: run % 3]
            for name in order:
                if name == "raw":
                    rate = raw_consume(uri, args.partitions, per, args.prefetch)
                elif name == "batch":
                    rate = spark_batch(spark, uri, args.messages, extra)
                else:
                    rate = spark_stream(spark, uri, args.messages, work / f"ck{run}", extra)
                results[name].append(rate)
                print(f"run {run + 1} {name:>9}: {rate:,.0f} msg/s", flush=True)
        med = {k: statistics.median(v) for k, v in results.items()}
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
