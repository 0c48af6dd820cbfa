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

from pamqp import commands
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

from leveret.spark._amqp import Client, PublishFailed
from leveret.spark.options import OptionError, WriteOptions, fail_once
from leveret.spark.rows import _PAMQP_ATTR, PROPERTY_FIELDS, header_text

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


def _properties(
    row: Row, has_props: bool, has_headers: bool, message_id: str
) -> commands.Basic.Properties:
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
            kwargs[_PAMQP_ATTR.get(name, name)] = value
    headers[DEDUP_HEADER] = message_id
    kwargs.setdefault("message_id", message_id)
    return commands.Basic.Properties(headers=headers, **kwargs)


@dataclass
class Published(WriterCommitMessage):
    partition: int
    messages: int


def publish_rows(opts: WriteOptions, prefix: str, rows: Iterator[Row]) -> Published:
    """Publish one task's rows with confirms; the id of row i is prefix:partition:i."""
    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    count = 0
    client = Client(opts.uri, timeout=opts.timeout, label="leveret-spark writer")
    client.connect_patiently(opts.timeout)
    try:
        client.confirm_select()
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
            props = _properties(row, has_props, has_headers, f"{prefix}:{partition}:{count}")
            client.publish(opts.exchange, key, body, props, mandatory=opts.mandatory)
            count += 1
            if client.outstanding() >= MAX_UNCONFIRMED:
                client.flush()
                while client.outstanding() >= MAX_UNCONFIRMED // 2:
                    client.read_one()
                _check(client, opts)
        client.wait_for_confirms(opts.timeout)
        _check(client, opts)
        if opts.debug_fail_once and fail_once(opts.debug_fail_once):
            raise RuntimeError("debugFailOnce: injected failure after publishing")
    finally:
        client.close()
    return Published(partition, count)


def _check(client: Client, opts: WriteOptions) -> None:
    if client.nacked:
        raise PublishFailed(
            f"the broker nacked {len(client.nacked)} message(s) published to {opts.exchange!r}"
        )
    if opts.mandatory and client.returned:
        r = client.returned[0]
        raise PublishFailed(
            f"{len(client.returned)} message(s) came back unroutable: exchange {r.exchange!r}, "
            f"routing key {r.routing_key!r}: {r.reply_code} {r.reply_text}"
        )


def check_target(opts: WriteOptions) -> None:
    """On the driver: the broker answers, the login works and the exchange exists."""
    with Client(opts.uri, timeout=opts.timeout, label="leveret-spark driver").connect() as client:
        if opts.exchange:
            client.call(
                commands.Exchange.Declare(exchange=opts.exchange, passive=True),
                commands.Exchange.DeclareOk,
            )


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
