"""Batch and streaming readers: the driver plans offset ranges, each task reads one range.

Why this shape (Kafka's): the only state is offsets, which Spark keeps in its checkpoint.
A task consumes exactly [start, end) of one stream over its own connection, acking only
to give the broker credit back, so a replayed task reads the very same messages again.
"""

from __future__ import annotations

import asyncio
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

from leveret.client import Connection, Consumer, Message, NotFound
from leveret.spark import planning
from leveret.spark._client import ConnectionLost, TaskLoop, close_quietly, open_connection, where
from leveret.spark._tail import PartitionTail, StreamNotFound, stream_offsets
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


def fetch_tails(
    opts: ReadOptions, timestamp: int | None = None, patience: float = 0.0
) -> list[PartitionTail]:
    """Tail offsets of the source's partitions; connection problems surface here, on the
    driver. `patience`: how long to keep trying a broker that cannot be reached (0 when
    the query starts, to fail fast on a wrong address; the timeout later, so that a
    restart or a cluster failover between two micro-batches does not end the query)."""
    deadline = time.monotonic() + patience
    while True:
        try:
            with TaskLoop() as tl:
                return tl.run(_fetch_tails(opts, timestamp, patience))
        except ConnectionLost:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


async def _fetch_tails(
    opts: ReadOptions, timestamp: int | None, patience: float
) -> list[PartitionTail]:
    conn = await open_connection(
        opts.uri, opts.timeout, "leveret-spark driver", patience=patience, recovery=False
    )
    try:
        if opts.super_stream:
            return await stream_offsets(
                conn, opts, super_stream=opts.super_stream, timestamp=timestamp
            )
        return await stream_offsets(conn, opts, streams=[opts.stream or ""], timestamp=timestamp)
    finally:
        await close_quietly(conn)


def read_range(opts: ReadOptions, stream: str, start: int, end: int) -> Iterator[pa.RecordBatch]:
    """Consume offsets [start, end) of `stream` and yield them as Arrow batches.

    Offsets below the next expected one (a stream consumer may begin at a chunk boundary)
    are skipped; a first offset above it, or a hole, means retention deleted data. A
    connection lost mid-range comes back by itself (leveret.client's recovery, on the
    next host of the URI that answers) and the consumer resumes after the last offset it
    took, so a broker restart or a cluster failover costs no task retry: every node of a
    cluster holds the same offsets.
    """
    if start >= end:
        return
    with TaskLoop() as tl:
        yield from _consume(tl, opts, stream, start, end)


