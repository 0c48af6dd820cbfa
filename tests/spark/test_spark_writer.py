"""df.write / writeStream with format("leveret"), against plain exchanges and queues.

Also runs against RabbitMQ (LEVERET_TEST_URL): writing needs nothing Leveret-specific.
"""

from __future__ import annotations

import collections
import datetime as dt
import json

import pika
import pytest

from conftest import connection_params

pytestmark = pytest.mark.spark


def queue_for(amqp_url, names, **args):
    conn = pika.BlockingConnection(connection_params(amqp_url))
    ch = conn.channel()
    q = names.queue("spark")
    ch.queue_declare(q, arguments=args or None)
    return conn, ch, q


def dedup_ids(messages) -> list[str]:
    return [props.headers["x-deduplication-header"] for props, _ in messages]


def drain_all(ch, queue: str) -> list[tuple[pika.BasicProperties, bytes]]:
    out = []
    while True:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append((props, body))


def test_batch_write_publishes_every_row_once_with_a_unique_id(spark, amqp_url, names):
    conn, ch, q = queue_for(amqp_url, names)
    df = spark.createDataFrame([(f"m{i}",) for i in range(500)], "body string").repartition(3)
    df.write.format("leveret").option("uri", amqp_url).option("exchange", "").option(
        "routingKey", q
    ).mode("append").save()
    got = drain_all(ch, q)
    assert sorted(b.decode() for _, b in got) == sorted(f"m{i}" for i in range(500))
    ids = dedup_ids(got)
    assert len(set(ids)) == 500
    assert all(p.message_id == p.headers["x-deduplication-header"] for p, _ in got)
    conn.close()


def test_routing_key_headers_and_properties_columns(spark, amqp_url, names):
    conn, ch, q = queue_for(amqp_url, names)
    ex = names.exchange("spark")
    ch.exchange_declare(ex, "direct")
    ch.queue_bind(q, ex, "k1")
    when = dt.datetime(2024, 5, 1, 12, 0, 0, tzinfo=dt.UTC)
    rows = [
        (
            b"\x00\x01",
            "k1",
            {"page": "/home", "n": "1"},
            ("application/json", 2, 5, "c-1", when, "click", "spark-app"),
        ),
        (b"other", "k2", None, None),  # routed nowhere
    ]
    schema = (
        "body binary, routing_key string, headers map<string,string>, properties struct<"
        "content_type string, delivery_mode int, priority int, correlation_id string, "
        "timestamp timestamp, type string, app_id string>"
    )
    spark.createDataFrame(rows, schema).write.format("leveret").option("uri", amqp_url).option(
        "exchange", ex
    ).mode("append").save()
    got = drain_all(ch, q)
    assert len(got) == 1
    props, body = got[0]
    assert body == b"\x00\x01"
    assert props.headers["page"] == "/home" and props.headers["n"] == "1"
    assert props.content_type == "application/json" and props.delivery_mode == 2
    assert props.priority == 5 and props.correlation_id == "c-1"
    assert props.timestamp == int(when.timestamp()) and props.type == "click"
    assert props.app_id == "spark-app"
    conn.close()


def test_a_replayed_task_publishes_the_same_ids_again(spark, amqp_url, names, tmp_path):
    """A task fails after its messages are confirmed; its retry repeats them with the same ids,
    which is what lets a deduplicating exchange or queue keep exactly one of each."""
    conn, ch, q = queue_for(amqp_url, names)
    df = spark.createDataFrame([(f"m{i}",) for i in range(300)], "body string").repartition(2)
    (
        df.write.format("leveret")
        .option("uri", amqp_url)
        .option("exchange", "")
        .option("routingKey", q)
        .option("debugFailOnce", str(tmp_path / "failed"))
        .mode("append")
        .save()
    )
    assert (tmp_path / "failed").exists()
    got = drain_all(ch, q)
    assert len(got) > 300  # the failed task's messages went out twice
    by_id = collections.defaultdict(set)
    for props, body in got:
        by_id[props.headers["x-deduplication-header"]].add(body)
    assert len(by_id) == 300
    assert all(len(bodies) == 1 for bodies in by_id.values())
    assert sorted(b.pop().decode() for b in by_id.values()) == sorted(f"m{i}" for i in range(300))
    conn.close()


def test_a_nacked_publish_fails_the_write(spark, amqp_url, names):
    conn, ch, q = queue_for(amqp_url, names, **{"x-max-length": 1, "x-overflow": "reject-publish"})
    df = spark.createDataFrame([("a",), ("b",), ("c",)], "body string").coalesce(1)
    with pytest.raises(Exception, match="nacked"):
        df.write.format("leveret").option("uri", amqp_url).option("exchange", "").option(
            "routingKey", q
        ).mode("append").save()
    conn.close()


