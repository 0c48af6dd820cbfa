"""spark.read / readStream with format("leveret") against a real Leveret with stream queues.

Exactly once is checked by distinct id: every test publishes events with unique ids and
compares what Spark produced with what was published, as multisets.
"""

from __future__ import annotations

import json
import time

import pika
import pytest
from pyspark.sql import functions as F
from spark_support import (
    declare_stream,
    declare_super_stream,
    events,
    load,
    params,
    publish,
    stream_broker,
)

pytestmark = [pytest.mark.spark, pytest.mark.leveret_only]


@pytest.fixture
def url(tmp_path):
    with stream_broker(tmp_path) as u:
        yield u


def ids(df) -> list[str]:
    rows = df.select(F.get_json_object(F.col("body").cast("string"), "$.id").alias("id")).collect()
    return [r.id for r in rows]


def test_batch_read_of_an_exact_range(spark, url):
    declare_stream(url, "s")
    publish(url, "", "s", events(0, 1000))
    df = load(
        spark,
        uri=url,
        stream="s",
        startingOffsets=json.dumps({"s": 100}),
        endingOffsets=json.dumps({"s": 900}),
    )
    rows = df.orderBy("offset").collect()
    assert [r.offset for r in rows] == list(range(100, 900))
    assert [json.loads(r.body)["n"] for r in rows] == list(range(100, 900))
    assert {r.partition for r in rows} == {"s"}
    assert {(r.exchange, r.routing_key) for r in rows} == {("", "s")}


def test_batch_read_defaults_to_everything_and_splits_large_ranges(spark, url):
    declare_stream(url, "s")
    publish(url, "", "s", events(0, 500))
    whole = load(spark, uri=url, stream="s")
    assert whole.rdd.getNumPartitions() == 1
    assert sorted(ids(whole)) == sorted(f"e{i}" for i in range(500))
    split = load(spark, uri=url, stream="s", minPartitions="7")
    assert split.rdd.getNumPartitions() == 7
    assert sorted(ids(split)) == sorted(f"e{i}" for i in range(500))
    capped = load(spark, uri=url, stream="s", maxRecordsPerPartition="64")
    assert capped.rdd.getNumPartitions() == 8
    assert capped.count() == 500 and capped.select("offset").distinct().count() == 500


def test_properties_and_headers(spark, url):
    declare_stream(url, "s")
    conn = pika.BlockingConnection(params(url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish(
        "",
        "s",
        b"hello",
        pika.BasicProperties(
            content_type="text/plain",
            delivery_mode=2,
            priority=3,
            correlation_id="c1",
            message_id="m1",
            timestamp=1_700_000_000,
            type="greeting",
            app_id="tests",
            headers={"page": "/home", "n": 7, "flag": True, "nested": {"a": 1}},
        ),
    )
    conn.close()
    row = load(spark, uri=url, stream="s", includeHeaders="true").collect()[0]
    assert row.body == b"hello" and row.offset == 0
    p = row.properties
    assert (p.content_type, p.delivery_mode, p.priority) == ("text/plain", 2, 3)
    assert (p.correlation_id, p.message_id, p.type, p.app_id) == ("c1", "m1", "greeting", "tests")
    assert int(p.timestamp.timestamp()) == 1_700_000_000 == int(row.timestamp.timestamp())
    assert row.headers == {"page": "/home", "n": "7", "flag": "true", "nested": '{"a": 1}'}
    assert "headers" not in load(spark, uri=url, stream="s").columns


def test_batch_read_by_timestamp(spark, url):
    declare_stream(url, "s")
    publish(url, "", "s", events(0, 100, "a"))
    time.sleep(0.05)
    middle = int(time.time() * 1000)
    time.sleep(0.05)
    publish(url, "", "s", events(0, 50, "b"))
    time.sleep(0.05)
    after = int(time.time() * 1000)
    time.sleep(0.05)
    publish(url, "", "s", events(0, 10, "c"))
    df = load(spark, uri=url, stream="s", startingTimestamp=str(middle), endingTimestamp=str(after))
    assert sorted(ids(df)) == sorted(f"b{i}" for i in range(50))
    assert sorted(ids(load(spark, uri=url, stream="s", startingTimestamp=str(after)))) == sorted(
        f"c{i}" for i in range(10)
    )


def test_batch_read_of_a_super_stream(spark, url):
    streams = declare_super_stream(url, "clicks", 4)
    keys = [str(i % 4) for i in range(400)]
    publish(url, "clicks", None, events(0, 400), keys=keys)
    df = load(spark, uri=url, superStream="clicks")
    assert df.rdd.getNumPartitions() == 4
    rows = df.collect()
    assert sorted(json.loads(r.body)["id"] for r in rows) == sorted(f"e{i}" for i in range(400))
    by_part = {s: sorted(r.offset for r in rows if r.partition == s) for s in streams}
    assert by_part == {s: list(range(100)) for s in streams}
    # each partition holds exactly the ids routed to its key
    for r in rows:
        assert int(json.loads(r.body)["n"]) % 4 == int(r.partition.rsplit("-", 1)[1])
    partial = load(
        spark,
        uri=url,
        superStream="clicks",
        startingOffsets=json.dumps({"clicks-1": 90, "clicks-2": -1}),
        endingOffsets=json.dumps({"clicks-0": 10}),
    )
    counts = {r.partition: r["count"] for r in partial.groupBy("partition").count().collect()}
    assert counts == {"clicks-0": 10, "clicks-1": 10, "clicks-3": 100}


def test_read_errors_name_the_problem_before_any_task(spark, url, tmp_path):
    declare_stream(url, "s")
    group = f"read-errors-{tmp_path.name}"
    spark.sparkContext.setJobGroup(group, "no job may start")
    with pytest.raises(Exception, match="unknown option 'strem'"):
        load(spark, uri=url, strem="s")  # unknown names fail at load(), the rest at the action
    with pytest.raises(Exception, match="not found"):
        load(spark, uri=url, stream="nope").collect()
    with pytest.raises(Exception, match="not found"):
        load(spark, uri=url, superStream="nope").collect()
    with pytest.raises(Exception, match="cannot reach the AMQP broker at 127.0.0.1:1"):
        load(spark, uri="amqp://guest:guest@127.0.0.1:1/%2F", stream="s").collect()
    with pytest.raises(Exception, match="login of user 'guest'"):
        load(spark, uri=url.replace("guest:guest", "guest:bad"), stream="s").collect()
    with pytest.raises(Exception, match="endingOffsets.*offset 5 of stream 's'"):
        load(spark, uri=url, stream="s", endingOffsets='{"s": 5}').collect()
    with pytest.raises(Exception, match="startingOffsets.*'t'"):
        load(spark, uri=url, stream="s", startingOffsets='{"t": 5}').collect()
    assert spark.sparkContext.statusTracker().getJobIdsForGroup(group) == []


def test_a_task_that_fails_once_mid_read_is_retried_exactly(spark, url, tmp_path):
    declare_super_stream(url, "clicks", 2)
    publish(url, "clicks", None, events(0, 600), keys=[str(i % 2) for i in range(600)])
    marker = tmp_path / "failed"
    df = load(spark, uri=url, superStream="clicks", debugFailOnce=str(marker))
    got = ids(df)
    assert marker.exists()
    assert sorted(got) == sorted(f"e{i}" for i in range(600))