class _Range:
    """What one task has read of its range; fed by the consumer's callback on the loop."""

    def __init__(self, opts: ReadOptions, stream: str, start: int, end: int) -> None:
        self.opts = opts
        self.stream = stream
        self.expected = start
        self.end = end
        self.rows = BatchBuilder(stream, opts.include_headers)
        self.fail_at = start + max(1, (end - start) // 2) if opts.debug_fail_once else None
        self.ack_every = max(1, opts.prefetch // 2)
        self.unacked = 0
        self.error: Exception | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.progress = time.monotonic()
        # wake the task at this offset even if its batch is not full
        self.wake_at = end if self.fail_at is None else min(end, self.fail_at)

    def ready(self) -> bool:
        """Whether the task has something to do: a full batch, the end, a failure."""
        return (
            self.error is not None
            or self.expected >= self.wake_at
            or len(self.rows) >= ARROW_BATCH_ROWS
        )

    def on_message(self, message: Message) -> None:
        # The hot path: one call per delivery, on the loop.
        self.unacked += 1
        if self.unacked >= self.ack_every:
            message.ack(multiple=True)  # only gives the broker credit back
            self.unacked = 0
        expected = self.expected
        if expected >= self.end or self.error is not None:
            return  # past the range: the task closes the connection soon
        offset = message.offset
        if offset is None:
            self._fail(
                RuntimeError(
                    f"a delivery from stream {self.stream!r} has no {OFFSET_HEADER} header"
                )
            )
            return
        if offset < expected:
            return
        if offset > expected:
            if self.opts.fail_on_data_loss:
                self._fail(
                    DataLoss(
                        f"offsets {expected}..{min(offset, self.end) - 1} of stream "
                        f"{self.stream!r} were deleted by retention before they were read; set "
                        "option 'failOnDataLoss' to false to skip them"
                    )
                )
                return
            if offset >= self.end:
                self.expected = self.end
                self._wake()
                return
        rows = self.rows
        rows.add(offset, message)
        self.expected = offset + 1
        if offset + 1 >= self.wake_at or len(rows.offsets) >= ARROW_BATCH_ROWS:
            self._wake()

    def _fail(self, error: Exception) -> None:
        self.error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, conn: Connection, consumer: Consumer) -> None:
        """Until ready(), the consumer ends, or the broker is silent for `timeout` s.

        A third of the timeout without a delivery drops the connection (recovery opens a
        new one, maybe to another host): a broker that was paused or cut off never says
        that it is gone, and there are no heartbeats while the task is busy elsewhere.
        """
        opts = self.opts
        self.progress = time.monotonic()
        seen = self.expected
        aborted = False
        while not self.ready():
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait((self.waiter,), timeout=0.5)
            finally:
                self.waiter = None
            if consumer.error is not None or conn.is_closed:
                raise ConnectionLost(
                    f"reading stream {self.stream!r} at offset {self.expected}: "
                    f"{consumer.error or 'the connection closed'}"
                )
            now = time.monotonic()
            if self.expected != seen:
                seen, self.progress, aborted = self.expected, now, False
            elif now - self.progress > opts.timeout:
                raise ConnectionLost(
                    f"no message from stream {self.stream!r} (offset {self.expected}) on "
                    f"{where(conn.params)} for {opts.timeout:g} s"
                )
            elif not aborted and now - self.progress > opts.timeout / 3 and conn.is_open:
                aborted = True
                conn.abort()


def _consume(
    tl: TaskLoop, opts: ReadOptions, stream: str, start: int, end: int
) -> Iterator[pa.RecordBatch]:
    state = _Range(opts, stream, start, end)
    conn = tl.run(
        open_connection(opts.uri, opts.timeout, "leveret-spark task", patience=opts.timeout)
    )
    try:
        channel = tl.run(conn.channel(confirms=False))
        consumer = channel.consume(
            stream, prefetch=opts.prefetch, offset=start, on_message=state.on_message
        )
        tl.run(_start(consumer, stream))
        while True:
            tl.run(state.wait(conn, consumer))
            if state.error is not None:
                raise state.error
            if state.fail_at is not None and state.expected >= state.fail_at:
                state.fail_at = None
                state.wake_at = end
                yield state.rows.take()
                if fail_once(opts.debug_fail_once):
                    raise RuntimeError(f"debugFailOnce: injected failure in stream {stream!r}")
            if state.expected >= end:
                break
            if len(state.rows) >= ARROW_BATCH_ROWS:
                yield state.rows.take()
        if len(state.rows):
            yield state.rows.take()
    finally:
        tl.run(close_quietly(conn))


async def _start(consumer: Consumer, stream: str) -> None:
    try:
        await consumer.start()
    except NotFound as exc:
        raise StreamNotFound(f"stream {stream!r} not found: {exc}") from None


def _plan_partitions(opts: ReadOptions, parts: list[OffsetRange]) -> list[RangePartition]:
    cut = planning.split(parts, opts.min_partitions, opts.max_records_per_partition)
    return [RangePartition(r.stream, r.start, r.end) for r in cut]


class _Tails:
    opts: ReadOptions
    _reached = False  # the broker answered once: from now on ride out restarts

    def fetch_tails(self, timestamp: int | None = None) -> list[PartitionTail]:
        """The partitions' tails now (a method, so a subclass can get them another way)."""
        tails = fetch_tails(self.opts, timestamp, self.opts.timeout if self._reached else 0.0)
        self._reached = True
        return tails


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
