"""A Spark Structured Streaming query over a super stream, across a leader SIGKILL.

The query reads the super stream with format("leveret") and writes every row to a
deduplicating queue with format("leveret"), both given every node in `uri`. The leader
is killed while the query runs and a publisher keeps publishing. Afterwards the output
holds every offset of every partition exactly once (no gap, no duplicate), each with the
body the stream holds at that offset, and every confirmed message is in the stream.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from leveret.client import OutgoingMessage
from leveret.client.blocking import connect

from .cluster_support import Cluster, needs_etcd

pytestmark = [needs_etcd, pytest.mark.slow, pytest.mark.spark, pytest.mark.leveret_only]

SUPER = "events"
PARTITIONS = 3
OUT = "copied"


def _uri(cluster: Cluster) -> str:
    """One URI naming every node, as a Spark job is given a cluster."""
    hosts = ",".join(n.url.split("@", 1)[1].split("/", 1)[0] for n in cluster.nodes)
    return f"amqp://guest:guest@{hosts}/%2F"


class Publisher(threading.Thread):
    """Confirmed publishing of 0, 1, 2, ... round the partitions, in small batches."""

    def __init__(self, uri: str, total: int) -> None:
        super().__init__(daemon=True)
        self.uri = uri
        self.total = total
        self.confirmed: set[int] = set()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with connect(self.uri) as conn:
                ch = conn.channel()
                for start in range(0, self.total, 25):
                    batch = range(start, min(start + 25, self.total))
                    ch.publish_many(
                        [OutgoingMessage(str(i).encode(), str(i % PARTITIONS)) for i in batch],
                        exchange=SUPER,
                        persistent=True,
                    )
                    self.confirmed.update(batch)
                    time.sleep(0.02)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def _streams(uri: str) -> dict[tuple[str, int], int]:
    """(partition, offset) -> body of everything the super stream holds."""
    from leveret.spark.options import parse_read
    from leveret.spark.reader import fetch_tails

    opts = parse_read({"uri": uri, "superStream": SUPER}, streaming=False)
    tails = fetch_tails(opts, patience=60)  # the nodes may still be settling after the failover
    held: dict[tuple[str, int], int] = {}
    with connect(uri) as conn:
        ch = conn.channel()
        for t in tails:
            if t.next == 0:
                continue
            consumer = ch.consume(t.stream, offset=0, prefetch=500)
            for m in consumer:
                held[(t.stream, m.offset)] = int(m.body)
                m.ack()
                if m.offset == t.next - 1:
                    break
            consumer.cancel()
    return held


def _read_up_to(query) -> dict[str, int]:  # noqa: ANN001
    """The offsets the query's last micro-batch read up to."""
    progress = query.lastProgress
    if not progress:
        return {}
    end = progress["sources"][0]["endOffset"]
    return json.loads(end) if isinstance(end, str) else dict(end or {})


def test_streaming_query_over_a_super_stream_survives_a_leader_sigkill(
    cluster: Cluster, spark, tmp_path
) -> None:
    from pyspark.sql import functions as F

    uri = _uri(cluster)
    with connect(uri) as conn:
        ch = conn.channel()
        ch.declare_exchange(SUPER, "direct", durable=True)
        for i in range(PARTITIONS):
            ch.declare_queue(f"{SUPER}-{i}", durable=True, arguments={"x-queue-type": "stream"})
            ch.bind_queue(f"{SUPER}-{i}", SUPER, str(i), {"x-stream-partition-order": i})
        ch.declare_queue(OUT, durable=True, arguments={"x-message-deduplication": True})

    publisher = Publisher(uri, 3000)
    publisher.start()
    rows = (
        spark.readStream.format("leveret")
        .option("uri", uri)
        .option("superStream", SUPER)
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerTrigger", "300")
        .option("timeout", "60")
        .load()
    )
    query = (
        rows.select(
            F.to_json(
                F.struct("partition", "offset", F.col("body").cast("string").alias("value"))
            ).alias("body"),
            F.struct(F.lit(2).alias("delivery_mode")).alias("properties"),
        )
        .writeStream.format("leveret")
        .option("uri", uri)
        .option("exchange", "")
        .option("routingKey", OUT)
        .option("timeout", "60")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 300
        while sum(p["numInputRows"] for p in query.recentProgress) < 300:
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, "the query read nothing"
            time.sleep(0.2)
        old = cluster.wait_leader()
        old.kill()
        cluster.wait_leader(other_than=old.name)
        publisher.join(300)
        assert publisher.error is None, f"the publisher failed: {publisher.error!r}"
        held = _streams(uri)
        assert publisher.confirmed <= set(held.values()), "a confirmed message is not in the stream"
        # until the query has read every offset the partitions hold
        want = {p: 0 for p in (f"{SUPER}-{i}" for i in range(PARTITIONS))}
        for partition, offset in held:
            want[partition] = max(want[partition], offset + 1)
        while True:
            assert query.exception() is None, query.exception()
            done = _read_up_to(query)
            if all(done.get(p, 0) >= n for p, n in want.items()):
                break
            assert time.monotonic() < deadline + 300, f"the query stopped at {done}, want {want}"
            time.sleep(0.5)
        query.processAllAvailable()
    finally:
        query.stop()

    copied: list[tuple[str, int, int]] = []
    with connect(uri) as conn:
        ch = conn.channel()
        while (m := ch.get(OUT)) is not None:
            row = json.loads(m.body)
            copied.append((row["partition"], row["offset"], int(row["value"])))
            m.ack()
    keys = [(p, o) for p, o, _ in copied]
    assert len(keys) == len(set(keys)), "an offset was copied twice"
    missing = set(held) - set(keys)
    assert not missing, f"offsets never copied (a gap): {sorted(missing)[:10]}"
    assert set(keys) <= set(held)
    assert all(held[(p, o)] == v for p, o, v in copied), "a copied body differs from the stream's"
