"""Click counts per page per minute: Leveret -> Spark Structured Streaming -> Leveret + Parquet.

    python -m leveret.examples.clicks                  # starts an embedded broker
    python -m leveret.examples.clicks --uri amqp://guest:guest@127.0.0.1:5672/%2F

1. A producer publishes JSON click events through a consistent-hash exchange
   (`clicks.in`, hashing the user id) into the super stream `clicks` (4 partitions).
2. A Spark job reads the super stream with format("leveret"), counts clicks per page
   per minute of event time (a 1-minute window with a 1-minute watermark) ...
3. ... and writes each finished window both to the exchange `click-counts` (exactly
   once: deterministic ids in `x-deduplication-header`) and to Parquet.
4. A consumer bound to `click-counts` prints the counts as they arrive.

The events carry a simulated clock (`--minutes` minutes of clicks, published in a few
seconds); then a clock event two minutes later, repeated every second, moves the
watermark past every window, so the run ends on its own once every window's count has
arrived.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

from leveret.client import BasicProperties, ChannelClosed, OutgoingMessage
from leveret.client.blocking import connect

SUPER_STREAM = "clicks"
PARTITIONS = 4
HASH_EXCHANGE = "clicks.in"
RESULTS_EXCHANGE = "click-counts"
RESULTS_QUEUE = "click-counts.printer"
PAGES = ("/", "/pricing", "/docs", "/blog", "/signup")
END_PAGE = "/_tick"  # the clock events that move the watermark past the last window


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m leveret.examples.clicks", description=__doc__.split("\n")[0]
    )
    p.add_argument("--uri", help="AMQP URL of a Leveret broker (default: start an embedded one)")
    p.add_argument("--minutes", type=int, default=5, help="minutes of simulated clicks (5)")
    p.add_argument(
        "--per-minute", type=int, default=2000, help="clicks per simulated minute (2000)"
    )
    p.add_argument(
        "--seconds", type=float, default=10.0, help="real seconds to publish them in (10)"
    )
    p.add_argument("--out", help="directory for the Parquet output and checkpoints (a temp dir)")
    p.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds")
    args = p.parse_args(argv)
    for name in ("minutes", "per_minute"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    return args


def _declare_exchange(uri: str, name: str, kind: str, arguments: dict | None = None) -> bool:
    """Declare an exchange on a connection of its own; False if the broker lacks the type."""
    try:
        with connect(uri) as conn:
            conn.channel().declare_exchange(name, kind, durable=True, arguments=arguments or {})
        return True
    except ChannelClosed:
        return False


def setup(uri: str) -> dict:
    """The super stream (as RabbitMQ makes one), the hash exchange in front, the results.

    Returns where the producer publishes and how results are deduplicated.
    """
    _declare_exchange(uri, SUPER_STREAM, "direct")
    hashed = _declare_exchange(uri, HASH_EXCHANGE, "x-consistent-hash")
    dedup = _declare_exchange(
        uri, RESULTS_EXCHANGE, "x-message-deduplication", {"x-cache-size": 100_000}
    ) or _declare_exchange(uri, RESULTS_EXCHANGE, "topic")
    with connect(uri) as conn:
        ch = conn.channel()
        for i in range(PARTITIONS):
            stream = f"{SUPER_STREAM}-{i}"
            ch.declare_queue(stream, durable=True, arguments={"x-queue-type": "stream"})
            ch.bind_queue(stream, SUPER_STREAM, str(i), arguments={"x-stream-partition-order": i})
            if hashed:  # consistent-hash binding: the routing key is the partition's weight
                ch.bind_queue(stream, HASH_EXCHANGE, "1")
        ch.declare_queue(RESULTS_QUEUE, durable=True)
        ch.bind_queue(RESULTS_QUEUE, RESULTS_EXCHANGE, "#")
    if not hashed:
        print("  (no x-consistent-hash exchange: the producer picks partitions itself)")
    if not dedup:
        print("  (no x-message-deduplication exchange: results may repeat after a crash)")
    return {"hashed": hashed, "dedup": dedup}


def clicks(minutes: int, per_minute: int, start_ms: int, seed: int = 7) -> Iterator[dict]:
    rng = random.Random(seed)
    step = 60_000 / per_minute
    for i in range(minutes * per_minute):
        yield {
            "id": f"c{i}",
            "user": f"u{rng.randrange(500)}",
            "page": rng.choices(PAGES, weights=(5, 2, 3, 2, 1))[0],
            "ts": int(start_ms + i * step),
        }


def produce(uri: str, args: argparse.Namespace, start_ms: int, hashed: bool) -> int:
    """Publish the clicks (keyed by user) paced over --seconds; returns how many."""

    def target(user: str) -> tuple[str, str]:
        if hashed:
            return HASH_EXCHANGE, user
        return SUPER_STREAM, str(zlib.crc32(user.encode()) % PARTITIONS)

    total = args.minutes * args.per_minute
    pace = args.seconds / total
    began = time.monotonic()
    props = BasicProperties(content_type="application/json", delivery_mode=2)
    events = clicks(args.minutes, args.per_minute, start_ms)
    with connect(uri) as conn:
        ch = conn.channel()
        sent = 0
        while sent < total:
            batch = []
            for event in events:
                exchange, key = target(event["user"])
                batch.append(OutgoingMessage(json.dumps(event).encode(), key, exchange, props))
                if len(batch) == 500:
                    break
            ch.publish_many(batch)  # returns once every one is confirmed
            sent += len(batch)
            ahead = began + sent * pace - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
    return total


def tick(uri: str, start_ms: int, minutes: int, stop: threading.Event) -> None:
    """Publish a clock event every second until stopped.

    The watermark a micro-batch uses is the one the batches before it reached, so the
    last windows close only in a batch after the one that saw the late event time:
    these ticks make sure there is one, whatever the trigger and the no-data-batch setting.
    """
    props = BasicProperties(content_type="application/json", delivery_mode=2)
    late = {"id": "tick", "user": "u0", "page": END_PAGE, "ts": start_ms + (minutes + 2) * 60_000}
    with connect(uri) as conn:
        ch = conn.channel()
        while not stop.is_set():
            ch.publish(json.dumps(late).encode(), "0", SUPER_STREAM, properties=props)
            stop.wait(1.0)


def start_job(spark, uri: str, out: Path):
    """The Structured Streaming job: two sinks of one windowed count, each exactly once."""
    from pyspark.sql import functions as F

    events = (
        spark.readStream.format("leveret")
        .option("uri", uri)
        .option("superStream", SUPER_STREAM)
        .option("startingOffsets", "earliest")
        .load()
        .select(
            F.from_json(
                F.col("body").cast("string"), "id string, user string, page string, ts long"
            ).alias("e")
        )
        .select("e.page", (F.col("e.ts") / 1000).cast("timestamp").alias("event_time"))
    )
    counts = (
        events.withWatermark("event_time", "1 minute")
        .groupBy(F.window("event_time", "1 minute"), "page")
        .count()
        # no filter for the clock events: Spark would push it below the watermark, which
        # would then never see them; their own window never closes, so it is never written
        .select(F.col("window.start").alias("minute"), "page", F.col("count").alias("clicks"))
    )
    to_leveret = (
        counts.select(
            F.to_json(F.struct("minute", "page", "clicks")).alias("body"),
            F.col("page").alias("routing_key"),
        )
        .writeStream.format("leveret")
        .option("uri", uri)
        .option("exchange", RESULTS_EXCHANGE)
        .option("checkpointLocation", str(out / "checkpoints" / "to-leveret"))
        .outputMode("append")
        .trigger(processingTime="1 second")
        .start()
    )
    to_parquet = (
        counts.writeStream.format("parquet")
        .option("path", str(out / "counts.parquet"))
        .option("checkpointLocation", str(out / "checkpoints" / "to-parquet"))
        .outputMode("append")
        .trigger(processingTime="1 second")
        .start()
    )
    return [to_leveret, to_parquet]


def print_results(uri: str, expected: int, stop: threading.Event, seen: dict) -> None:
    """The consumer: print each window's count as it arrives, until all clicks are counted."""
    with connect(uri) as conn:
        consumer = conn.channel().consume(RESULTS_QUEUE, prefetch=100)
        while not stop.is_set() and seen["clicks"] < expected:
            try:
                message = consumer.next_message(timeout=1.0)
            except TimeoutError:
                continue  # no delivery within a second: look at the stop flag again
            r = json.loads(message.body)
            message.ack()
            key = (r["minute"], r["page"])
            if key not in seen["windows"]:
                seen["windows"][key] = r["clicks"]
                seen["clicks"] += r["clicks"]
            print(f"  {r['minute'][11:16]}  {r['page']:<10} {r['clicks']:>6} clicks", flush=True)


