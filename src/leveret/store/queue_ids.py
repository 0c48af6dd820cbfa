"""The queue id side file, `queues.idx`: which small integer names which queue.

Every record in the segment log names its queue by a 4-byte id, not by name;
this file is the one place that maps `(vhost, name)` (and a priority level's or
a delay queue's key) to that id. It is its own piece because it is its own file
with its own format, versions and crash rules (append-only, CRC-framed, fsynced
on every change, rewritten atomically), and because it never looks at messages:
the store only asks it for ids. Purging a queue assigns it a fresh id, which
cancels all its old records at once without a tombstone per message.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib

from leveret.store import replica
from leveret.store.delay_queue import DELAYED
from leveret.store.errors import StoreFormatError
from leveret.store.files import write_atomic
from leveret.store.segments import PREFIX_SIZE, RECORD_PREFIX, ScanResult, iter_records

log = logging.getLogger("leveret.store")

# (vhost, queue name), or (vhost, queue name, level) for one priority level of a
# priority queue: the store keeps each level as a queue of its own, so each comes
# back from recovery in its own order (the model decides what a level means).
# (vhost, exchange, DELAYED) is a delayed exchange's delay queue (store.delay_queue).
QueueKey = tuple[str, str] | tuple[str, str, int] | tuple[str, str, str]

_QI_MAGIC = b"LVQI"
# Version 2 files may hold level keys, version 3 delay queue keys; a file stays at the
# lowest version that holds its keys, so a data dir without priority queues still
# opens in a build that knows only version 1, and one with them is refused there
# rather than misread.
_QI_VERSION = 3
_QI_VERSIONS = (1, 2, 3)
_QI_HEADER = struct.Struct("<4sHH")
_QI_ENTRY = struct.Struct("<BBI")  # kind, flags, queue id
_QI_ASSIGN = 1
_QI_DROP = 2
_QI_NEXT = 3
_QI_LEVEL = 0x01  # flag: an ASSIGN whose key has a priority level (a "<H" before vhost)
_QI_DELAY = 0x02  # flag: an ASSIGN of a delayed exchange's delay queue (store.delay_queue)


def _qi_version(key: QueueKey) -> int:
    """The lowest queue id file version that can hold `key`."""
    if len(key) == 2:
        return 1
    return 3 if key[2] == DELAYED else 2


class QueueIds:
    """(vhost, name) <-> small int, in an append-only, CRC-framed, fsynced file.

    Ids are never reused (a NEXT entry survives rewrites), so records of a deleted
    or purged queue can never be mistaken for a new queue's.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.ids: dict[QueueKey, int] = {}
        self.keys: dict[int, QueueKey] = {}
        self.next_id = 1
        self._fd = -1
        self._dead = 0
        self._version = 1  # of the file on disk

    def load(self) -> None:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        if len(data) >= _QI_HEADER.size:
            magic, version, _ = _QI_HEADER.unpack_from(data)
            if magic == _QI_MAGIC and version not in _QI_VERSIONS:
                raise StoreFormatError(f"queue id file {self.path}", version, _QI_VERSION)
            self._version = version
        if len(data) < _QI_HEADER.size or data[:4] != _QI_MAGIC:
            if data:
                log.warning("queue id file %s: bad header, starting empty", self.path)
            self._rewrite()
            return
        result = ScanResult()
        for off, end, kind, flags in iter_records(data, _QI_HEADER.size, result):
            (qid,) = struct.unpack_from("<I", data, off + PREFIX_SIZE + 2)
            self.next_id = (
                max(self.next_id, qid + 1) if kind != _QI_NEXT else max(self.next_id, qid)
            )
            if kind == _QI_ASSIGN:
                p = off + PREFIX_SIZE + 6
                level = -1
                if flags & _QI_LEVEL:
                    (level,) = struct.unpack_from("<H", data, p)
                    p += 2
                (vlen,) = struct.unpack_from("<H", data, p)
                p += 2
                key: QueueKey = (data[p : p + vlen].decode(), data[p + vlen : end].decode())
                if level >= 0:
                    key = (*key, level)
                elif flags & _QI_DELAY:
                    key = (*key, DELAYED)  # type: ignore[assignment]
                old = self.ids.get(key)
                if old is not None:
                    self.keys.pop(old, None)
                self.ids[key] = qid
                self.keys[qid] = key
            elif kind == _QI_DROP:
                key = self.keys.pop(qid, None)
                if key is not None and self.ids.get(key) == qid:
                    del self.ids[key]
                self._dead += 2
        if result.error is not None:
            log.warning(
                "queue id file %s: %s at offset %d; dropping the tail",
                self.path,
                result.error,
                result.end,
            )
        if result.error is not None or self._dead > 64 + len(self.ids):
            self._rewrite()
        else:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)

    @staticmethod
    def _entry(kind: int, qid: int, key: QueueKey | None = None) -> bytes:
        if key is None:
            body = _QI_ENTRY.pack(kind, 0, qid)
        else:
            vhost = key[0].encode()
            if len(key) == 3 and key[2] == DELAYED:
                body = _QI_ENTRY.pack(kind, _QI_DELAY, qid)
            elif len(key) == 3:
                body = _QI_ENTRY.pack(kind, _QI_LEVEL, qid) + struct.pack("<H", key[2])
            else:
                body = _QI_ENTRY.pack(kind, 0, qid)
            body += struct.pack("<H", len(vhost)) + vhost + key[1].encode()
        return RECORD_PREFIX.pack(len(body), zlib.crc32(body)) + body

    def _rewrite(self) -> None:
        """Write the live map to a temp file and rename it over: crash-atomic compaction."""
        version = max(map(_qi_version, self.ids), default=1)
        parts = [_QI_HEADER.pack(_QI_MAGIC, version, 0), self._entry(_QI_NEXT, self.next_id)]
        parts += [self._entry(_QI_ASSIGN, qid, key) for key, qid in self.ids.items()]
        write_atomic(self.path, b"".join(parts))
        self._version = version
        self._dead = 0
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)

    def _append(self, data: bytes) -> None:
        os.write(self._fd, data)
        os.fsync(self._fd)
        replica.appended(self.path, self._fd, data)

    def assign(self, key: QueueKey, drop: int | None = None) -> int:
        qid = self.next_id
        if _qi_version(key) > self._version:
            # The first key of a newer kind: mark the file's version before it holds one.
            self.next_id = qid + 1
            self.ids[key] = qid
            self.keys[qid] = key
            if drop is not None:
                self.keys.pop(drop, None)
            self._rewrite()
            return qid
        data = self._entry(_QI_ASSIGN, qid, key)
        if drop is not None:
            data = self._entry(_QI_DROP, drop) + data
        self._append(data)
        self.next_id = qid + 1
        if drop is not None:
            self.keys.pop(drop, None)
            self._dead += 2
        self.ids[key] = qid
        self.keys[qid] = key
        return qid

    def keys_of(self, vhost: str, name: str) -> list[QueueKey]:
        """The queue's own key and those of its priority levels, as far as assigned."""
        return [
            key
            for key in self.ids
            if key[0] == vhost and key[1] == name and (len(key) == 2 or key[2] != DELAYED)
        ]

    def drop(self, key: QueueKey) -> int | None:
        qid = self.ids.get(key)
        if qid is None:
            return None
        self._append(self._entry(_QI_DROP, qid))
        del self.ids[key]
        del self.keys[qid]
        self._dead += 2
        if self._dead > 64 + 4 * len(self.ids):
            self._rewrite()
        return qid

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
