"""readStream/writeStream with format("leveret"): checkpoints, restarts and crashes.

After every scenario the output must hold exactly the input, counted by distinct id.
"""

from __future__ import annotations

import json
import time

import pika
import pytest
from pyspark.sql import functions as F
from spark_support import (
    BrokerProcess,
    declare_stream,
    declare_super_stream,
    events,
    has_dedup_exchange,
    has_streams,
    params,
    publish,
    stream_broker,
)

from leveret.spark.options import parse_read
from leveret.spark.reader import fetch_tails

pytestmark = [pytest.mark.spark, pytest.mark.leveret_only]


@pytest.fixture
def url(tmp_path):
    with stream_broker(tmp_path) as u:
        yield u


def start_query(spark, url, out, checkpoint, trigger, **opts):
    reader = spark.readStream.format("leveret").option("uri", url)
    for k, v in opts.items():
        reader = reader.option(k, v)
    ids = reader.load().select(
        F.get_json_object(F.col("body").cast("string"), "$.id").alias("id"), "partition", "offset"
    )
    return (
        ids.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(**trigger)
        .start()
    )


def run_available_now(spark, url, out, checkpoint, **opts) -> None:
    query = start_query(spark, url, out, checkpoint, {"availableNow": True}, **opts)
    query.awaitTermination(180)
    if query.exception() is not None:
        raise query.exception()


def output_ids(spark, out) -> list[str]:
    return [r.id for r in spark.read.parquet(str(out)).select("id").collect()]


