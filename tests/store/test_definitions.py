"""DefinitionStore: SQLite round trips, cascades and the format-version guard."""

from __future__ import annotations

import datetime
import decimal
import sqlite3
import struct
from pathlib import Path

import pytest
from pamqp import encode

from leveret.broker.queue_args import amqp_type_name
from leveret.protocol.fieldtable import (
    Byte,
    Long,
    Short,
    SignedInt,
    UnsignedByte,
    UnsignedInt,
    UnsignedShort,
)
from leveret.store import DefinitionStore, StoreFormatError


def _short_str(s: str) -> bytes:
    raw = s.encode()
    return bytes([len(raw)]) + raw


def _long_str(raw: bytes) -> bytes:
    return struct.pack(">I", len(raw)) + raw


def table_with_every_type() -> bytes:
    """Hand-built so each integer width is exactly what a client might send."""
    fields = [
        ("bool", b"t\x01"),
        ("i8", b"b" + struct.pack(">b", -5)),
        ("u8", b"B" + struct.pack(">B", 250)),
        ("i16", b"s" + struct.pack(">h", -300)),
        ("u16", b"u" + struct.pack(">H", 60000)),
        ("i32", b"I" + struct.pack(">i", -70000)),
        ("u32", b"i" + struct.pack(">I", 4000000000)),
        ("i64", b"l" + struct.pack(">q", -(2**40))),
        ("float", b"f" + struct.pack(">f", 1.5)),
        ("double", b"d" + struct.pack(">d", 2.25)),
        ("decimal", b"D" + struct.pack(">Bi", 2, 12345)),
        ("string", b"S" + _long_str("héllo".encode())),
        ("bytes", b"x" + _long_str(b"\x00\x01\xff")),
        ("array", b"A" + _long_str(b"b\x01S" + _long_str(b"two") + b"V")),
        ("table", b"F" + _long_str(_short_str("inner") + b"I" + struct.pack(">i", 7))),
        ("timestamp", b"T" + struct.pack(">Q", 1700000000)),
        ("void", b"V"),
    ]
    body = b"".join(_short_str(k) + v for k, v in fields)
    return _long_str(body)


def test_round_trip_all_field_types(tmp_path: Path) -> None:
    raw = table_with_every_type()
    store = DefinitionStore(str(tmp_path))
    store.save_exchange("/", "ex", "topic", True, False, True, raw)
    store.save_queue("/", "q", True, False, raw)
    store.save_binding("/", "ex", "q", "queue", "a.#", raw)
    store.close()

    store = DefinitionStore(str(tmp_path / "definitions.db"))
    defs = store.load()
    (ex,) = defs.exchanges
    (q,) = defs.queues
    (b,) = defs.bindings
    assert (ex.vhost, ex.name, ex.type, ex.durable, ex.auto_delete, ex.internal) == (
        "/",
        "ex",
        "topic",
        True,
        False,
        True,
    )
    for item in (ex, q, b):
        assert item.arguments_raw == raw  # byte-exact: widths preserved
        args = item.arguments
        assert args["bool"] is True
        assert (args["i8"], args["u8"], args["i16"], args["u16"]) == (-5, 250, -300, 60000)
        assert (args["i32"], args["u32"], args["i64"]) == (-70000, 4000000000, -(2**40))
        assert args["float"] == 1.5 and args["double"] == 2.25
        assert args["decimal"] == decimal.Decimal("123.45")
        assert args["string"] == "héllo"
        assert bytes(args["bytes"]) == b"\x00\x01\xff"
        assert args["array"] == [1, "two", None]
        assert args["table"] == {"inner": 7}
        assert args["timestamp"] == datetime.datetime.fromtimestamp(
            1700000000, tz=datetime.UTC
        ).replace(tzinfo=args["timestamp"].tzinfo)
        assert args["void"] is None
    assert (b.source, b.destination, b.destination_kind, b.routing_key) == (
        "ex",
        "q",
        "queue",
        "a.#",
    )
    store.close()


