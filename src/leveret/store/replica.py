"""The store's one hook for replication: every write to the data dir, as it is made.

A cluster leader (`leveret.cluster`) sets `TAP` while it leads; the store and the
few other writers of the data dir (streams, the deduplication journal, the
SQLite definitions) report each change through the functions below, in the order
the broker makes them, and the tap ships them to the followers, which make the
same changes to their own copy. The store knows nothing about clusters: it only
says "these bytes went to this file at this offset", "this file now holds this",
"this file is gone".

Without a cluster `TAP` is None and every call site pays one global load and a
comparison (hot paths test `replica.TAP is not None` themselves).

Paths are absolute; the tap ignores those outside the data dir it serves.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Sequence
from typing import Protocol


class FileTap(Protocol):
    """What a replication leader implements (leveret.cluster.leader.Tap)."""

    position: int

    def write(self, path: str, offset: int, chunks: Sequence[bytes]) -> None: ...

    def replace(self, path: str, data: bytes) -> None: ...

    def unlink(self, path: str) -> None: ...

    def truncate(self, path: str, size: int) -> None: ...

    def remove_tree(self, path: str) -> None: ...

    def sql(self, path: str, statements: list[str]) -> None: ...

    def release(
        self, position: int, calls: list[tuple[Callable[..., None], BaseException | None]]
    ) -> None:
        """Run the group commit's callbacks once the followers hold `position`."""

    def failed(self, path: str, error: BaseException) -> None:
        """A write or fsync under the data dir failed (any thread)."""


class NotLeading(Exception):
    """A change waited for the followers to hold it, and the node stopped leading
    first: it was made here, but is not to be reported as done."""


TAP: FileTap | None = None


def wrote(path: str, offset: int, chunks: Sequence[bytes]) -> None:
    tap = TAP
    if tap is not None:
        tap.write(path, offset, chunks)


def appended(path: str, fd: int, data: bytes) -> None:
    """`data` was just appended through the O_APPEND descriptor `fd`.

    Followers get it as a write at its offset, not as an append, so that applying
    it twice (after a snapshot that already held it) changes nothing.
    """
    tap = TAP
    if tap is not None:
        end = os.lseek(fd, 0, os.SEEK_CUR)
        tap.write(path, end - len(data), (data,))


def replaced(path: str, data: bytes | None = None) -> None:
    """The file now holds `data` (read back when not given)."""
    tap = TAP
    if tap is not None:
        if data is None:
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                tap.unlink(path)
                return
        tap.replace(path, data)


def failed(path: str, error: BaseException) -> None:
    """A write or fsync under the data dir failed: this copy may now differ from what
    the followers were sent (a cluster leader steps down; see leveret.cluster.node)."""
    tap = TAP
    if tap is not None:
        tap.failed(path, error)


def unlinked(path: str) -> None:
    tap = TAP
    if tap is not None:
        tap.unlink(path)


def truncated(path: str, size: int) -> None:
    tap = TAP
    if tap is not None:
        tap.truncate(path, size)


def removed_tree(path: str) -> None:
    tap = TAP
    if tap is not None:
        tap.remove_tree(path)


def watch_sqlite(db: sqlite3.Connection, path: str) -> None:
    """Report every committed write transaction of `db` as its SQL statements.

    SQLite's own file writes (pages, WAL frames) cannot be seen from Python, so the
    definitions are replicated logically: the trace callback gives each statement
    with its bound values written in (text, blobs as x'..', integers exactly; no
    table here holds REALs, which SQLite would print with 15 digits). Reads are
    skipped; a transaction's statements go out at its COMMIT, and not at all if it
    rolls back.
    """
    if TAP is None:
        return
    pending: list[str] = []
    in_tx = False

    def trace(statement: str) -> None:
        nonlocal in_tx
        tap = TAP
        if tap is None:
            return
        head = statement.lstrip()[:8].upper()
        if head.startswith(("SELECT", "PRAGMA")):
            return
        if head.startswith("BEGIN"):
            in_tx = True
            pending.clear()
        elif head.startswith(("COMMIT", "END")):
            in_tx = False
            if pending:
                tap.sql(path, list(pending))
                pending.clear()
        elif head.startswith("ROLLBACK"):
            in_tx = False
            pending.clear()
        elif in_tx:
            pending.append(statement)
        else:
            tap.sql(path, [statement])

    db.set_trace_callback(trace)