def test_mandatory_fails_on_an_unroutable_message(spark, amqp_url, names):
    ex = names.exchange("spark")
    conn = pika.BlockingConnection(connection_params(amqp_url))
    conn.channel().exchange_declare(ex, "direct")
    df = spark.createDataFrame([("a", "nowhere")], "body string, routing_key string")
    with pytest.raises(Exception, match="unroutable.*nowhere"):
        df.write.format("leveret").option("uri", amqp_url).option("exchange", ex).option(
            "mandatory", "true"
        ).mode("append").save()
    conn.close()


def test_streaming_write_ids_come_from_the_query_and_batch(spark, amqp_url, names, tmp_path):
    """A micro-batch that Spark replays after a restart (its commit was lost) publishes the
    same ids as the first time."""
    conn, ch, q = queue_for(amqp_url, names)
    src = tmp_path / "in"
    src.mkdir()
    for f in range(2):
        (src / f"{f}.json").write_text(
            "\n".join(json.dumps({"body": f"f{f}-{i}"}) for i in range(50))
        )
    checkpoint = tmp_path / "ck"

    def run():
        query = (
            spark.readStream.schema("body string")
            .option("maxFilesPerTrigger", 1)
            .json(str(src))
            .writeStream.format("leveret")
            .option("uri", amqp_url)
            .option("exchange", "")
            .option("routingKey", q)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None
        return query.id

    first = run()
    assert len(drain_all_peek := drain_all(ch, q)) == 100
    ids = set(dedup_ids(drain_all_peek))
    assert len(ids) == 100 and all(i.startswith(str(first)) for i in ids)
    # forget that the last batch was committed: Spark replays it on restart
    commits = sorted((checkpoint / "commits").iterdir(), key=lambda p: p.name)
    last = [p for p in commits if p.name.isdigit()][-1]
    last.unlink()
    for crc in (checkpoint / "commits").glob(f".{last.name}.crc"):
        crc.unlink()
    second = run()
    assert second == first
    replayed = drain_all(ch, q)
    assert len(replayed) == 50
    assert set(dedup_ids(replayed)) <= ids
    conn.close()


def test_driver_errors_name_the_problem_before_any_task(spark, amqp_url, names):
    df = spark.createDataFrame([("a",)], "body string")
    group = f"write-errors-{names.token}"
    spark.sparkContext.setJobGroup(group, "no job may start")

    def write(frame, **opts):
        w = frame.write.format("leveret").mode("append")
        for k, v in opts.items():
            w = w.option(k, v)
        w.save()

    with pytest.raises(Exception, match="unknown option 'exchnage'"):
        write(df, uri=amqp_url, exchnage="x")
    with pytest.raises(Exception, match="cannot reach the AMQP broker at 127.0.0.1:1"):
        write(df, uri="amqp://guest:guest@127.0.0.1:1/%2F", exchange="amq.fanout")
    bad_login = amqp_url.replace("guest:guest", "guest:wrong")
    with pytest.raises(Exception, match="refused the login of user 'guest'|wrong user or password"):
        write(df, uri=bad_login, exchange="amq.fanout")
    with pytest.raises(Exception, match="404"):
        write(df, uri=amqp_url, exchange=names.exchange("missing"))
    with pytest.raises(Exception, match="'body' column"):
        write(spark.createDataFrame([("a",)], "text string"), uri=amqp_url, exchange="amq.fanout")
    with pytest.raises(Exception, match=r"unexpected column\(s\) \['extra'\]"):
        write(
            spark.createDataFrame([("a", 1)], "body string, extra int"),
            uri=amqp_url,
            exchange="amq.fanout",
        )
    assert spark.sparkContext.statusTracker().getJobIdsForGroup(group) == []


def test_reading_needs_the_tail_offsets_extension_and_says_so(spark, amqp_url, names):
    """On RabbitMQ (LEVERET_TEST_URL) the request for tail offsets comes back unroutable."""
    from conftest import against_rabbitmq

    if not against_rabbitmq():
        pytest.skip("checks the error a broker without the extension gives (RabbitMQ)")
    conn = pika.BlockingConnection(connection_params(amqp_url))
    q = names.queue("stream")
    conn.channel().queue_declare(q, durable=True, arguments={"x-queue-type": "stream"})
    with pytest.raises(Exception, match="does not answer Leveret's tail-offsets extension"):
        spark.read.format("leveret").option("uri", amqp_url).option("stream", q).load().collect()
    conn.close()