def test_dict_arguments_are_encoded(tmp_path: Path) -> None:
    """A plain int (the management API's, a definitions file's) is a signedint, a
    float a double: the types amqp_type_name gives them before a restart."""
    store = DefinitionStore(str(tmp_path))
    args = {"x-message-ttl": 60000, "x-dead-letter-exchange": "dlx", "nested": {"a": [1, 2.5]}}
    store.save_queue("/", "q", arguments=args)
    (queue,) = store.load().queues
    assert queue.arguments == args
    assert queue.arguments_raw == _long_str(
        _short_str("x-message-ttl") + b"I" + struct.pack(">i", 60000)
        + _short_str("x-dead-letter-exchange") + b"S" + _long_str(b"dlx")
        + _short_str("nested") + b"F" + _long_str(
            _short_str("a") + b"A"
            + _long_str(b"I" + struct.pack(">i", 1) + b"d" + struct.pack(">d", 2.5))
        )
    )  # fmt: skip
    assert {k: amqp_type_name(v) for k, v in queue.arguments.items()} == {
        k: amqp_type_name(v) for k, v in args.items()
    }
    store.close()


@pytest.mark.parametrize(
    "kind", [Byte, UnsignedByte, Short, UnsignedShort, SignedInt, UnsignedInt, Long]
)
def test_integer_arguments_keep_their_wire_type(tmp_path: Path, kind: type) -> None:
    """An int decoded from a client's table comes back with the type it was sent as,
    keys in the client's order, for each kind of definition."""
    args = {"x-max-length": kind(10), "x-b": kind(7), "x-a": "s"}
    store = DefinitionStore(str(tmp_path))
    store.save_queue("/", "q", arguments=args)
    store.save_exchange("/", "x", "headers", arguments=args)
    store.save_binding("/", "x", "q", "queue", "", args)
    store.close()
    store = DefinitionStore(str(tmp_path))
    defs = store.load()
    for item in (defs.queues[0], defs.exchanges[0], defs.bindings[0]):
        assert list(item.arguments) == ["x-max-length", "x-b", "x-a"]
        assert [type(v) for v in item.arguments.values()] == [kind, kind, str]
        assert item.arguments == args
    store.delete_binding("/", "x", "q", "queue", "", defs.bindings[0].arguments)
    assert store.load().bindings == []
    store.close()


_FORMAT_1_COLUMNS = {
    "exchanges": ("vhost", "name", "type", "durable", "auto_delete", "internal", "arguments"),
    "queues": ("vhost", "name", "durable", "auto_delete", "arguments"),
    "bindings": (
        "vhost", "source", "destination", "destination_kind", "routing_key", "arguments",
    ),
}  # fmt: skip


def _format_1_store(path: Path, rows: dict[str, list[tuple]]) -> None:
    """A definitions.db as format 1 wrote it: arguments by pamqp's encoder (the
    smallest integer type, keys sorted), the function format 1 used."""
    store = DefinitionStore(str(path))
    store.close()
    db = sqlite3.connect(path / "definitions.db")
    db.execute("UPDATE meta SET value='1' WHERE key='format_version'")
    for table, values in rows.items():
        for row in values:
            *head, args = row
            columns = ", ".join(_FORMAT_1_COLUMNS[table])
            marks = ", ".join("?" * len(row))
            db.execute(
                f"INSERT INTO {table} ({columns}) VALUES ({marks})",
                (*head, encode.field_table(args)),
            )
    db.commit()
    db.close()


def test_a_format_1_store_is_migrated(tmp_path: Path) -> None:
    """Format 1's rows load as they did (the smallest types: what was written), the
    file becomes format 2, and a binding stored in format 1 is found for delete by
    the arguments it loaded with, after the migration and after another restart."""
    old_args = {"x-match": "any", "n": 7, "big": 70000}
    _format_1_store(
        tmp_path,
        {
            "exchanges": [("/", "hx", "headers", 1, 0, 0, {"alternate-exchange": "ae"})],
            "queues": [("/", "q", 1, 0, {"x-max-length": 10})],
            "bindings": [
                ("/", "hx", "q", "queue", "", old_args),
                ("/", "hx", "q", "queue", "k", {"n": 300}),
            ],
        },
    )
    store = DefinitionStore(str(tmp_path))
    defs = store.load()
    assert store.db.execute("SELECT value FROM meta WHERE key='format_version'").fetchone() == (
        "2",
    )
    (queue,) = defs.queues
    assert queue.arguments == {"x-max-length": 10}
    assert type(queue.arguments["x-max-length"]) is Byte  # what format 1 wrote
    assert defs.exchanges[0].arguments == {"alternate-exchange": "ae"}
    first, second = defs.bindings
    assert first.arguments == old_args and second.arguments == {"n": 300}
    assert first.arguments_raw == encode.field_table(old_args)  # the rows' bytes are kept
    store.delete_binding("/", "hx", "q", "queue", "", first.arguments)
    assert [b.routing_key for b in store.load().bindings] == ["k"]
    store.close()
    store = DefinitionStore(str(tmp_path))
    (left,) = store.load().bindings
    store.delete_binding("/", "hx", "q", "queue", "k", left.arguments)
    assert store.load().bindings == []
    store.close()


