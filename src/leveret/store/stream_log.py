"""A stream's append-only log: segment files and a sparse index.

Records are never rewritten.  Each segment file is named by its first offset;
retention deletes whole segments, oldest first.  In RAM a stream keeps one small
index per segment (an entry every INDEX_EVERY records: offset, file position and
timestamp), so its memory does not grow with the number of messages, and a
reader starting at any offset or timestamp seeks straight to its place.

Record layout (big-endian)::

    length u32 | crc32 u32 | offset i64 | timestamp_ms i64 | ek_len u16 | exchange_and_key
    | header_len u32 | header | body

`length` counts everything after the crc; the crc covers the same bytes, so a
torn or corrupt tail (a crash mid-write) is found on open and cut off.

Each segment's sparse index is also kept on disk, in `<first>.idx` beside it: one
24-byte entry (offset, position, timestamp; big-endian i64s) per INDEX_EVERY
records, appended as records are written.  On open a segment's index is read from
there and only the records after its last entry are scanned, so start-up does not
read the stream.  The file is a hint, never trusted blindly: entries must follow
one another, point inside the segment, and the last one must point at a whole
record with its offset, or they are dropped and the segment is scanned from the
last good entry (from the start when none is left).

The store knows nothing of the model's classes: it stores byte strings, and the
stream queue decides what they mean.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import os
import shutil
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from leveret import wallclock
from leveret.store import replica

log = logging.getLogger("leveret.stream")

# sync(fds, done): fsync the descriptors, then call done(error) on the event loop.
SyncSubmitter = Callable[[list[int], Callable[[BaseException | None], None]], None]

INDEX_EVERY = 256  # records between two sparse-index entries
FLUSH_BYTES = 1 << 20  # write the append buffer out early once it holds this much
_HEAD = struct.Struct(">II")  # length, crc32
_META = struct.Struct(">qqH")  # offset, timestamp, exchange_and_key length
_U32 = struct.Struct(">I")
_IDX = struct.Struct(">qqq")  # offset, position, timestamp: one persisted index entry
READ_CHUNK = 1 << 20
SCAN_CHUNK = 4 << 20  # read size when scanning a segment's unindexed tail on open


@dataclass(slots=True)
class Record:
    offset: int
    timestamp: int  # ms since the epoch
    exchange_and_key: bytes
    header: bytes
    body: bytes


@dataclass
class Segment:
    first: int  # offset of its first record
    path: str
    size: int = 0
    count: int = 0
    first_ts: int = 0
    last_ts: int = 0
    # sparse index: parallel lists, one entry every INDEX_EVERY records
    idx_offset: list[int] = field(default_factory=list)
    idx_pos: list[int] = field(default_factory=list)
    idx_ts: list[int] = field(default_factory=list)
    idx_written: int = 0  # entries already in the .idx file

    @property
    def idx_path(self) -> str:
        return self.path[:-4] + ".idx"

    @property
    def next(self) -> int:
        return self.first + self.count

    def note(self, offset: int, pos: int, ts: int) -> None:
        if self.count % INDEX_EVERY == 0:
            self.idx_offset.append(offset)
            self.idx_pos.append(pos)
            self.idx_ts.append(ts)
        if self.count == 0:
            self.first_ts = ts
        self.last_ts = ts
        self.count += 1


def encode_record(
    offset: int, ts: int, exchange_and_key: bytes, header: bytes, body: bytes
) -> bytes:
    rest = b"".join(
        (
            _META.pack(offset, ts, len(exchange_and_key)),
            exchange_and_key,
            _U32.pack(len(header)),
            header,
            body,
        )
    )
    return _HEAD.pack(len(rest), zlib.crc32(rest)) + rest


def _decode_rest(rest: bytes | memoryview) -> Record:
    offset, ts, ek_len = _META.unpack_from(rest)
    pos = _META.size
    ek = bytes(rest[pos : pos + ek_len])
    pos += ek_len
    (h_len,) = _U32.unpack_from(rest, pos)
    pos += 4
    header = bytes(rest[pos : pos + h_len])
    body = bytes(rest[pos + h_len :])
    return Record(offset, ts, ek, header, body)


class StreamLog:
    """One stream's segments.  `fsync` False (the in-memory broker) skips fsyncs."""

    def __init__(
        self,
        directory: str,
        fsync: bool = True,
        max_segment_bytes: int = 500_000_000,
        max_bytes: int | None = None,
        max_age_ms: int | None = None,
        sync: SyncSubmitter | None = None,
    ) -> None:
        self.directory = directory
        # The store's writer thread fsyncs for us when given (one thread and one
        # batch for every stream and the message store); else the loop's executor.
        self._submit_sync = sync
        self._close_after_sync: list[int] = []
        self.fsync = fsync
        self.max_segment_bytes = max_segment_bytes
        self.max_bytes = max_bytes
        self.max_age_ms = max_age_ms
        self.segments: list[Segment] = []
        self._fd = -1
        self._idx_fd = -1
        # Appends are buffered and written with one os.write per loop turn: a
        # write call per record would take nearly half of the broker's time when
        # publishing under confirms.  Offsets, positions and the index count buffered records, so
        # every reader flushes first (`flush` is cheap when nothing is buffered).
        self._buf: list[bytes] = []
        self._buffered = 0
        self._flush_armed = False
        self._write_error: OSError | None = None
        # Segment files rolled away from but maybe not fsynced yet: closed only
        # once a sync that covers them is done.
        self._retired: list[int] = []
        self._pending: list[Callable[[BaseException | None], None]] = []
        self._syncing = False
        self.closed = False
        # Called (on the loop) when `readable_end()` moved on: the queue dispatches.
        self.on_readable: Callable[[], None] | None = None
        os.makedirs(directory, exist_ok=True)
        self._open()
        # Everything below this offset is durable (and, on a cluster leader, held
        # by the followers). A leader's log starts with nothing readable: what it
        # held when it was elected is readable once its followers hold it too.
        self._durable_next = self.next if replica.TAP is None else 0

    # --- open and recover ---------------------------------------------------

    def _open(self) -> None:
        names = os.listdir(self.directory)
        segs = sorted(n for n in names if n.endswith(".seg"))
        for stray in set(n[:-4] for n in names if n.endswith(".idx")) - set(n[:-4] for n in segs):
            os.unlink(os.path.join(self.directory, stray + ".idx"))  # its segment is gone
        expected = None
        for name in segs:
            seg = Segment(int(name[:-4]), os.path.join(self.directory, name))
            if expected is not None and seg.first != expected:
                log.warning("stream %s: gap before segment %s", self.directory, name)
            self._recover(seg)
            self.segments.append(seg)
            expected = seg.next
        if not self.segments:
            self.segments.append(Segment(0, self._seg_path(0)))
            open(self.segments[0].path, "ab").close()
        tail = self.segments[-1]
        self._fd = os.open(tail.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._idx_fd = os.open(tail.idx_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _recover(self, seg: Segment) -> None:
        """Rebuild a segment's index from its .idx file plus a scan of what follows."""
        size = os.path.getsize(seg.path)
        entries = _read_index(seg, size)
        while True:
            if entries:
                offset, pos, first_ts = entries[-1][0], entries[-1][1], entries[0][2]
            else:
                offset, pos, first_ts = seg.first, 0, 0
            seg.idx_offset = [e[0] for e in entries[:-1]]
            seg.idx_pos = [e[1] for e in entries[:-1]]
            seg.idx_ts = [e[2] for e in entries[:-1]]
            seg.count = offset - seg.first
            seg.first_ts = first_ts
            good = self._scan(seg, pos, size)
            if good > pos or not entries or pos == size:
                break
            entries.pop()  # its record is not whole: step back to the one before
        if good < size:
            log.warning(
                "stream segment %s: cut %d bytes of torn or corrupt tail", seg.path, size - good
            )
            with open(seg.path, "r+b") as f:
                f.truncate(good)
        seg.size = good
        try:
            on_disk = os.path.getsize(seg.idx_path)
        except FileNotFoundError:
            on_disk = -1
        if on_disk != len(seg.idx_offset) * _IDX.size or len(entries) < on_disk // _IDX.size:
            _write_index(seg)  # drop bad or torn entries, add those the scan made
        seg.idx_written = len(seg.idx_offset)

    def _scan(self, seg: Segment, pos: int, size: int) -> int:
        """Note every whole record from `pos` on; the position after the last one.

        Reads SCAN_CHUNK at a time, so a segment without its index (an old
        stream, or a lost .idx) never sits in memory whole.
        """
        good = pos
        with open(seg.path, "rb") as f:
            f.seek(pos)
            buf = b""
            at = 0  # where the next record starts in buf; buf[0] is at file position `base`
            base = pos
            while True:
                if len(buf) - at < _HEAD.size + _META.size:
                    more = f.read(SCAN_CHUNK)
                    if not more:
                        break
                    buf, base, at = buf[at:] + more, base + at, 0
                    continue
                length, crc = _HEAD.unpack_from(buf, at)
                end = at + _HEAD.size + length
                if end > len(buf):
                    if base + end > size:
                        break  # torn: the record runs past the end of the file
                    more = f.read(max(SCAN_CHUNK, end - len(buf)))
                    if not more:
                        break
                    buf, base, at = buf[at:] + more, base + at, 0
                    continue
                rest = memoryview(buf)[at + _HEAD.size : end]
                if zlib.crc32(rest) != crc:
                    break
                offset, ts, _ = _META.unpack_from(rest)
                if offset != seg.first + seg.count:
                    break
                seg.note(offset, base + at, ts)
                at = end
                good = base + at
        return good

    def _seg_path(self, first: int) -> str:
        return os.path.join(self.directory, f"{first:020d}.seg")

    # --- offsets --------------------------------------------------------------

    @property
    def first(self) -> int:
        return self.segments[0].first

    @property
    def next(self) -> int:
        return self.segments[-1].next

    @property
    def first_timestamp(self) -> int | None:
        for seg in self.segments:
            if seg.count:
                return seg.first_ts
        return None

    @property
    def last_timestamp(self) -> int | None:
        for seg in reversed(self.segments):
            if seg.count:
                return seg.last_ts
        return None

    @property
    def size(self) -> int:
        return sum(seg.size for seg in self.segments)

    def offset_for_timestamp(self, ts: int) -> int:
        """The first offset whose timestamp is at or after `ts` (next if none)."""
        self.flush()
        for seg in self.segments:
            if seg.count and seg.last_ts >= ts:
                k = max(0, bisect.bisect_left(seg.idx_ts, ts) - 1)
                for rec in self._iter_segment(seg, seg.idx_pos[k], seg.idx_offset[k]):
                    if rec.timestamp >= ts:
                        return rec.offset
        return self.next

    # --- append ---------------------------------------------------------------

    def append(self, ts: int, exchange_and_key: bytes, header: bytes, body: bytes) -> int:
        """Add a record; it reaches the file by the end of this loop turn."""
        seg = self.segments[-1]
        if seg.count and seg.size >= self.max_segment_bytes:
            seg = self._roll()
        offset = seg.next
        data = encode_record(offset, ts, exchange_and_key, header, body)
        self._buf.append(data)
        seg.note(offset, seg.size, ts)
        seg.size += len(data)
        self._buffered += len(data)
        if self._buffered >= FLUSH_BYTES:
            self.flush()
        elif not self._flush_armed:
            self._arm_flush()
        return offset

    def _arm_flush(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # used outside a loop (tools, tests): write at once
            self.flush()
            return
        self._flush_armed = True
        loop.call_soon(self._flush_soon)

    def _flush_soon(self) -> None:
        self._flush_armed = False
        try:
            self.flush()
        except OSError as exc:  # disk full, I/O error: fail the confirms that wait
            log.error("stream %s: write failed: %s", self.directory, exc)
            self._write_error = exc
            replica.failed(self.directory, exc)

    def flush(self) -> None:
        """Write the buffered records to the segment file (not fsynced)."""
        if not self._buf or self.closed:
            return
        data = b"".join(self._buf) if len(self._buf) > 1 else self._buf[0]
        self._buf = []
        self._buffered = 0
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        seg = self.segments[-1]
        if replica.TAP is not None:
            replica.appended(seg.path, self._fd, data)
        if len(seg.idx_offset) > seg.idx_written:  # after the records they point at
            entries = _index_bytes(seg, seg.idx_written)
            os.write(self._idx_fd, entries)
            seg.idx_written = len(seg.idx_offset)
            replica.appended(seg.idx_path, self._idx_fd, entries)

    def _roll(self) -> Segment:
        self.flush()
        if self._pending or self._syncing:
            # A confirm waits on it or a sync in flight holds its fd: the next
            # sync covers it, then closes it.
            self._retired.append(self._fd)
        else:
            os.close(self._fd)
        os.close(self._idx_fd)
        first = self.next
        seg = Segment(first, self._seg_path(first))
        self._fd = os.open(seg.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._idx_fd = os.open(seg.idx_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.segments.append(seg)
        self.apply_retention(int(wallclock.time() * 1000))
        return seg

    def apply_retention(self, now_ms: int | None = None) -> int:
        """Delete whole old segments over the size or age limit; never the active one."""
        removed = 0
        while len(self.segments) > 1:
            oldest = self.segments[0]
            too_big = self.max_bytes is not None and self.size > self.max_bytes
            too_old = (
                self.max_age_ms is not None
                and now_ms is not None
                and oldest.count
                and oldest.last_ts < now_ms - self.max_age_ms
            )
            if not (too_big or too_old):
                break
            self.segments.pop(0)
            for path in (oldest.path, oldest.idx_path):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                replica.unlinked(path)
            removed += 1
        return removed

    def readable_end(self) -> int:
        """The offset below which readers may read (and the tail-offsets `next`).

        On a single node that is every record written (`next`): a record in the
        file survives a crash of the process. On a cluster leader it is what the
        followers hold: a record a failover could take back is never delivered,
        so offsets a consumer has seen stay the same on every node (Kafka's high
        watermark, RabbitMQ's stream commit offset). Asking arms a sync that
        moves it on (and calls `on_readable`).
        """
        if replica.TAP is None or not self.fsync:
            return self.next
        end = self._durable_next
        if end < self.next and not self._pending and not self._syncing and not self.closed:
            self.when_durable(_noop)
        return end

    def when_durable(self, done: Callable[[BaseException | None], None]) -> None:
        """Call `done` once everything appended so far is fsynced (group commit)."""
        if not self.fsync:
            done(None)
            return
        self._pending.append(done)
        if not self._syncing:
            self._syncing = True
            asyncio.get_running_loop().call_soon(self._sync)

    def _sync(self) -> None:
        waiting, self._pending = self._pending, []
        if self.closed:
            for done in waiting:
                done(None)
            return
        try:
            self.flush()
        except OSError as exc:
            self._write_error = exc
            replica.failed(self.directory, exc)
        error, self._write_error = self._write_error, None
        if error is not None:
            for done in waiting:
                done(error)
            self._syncing = False
            return
        fds = [*self._retired, self._fd]
        retired, self._retired = self._retired, []
        upto = self.next  # every record below it is in the file now

        def finished(error: BaseException | None) -> None:
            for fd in retired:
                os.close(fd)
            moved = error is None and upto > self._durable_next
            if moved:
                self._durable_next = upto
            if self.closed:
                for fd in self._close_after_sync:
                    os.close(fd)
                self._close_after_sync = []
            for done in waiting:
                done(error)
            if self._pending:
                self._sync()
            else:
                self._syncing = False
            if moved and self.on_readable is not None and replica.TAP is not None:
                self.on_readable()  # last: a read it makes may arm the next sync

        if self._submit_sync is not None:
            try:
                self._submit_sync(fds, finished)
            except Exception as exc:  # the store is closing: nothing will sync
                finished(exc)
            return
        future = asyncio.get_running_loop().run_in_executor(None, _fsync_all, fds)
        future.add_done_callback(lambda fut: finished(fut.exception()))

    # --- reading --------------------------------------------------------------

    def reader(self, offset: int) -> StreamReader:
        return StreamReader(self, offset)

    def _iter_segment(self, seg: Segment, pos: int, offset: int):
        self.flush()
        with open(seg.path, "rb") as f:
            f.seek(pos)
            data = f.read()
        view = memoryview(data)
        p = 0
        while p + _HEAD.size <= len(view) and offset < seg.next:
            length, _crc = _HEAD.unpack_from(view, p)
            end = p + _HEAD.size + length
            yield _decode_rest(view[p + _HEAD.size : end])
            p = end
            offset += 1

    # --- lifetime -------------------------------------------------------------

    def close(self) -> None:
        if not self.closed:
            self.flush()
            self.closed = True
            if self._syncing:  # a sync in flight may still hold it: closed when it ends
                self._close_after_sync.append(self._fd)
            else:
                os.close(self._fd)
            os.close(self._idx_fd)
            for fd in self._retired:  # those in a sync in flight are not in this list
                os.close(fd)
            self._retired = []

    def destroy(self) -> None:
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)
        replica.removed_tree(self.directory)


def _index_bytes(seg: Segment, start: int) -> bytes:
    return b"".join(
        _IDX.pack(seg.idx_offset[k], seg.idx_pos[k], seg.idx_ts[k])
        for k in range(start, len(seg.idx_offset))
    )


def _read_index(seg: Segment, size: int) -> list[tuple[int, int, int]]:
    """The .idx entries that can be right: in sequence and inside the segment."""
    try:
        with open(seg.idx_path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return []
    entries = []
    last_pos = -1
    for k in range(len(raw) // _IDX.size):
        offset, pos, ts = _IDX.unpack_from(raw, k * _IDX.size)
        if offset != seg.first + k * INDEX_EVERY or pos >= size or pos <= last_pos:
            break
        if k == 0 and pos != 0:
            break
        entries.append((offset, pos, ts))
        last_pos = pos
    return entries


def _write_index(seg: Segment) -> None:
    tmp = seg.idx_path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(_index_bytes(seg, 0))
    os.replace(tmp, seg.idx_path)
    replica.replaced(seg.idx_path)


def _fsync_all(fds: list[int]) -> None:
    for fd in fds:
        os.fsync(fd)


def _noop(error: BaseException | None) -> None:
    return None


class StreamReader:
    """A cursor: reads records in order from `offset`, across segments.

    Holds one open file and a read buffer of at most READ_CHUNK bytes, so a
    consumer reading from `first` does not hold the stream in memory.
    """

    def __init__(self, log: StreamLog, offset: int) -> None:
        self.log = log
        self.offset = max(offset, log.first)
        self._file = None
        self._seg: Segment | None = None
        self._buf = b""
        self._at = 0  # where the next record starts in _buf
        self._pos = 0  # file position of the next record

    def _seek(self) -> bool:
        log = self.log
        firsts = [s.first for s in log.segments]
        if self.offset < log.first:
            self.offset = log.first  # retention removed what we were about to read
        k = bisect.bisect_right(firsts, self.offset) - 1
        seg = log.segments[k]
        if self.offset >= seg.next:
            return False
        j = bisect.bisect_right(seg.idx_offset, self.offset) - 1
        if self._file is not None:
            self._file.close()
        self._file = open(seg.path, "rb")
        self._seg = seg
        self._pos = seg.idx_pos[j]
        self._file.seek(self._pos)
        self._buf = b""
        self._at = 0
        skip = self.offset - seg.idx_offset[j]
        while skip:
            rec = self._next_raw()
            if rec is None:
                return False
            skip -= 1
        return True

    def _next_raw(self) -> Record | None:
        # `_at` walks the read buffer; the buffer is only cut when it is refilled,
        # so a record costs no copy of the rest of the buffer.
        while True:
            buf, at = self._buf, self._at
            if len(buf) - at >= _HEAD.size:
                length, _crc = _HEAD.unpack_from(buf, at)
                end = at + _HEAD.size + length
                if len(buf) >= end:
                    rec = _decode_rest(memoryview(buf)[at + _HEAD.size : end])
                    self._at = end
                    self._pos += end - at
                    return rec
            assert self._file is not None
            more = self._file.read(READ_CHUNK)
            if not more:
                return None
            self._buf = buf[at:] + more
            self._at = 0

    def read(self, n: int) -> list[Record]:
        """Up to `n` records from the cursor; fewer at the end of the log."""
        out: list[Record] = []
        end = self.log.readable_end()
        if self.offset >= end:
            return out
        if self.log._buf:
            self.log.flush()
        seg = self._seg
        if seg is None or seg not in self.log.segments or self.offset < seg.first:
            if not self._seek():
                return out
        while len(out) < n and self.offset < end:
            seg = self._seg
            assert seg is not None
            if self.offset >= seg.next:
                if seg is self.log.segments[-1] or not self._seek():
                    break
                continue
            rec = self._next_raw()
            if rec is None:
                break
            out.append(rec)
            self.offset = rec.offset + 1
        return out

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
