"""The broker's catalog on disk: vhosts, users, permissions, limits.

The store does not know what these records mean: it keeps (kind, key) →
JSON record rows in the definitions database, each change its own synchronous
transaction, and hands them all back at start. The model (broker.admin)
decides what a kind is. A meta row says the catalog was written once, so that
only the very first start creates the default user and vhost.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS catalog (
    kind TEXT NOT NULL, key TEXT NOT NULL, record TEXT NOT NULL, PRIMARY KEY (kind, key))
"""

Records = dict[str, dict[str, dict[str, Any]]]


class CatalogStore:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        db.execute(_SCHEMA)

    def load(self) -> Records | None:
        """Every record by kind and key; None before the catalog was first written."""
        row = self._db.execute("SELECT value FROM meta WHERE key='catalog'").fetchone()
        if row is None:
            return None
        records: Records = {}
        for kind, key, record in self._db.execute("SELECT kind, key, record FROM catalog"):
            records.setdefault(kind, {})[key] = json.loads(record)
        return records

    def initialize(self) -> None:
        self._db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('catalog', '1')")

    def put(self, kind: str, key: str, record: dict[str, Any]) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO catalog VALUES (?, ?, ?)",
            (kind, key, json.dumps(record, sort_keys=True)),
        )

    def delete(self, kind: str, key: str) -> None:
        self._db.execute("DELETE FROM catalog WHERE kind=? AND key=?", (kind, key))