def wait_for_batches(query, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while len([p for p in query.recentProgress if p["numInputRows"] > 0]) < n:
        if query.exception() is not None:
            raise query.exception()
        assert time.monotonic() < deadline, f"fewer than {n} batches in {timeout} s"
        time.sleep(0.1)


def test_available_now_reads_everything_in_limited_batches(spark, url, tmp_path):
    declare_super_stream(url, "clicks", 4)
    publish(url, "clicks", None, events(0, 1000), keys=[str(i % 4) for i in range(1000)])
    out, ck = tmp_path / "out", tmp_path / "ck"
    run_available_now(
        spark,
        url,
        out,
        ck,
        superStream="clicks",
        startingOffsets="earliest",
        maxMessagesPerTrigger="300",
    )
    assert sorted(output_ids(spark, out)) == sorted(f"e{i}" for i in range(1000))
    batches = [p for p in (ck / "offsets").iterdir() if p.name.isdigit()]
    assert len(batches) == 4  # 300 + 300 + 300 + 100


def test_stop_half_way_and_restart_from_the_checkpoint_is_exactly_once(spark, url, tmp_path):
    declare_super_stream(url, "clicks", 4)
    publish(url, "clicks", None, events(0, 2000), keys=[str(i % 4) for i in range(2000)])
    out, ck = tmp_path / "out", tmp_path / "ck"
    query = start_query(
        spark,
        url,
        out,
        ck,
        {"processingTime": "0 seconds"},
        superStream="clicks",
        startingOffsets="earliest",
        maxMessagesPerTrigger="200",
    )
    wait_for_batches(query, 3)
    query.stop()
    half = output_ids(spark, out)
    assert 0 < len(half) < 2000
    publish(url, "clicks", None, events(2000, 1000), keys=[str(i % 4) for i in range(1000)])
    run_available_now(spark, url, out, ck, superStream="clicks", maxMessagesPerTrigger="700")
    got = output_ids(spark, out)
    assert sorted(got) == sorted(f"e{i}" for i in range(3000))


def test_latest_is_the_default_start_of_a_new_query(spark, url, tmp_path):
    declare_stream(url, "s")
    publish(url, "", "s", events(0, 100, "old"))
    out, ck = tmp_path / "out", tmp_path / "ck"
    run_available_now(spark, url, out, ck, stream="s")  # starts at the tail: nothing
    publish(url, "", "s", events(0, 50, "new"))
    run_available_now(spark, url, out, ck, stream="s")
    assert sorted(output_ids(spark, out)) == sorted(f"new{i}" for i in range(50))


def test_a_task_failing_once_in_a_micro_batch_leaves_the_output_exact(spark, url, tmp_path):
    declare_stream(url, "s")
    publish(url, "", "s", events(0, 800))
    out, ck = tmp_path / "out", tmp_path / "ck"
    marker = tmp_path / "failed"
    run_available_now(
        spark,
        url,
        out,
        ck,
        stream="s",
        startingOffsets="earliest",
        debugFailOnce=str(marker),
        minPartitions="3",
    )
    assert marker.exists()
    assert sorted(output_ids(spark, out)) == sorted(f"e{i}" for i in range(800))


def tails(url: str, stream: str):
    return fetch_tails(parse_read({"uri": url, "stream": stream}, streaming=False))[0]


def test_retention_with_fail_on_data_loss_both_ways(spark, url, tmp_path):
    declare_stream(
        url, "s", **{"x-max-length-bytes": 20_000, "x-stream-max-segment-size-bytes": 4_000}
    )
    publish(
        url, "", "s", [json.dumps({"id": f"e{i}", "pad": "x" * 200}).encode() for i in range(500)]
    )
    tail = tails(url, "s")
    assert tail.first > 0 and tail.next == 500
    with pytest.raises(Exception, match="deleted by retention.*failOnDataLoss"):
        spark.read.format("leveret").option("uri", url).option("stream", "s").option(
            "startingOffsets", '{"s": 0}'
        ).load().collect()
    df = (
        spark.read.format("leveret")
        .option("uri", url)
        .option("stream", "s")
        .option("startingOffsets", '{"s": 0}')
        .option("failOnDataLoss", "false")
        .load()
    )
    offsets = sorted(r.offset for r in df.select("offset").collect())
    assert offsets[0] >= tail.first and offsets == list(range(offsets[0], 500))
    # streaming: a checkpoint that points below the first offset
    out, ck = tmp_path / "out", tmp_path / "ck"
    with pytest.raises(Exception, match="deleted by retention"):
        run_available_now(spark, url, out, ck, stream="s", startingOffsets='{"s": 0}')
    run_available_now(
        spark,
        url,
        tmp_path / "out2",
        tmp_path / "ck2",
        stream="s",
        startingOffsets='{"s": 0}',
        failOnDataLoss="false",
    )
    assert len(output_ids(spark, tmp_path / "out2")) == 500 - offsets[0]


def test_broker_sigkill_during_a_streaming_query_is_exactly_once(spark, tmp_path):
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log").start()
    try:
        if not has_streams(broker.url):
            pytest.skip("this Leveret has no stream queues yet")
        declare_super_stream(broker.url, "clicks", 4)
        publish(broker.url, "clicks", None, events(0, 3000), keys=[str(i % 4) for i in range(3000)])
        out, ck = tmp_path / "out", tmp_path / "ck"
        query = start_query(
            spark,
            broker.url,
            out,
            ck,
            {"processingTime": "0 seconds"},
            superStream="clicks",
            startingOffsets="earliest",
            maxMessagesPerTrigger="250",
        )
        wait_for_batches(query, 2)
        broker.kill()
        broker.start()
        publish(
            broker.url, "clicks", None, events(3000, 500), keys=[str(i % 4) for i in range(500)]
        )
        # the query either rode out the crash (task retries) or failed; either way a restart
        # from the checkpoint must finish the job with nothing lost and nothing doubled
        try:
            query.stop()
        except Exception:
            pass
        run_available_now(spark, broker.url, out, ck, superStream="clicks")
        assert sorted(output_ids(spark, out)) == sorted(f"e{i}" for i in range(3500))
    finally:
        broker.close()


def test_sink_deduplication_makes_a_replayed_write_exactly_once(spark, url, tmp_path):
    if not has_dedup_exchange(url):
        pytest.skip("this Leveret has no x-message-deduplication exchange yet")
    declare_stream(url, "s")
    publish(url, "", "s", events(0, 400))
    conn = pika.BlockingConnection(params(url))
    ch = conn.channel()
    ch.exchange_declare("dedup", "x-message-deduplication", arguments={"x-cache-size": 10_000})
    ch.queue_declare("results")
    ch.queue_bind("results", "dedup", "#")
    query = (
        spark.readStream.format("leveret")
        .option("uri", url)
        .option("stream", "s")
        .option("startingOffsets", "earliest")
        .load()
        .select("body", F.lit("k").alias("routing_key"))
        .writeStream.format("leveret")
        .option("uri", url)
        .option("exchange", "dedup")
        .option("debugFailOnce", str(tmp_path / "failed"))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None and (tmp_path / "failed").exists()
    got = []
    while True:
        method, _props, body = ch.basic_get("results", auto_ack=True)
        if method is None:
            break
        got.append(json.loads(body)["id"])
    assert sorted(got) == sorted(f"e{i}" for i in range(400))
    conn.close()
