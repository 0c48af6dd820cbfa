"""Batch and streaming readers: the driver plans offset ranges, each task reads one range.

Why this shape (Kafka's): the only state is offsets, which Spark keeps in its checkpoint.
A task consumes exactly [start, end) of one stream over its own connection, acking only
to give the broker credit back, so a replayed task reads the very same messages again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from leveret.spark import planning
from leveret.spark._amqp import Client, ConnectFailed, ConnectionLost
from leveret.spark._tail import PartitionTail, stream_offsets
from leveret.spark.options import ReadOptions, fail_once
from leveret.spark.planning import DataLoss, OffsetRange
from leveret.spark.rows import OFFSET_HEADER, BatchBuilder

ARROW_BATCH_ROWS = 8192


class RangePartition(InputPartition):
    """One task's work: exactly [start, end) of `stream`."""

    def __init__(self, stream: str, start: int, end: int) -> None:
        super().__init__((stream, start, end))
        self.stream = stream
        self.start = start
        self.end = end


def fetch_tails(opts: ReadOptions, timestamp: int | None = None) -> list[PartitionTail]:
    """Tail offsets of the source's partitions; connection problems surface here, on the driver."""
    with Client(opts.uri, timeout=opts.timeout, label="leveret-spark driver").connect() as client:
        if opts.super_stream:
            return stream_offsets(client, super_stream=opts.super_stream, timestamp=timestamp)
        return stream_offsets(client, streams=[opts.stream or ""], timestamp=timestamp)


