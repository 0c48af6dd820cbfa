"""Durable exchanges, queues and bindings in SQLite (`<data_dir>/definitions.db`).

Definitions change rarely and must survive a crash the moment declare-ok is sent,
so every change is its own transaction with WAL + synchronous=FULL. Arguments are
kept as AMQP-encoded field tables, each value with the wire type it arrived with and
the keys in the client's order (protocol.fieldtable's encode_decoded_table), so every
field type (int widths, decimals, timestamps, nested tables, byte arrays) round-trips
as the client sent it: RabbitMQ names the type of a queue's argument in the text that
refuses a redeclaration without it, and that text must not change with a restart.

Format 1 wrote arguments with pamqp's encoder (the smallest integer type for an
int, keys sorted); opening such a file rewrites every row's arguments in format 2's
encoding of what they decode to (for those rows, the same bytes) and marks the file
2, so an older build refuses it rather than leaving rows it cannot match for delete.
Exclusive and server-named queues are never passed here; that is the caller's call.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from pamqp import decode

from leveret.protocol.fieldtable import encode_decoded_table
from leveret.store import replica
from leveret.store.errors import StoreFormatError

DEFINITIONS_FORMAT_VERSION = 2
#: formats this build opens and rewrites in its own (see the module's docstring)
MIGRATED_FORMATS = frozenset({1})
DEFINITIONS_FILE = "definitions.db"

Arguments = dict[str, Any] | bytes | bytearray | None
EMPTY_TABLE = b"\x00\x00\x00\x00"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS exchanges (
    vhost TEXT NOT NULL, name TEXT NOT NULL, type TEXT NOT NULL,
    durable INTEGER NOT NULL, auto_delete INTEGER NOT NULL, internal INTEGER NOT NULL,
    arguments BLOB NOT NULL, PRIMARY KEY (vhost, name));
CREATE TABLE IF NOT EXISTS queues (
    vhost TEXT NOT NULL, name TEXT NOT NULL,
    durable INTEGER NOT NULL, auto_delete INTEGER NOT NULL,
    arguments BLOB NOT NULL, worker INTEGER, PRIMARY KEY (vhost, name));
CREATE TABLE IF NOT EXISTS bindings (
    vhost TEXT NOT NULL, source TEXT NOT NULL, destination TEXT NOT NULL,
    destination_kind TEXT NOT NULL CHECK (destination_kind IN ('queue', 'exchange')),
    routing_key TEXT NOT NULL, arguments BLOB NOT NULL,
    PRIMARY KEY (vhost, source, destination, destination_kind, routing_key, arguments));
"""


def encode_arguments(arguments: Arguments) -> bytes:
    """AMQP field-table bytes; raw bytes are validated and kept verbatim. A dict decoded
    from the wire (its numbers protocol.fieldtable's typed ints) is written with each
    value's own type and its keys' order; a plain int (the management API's, a
    definitions file's) as a signedint, or a long beyond 32 bits, as amqp_type_name
    names it. A binding's row is found again for delete by these bytes, so the same
    dict always encodes the same."""
    if arguments is None:
        return EMPTY_TABLE
    if isinstance(arguments, (bytes, bytearray)):
        raw = bytes(arguments)
        decode_arguments(raw)  # refuse garbage now rather than at the next startup
        return raw
    return encode_decoded_table(arguments)


def decode_arguments(raw: bytes) -> dict[str, Any]:
    _consumed, table = decode.field_table(raw)
    return table


@dataclass
class ExchangeDef:
    vhost: str
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)
    arguments_raw: bytes = EMPTY_TABLE


@dataclass
class QueueDef:
    vhost: str
    name: str
    durable: bool = True
    auto_delete: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)
    arguments_raw: bytes = EMPTY_TABLE
    #: in a broker of several workers, the worker that owns the queue when it is not
    #: the one whose store this is (None: this one)
    worker: int | None = None


@dataclass
class BindingDef:
    vhost: str
    source: str
    destination: str
    destination_kind: str  # 'queue' | 'exchange'
    routing_key: str
    arguments: dict[str, Any] = field(default_factory=dict)
    arguments_raw: bytes = EMPTY_TABLE


