"""A node's data dir as the replication sees it: which files to compare, the plan
that makes a follower's copy equal the leader's, and the follower's writer.

Files are compared by size and CRC32. A follower's file that is a prefix of the
leader's (an append-only segment it holds the start of) gets only the rest; any
other difference gets the whole file. The SQLite definitions are not compared as
files (their pages differ from node to node): the follower always gets a fresh
image of the database, which is small.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import sqlite3
import zlib
from dataclasses import dataclass

from leveret.cluster import wire

log = logging.getLogger("leveret.cluster")

DEFINITIONS = "definitions.db"
SYNCING_MARK = "cluster-syncing"  # present while a snapshot is half applied
NODE_STATE = "cluster-node.json"  # cluster/nodestate.py: each node's own, never replicated
# A node of workers' supervisor status (workers/serve.py): each node's own, rewritten
# outside the store at every change of its workers.
WORKERS_STATUS = "workers-status.json"
_SKIP_NAMES = {
    DEFINITIONS,
    DEFINITIONS + "-wal",
    DEFINITIONS + "-shm",
    SYNCING_MARK,
    NODE_STATE,
    WORKERS_STATUS,
}
CHUNK = 1 << 20
# A test hook for disk errors other than a full disk (tests/partitions): while this
# variable names a file that exists, the follower's writer fails each write, replace
# and fsync with EIO, as a failing disk would. Unset (always, outside tests), the
# writer is the plain one: the check is installed only when the variable is set.
EIO_FILE_ENV = "LEVERET_TEST_EIO_FILE"

Manifest = dict[str, tuple[int, int]]  # path → (size, crc32)


def skipped(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return name in _SKIP_NAMES or name.endswith((".sock", ".tmp", ".lock"))


def walk(root: str) -> list[str]:
    out = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            if not skipped(rel):
                out.append(rel)
    return sorted(out)


def manifest(root: str) -> Manifest:
    result: Manifest = {}
    for rel in walk(root):
        try:
            with open(os.path.join(root, rel), "rb") as f:
                crc = 0
                size = 0
                while chunk := f.read(CHUNK):
                    crc = zlib.crc32(chunk, crc)
                    size += len(chunk)
        except FileNotFoundError:
            continue
        result[rel] = (size, crc)
    return result


@dataclass
class Transfer:
    path: str
    start: int  # send from here; 0 with fresh: the follower truncates first
    fresh: bool


def plan(root: str, theirs: Manifest) -> tuple[list[Transfer], list[str], int]:
    """What to send and delete so the follower matches `root`; and the bytes to send."""
    sends: list[Transfer] = []
    total = 0
    mine = walk(root)
    for rel in mine:
        path = os.path.join(root, rel)
        have = theirs.get(rel)
        try:
            size = os.path.getsize(path)
            if have is not None and have[0] <= size:
                crc = _crc_prefix(path, have[0])
                if crc == have[1]:
                    if have[0] < size:
                        sends.append(Transfer(rel, have[0], False))
                        total += size - have[0]
                    continue
        except FileNotFoundError:
            continue
        sends.append(Transfer(rel, 0, True))
        total += size
    present = set(mine)
    deletes = [rel for rel in theirs if rel not in present]
    return sends, deletes, total


def _crc_prefix(path: str, n: int) -> int:
    crc = 0
    with open(path, "rb") as f:
        left = n
        while left > 0:
            chunk = f.read(min(CHUNK, left))
            if not chunk:
                return -1
            crc = zlib.crc32(chunk, crc)
            left -= len(chunk)
    return crc


class Applier:
    """Makes the leader's changes to a follower's data dir; `sync()` makes them durable.

    Used from one thread at a time (the follower's writer thread).
    """

    def __init__(self, root: str, fsync: bool) -> None:
        self.root = root
        self.fsync = fsync
        self._fds: dict[str, int] = {}
        self._dirty: set[str] = set()
        self._dirs: set[str] = set()
        # One connection per database: a node of workers has one per worker's store
        # (`worker-<i>/definitions.db`), a one-process node one.
        self._dbs: dict[str, sqlite3.Connection] = {}
        flag = os.environ.get(EIO_FILE_ENV)
        if flag:
            self._fail_if_flagged(flag)

    def _fail_if_flagged(self, flag: str) -> None:
        """Wrap this writer's disk operations so each fails with EIO while `flag` exists."""
        for name in ("write", "replace", "truncate", "sync"):
            plain = getattr(self, name)

            def checked(*args: object, _plain: object = plain, _name: str = name) -> object:
                if os.path.exists(flag):
                    raise OSError(errno.EIO, f"{os.strerror(errno.EIO)} ({_name}: test fault)")
                return _plain(*args)  # type: ignore[operator]

            setattr(self, name, checked)

    def _full(self, rel: str) -> str:
        return os.path.join(self.root, wire.safe_path(rel))

    def _fd(self, rel: str) -> int:
        fd = self._fds.get(rel)
        if fd is None:
            full = self._full(rel)
            parent = os.path.dirname(full)
            if not os.path.isdir(parent):
                os.makedirs(parent, exist_ok=True)
                self._dirs.add(os.path.dirname(parent))
            existed = os.path.exists(full)
            fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            if not existed:
                self._dirs.add(parent)
            self._fds[rel] = fd
        return fd

    def _close(self, rel: str) -> None:
        fd = self._fds.pop(rel, None)
        self._dirty.discard(rel)
        if fd is not None:
            os.close(fd)

    def write(self, rel: str, offset: int, data: memoryview | bytes, fresh: bool = False) -> None:
        fd = self._fd(rel)
        if fresh:
            os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            n = os.pwrite(fd, view, offset)
            offset += n
            view = view[n:]
        self._dirty.add(rel)

    def replace(self, rel: str, data: memoryview | bytes) -> None:
        self._close(rel)
        full = self._full(rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        tmp = full + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            if self.fsync:
                os.fsync(f.fileno())
        os.replace(tmp, full)
        self._dirs.add(os.path.dirname(full))

    def unlink(self, rel: str) -> None:
        self._close(rel)
        try:
            os.unlink(self._full(rel))
            self._dirs.add(os.path.dirname(self._full(rel)))
        except FileNotFoundError:
            pass

    def truncate(self, rel: str, size: int) -> None:
        os.ftruncate(self._fd(rel), size)
        self._dirty.add(rel)

    def rmtree(self, rel: str) -> None:
        prefix = rel + "/"
        for name in [p for p in self._fds if p.startswith(prefix)]:
            self._close(name)
        full = self._full(rel)
        shutil.rmtree(full, ignore_errors=True)
        self._dirs.add(os.path.dirname(full))

    def sql(self, rel: str, statements: list[str]) -> None:
        db = self.database(rel)
        db.execute("BEGIN IMMEDIATE")
        try:
            for statement in statements:
                db.execute(statement)
        except sqlite3.Error as exc:
            db.execute("ROLLBACK")
            # The leader committed it, so it applies here unless the copies differ:
            # say so loudly; the next sync sends a fresh image.
            log.error("replicated SQL failed (%s): %s", exc, statements[:3])
            raise
        db.execute("COMMIT")

    def database(self, rel: str) -> sqlite3.Connection:
        db = self._dbs.get(rel)
        if db is None:
            db = sqlite3.connect(self._full(rel), isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={'FULL' if self.fsync else 'OFF'}")
            self._dbs[rel] = db
        return db

    def sqlite_image(self, rel: str, image: memoryview | bytes) -> None:
        """Replace the database with the leader's image (closing ours first)."""
        self.close_db(rel)
        full = self._full(rel)
        for suffix in ("-wal", "-shm"):
            try:
                os.unlink(full + suffix)
            except FileNotFoundError:
                pass
        self.replace(rel, image)

    def apply(self, data: memoryview) -> None:
        for kind, rel, number, payload in wire.iter_ops(data):
            if kind == wire.WRITE:
                self.write(rel, number, payload)
            elif kind == wire.REPLACE:
                self.replace(rel, payload)
            elif kind == wire.UNLINK:
                self.unlink(rel)
            elif kind == wire.TRUNCATE:
                self.truncate(rel, number)
            elif kind == wire.RMTREE:
                self.rmtree(rel)
            elif kind == wire.SQL:
                import json

                self.sql(rel, json.loads(bytes(payload)))

    def sync(self) -> None:
        """fsync what changed since the last sync (files, then their directories)."""
        if self.fsync:
            for rel in self._dirty:
                fd = self._fds.get(rel)
                if fd is not None:
                    os.fdatasync(fd)
            for d in self._dirs:
                try:
                    fd = os.open(d, os.O_RDONLY)
                except FileNotFoundError:
                    continue
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        self._dirty.clear()
        self._dirs.clear()
        if len(self._fds) > 64:  # keep the newest few open; segments are append-only
            for rel in list(self._fds)[:-16]:
                self._close(rel)

    def close_db(self, rel: str | None = None) -> None:
        """Close the connection to database `rel` (every database's, by default)."""
        for name in [rel] if rel is not None else list(self._dbs):
            db = self._dbs.pop(name, None)
            if db is not None:
                db.close()

    def close(self) -> None:
        for rel in list(self._fds):
            self._close(rel)
        self.close_db()