def test_deletes_cascade_to_bindings(tmp_path: Path) -> None:
    store = DefinitionStore(str(tmp_path))
    store.save_exchange("/", "a", "direct")
    store.save_exchange("/", "b", "fanout")
    store.save_queue("/", "q")
    store.save_binding("/", "a", "q", "queue", "k1")
    store.save_binding("/", "a", "q", "queue", "k1", {"x": 1})  # args are part of identity
    store.save_binding("/", "a", "q", "queue", "k1")  # duplicate: ignored
    store.save_binding("/", "b", "q", "queue", "")
    store.save_binding("/", "a", "b", "exchange", "k2")
    assert len(store.load().bindings) == 4
    store.delete_binding("/", "a", "q", "queue", "k1", {"x": 1})
    assert len(store.load().bindings) == 3
    store.delete_queue("/", "q")
    assert [(b.source, b.destination) for b in store.load().bindings] == [("a", "b")]
    store.delete_exchange("/", "b")
    defs = store.load()
    assert defs.bindings == [] and [e.name for e in defs.exchanges] == ["a"] and defs.queues == []
    store.close()


def test_format_version_mismatch(tmp_path: Path) -> None:
    DefinitionStore(str(tmp_path)).close()
    db = sqlite3.connect(tmp_path / "definitions.db")
    db.execute("UPDATE meta SET value='7' WHERE key='format_version'")
    db.commit()
    db.close()
    with pytest.raises(StoreFormatError, match=r"version 7 .*expects version 2") as info:
        DefinitionStore(str(tmp_path))
    assert info.value.found == 7 and info.value.expected == 2


def test_wal_and_full_sync(tmp_path: Path) -> None:
    store = DefinitionStore(str(tmp_path))
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2
    store.close()


def test_queue_owner_is_kept_and_an_older_store_gains_the_column(tmp_path: Path) -> None:
    """The worker that owns a queue (a broker of several workers) is stored with it; a
    store made before that column existed opens with NULL (this worker's own)."""
    path = tmp_path / "definitions.db"
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('format_version', '1');
        CREATE TABLE queues (
            vhost TEXT NOT NULL, name TEXT NOT NULL,
            durable INTEGER NOT NULL, auto_delete INTEGER NOT NULL,
            arguments BLOB NOT NULL, PRIMARY KEY (vhost, name));
        INSERT INTO queues VALUES ('/', 'old', 1, 0, X'00000000');
        """
    )
    db.close()
    store = DefinitionStore(str(path))
    store.save_queue("/", "theirs", worker=3)
    store.save_queue("/", "mine")
    queues = {q.name: q.worker for q in store.load().queues}
    assert queues == {"old": None, "theirs": 3, "mine": None}


def test_set_queue_worker_changes_the_owner_only(tmp_path: Path) -> None:
    """A re-shard (workers/reshard.py) records each queue's new owner; the rest of the
    definition, and the queue's place in the load order, stay as they were."""
    store = DefinitionStore(str(tmp_path / "definitions.db"))
    store.save_queue("/", "a", arguments={"x-max-priority": 5})
    store.save_queue("/", "b", worker=1)
    store.set_queue_worker("/", "a", 2)
    store.set_queue_worker("/", "b", None)
    store.set_queue_worker("/", "missing", 1)  # no such queue: nothing
    queues = store.load().queues
    assert [(q.name, q.worker, q.arguments) for q in queues] == [
        ("a", 2, {"x-max-priority": 5}),
        ("b", None, {}),
    ]
    store.close()
