"""Persistent message store: queue messages as records in a SegmentLog.

Record types (payloads, little-endian, after the segment record prefix):

    PUBLISH   u32 queue id, u64 message id, u32 header length, header bytes, body bytes
    ACK       u32 queue id, u64 message id, u64 segment that held the PUBLISH
    DELIVERED u32 queue id, u64 message id, u64 segment that held the PUBLISH

Message ids are assigned here, unique across the store and increasing, so sorting by id
gives publish order even after compaction moved records around. ACK/DELIVERED name the
segment of their PUBLISH so we know which segments they pin: a segment holding ACKs
may only go once the segment whose PUBLISHes they cancel is gone (otherwise a crash
would resurrect acked messages). Queue ids live in a small side file, `queues.idx`,
fsynced on change; purging a queue gives it a fresh id, which cancels every old record
at once without writing a tombstone per message.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import zlib
from collections.abc import Iterator
from operator import attrgetter

from leveret.store.committer import GroupCommitter, OnDurable
from leveret.store.errors import StoreError, StoreFormatError
from leveret.store.segments import (
    DEFAULT_SEGMENT_SIZE,
    HEADER_SIZE,
    PREFIX_SIZE,
    RECORD_PREFIX,
    ScanResult,
    SegmentLog,
    iter_records,
)

log = logging.getLogger("leveret.store")

QueueKey = tuple[str, str]  # (vhost, queue name)

PUBLISH = 1
ACK = 2
DELIVERED = 3

# Recent segments are not compacted: with consumers keeping up, their stragglers are
# acked moments later and the whole file is simply deleted, with nothing copied.
COMPACT_GRACE = 2

READ_SPAN = 4 * 1024 * 1024  # most bytes read_run reads at once

FLAG_TRANSIENT = 0x01  # written only to page a body out of RAM; recovery ignores it

_PUB_FIXED = struct.Struct("<BBIQI")  # type, flags, queue id, message id, header length
_PUB_HEAD = PREFIX_SIZE + _PUB_FIXED.size
_PUB_IDS = struct.Struct("<IQ")  # queue id, message id (at record offset + 10)
_REF_BODY = struct.Struct("<BBIQQ")  # type, flags, queue id, message id, target segment
_REF_IDS = struct.Struct("<IQQ")
_REF_SIZE = PREFIX_SIZE + _REF_BODY.size
_IDS_AT = PREFIX_SIZE + 2


class Location:
    """Where one queued message lives on disk, plus what recovery needs to know about it.

    Mutable on purpose: compaction moves records and updates the same object the
    queue holds, so the queue's reference never goes stale. A long queue keeps one
    of these per paged message, so every slot counts: `transient` is a class
    attribute (TransientLocation), and equal sizes share one int (`_size`).
    """

    __slots__ = ("segment", "offset", "size", "queue_id", "msg_id", "redelivered")

    transient = False  # a record written only to page a body out (TransientLocation)

    def __init__(self, segment: int, offset: int, size: int, queue_id: int, msg_id: int) -> None:
        self.segment = segment
        self.offset = offset
        self.size = size
        self.queue_id = queue_id
        self.msg_id = msg_id
        # True once a DELIVERED record exists: a recovered message goes out redelivered.
        self.redelivered = False

    @property
    def body_estimate(self) -> int:
        """The body's size, over by the routing and properties stored with it; what a
        queue counts for a message it keeps as this location alone."""
        return self.size - _PUB_HEAD

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(seg={self.segment}, off={self.offset}, size={self.size}, "
            f"q={self.queue_id}, id={self.msg_id}, redelivered={self.redelivered})"
        )


class TransientLocation(Location):
    """A body paged out of RAM: not fsynced on its own account, ignored by recovery."""

    __slots__ = ()
    transient = True


_SIZES: dict[int, int] = {}


def _size(n: int) -> int:
    """One int object per distinct record size under 64 KB: a long queue of
    same-sized messages then holds one, not one per Location (28 bytes each)."""
    if n < 65536:
        return _SIZES.setdefault(n, n)
    return n


# ---- queue id side file ------------------------------------------------------------------

_QI_MAGIC = b"LVQI"
_QI_VERSION = 1
_QI_HEADER = struct.Struct("<4sHH")
_QI_ENTRY = struct.Struct("<BBI")  # kind, flags, queue id
_QI_ASSIGN = 1
_QI_DROP = 2
_QI_NEXT = 3


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

    def load(self) -> None:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        if len(data) >= _QI_HEADER.size:
            magic, version, _ = _QI_HEADER.unpack_from(data)
            if magic == _QI_MAGIC and version != _QI_VERSION:
                raise StoreFormatError(f"queue id file {self.path}", version, _QI_VERSION)
        if len(data) < _QI_HEADER.size or data[:4] != _QI_MAGIC:
            if data:
                log.warning("queue id file %s: bad header, starting empty", self.path)
            self._rewrite()
            return
        result = ScanResult()
        for off, end, kind, _flags in iter_records(data, _QI_HEADER.size, result):
            (qid,) = struct.unpack_from("<I", data, off + PREFIX_SIZE + 2)
            self.next_id = (
                max(self.next_id, qid + 1) if kind != _QI_NEXT else max(self.next_id, qid)
            )
            if kind == _QI_ASSIGN:
                (vlen,) = struct.unpack_from("<H", data, off + PREFIX_SIZE + 6)
                p = off + PREFIX_SIZE + 8
                key = (data[p : p + vlen].decode(), data[p + vlen : end].decode())
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
        body = _QI_ENTRY.pack(kind, 0, qid)
        if key is not None:
            vhost = key[0].encode()
            body += struct.pack("<H", len(vhost)) + vhost + key[1].encode()
        return RECORD_PREFIX.pack(len(body), zlib.crc32(body)) + body

    def _rewrite(self) -> None:
        """Write the live map to a temp file and rename it over: crash-atomic compaction."""
        parts = [_QI_HEADER.pack(_QI_MAGIC, _QI_VERSION, 0), self._entry(_QI_NEXT, self.next_id)]
        parts += [self._entry(_QI_ASSIGN, qid, key) for key, qid in self.ids.items()]
        tmp = self.path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, b"".join(parts))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        _fsync_dir(os.path.dirname(self.path))
        self._dead = 0
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)

    def _append(self, data: bytes) -> None:
        os.write(self._fd, data)
        os.fsync(self._fd)

    def assign(self, key: QueueKey, drop: int | None = None) -> int:
        qid = self.next_id
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


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _split_publish(record: memoryview, loc: Location, check: bool) -> tuple[bytes, bytes]:
    """(header bytes, body) of one PUBLISH record; with `check`, its CRC verified first."""
    if check and (
        len(record) != loc.size
        or zlib.crc32(record[PREFIX_SIZE:]) != RECORD_PREFIX.unpack_from(record)[1]
    ):
        raise StoreError(f"stored message {loc!r} is corrupt")
    hlen = _PUB_FIXED.unpack_from(record, PREFIX_SIZE)[4]
    return bytes(record[_PUB_HEAD : _PUB_HEAD + hlen]), bytes(record[_PUB_HEAD + hlen :])


# ---- the store ---------------------------------------------------------------------------


class MessageStore:
    """Durable queue contents for one data dir; call every method from one thread (the loop).

    Only `on_durable` callbacks cross threads, and they are delivered on `loop` (or on
    the writer thread when no loop is given, which is meant for tools and tests).
    """

    def __init__(
        self,
        data_dir: str,
        *,
        segment_size: int = DEFAULT_SEGMENT_SIZE,
        fsync: str = "batch",
        loop: asyncio.AbstractEventLoop | None = None,
        compact_ratio: float = 0.25,
    ) -> None:
        self.directory = os.path.join(data_dir, "msgs")
        self.segment_size = segment_size
        self.fsync = fsync
        self.loop = loop
        self.compact_ratio = compact_ratio
        self.committer: GroupCommitter | None = None
        self._log: SegmentLog | None = None
        self._queues = QueueIds(os.path.join(self.directory, "queues.idx"))
        self._index: dict[int, Location] = {}  # message id -> location of live messages
        self._live: dict[int, int] = {}  # segment -> live PUBLISH bytes
        self._deps: dict[int, set[int]] = {}  # segment -> segments its ACKs/DELIVEREDs refer to
        self._dependents: dict[int, set[int]] = {}  # reverse of _deps
        self._attempts: dict[int, tuple[int, int]] = {}  # fruitless compaction memo
        self._candidates: list[int] = []
        self._reclaiming = False
        self._reclaim_enabled = True
        self._active = 0
        self._next_mid = 1

    # ---- lifecycle -------------------------------------------------------------------

    def open(self) -> dict[QueueKey, list[Location]]:
        """Replay the log; return every queue's live messages in publish order.

        Bodies are not loaded: read them with `read_body(location)` when needed.
        """
        os.makedirs(self.directory, exist_ok=True)
        self._queues.load()
        self.committer = GroupCommitter(self.directory, self.fsync, self.loop)
        lg = self._log = SegmentLog(
            self.directory, self.committer, self.segment_size, on_resync=self._on_resync
        )
        known = self._queues.keys
        index: dict[int, Location] = {}
        deps: dict[int, set[int]] = {}
        next_mid = 1
        pub_ids = _PUB_IDS.unpack_from
        ref_ids = _REF_IDS.unpack_from
        at = _IDS_AT
        for seq, data, records in lg.scan():
            for off, end, rtype, flags in records:
                if rtype == PUBLISH:
                    qid, mid = pub_ids(data, off + at)
                    if mid >= next_mid:
                        next_mid = mid + 1
                    if flags & FLAG_TRANSIENT or qid not in known:
                        continue
                    loc = Location(seq, off, _size(end - off), qid, mid)
                    old = index.get(mid)
                    if old is not None:  # a compaction copy whose original survived a crash
                        loc.redelivered = old.redelivered
                    index[mid] = loc
                else:
                    qid, mid, target = ref_ids(data, off + at)
                    if mid >= next_mid:
                        next_mid = mid + 1
                    if rtype == ACK:
                        index.pop(mid, None)
                    elif rtype == DELIVERED:
                        loc = index.get(mid)
                        if loc is not None:
                            loc.redelivered = True
                    if target != seq:
                        d = deps.get(seq)
                        if d is None:
                            deps[seq] = {target}
                        else:
                            d.add(target)
        self._next_mid = next_mid
        self._index = index
        live = self._live
        for seq in lg.segment_sizes():
            live[seq] = 0
        by_queue: dict[int, list[Location]] = {qid: [] for qid in known}
        for loc in index.values():
            live[loc.segment] += loc.size
            by_queue[loc.queue_id].append(loc)
        for seq, targets in deps.items():
            for t in targets:
                if lg.exists(t):
                    self._add_dep(seq, t)
        self._active = lg.active
        result: dict[QueueKey, list[Location]] = {}
        msg_id = attrgetter("msg_id")
        for qid, locs in by_queue.items():
            locs.sort(key=msg_id)
            result[known[qid]] = locs
        self._candidates.extend(s for s in lg.segment_sizes() if s != lg.active)
        self._reclaim()
        log.info(
            "message store %s: recovered %d messages in %d queues from %d segments",
            self.directory,
            len(index),
            len(result),
            len(lg.segment_sizes()),
        )
        return result

    def flush(self, timeout: float | None = None) -> bool:
        """Block until everything submitted so far is written (and fsynced per mode)."""
        assert self.committer is not None
        if self._log is not None:
            self._log.flush_pending()
        return self.committer.drain(timeout)

    def close(self) -> None:
        """Write out what is pending and stop the writer thread."""
        if self._log is not None:
            self._log.flush_pending()
        if self.committer is not None:
            self.committer.close()
        if self._log is not None:
            self._log.close_readers()
        self._queues.close()

    # ---- queues ----------------------------------------------------------------------

    def queue_id(self, key: QueueKey) -> int:
        """The store's id for a queue, assigning (and fsyncing) one on first use."""
        qid = self._queues.ids.get(key)
        if qid is None:
            qid = self._queues.assign(key)
        return qid

    def delete_queue(self, key: QueueKey) -> int:
        """Forget a queue and all its messages; returns how many were dropped."""
        qid = self._queues.drop(key)
        return 0 if qid is None else self._drop_queue_messages(qid)

    def purge(self, key: QueueKey) -> int:
        """Drop all of a queue's messages (the queue keeps existing under a fresh id)."""
        old = self._queues.ids.get(key)
        if old is None:
            return 0
        self._queues.assign(key, drop=old)
        return self._drop_queue_messages(old)

    def _drop_queue_messages(self, qid: int) -> int:
        doomed = [loc for loc in self._index.values() if loc.queue_id == qid]
        index = self._index
        live = self._live
        touched = set()
        for loc in doomed:
            del index[loc.msg_id]
            live[loc.segment] -= loc.size
            touched.add(loc.segment)
        self._candidates.extend(touched)
        self._reclaim()
        return len(doomed)

    # ---- messages --------------------------------------------------------------------

    def publish(
        self,
        key: QueueKey,
        header: bytes,
        body: bytes,
        on_durable: OnDurable | None = None,
        *,
        transient: bool = False,
    ) -> Location:
        """Append a message to a queue; `on_durable(exc)` fires once it is fsynced.

        `transient=True` writes a body only to page it out of RAM: it is not fsynced
        on its own account and recovery discards it.
        """
        qid = self._queues.ids.get(key)
        if qid is None:
            qid = self._queues.assign(key)
        mid = self._next_mid
        self._next_mid = mid + 1
        hlen = len(header)
        size = _PUB_HEAD + hlen + len(body)
        fixed = _PUB_FIXED.pack(PUBLISH, FLAG_TRANSIENT if transient else 0, qid, mid, hlen)
        crc = zlib.crc32(body, zlib.crc32(header, zlib.crc32(fixed)))
        lg = self._log
        assert lg is not None
        seq, off = lg.append(
            (RECORD_PREFIX.pack(size - PREFIX_SIZE, crc), fixed, header, body), size, on_durable
        )
        loc = (TransientLocation if transient else Location)(seq, off, _size(size), qid, mid)
        self._index[mid] = loc
        if seq != self._active:
            self._rolled(seq)
        self._live[seq] = self._live.get(seq, 0) + size
        return loc

    def mark_delivered(self, loc: Location) -> None:
        """Record the first delivery so a restart re-sends the message as redelivered."""
        if loc.redelivered or loc.transient or loc.msg_id not in self._index:
            loc.redelivered = True
            return
        loc.redelivered = True
        self._append_ref(DELIVERED, loc)

    def ack(self, loc: Location) -> None:
        """Remove a message (acked, rejected, expired, ...); unknown locations are ignored."""
        if self._index.pop(loc.msg_id, None) is None:
            return
        seq = loc.segment
        self._live[seq] -= loc.size
        if not loc.transient:
            self._append_ref(ACK, loc)
        if seq != self._active:
            self._candidates.append(seq)
            self._reclaim()

    remove = ack

    def read_body(self, loc: Location) -> tuple[bytes, bytes]:
        """(header bytes, body) of a stored message, CRC-checked."""
        assert self._log is not None
        data = self._log.read(loc.segment, loc.offset, loc.size)
        return _split_publish(memoryview(data), loc, check=True)

    read = read_body

    def read_many(self, locations: list[Location]) -> Iterator[tuple[Location, bytes, bytes]]:
        """(location, header, body) for many messages, reading each segment file once.

        Recovery uses this: one read per segment instead of one per message. The
        records' checksums were verified by the scan in open(), so they are not
        computed a second time here.
        """
        assert self._log is not None
        by_segment: dict[int, list[Location]] = {}
        for loc in locations:
            by_segment.setdefault(loc.segment, []).append(loc)
        for seq in sorted(by_segment):
            data = self._log.read_segment(seq)
            view = memoryview(data)
            for loc in by_segment[seq]:
                record = view[loc.offset : loc.offset + loc.size]
                yield (loc, *_split_publish(record, loc, check=False))

    def read_run(self, locations: list[Location]) -> Iterator[tuple[Location, bytes, bytes]]:
        """(location, header, body) for a paged queue's next batch, in the given order.

        A queue's records sit close together in a segment, so each stretch of up to
        READ_SPAN bytes that holds consecutive locations is read with one pread.
        Checksums are verified: unlike at recovery, nothing has checked these since
        they were written.
        """
        lg = self._log
        assert lg is not None
        n = len(locations)
        i = 0
        while i < n:
            first = locations[i]
            seq = first.segment
            start = first.offset
            end = start + first.size
            j = i + 1
            while j < n:
                loc = locations[j]
                if loc.segment != seq or loc.offset < start:
                    break
                stop = loc.offset + loc.size
                if stop - start > READ_SPAN:
                    break
                if stop > end:
                    end = stop
                j += 1
            view = memoryview(lg.read(seq, start, end - start))
            for loc in locations[i:j]:
                record = view[loc.offset - start : loc.offset - start + loc.size]
                yield (loc, *_split_publish(record, loc, check=True))
            i = j

    def _append_ref(self, rtype: int, loc: Location) -> None:
        target = loc.segment
        body = _REF_BODY.pack(rtype, 0, loc.queue_id, loc.msg_id, target)
        lg = self._log
        assert lg is not None
        seq, _off = lg.append((RECORD_PREFIX.pack(len(body), zlib.crc32(body)), body), _REF_SIZE)
        if seq != self._active:
            self._rolled(seq)
        if seq != target:
            self._add_dep(seq, target)

    # ---- reclaiming disk -------------------------------------------------------------

    def _rolled(self, seq: int) -> None:
        prev = self._active
        self._active = seq
        self._live.setdefault(seq, 0)
        # The segment that just left the grace window may now be worth compacting.
        aged = seq - COMPACT_GRACE - 1
        if aged > 0 and aged != prev:
            self._candidates.append(aged)
        if prev:
            self._candidates.append(prev)
            self._reclaim()

    def _add_dep(self, seq: int, target: int) -> None:
        d = self._deps.get(seq)
        if d is None:
            self._deps[seq] = {target}
        elif target in d:
            return
        else:
            d.add(target)
        self._dependents.setdefault(target, set()).add(seq)

    def _reclaim(self) -> None:
        """Delete dead segments and compact mostly-dead ones; re-entrancy safe."""
        if self._reclaiming or not self._reclaim_enabled:
            return
        self._reclaiming = True
        try:
            lg = self._log
            assert lg is not None
            while self._candidates:
                seq = self._candidates.pop()
                if seq == lg.active or not lg.exists(seq):
                    continue
                live = self._live.get(seq, 0)
                if live == 0 and seq not in self._deps:
                    self._retire(seq)
                elif seq < lg.active - COMPACT_GRACE and live < self.compact_ratio * lg.size_of(
                    seq
                ):
                    self._compact(seq)
        finally:
            self._reclaiming = False

    def _retire(self, seq: int) -> None:
        assert self._log is not None
        self._log.retire(seq)
        self._live.pop(seq, None)
        self._attempts.pop(seq, None)
        for t in self._deps.pop(seq, ()):
            ds = self._dependents.get(t)
            if ds is not None:
                ds.discard(seq)
                if not ds:
                    del self._dependents[t]
        for s in self._dependents.pop(seq, ()):
            d = self._deps.get(s)
            if d is not None:
                d.discard(seq)
                if not d:
                    del self._deps[s]
                    self._candidates.append(s)

    def _compact(self, seq: int) -> None:
        """Copy what still matters out of `seq` into the active segment, then delete it.

        Live PUBLISHes move (their Location is updated in place); ACK/DELIVERED records
        whose target segment still exists move too. Gives up if that would copy more
        than compact_ratio of the segment, and does not retry until something changed.
        """
        lg = self._log
        assert lg is not None
        size = lg.size_of(seq)
        memo = (self._live.get(seq, 0), len(self._deps.get(seq, ())))
        if self._attempts.get(seq) == memo:
            return
        data = lg.read_segment(seq)
        budget = self.compact_ratio * size
        index = self._index
        exists = lg.exists
        moves: list[tuple[int, int, int, Location | int]] = []
        total = 0
        result = ScanResult()
        for off, end, rtype, _flags in iter_records(data, HEADER_SIZE, result):
            if rtype == PUBLISH:
                _qid, mid = _PUB_IDS.unpack_from(data, off + _IDS_AT)
                loc = index.get(mid)
                if loc is None or loc.segment != seq or loc.offset != off:
                    continue
                moves.append((PUBLISH, off, end, loc))
            else:
                _qid, mid, target = _REF_IDS.unpack_from(data, off + _IDS_AT)
                if target == seq or not exists(target):
                    continue
                if rtype == DELIVERED:
                    loc = index.get(mid)
                    if loc is None or loc.segment != target:
                        continue
                moves.append((rtype, off, end, target))
            total += end - off
            if total > budget:
                self._attempts[seq] = memo
                return
        if result.error is not None:
            log.error(
                "segment %d: %s at %d during compaction; left as is", seq, result.error, result.end
            )
            self._attempts[seq] = memo
            return
        view = memoryview(data)
        live = self._live
        for rtype, off, end, what in moves:
            n = end - off
            new_seq, new_off = lg.append((view[off:end],), n)
            if new_seq != self._active:
                self._rolled(new_seq)
            if rtype == PUBLISH:
                loc = what  # type: ignore[assignment]
                live[seq] -= n
                live[new_seq] = live.get(new_seq, 0) + n
                loc.segment = new_seq
                loc.offset = new_off
                if loc.redelivered:
                    self._append_ref(DELIVERED, loc)
            elif new_seq != what:
                self._add_dep(new_seq, what)  # type: ignore[arg-type]
        self._retire(seq)
        log.debug("compacted segment %d: moved %d records (%d bytes)", seq, len(moves), total)

    def _on_resync(self, failed_from: tuple[int, int] | None) -> None:
        """A write failed: forget messages whose records were never written."""
        assert self.committer is not None
        if failed_from is not None:
            fseq, foff = failed_from
            lost = [
                loc
                for loc in self._index.values()
                if loc.segment > fseq or (loc.segment == fseq and loc.offset >= foff)
            ]
            for loc in lost:
                del self._index[loc.msg_id]
                self._live[loc.segment] = self._live.get(loc.segment, 0) - loc.size
            for s in [s for s in self._live if s > fseq]:
                del self._live[s]
        self._active = 0
        if self.committer.failed_unlinks or self.committer.unlinks_disabled:
            # A deletion that depended on the failed writes did not happen; deleting
            # anything else now could leave acked messages without their ACKs.
            self._reclaim_enabled = False
            log.error("message store: disk reclaim paused until restart after a write failure")

    # ---- introspection ---------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        assert self._log is not None
        sizes = self._log.segment_sizes()
        return {
            "messages": len(self._index),
            "segments": len(sizes),
            "disk_bytes": sum(sizes.values()),
            "live_bytes": sum(self._live.values()),
        }

    def iter_locations(self) -> Iterator[Location]:
        return iter(self._index.values())
