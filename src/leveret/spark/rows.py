"""The row schema of `format("leveret")` reads, and AMQP messages turned into Arrow batches.

Why Arrow: a Python data source that yields pyarrow RecordBatches skips Spark's per-row
conversion, which is the difference between tens and hundreds of thousands of rows a
second per task.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any

import pyarrow as pa

from leveret.client import BasicProperties, Message

PROPERTY_FIELDS: tuple[tuple[str, str], ...] = (
    ("content_type", "string"),
    ("content_encoding", "string"),
    ("delivery_mode", "int"),
    ("priority", "int"),
    ("correlation_id", "string"),
    ("reply_to", "string"),
    ("expiration", "string"),
    ("message_id", "string"),
    ("timestamp", "timestamp"),
    ("type", "string"),
    ("user_id", "string"),
    ("app_id", "string"),
)

_PROPS_DDL = ", ".join(f"{name}: {kind}" for name, kind in PROPERTY_FIELDS)
BASE_DDL = (
    "partition string, offset long, timestamp timestamp, exchange string, "
    f"routing_key string, body binary, properties struct<{_PROPS_DDL}>"
)
HEADERS_DDL = "headers map<string, string>"

OFFSET_HEADER = "x-stream-offset"

_TS = pa.timestamp("us", tz="UTC")
_ARROW_KIND = {"string": pa.string(), "int": pa.int32(), "timestamp": _TS}
PROPERTIES_TYPE = pa.struct([(n, _ARROW_KIND[k]) for n, k in PROPERTY_FIELDS])
HEADERS_TYPE = pa.map_(pa.string(), pa.string())


def schema_ddl(include_headers: bool) -> str:
    return f"{BASE_DDL}, {HEADERS_DDL}" if include_headers else BASE_DDL


def header_text(value: Any) -> str | None:
    """AMQP field values as strings, so headers fit one map<string, string> column."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | Decimal):
        return str(value)
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return json.dumps(value, default=str, sort_keys=True)


def _micros(timestamp: dt.datetime | int) -> int:
    """An AMQP timestamp (whole seconds; leveret.client gives a datetime) in microseconds."""
    if isinstance(timestamp, dt.datetime):
        return int(timestamp.timestamp()) * 1_000_000
    return int(timestamp) * 1_000_000


# The content header of the usual stream delivery: class 60, weight 0, any body size,
# property flags "headers only", and a table holding only x-stream-offset (its 8-byte
# value follows): a message with no properties of its own.
_PLAIN_FLAGS_AND_TABLE = b"\x20\x00\x00\x00\x00\x19\x0fx-stream-offsetl"
_PLAIN_SIZE = 12 + len(_PLAIN_FLAGS_AND_TABLE) + 8


def _decode(header: bytes | None) -> BasicProperties | None:
    """The properties of a content header; None for the usual stream delivery's (none)."""
    if header is None or (
        len(header) == _PLAIN_SIZE and header[12 : _PLAIN_SIZE - 8] == _PLAIN_FLAGS_AND_TABLE
    ):
        return None
    return BasicProperties.decode(header)


class BatchBuilder:
    """Collects deliveries of one stream column by column; `take()` makes a RecordBatch.

    Properties are decoded only at `take()`, and not at all for the usual stream
    delivery (no properties but its offset): their columns are then nulls.
    """

    def __init__(self, stream: str, include_headers: bool) -> None:
        self.stream = stream
        self.include_headers = include_headers
        self._reset()

    def _reset(self) -> None:
        self.offsets: list[int] = []
        self.exchanges: list[str] = []
        self.keys: list[str] = []
        self.bodies: list[bytes] = []
        self.headers: list[bytes | None] = []  # raw content headers

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, offset: int, m: Message) -> None:
        self.offsets.append(offset)
        self.exchanges.append(m.exchange)
        self.keys.append(m.routing_key)
        self.bodies.append(m.body)
        self.headers.append(m.raw_header)

    def take(self) -> pa.RecordBatch:
        n = len(self.offsets)
        props = [_decode(h) for h in self.headers]
        if any(p is not None for p in props):
            timestamps = pa.array(
                [None if p is None or p.timestamp is None else _micros(p.timestamp) for p in props],
                pa.int64(),
            ).cast(_TS)
            columns = []
            for name, kind in PROPERTY_FIELDS:
                if name == "timestamp":
                    columns.append(timestamps)
                else:
                    values = [None if p is None else getattr(p, name) for p in props]
                    columns.append(pa.array(values, _ARROW_KIND[kind]))
        else:
            timestamps = pa.nulls(n, _TS)
            columns = [pa.nulls(n, _ARROW_KIND[kind]) for _name, kind in PROPERTY_FIELDS]
        props_array = pa.StructArray.from_arrays(columns, fields=list(PROPERTIES_TYPE))
        arrays = [
            pa.array([self.stream] * n, pa.string()),
            pa.array(self.offsets, pa.int64()),
            timestamps,
            pa.array(self.exchanges, pa.string()),
            pa.array(self.keys, pa.string()),
            pa.array(self.bodies, pa.binary()),
            props_array,
        ]
        names = [
            "partition",
            "offset",
            "timestamp",
            "exchange",
            "routing_key",
            "body",
            "properties",
        ]
        if self.include_headers:
            headers = [
                []
                if p is None
                else None
                if p.headers is None
                else [(k, header_text(v)) for k, v in p.headers.items() if k != OFFSET_HEADER]
                for p in props
            ]
            arrays.append(pa.array(headers, HEADERS_TYPE))
            names.append("headers")
        self._reset()
        return pa.RecordBatch.from_arrays(arrays, names=names)