@contextlib.contextmanager
def broker_for(uri: str | None, data_dir: Path) -> Iterator[str]:
    if uri:
        yield uri
        return
    from leveret.testing import embedded_broker

    with embedded_broker(persistence=True, data_dir=str(data_dir)) as broker:
        print(f"started an embedded Leveret at {broker.url}", flush=True)
        yield broker.url


def spark_session():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from leveret.spark import LeveretDataSource

    spark = (
        SparkSession.builder.appName("leveret-clicks")
        .master(os.environ.get("SPARK_MASTER", "local[2]"))
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(LeveretDataSource)
    return spark


def main(argv: list[str] | None = None, spark=None) -> dict:
    from leveret.spark import LeveretDataSource

    args = parse_args(argv)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="leveret-clicks-"))
    out.mkdir(parents=True, exist_ok=True)
    with broker_for(args.uri, out / "broker") as uri:
        print("setting up the super stream, the hash exchange and the results exchange", flush=True)
        made = setup(uri)
        spark = spark or spark_session()
        spark.dataSource.register(LeveretDataSource)
        queries = start_job(spark, uri, out)
        start_ms = (int(time.time()) // 60) * 60_000
        expected = args.minutes * args.per_minute
        seen: dict = {"clicks": 0, "windows": {}}
        stop = threading.Event()
        ticker: threading.Thread | None = None
        printer = threading.Thread(target=print_results, args=(uri, expected, stop, seen))
        printer.start()
        print(f"publishing {expected} clicks ({args.minutes} simulated minutes) ...", flush=True)
        try:
            produce(uri, args, start_ms, made["hashed"])
            ticker = threading.Thread(target=tick, args=(uri, start_ms, args.minutes, stop))
            ticker.start()
            deadline = time.monotonic() + args.timeout
            while printer.is_alive() and time.monotonic() < deadline:
                printer.join(1)
                for q in queries:
                    if q.exception() is not None:
                        raise RuntimeError(f"the Spark job failed: {q.exception()}")
        finally:
            stop.set()
            printer.join(10)
            if ticker is not None:
                ticker.join(10)
            for q in queries:  # let a running micro-batch finish, then stop
                with contextlib.suppress(Exception):
                    q.processAllAvailable()
                q.stop()
        parquet = spark.read.parquet(str(out / "counts.parquet"))
        in_parquet = parquet.groupBy().sum("clicks").collect()[0][0] or 0
        print(
            f"done: {seen['clicks']} of {expected} clicks counted in {len(seen['windows'])} "
            f"windows; Parquet ({out / 'counts.parquet'}) holds {in_parquet}",
            flush=True,
        )
        return {
            "expected": expected,
            "printed": seen["clicks"],
            "parquet": in_parquet,
            "windows": len(seen["windows"]),
            "out": str(out),
        }


if __name__ == "__main__":
    result = main()
    sys.exit(0 if result["printed"] == result["expected"] == result["parquet"] else 1)
