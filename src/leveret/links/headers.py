"""The headers shovels and federation links write, on the raw content header.

A forwarded message keeps the bytes of every property and header it came
with (protocol.properties.rewrite_header, protocol.fieldtable): only what a
link adds is encoded here, with the field types RabbitMQ uses, so a consumer
sees the same table whichever broker moved the message.

- `x-shovelled`: an array of tables, newest first, each describing one shovel
  (shovelled-by, shovel-type, shovel-name, shovel-vhost, src-uri, dest-uri,
  then src-queue or src-exchange/src-exchange-key, then the destination keys).
- `x-shovelled-timestamp`: seconds since the epoch, a signed 64-bit integer.
- `x-received-from`: federation's array of tables (uri, exchange or queue,
  redelivered, cluster-name, vhost), newest first; its length is the number
  of hops, which max-hops bounds.
"""

from __future__ import annotations

import struct
import time
from typing import Any

from leveret.protocol import fieldtable as ft
from leveret.protocol import properties as pp

SHOVELLED = "x-shovelled"
SHOVELLED_TIMESTAMP = "x-shovelled-timestamp"
RECEIVED_FROM = "x-received-from"

# dest-publish-properties name → (flag, kind) on the wire
PROPERTY_FLAGS: dict[str, tuple[int, str]] = {
    "content_type": (pp.FLAG_CONTENT_TYPE, "short"),
    "content_encoding": (pp.FLAG_CONTENT_ENCODING, "short"),
    "delivery_mode": (pp.FLAG_DELIVERY_MODE, "octet"),
    "priority": (pp.FLAG_PRIORITY, "octet"),
    "correlation_id": (pp.FLAG_CORRELATION_ID, "short"),
    "reply_to": (pp.FLAG_REPLY_TO, "short"),
    "expiration": (pp.FLAG_EXPIRATION, "short"),
    "message_id": (pp.FLAG_MESSAGE_ID, "short"),
    "timestamp": (pp.FLAG_TIMESTAMP, "timestamp"),
    "type": (pp.FLAG_TYPE, "short"),
    "user_id": (pp.FLAG_USER_ID, "short"),
    "app_id": (pp.FLAG_APP_ID, "short"),
    "cluster_id": (pp.FLAG_CLUSTER_ID, "short"),
}
EMPTY_HEADER = struct.pack(">HHQH", 60, 0, 0, 0)


def longstr_table(entries: list[tuple[str, Any]]) -> bytes:
    """An 'F' value whose entries are typed as RabbitMQ types them (strings: longstr)."""
    return b"F" + ft.join_table({k: _typed(v) for k, v in entries})


def _typed(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value  # already typed
    return ft.encode_value(value)


def headers_of(header: bytes) -> dict[str, bytes]:
    """The headers table as key → raw typed value ({} when there is none)."""
    raw = pp.split_properties(header).get(pp.FLAG_HEADERS)
    return ft.split_table(raw) if raw else {}


def prepend(table: dict[str, bytes], name: str, entry: bytes) -> None:
    """RabbitMQ's prepend_table_header: `entry` first in the array `name`; a value of
    another type is replaced, and kept in x-invalid-headers (an array, newest first)."""
    old = table.get(name)
    if old is not None and old[:1] == b"A":
        elements = ft.split_array(old)
    else:
        elements = []
        if old is not None:
            invalid = table.get("x-invalid-headers")
            bad = ft.split_table(invalid, 1) if invalid and invalid[:1] == b"F" else {}
            prior = bad.get(name)
            earlier = ft.split_array(prior) if prior is not None and prior[:1] == b"A" else []
            bad[name] = ft.join_array([old, *earlier])
            table["x-invalid-headers"] = b"F" + ft.join_table(sort(bad))
    table[name] = ft.join_array([entry, *elements])


def rewrite(
    header: bytes | None,
    table_changes: Any = None,
    properties: dict[str, Any] | None = None,
    drop_user_id: bool = False,
) -> bytes:
    """A new content header payload: `table_changes(table)` edits the headers table
    in place; `properties` replace properties (dest-publish-properties)."""
    header = header or EMPTY_HEADER
    changes: dict[int, Any] = {}
    if table_changes is not None:
        table = headers_of(header)
        table_changes(table)
        changes[pp.FLAG_HEADERS] = ft.join_table(sort(table))
    for name, value in (properties or {}).items():
        flag, kind = PROPERTY_FLAGS[name]
        if kind == "short":
            changes[flag] = pp.short_string(str(value))
        elif kind == "octet":
            changes[flag] = bytes((int(value) & 0xFF,))
        else:
            changes[flag] = struct.pack(">Q", int(value))
    if drop_user_id:
        changes[pp.FLAG_USER_ID] = pp.REMOVE
    return pp.rewrite_header(header, changes)


def sort(table: dict[str, bytes]) -> dict[str, bytes]:
    """RabbitMQ sorts a table by key whenever it sets a value in it (set_table_value)."""
    return dict(sorted(table.items(), key=lambda kv: kv[0].encode()))


def shovelled_entry(entries: list[tuple[str, str]]) -> bytes:
    return longstr_table(entries)


def timestamp_value() -> bytes:
    return b"l" + struct.pack(">q", int(time.time()))


def hops(table: dict[str, bytes]) -> list[dict[str, Any]]:
    """The decoded x-received-from entries (newest first); [] if absent or malformed."""
    raw = table.get(RECEIVED_FROM)
    if raw is None or raw[:1] != b"A":
        return []
    try:
        return [v for v in ft.decode_value(raw) if isinstance(v, dict)]
    except (ValueError, struct.error, IndexError, TypeError):
        return []


def received_from_count(table: dict[str, bytes]) -> int | None:
    """Length of the x-received-from array; None when the header is absent or not an array."""
    raw = table.get(RECEIVED_FROM)
    if raw is None or raw[:1] != b"A":
        return None
    return len(ft.split_array(raw))


def already_seen(entries: list[dict[str, Any]], cluster: str, vhost: str) -> bool:
    return any(
        _text(e.get("cluster-name")) == cluster and _text(e.get("vhost")) == vhost for e in entries
    )


def _text(value: Any) -> Any:
    return value.decode(errors="replace") if isinstance(value, bytes) else value