@dataclass
class Definitions:
    exchanges: list[ExchangeDef] = field(default_factory=list)
    queues: list[QueueDef] = field(default_factory=list)
    bindings: list[BindingDef] = field(default_factory=list)


class DefinitionStore:
    """The durable topology. `path` is the .db file, or a data dir to put definitions.db in."""

    def __init__(self, path: str, *, check_same_thread: bool = True) -> None:
        if os.path.isdir(path):
            path = os.path.join(path, DEFINITIONS_FILE)
        else:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=check_same_thread)
        replica.watch_sqlite(self._db, path)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._check_version()
        except BaseException:
            self._db.close()
            raise

    def _check_version(self) -> None:
        db = self._db
        has_meta = db.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'"
        ).fetchone()
        found: int | None = None
        if has_meta:
            row = db.execute("SELECT value FROM meta WHERE key='format_version'").fetchone()
            if row is not None:
                found = int(row[0])
                if found != DEFINITIONS_FORMAT_VERSION and found not in MIGRATED_FORMATS:
                    raise StoreFormatError(
                        f"definitions store {self.path}", found, DEFINITIONS_FORMAT_VERSION
                    )
        with self._tx():
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    db.execute(stmt)
            # A store made before queues had an owning worker gets the column (NULL:
            # this worker's own, which every queue of a one-process broker is).
            columns = {row[1] for row in db.execute("PRAGMA table_info(queues)")}
            if "worker" not in columns:
                db.execute("ALTER TABLE queues ADD COLUMN worker INTEGER")
            if found in MIGRATED_FORMATS:
                self._reencode_arguments()
            db.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('format_version', ?)",
                (str(DEFINITIONS_FORMAT_VERSION),),
            )

    def _reencode_arguments(self) -> None:
        """Every row's arguments in this format's encoding of what they decode to, in
        the caller's transaction. A binding's arguments are part of its key, and its
        delete looks the row up by the encoding of the arguments it was loaded with:
        after this, those are the row's bytes. Rows keep their rowid (load's order);
        two bindings that come to the same key are one (UPDATE OR REPLACE)."""
        db = self._db
        for table in ("exchanges", "queues", "bindings"):
            rows = db.execute(f"SELECT rowid, arguments FROM {table}").fetchall()
            for rowid, raw in rows:
                new = encode_arguments(decode_arguments(bytes(raw)))
                if new != bytes(raw):
                    db.execute(
                        f"UPDATE OR REPLACE {table} SET arguments=? WHERE rowid=?", (new, rowid)
                    )

    def _tx(self) -> _Tx:
        return _Tx(self._db)

    # ---- exchanges -------------------------------------------------------------------

    def save_exchange(
        self,
        vhost: str,
        name: str,
        type: str,
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: Arguments = None,
    ) -> None:
        with self._tx():
            self._db.execute(
                "INSERT OR REPLACE INTO exchanges VALUES (?, ?, ?, ?, ?, ?, ?)",
                (vhost, name, type, durable, auto_delete, internal, encode_arguments(arguments)),
            )

    def delete_exchange(self, vhost: str, name: str) -> None:
        """Removes the exchange and every binding from or to it."""
        with self._tx():
            self._db.execute("DELETE FROM exchanges WHERE vhost=? AND name=?", (vhost, name))
            self._db.execute(
                "DELETE FROM bindings WHERE vhost=? AND (source=? OR "
                "(destination=? AND destination_kind='exchange'))",
                (vhost, name, name),
            )

    # ---- queues ----------------------------------------------------------------------

    def save_queue(
        self,
        vhost: str,
        name: str,
        durable: bool = True,
        auto_delete: bool = False,
        arguments: Arguments = None,
        worker: int | None = None,
    ) -> None:
        """`worker`: the worker that owns it, when another worker of the broker does."""
        with self._tx():
            self._db.execute(
                "INSERT OR REPLACE INTO queues (vhost, name, durable, auto_delete, arguments, "
                "worker) VALUES (?, ?, ?, ?, ?, ?)",
                (vhost, name, durable, auto_delete, encode_arguments(arguments), worker),
            )

    def delete_queue(self, vhost: str, name: str) -> None:
        """Removes the queue and every binding to it."""
        with self._tx():
            self._db.execute("DELETE FROM queues WHERE vhost=? AND name=?", (vhost, name))
            self._db.execute(
                "DELETE FROM bindings WHERE vhost=? AND destination=? AND destination_kind='queue'",
                (vhost, name),
            )

    def set_queue_worker(self, vhost: str, name: str, worker: int | None) -> None:
        """Record another owner for a stored queue (None: this store's own); for
        changing a broker's worker count offline (`workers/reshard.py`)."""
        with self._tx():
            self._db.execute(
                "UPDATE queues SET worker=? WHERE vhost=? AND name=?", (worker, vhost, name)
            )

    # ---- bindings --------------------------------------------------------------------

    def save_binding(
        self,
        vhost: str,
        source: str,
        destination: str,
        destination_kind: str,
        routing_key: str,
        arguments: Arguments = None,
    ) -> None:
        if destination_kind not in ("queue", "exchange"):
            raise ValueError(
                f"destination_kind must be 'queue' or 'exchange', not {destination_kind!r}"
            )
        with self._tx():
            self._db.execute(
                "INSERT OR IGNORE INTO bindings VALUES (?, ?, ?, ?, ?, ?)",
                (
                    vhost,
                    source,
                    destination,
                    destination_kind,
                    routing_key,
                    encode_arguments(arguments),
                ),
            )

    def delete_binding(
        self,
        vhost: str,
        source: str,
        destination: str,
        destination_kind: str,
        routing_key: str,
        arguments: Arguments = None,
    ) -> None:
        with self._tx():
            self._db.execute(
                "DELETE FROM bindings WHERE vhost=? AND source=? AND destination=? "
                "AND destination_kind=? AND routing_key=? AND arguments=?",
                (
                    vhost,
                    source,
                    destination,
                    destination_kind,
                    routing_key,
                    encode_arguments(arguments),
                ),
            )

    # ---- loading ---------------------------------------------------------------------

    def load(self) -> Definitions:
        """Everything saved, in insertion order (so bindings follow their endpoints)."""
        db = self._db
        defs = Definitions()
        for vhost, name, typ, durable, auto_delete, internal, args in db.execute(
            "SELECT vhost, name, type, durable, auto_delete, internal, arguments "
            "FROM exchanges ORDER BY rowid"
        ):
            defs.exchanges.append(
                ExchangeDef(
                    vhost,
                    name,
                    typ,
                    bool(durable),
                    bool(auto_delete),
                    bool(internal),
                    decode_arguments(args),
                    bytes(args),
                )
            )
        for vhost, name, durable, auto_delete, args, worker in db.execute(
            "SELECT vhost, name, durable, auto_delete, arguments, worker FROM queues ORDER BY rowid"
        ):
            defs.queues.append(
                QueueDef(
                    vhost,
                    name,
                    bool(durable),
                    bool(auto_delete),
                    decode_arguments(args),
                    bytes(args),
                    worker,
                )
            )
        for vhost, source, dest, kind, rk, args in db.execute(
            "SELECT vhost, source, destination, destination_kind, routing_key, arguments "
            "FROM bindings ORDER BY rowid"
        ):
            defs.bindings.append(
                BindingDef(vhost, source, dest, kind, rk, decode_arguments(args), bytes(args))
            )
        return defs

    @property
    def db(self) -> sqlite3.Connection:
        """The connection, for other stores that keep their tables in this file."""
        return self._db

    def delete_vhost(self, vhost: str) -> None:
        """Every exchange, queue and binding of a vhost."""
        with self._tx():
            for table in ("exchanges", "queues", "bindings"):
                self._db.execute(f"DELETE FROM {table} WHERE vhost=?", (vhost,))

    def close(self) -> None:
        self._db.close()


class _Tx:
    """BEGIN IMMEDIATE ... COMMIT/ROLLBACK around one change (autocommit connection)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._db.execute("COMMIT" if exc_type is None else "ROLLBACK")
