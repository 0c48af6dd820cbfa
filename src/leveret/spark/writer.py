"""Batch and streaming writers: rows become messages, published with confirms.

Why deterministic ids: Spark replays a failed task, or a whole micro-batch after a crash,
with the same rows in the same partitions. Each message carries an id made of the query
id (or the job's id), the batch id, the partition and the row number, in the
`x-deduplication-header` header, so a deduplicating exchange or queue drops the replay:
exactly once end to end. A task returns only when every message is confirmed, and fails
on a nack, an unroutable message (option mandatory) or a lost connection.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext
from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import (
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestampType,
)

from leveret.client import (
    BasicProperties,
    ClientError,
    MessageNacked,
    MessageReturned,
    NotFound,
    OutgoingMessage,
    PublishTimeout,
)
from leveret.client import PublishFailed as ManyFailed
from leveret.spark._client import (
    AmqpError,
    ConnectionLost,
    PublishFailed,
    TaskLoop,
    close_quietly,
    open_connection,
    where,
)
from leveret.spark.options import OptionError, WriteOptions, fail_once
from leveret.spark.rows import PROPERTY_FIELDS, header_text

DEDUP_HEADER = "x-deduplication-header"
MAX_UNCONFIRMED = 20000
_PROP_TYPES: dict[str, tuple[type[DataType], ...]] = {
    name: (
        (IntegerType, LongType)
        if kind == "int"
        else (TimestampType, LongType)
        if kind == "timestamp"
        else (StringType,)
    )
    for name, kind in PROPERTY_FIELDS
}


def check_schema(schema: StructType, opts: WriteOptions) -> None:
    """The columns a write accepts; anything else is named in the error, on the driver."""
    fields = {f.name: f.dataType for f in schema.fields}
    if "body" not in fields:
        raise OptionError(
            f"writing to format('leveret') needs a 'body' column (binary or string); "
            f"the columns are {list(fields)}"
        )
    if not isinstance(fields["body"], BinaryType | StringType):
        raise OptionError(
            f"column 'body' must be binary or string, not {fields['body'].simpleString()}"
        )
    extra = sorted(set(fields) - {"body", "routing_key", "headers", "properties"})
    if extra:
        raise OptionError(
            f"unexpected column(s) {extra}: a leveret write takes body, routing_key, "
            "headers and properties"
        )
    if "routing_key" in fields and not isinstance(fields["routing_key"], StringType):
        raise OptionError("column 'routing_key' must be a string")
    if "headers" in fields:
        h = fields["headers"]
        if not (isinstance(h, MapType) and isinstance(h.keyType, StringType)):
            raise OptionError("column 'headers' must be a map with string keys")
    if "properties" in fields:
        p = fields["properties"]
        if not isinstance(p, StructType):
            raise OptionError("column 'properties' must be a struct of AMQP properties")
        for f in p.fields:
            if f.name not in _PROP_TYPES:
                raise OptionError(
                    f"unknown AMQP property {f.name!r} in column 'properties'; the properties "
                    f"are {[n for n, _ in PROPERTY_FIELDS]}"
                )
            if f.name == "headers" or not isinstance(f.dataType, _PROP_TYPES[f.name]):
                raise OptionError(
                    f"property {f.name!r} in column 'properties' has type "
                    f"{f.dataType.simpleString()}"
                )
    if "routing_key" not in fields and opts.routing_key is None and opts.exchange == "":
        raise OptionError(
            "writing to the default exchange needs option 'routingKey' or a routing_key column"
        )


def _properties(row: Row, has_props: bool, has_headers: bool, message_id: str) -> BasicProperties:
    headers: dict[str, Any] = {}
    kwargs: dict[str, Any] = {}
    if has_headers and row["headers"]:
        headers = {k: header_text(v) for k, v in row["headers"].items()}
    if has_props and row["properties"] is not None:
        for name, value in row["properties"].asDict().items():
            if value is None:
                continue
            if name == "timestamp":
                if isinstance(value, dt.datetime):
                    value = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
                else:
                    value = dt.datetime.fromtimestamp(int(value), dt.UTC)
            kwargs[name] = value
    headers[DEDUP_HEADER] = message_id
    kwargs.setdefault("message_id", message_id)
    return BasicProperties(headers=headers, **kwargs)


@dataclass
class Published(WriterCommitMessage):
    partition: int
    messages: int


def publish_rows(opts: WriteOptions, prefix: str, rows: Iterator[Row]) -> Published:
    """Publish one task's rows with confirms; the id of row i is prefix:partition:i.

    At most MAX_UNCONFIRMED messages are unconfirmed at a time. A connection lost on
    the way comes back by itself (on the next host of the URI that answers) and the
    unconfirmed messages are published again, with the same ids: a deduplicating
    target drops the copies, so a cluster failover keeps the write exactly once.
    """
    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    with TaskLoop() as tl:
        count = tl.run(_publish(opts, f"{prefix}:{partition}", rows))
    if opts.debug_fail_once and fail_once(opts.debug_fail_once):
        raise RuntimeError("debugFailOnce: injected failure after publishing")
    return Published(partition, count)


def _messages(opts: WriteOptions, prefix: str, rows: Iterator[Row]) -> Iterator[OutgoingMessage]:
    count = 0
    for row in rows:
        if count == 0:
            fields = row.__fields__
            has_rk = "routing_key" in fields
            has_props = "properties" in fields
            has_headers = "headers" in fields
        body = row["body"]
        if body is None:
            body = b""
        elif isinstance(body, str):
            body = body.encode()
        else:
            body = bytes(body)
        key = row["routing_key"] if has_rk else None
        if key is None:
            key = opts.routing_key or ""
        props = _properties(row, has_props, has_headers, f"{prefix}:{count}")
        yield OutgoingMessage(body, key, None, props)
        count += 1


async def _publish(opts: WriteOptions, prefix: str, rows: Iterator[Row]) -> int:
    conn = await open_connection(
        opts.uri, opts.timeout, "leveret-spark writer", patience=opts.timeout
    )
    address = where(conn.params)
    try:
        channel = await conn.channel(confirms=True)
        return await channel.publish_many(
            _messages(opts, prefix, rows),
            exchange=opts.exchange,
            mandatory=opts.mandatory,
            window=MAX_UNCONFIRMED,
            timeout=opts.timeout,
        )
    except ManyFailed as exc:
        raise _failed(exc, opts) from None
    except PublishTimeout as exc:
        raise ConnectionLost(f"publisher confirms from {address}: {exc}") from None
    except ClientError as exc:
        raise ConnectionLost(f"publishing to {address}: {exc}") from None
    finally:
        await close_quietly(conn)


def _failed(exc: ManyFailed, opts: WriteOptions) -> PublishFailed:
    """One PublishFailed for a batch: how many messages came back unroutable or were
    nacked, and where they were going."""
    returned = [e for _, e in exc.failures if isinstance(e, MessageReturned)]
    nacked = [e for _, e in exc.failures if isinstance(e, MessageNacked)]
    if returned:
        r = returned[0]
        return PublishFailed(
            f"{len(returned)} message(s) came back unroutable: exchange "
            f"{r.message.exchange!r}, routing key {r.message.routing_key!r}: "
            f"{r.reply_code} {r.reply_text}"
        )
    if nacked:
        return PublishFailed(
            f"the broker nacked {len(nacked)} message(s) published to {opts.exchange!r}"
        )
    return PublishFailed(f"publishing to {opts.exchange!r} failed: {exc}")


# URIs this driver process has reached. Spark builds a streaming query's writer again
# as the query goes on; once a broker has answered, a later check waits out a restart
# or a cluster failover (up to the timeout) instead of ending the query, while the
# first check still fails fast on a wrong address (as the reader's tails do).
_REACHED: set[str] = set()


def check_target(opts: WriteOptions) -> None:
    """On the driver: the broker answers, the login works and the exchange exists."""
    patience = opts.timeout if opts.uri in _REACHED else 0.0
    with TaskLoop() as tl:
        tl.run(_check_target(opts, patience))
    _REACHED.add(opts.uri)


async def _check_target(opts: WriteOptions, patience: float = 0.0) -> None:
    conn = await open_connection(
        opts.uri, opts.timeout, "leveret-spark driver", patience=patience, recovery=False
    )
    try:
        if opts.exchange:
            channel = await conn.channel(confirms=False)
            try:
                await channel.declare_exchange(opts.exchange, passive=True)
            except NotFound as exc:
                raise AmqpError(
                    f"{where(conn.params)}: exchange {opts.exchange!r} not found: {exc}"
                ) from None
    finally:
        await close_quietly(conn)


class BatchWriter(DataSourceWriter):
    """df.write: one id prefix per job, made here on the driver, so task retries reuse it."""

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts
        self.prefix = f"spark-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[Row]) -> Published:
        return publish_rows(self.opts, self.prefix, iterator)


class StreamWriter(DataSourceStreamWriter):
    """writeStream: ids from the query id (kept in the checkpoint) and the batch id."""

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Row]) -> Published:
        ctx = TaskContext.get()
        query = ctx.getLocalProperty("sql.streaming.queryId") if ctx else None
        batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx else None
        if not query or batch is None:
            raise RuntimeError("the Spark task has no streaming query id or batch id")
        return publish_rows(self.opts, f"{query}:{batch}", iterator)

    def commit(self, messages: list, batchId: int) -> None:
        """Nothing to do: every message of the batch is already confirmed."""

    def abort(self, messages: list, batchId: int) -> None:
        """Nothing to undo: a replay of the batch publishes the same ids again."""