def read_range(opts: ReadOptions, stream: str, start: int, end: int) -> Iterator[pa.RecordBatch]:
    """Consume offsets [start, end) of `stream` and yield them as Arrow batches.

    Offsets below the next expected one (a stream consumer may begin at a chunk boundary)
    are skipped; a first offset above it, or a hole, means retention deleted data. A
    connection lost mid-range is opened again (for up to `timeout` seconds) and the read
    goes on from the next expected offset, so a broker restart costs no task retry.
    """
    rows = BatchBuilder(stream, opts.include_headers)
    state = {"expected": start, "fail_at": None}
    if opts.debug_fail_once:
        state["fail_at"] = start + max(1, (end - start) // 2)
    lost_since: float | None = None
    while state["expected"] < end:
        before = state["expected"]
        try:
            yield from _consume(opts, stream, end, rows, state)
        except (ConnectionLost, ConnectFailed):
            if state["expected"] > before:
                lost_since = None
            now = time.monotonic()
            lost_since = lost_since or now
            if now - lost_since > opts.timeout:
                raise
            time.sleep(0.2)
            continue
        break
    if len(rows):
        yield rows.take()


def _consume(
    opts: ReadOptions, stream: str, end: int, rows: BatchBuilder, state: dict
) -> Iterator[pa.RecordBatch]:
    ack_every = max(1, opts.prefetch // 2)
    unacked = 0
    expected = state["expected"]
    task = Client(opts.uri, timeout=opts.timeout, label="leveret-spark task")
    with task.connect_patiently(opts.timeout) as client:
        client.qos(opts.prefetch)
        client.consume(stream, {OFFSET_HEADER: expected})
        for d in client.deliveries():
            unacked += 1
            if unacked >= ack_every:
                client.ack(d.delivery_tag, multiple=True)
                unacked = 0
            headers = d.properties.headers or {}
            offset = headers.get(OFFSET_HEADER)
            if offset is None:
                raise RuntimeError(
                    f"a delivery from stream {stream!r} has no {OFFSET_HEADER} header"
                )
            if offset < expected:
                continue
            if offset > expected:
                if opts.fail_on_data_loss:
                    raise DataLoss(
                        f"offsets {expected}..{min(offset, end) - 1} of stream {stream!r} were "
                        "deleted by retention before they were read; set option "
                        "'failOnDataLoss' to false to skip them"
                    )
                if offset >= end:
                    state["expected"] = end
                    return
            rows.add(offset, d)
            expected = state["expected"] = offset + 1
            if state["fail_at"] is not None and expected >= state["fail_at"]:
                state["fail_at"] = None
                yield rows.take()
                if fail_once(opts.debug_fail_once):
                    raise RuntimeError(f"debugFailOnce: injected failure in stream {stream!r}")
            if expected >= end:
                return
            if len(rows) >= ARROW_BATCH_ROWS:
                yield rows.take()


def _plan_partitions(opts: ReadOptions, parts: list[OffsetRange]) -> list[RangePartition]:
    cut = planning.split(parts, opts.min_partitions, opts.max_records_per_partition)
    return [RangePartition(r.stream, r.start, r.end) for r in cut]


class _Tails:
    opts: ReadOptions

    def fetch_tails(self, timestamp: int | None = None) -> list[PartitionTail]:
        """The partitions' tails now (a method, so a subclass can get them another way)."""
        return fetch_tails(self.opts, timestamp)


class BatchReader(_Tails, DataSourceReader):
    """spark.read: the ranges are fixed here, on the driver, from the tails at planning time."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        tails = self.fetch_tails()
        order = [t.stream for t in tails]
        if opts.starting_timestamp is not None:
            start = planning.at_timestamp(self.fetch_tails(opts.starting_timestamp))
        else:
            start = planning.resolve("startingOffsets", opts.starting or "earliest", tails)
        if opts.ending_timestamp is not None:
            end = planning.at_timestamp(self.fetch_tails(opts.ending_timestamp))
        else:
            end = planning.resolve("endingOffsets", opts.ending, tails, default=planning.LATEST)
            planning.check_end("endingOffsets", end, tails)
        start = planning.check_start(start, tails, opts.fail_on_data_loss)
        if not opts.fail_on_data_loss:
            end = {s: max(e, start[s]) for s, e in end.items()}
        self.ranges = planning.ranges(start, end, order)

    def partitions(self) -> list[RangePartition]:
        return _plan_partitions(self.opts, self.ranges)

    def read(self, partition: RangePartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return read_range(self.opts, partition.stream, partition.start, partition.end)


class StreamReader(_Tails, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """readStream: offsets {stream: next offset to read}; Spark checkpoints them."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self.tails = self.fetch_tails()  # fails now, on the driver, if anything is wrong
        self.target: dict[str, int] | None = None  # Trigger.AvailableNow's end

    def initialOffset(self) -> dict:
        opts = self.opts
        if opts.starting_timestamp is not None:
            return planning.at_timestamp(self.fetch_tails(opts.starting_timestamp))
        start = planning.resolve("startingOffsets", opts.starting or "latest", self.tails)
        return planning.check_start(start, self.tails, opts.fail_on_data_loss)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_per_trigger:
            return ReadMaxRows(self.opts.max_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {t.stream: t.next for t in self.fetch_tails()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        tails = self.fetch_tails()
        self.tails = tails
        available = {t.stream: t.next for t in tails}
        if self.target is not None:
            available = {s: min(n, self.target.get(s, n)) for s, n in available.items()}
        # a partition below its start (never, unless the stream was recreated) stays put
        available = {s: max(n, start.get(s, 0)) for s, n in available.items()}
        if isinstance(limit, ReadMaxRows):
            return planning.limit(start, available, limit.max_rows)
        return available

    def reportLatestOffset(self) -> dict | None:
        return {t.stream: t.next for t in self.tails} if self.tails else None

    def partitions(self, start: dict, end: dict) -> list[RangePartition]:
        tails = self.fetch_tails()
        order = [t.stream for t in tails]
        # a partition the checkpoint does not know starts at its beginning, as in Kafka
        start = {s: start.get(s, t.first) for s, t in ((t.stream, t) for t in tails)}
        start = planning.check_start(start, tails, self.opts.fail_on_data_loss)
        end = {s: max(e, start.get(s, e)) for s, e in end.items()}
        return _plan_partitions(self.opts, planning.ranges(start, end, order))

    def read(self, partition: RangePartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return read_range(self.opts, partition.stream, partition.start, partition.end)

    def commit(self, end: dict) -> None:
        """Nothing to do: a stream keeps its messages; progress lives in the checkpoint."""
