"""DefinitionStore: SQLite round trips, cascades and the format-version guard."""

from __future__ import annotations

import datetime
import decimal
import sqlite3
import struct
from pathlib import Path

import pytest
from pamqp import encode

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
    store = DefinitionStore(str(tmp_path))
    args = {"x-message-ttl": 60000, "x-dead-letter-exchange": "dlx", "nested": {"a": [1, 2]}}
    store.save_queue("/", "q", arguments=args)
    assert store.load().queues[0].arguments == args
    assert store.load().queues[0].arguments_raw == encode.field_table(args)
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
    with pytest.raises(StoreFormatError, match=r"version 7 .*expects version 1") as info:
        DefinitionStore(str(tmp_path))
    assert info.value.found == 7 and info.value.expected == 1


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
