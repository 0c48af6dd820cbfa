"""Append-only segment files: the on-disk log under the message store (and, later, streams).

Layout of one segment file `<dir>/<seq:016d>.seg`::

    header (32 bytes): magic b"LVSG", u16 format version, u16 header size,
                       u64 segment seq, u64 base offset (for streams), u64 created (ms)
    records, back to back, each:
        u32 length   bytes after this 8-byte prefix (type + flags + payload)
        u32 crc32    of those `length` bytes
        u8  type     what the payload means (the log itself does not care)
        u8  flags
        payload

Everything is little-endian. The log knows nothing about queues: it places records,
hands the bytes to a GroupCommitter, and on startup replays intact records, cutting a
torn or corrupt tail. A stream queue can reuse it unchanged with its own record types,
keeping (seq -> first offset) in the header's base offset and retiring whole segments
by size or age (`created_ms`, `segment_sizes()`, `retire()`).
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from leveret import wallclock
from leveret.store.committer import SUMMARY_OP, GroupCommitter, OnDurable, segment_path
from leveret.store.errors import StoreFormatError

log = logging.getLogger("leveret.store")

# Version 2 added the message store's batched ACK/DELIVERED record (REFS), version 3
# its FANOUT record (one body for several queues). This build reads all three; an
# older build refuses a data dir with a newer segment instead of misreading it.
SEGMENT_FORMAT_VERSION = 3
READABLE_FORMAT_VERSIONS = frozenset({1, 2, 3})
SEGMENT_MAGIC = b"LVSG"
DEFAULT_SEGMENT_SIZE = 16 * 1024 * 1024

SEGMENT_HEADER = struct.Struct("<4sHHQQQ")
HEADER_SIZE = SEGMENT_HEADER.size
RECORD_PREFIX = struct.Struct("<II")
PREFIX_SIZE = RECORD_PREFIX.size
# Smallest valid record: prefix + type + flags. A zero-filled tail fails this check.
MIN_RECORD = PREFIX_SIZE + 2


def list_segments(directory: str) -> list[int]:
    """Sequence numbers of the segment files in `directory`, oldest first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    seqs = []
    for name in names:
        if name.endswith(".seg") and name[:-4].isdigit():
            seqs.append(int(name[:-4]))
    seqs.sort()
    return seqs


def encode_header(seq: int, base_offset: int = 0) -> bytes:
    return SEGMENT_HEADER.pack(
        SEGMENT_MAGIC,
        SEGMENT_FORMAT_VERSION,
        HEADER_SIZE,
        seq,
        base_offset,
        int(wallclock.time() * 1000),
    )


class ScanResult:
    """Where a scan stopped and why; `error` is None when the segment ended cleanly."""

    __slots__ = ("end", "error")

    def __init__(self) -> None:
        self.end = HEADER_SIZE
        self.error: str | None = None


def iter_records(
    data: bytes, start: int, result: ScanResult
) -> Iterator[tuple[int, int, int, int]]:
    """Yield (offset, end, type, flags) for each intact record, stopping at the first bad one.

    A record whose length runs past the end of the data (torn write), whose length is
    impossible (zero-filled tail) or whose CRC does not match (bit rot, torn sector)
    ends the scan: nothing after it can be trusted to be framed correctly.
    """
    n = len(data)
    off = start
    unpack = RECORD_PREFIX.unpack_from
    crc32 = zlib.crc32
    view = memoryview(data)
    try:
        while off < n:
            if n - off < MIN_RECORD:
                result.error = "torn record prefix"
                break
            length, crc = unpack(data, off)
            body = off + PREFIX_SIZE
            end = body + length
            if length < 2:
                result.error = f"invalid record length {length}"
                break
            if end > n:
                result.error = f"torn record (length {length} runs past end of file)"
                break
            if crc32(view[body:end]) != crc:
                result.error = "CRC mismatch"
                break
            yield off, end, data[body], data[body + 1]
            off = end
    finally:
        result.end = off
        view.release()


def frame(rtype: int, flags: int, payload: bytes) -> bytes:
    """Frame one record (slow path: the message store packs its hot records inline)."""
    body = bytes((rtype, flags)) + payload
    return RECORD_PREFIX.pack(len(body), zlib.crc32(body)) + body


class SegmentLog:
    """Places records into fixed-size segments and replays them at startup.

    Offsets are reserved in the caller's thread (the event loop), so a record's
    location is known the moment it is appended; the committer thread only writes.
    """

    def __init__(
        self,
        directory: str,
        committer: GroupCommitter,
        segment_size: int = DEFAULT_SEGMENT_SIZE,
        on_resync: Callable[[tuple[int, int] | None], None] | None = None,
    ) -> None:
        if segment_size < HEADER_SIZE + MIN_RECORD:
            raise ValueError(f"segment_size {segment_size} is too small")
        self.directory = directory
        self.committer = committer
        self.segment_size = segment_size
        self.on_resync = on_resync
        self.active = 0  # seq of the segment being appended to; 0 = none yet
        self._tail = 0
        self._gen = committer.generation
        self._sizes: dict[int, int] = {}  # seq -> bytes used (reserved) in that segment
        self._read_fds: dict[int, int] = {}  # seq -> fd open for reading
        self._local_ops: list[tuple[int, int, Sequence[bytes]]] = []
        self._local_cbs: list[OnDurable] = []
        self._flush_scheduled = False
        self.before_flush: Callable[[], None] | None = None
        # Called when the active segment is sealed (the log rolls past it) with its
        # seq, size and header; what it returns is written by the writer thread, as
        # that segment's summary, once the segment is synced (see store.summaries).
        self.on_seal: Callable[[int, int, bytes], Sequence[Any] | None] | None = None
        self.active_header: bytes | None = None  # of the active segment, as written

    # ---- startup ---------------------------------------------------------------------

    def scan(
        self, summarised: Callable[[int], int | None] | None = None
    ) -> Iterator[tuple[int, bytes | None, Iterator[tuple[int, int, int, int]], ScanResult]]:
        """Yield (seq, data, records, result) per segment, oldest first; consume `records`
        fully, after which `result` says where the segment's intact records end.

        `summarised(seq)` is asked first: a size means the caller trusts its summary
        of the segment (of exactly that size), which is then not read: it comes with
        data None and no records. After each segment read, the stop reason is logged;
        the last segment's torn tail is truncated so that new appends start on a
        clean record boundary.
        """
        seqs = list_segments(self.directory)
        version = SEGMENT_FORMAT_VERSION
        header = b""
        for i, seq in enumerate(seqs):
            last = i == len(seqs) - 1
            path = segment_path(self.directory, seq)
            size = summarised(seq) if summarised is not None else None
            if size is not None:
                with open(path, "rb") as f:
                    header = f.read(HEADER_SIZE)
                version = SEGMENT_HEADER.unpack_from(header)[1]
                if version not in READABLE_FORMAT_VERSIONS:
                    raise StoreFormatError(f"segment {path}", version, SEGMENT_FORMAT_VERSION)
                result = ScanResult()
                result.end = self._sizes[seq] = size
                self.committer.mark_written(seq, size)
                yield seq, None, iter(()), result
                continue
            with open(path, "rb") as f:
                data = f.read()
            if len(data) < HEADER_SIZE or data[:4] != SEGMENT_MAGIC:
                log.warning(
                    "segment %s: missing or torn header (%d bytes), ignored", path, len(data)
                )
                if last:
                    # Nothing in it can be read; start it over so appends land cleanly.
                    header = encode_header(seq)
                    with open(path, "wb") as f:
                        f.write(header)
                        f.flush()
                        os.fsync(f.fileno())
                    self._sizes[seq] = HEADER_SIZE
                    self.committer.mark_written(seq, HEADER_SIZE)
                    version = SEGMENT_FORMAT_VERSION
                else:
                    self._sizes[seq] = len(data)
                continue
            header = data[:HEADER_SIZE]
            _magic, version, hsize, _hseq, _base, _created = SEGMENT_HEADER.unpack_from(data)
            if version not in READABLE_FORMAT_VERSIONS:
                raise StoreFormatError(f"segment {path}", version, SEGMENT_FORMAT_VERSION)
            result = ScanResult()
            records = iter_records(data, hsize, result)
            yield seq, data, records, result
            for _ in records:  # in case the consumer stopped early
                pass
            if result.error is not None:
                log.warning(
                    "segment %s: %s at offset %d; skipping %d bytes after it",
                    path,
                    result.error,
                    result.end,
                    len(data) - result.end,
                )
                if last:
                    os.truncate(path, result.end)
                    fd = os.open(path, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
            self._sizes[seq] = result.end
            self.committer.mark_written(seq, result.end)
        if seqs:
            self._take_active(seqs[-1], version, header)

    def peek(self, seq: int) -> tuple[bytes, int] | None:
        """(header bytes, file size) of a segment on disk, or None if it has neither."""
        try:
            with open(segment_path(self.directory, seq), "rb") as f:
                header = f.read(HEADER_SIZE)
                size = os.fstat(f.fileno()).st_size
        except OSError:
            return None
        if len(header) < HEADER_SIZE or header[:4] != SEGMENT_MAGIC:
            return None
        return header, size

    def _take_active(self, seq: int, version: int, header: bytes) -> None:
        """Append to the newest segment, unless an older format wrote it: then the
        next append starts a new one (a segment holds records of its own version)."""
        self.active = seq if version == SEGMENT_FORMAT_VERSION else 0
        self.active_header = header if self.active else None
        self._tail = self._sizes[seq]

    def check_format(self) -> None:
        """Refuse a data dir of another format version before anything listens.

        Reads only each segment's header, so it costs the same whatever is queued;
        the scan (which may run after the broker listens) then meets no such error.
        """
        for seq in list_segments(self.directory):
            path = segment_path(self.directory, seq)
            with open(path, "rb") as f:
                head = f.read(HEADER_SIZE)
            if len(head) == HEADER_SIZE and head[:4] == SEGMENT_MAGIC:
                version = SEGMENT_HEADER.unpack_from(head)[1]
                if version not in READABLE_FORMAT_VERSIONS:
                    raise StoreFormatError(f"segment {path}", version, SEGMENT_FORMAT_VERSION)

    def adopt(self, sizes: dict[int, int], last_crc: int) -> bool:
        """Take the segments' sizes from a clean-shutdown index instead of scanning.

        True only if the files on disk are exactly these segments, with these sizes,
        readable headers, and the newest one's CRC32 is `last_crc` (anything else
        means the index is not about these files, and the caller scans)."""
        seqs = list_segments(self.directory)
        if not seqs or seqs != sorted(sizes):
            return False
        for seq in seqs:
            path = segment_path(self.directory, seq)
            try:
                if os.stat(path).st_size != sizes[seq]:
                    return False
                with open(path, "rb") as f:
                    head = f.read(HEADER_SIZE) if seq != seqs[-1] else f.read()
            except OSError:
                return False
            if len(head) < HEADER_SIZE or head[:4] != SEGMENT_MAGIC:
                return False
            version = SEGMENT_HEADER.unpack_from(head)[1]
            if version not in READABLE_FORMAT_VERSIONS:
                raise StoreFormatError(f"segment {path}", version, SEGMENT_FORMAT_VERSION)
            if seq == seqs[-1] and zlib.crc32(head) != last_crc:
                return False
        for seq in seqs:
            self._sizes[seq] = sizes[seq]
            self.committer.mark_written(seq, sizes[seq])
        self._take_active(seqs[-1], version, head[:HEADER_SIZE])
        return True

    # ---- appending -------------------------------------------------------------------

    def reserve(self, nbytes: int) -> tuple[int, int]:
        """Claim `nbytes` at the tail, rolling to a new segment when this one is full."""
        if self.committer.generation != self._gen:
            self.flush_pending()  # ops of the failed generation are refused, with errors
            if self.committer.generation != self._gen:  # before_flush's appends may have
                self._resync()
        tail = self._tail
        if not self.active or (tail + nbytes > self.segment_size and tail > HEADER_SIZE):
            self._roll()
            tail = self._tail
        self._tail = tail + nbytes
        self._sizes[self.active] = self._tail
        return self.active, tail

    def append(
        self, parts: Sequence[bytes], nbytes: int, on_durable: OnDurable | None = None
    ) -> tuple[int, int]:
        """Append one record (given as chunks totalling `nbytes`); returns (seq, offset)."""
        seq, off = self.reserve(nbytes)
        self._queue_op((seq, off, parts), on_durable)
        return seq, off

    def write_at(
        self, seq: int, off: int, parts: Sequence[bytes], on_durable: OnDurable | None = None
    ) -> None:
        """Queue the record for a place `reserve` gave. Split from `append` for a
        caller that must note the place before anything else is appended: without a
        loop, queueing flushes at once, and a flush may append (and roll)."""
        self._queue_op((seq, off, parts), on_durable)

    # Records are handed to the writer thread once per event-loop turn, not one by
    # one: a lock round-trip and a list entry per record cost the loop (which shares
    # the GIL with the writer) more than the write itself. Order is kept: every path
    # that depends on earlier records being queued (read, retire, drain) flushes first.

    def _queue_op(self, op: tuple[int, int, Sequence[bytes]], on_durable: OnDurable | None) -> None:
        self._local_ops.append(op)
        if on_durable is not None:
            self._local_cbs.append(on_durable)
        if not self._flush_scheduled:
            loop = self.committer.loop
            if loop is None:
                self.flush_pending()
            else:
                self._flush_scheduled = True
                loop.call_soon(self.flush_pending)

    def schedule_flush(self) -> None:
        """Make sure a flush comes at the end of this loop turn (for `before_flush`'s
        sake: the caller buffered records it has not appended yet). Without a loop the
        next append, read or drain flushes."""
        if not self._flush_scheduled:
            loop = self.committer.loop
            if loop is not None:
                self._flush_scheduled = True
                loop.call_soon(self.flush_pending)

    def flush_pending(self) -> None:
        """Hand every record appended since the last flush to the writer thread.

        `before_flush` runs first, so records a caller batches per loop turn land
        before anything that needs every earlier record queued (a read, a retire)."""
        if self.before_flush is not None:
            self._flush_scheduled = True  # its appends join this flush
            self.before_flush()
        self._flush_scheduled = False
        ops = self._local_ops
        if not ops:
            return
        callbacks = self._local_cbs
        self._local_ops = []
        self._local_cbs = []
        if not callbacks:
            on_durable = None
        elif len(callbacks) == 1:
            on_durable = callbacks[0]
        else:

            def on_durable(exc: BaseException | None, callbacks=callbacks) -> None:
                for callback in callbacks:
                    callback(exc)

        self.committer.submit(ops, on_durable, self._gen)

    def _roll(self) -> None:
        old = self.active
        summary = None
        if old and self.on_seal is not None and self.active_header is not None:
            summary = self.on_seal(old, self._tail, self.active_header)
        seq = max(self.active, max(self._sizes, default=0)) + 1
        header = encode_header(seq)
        self.active = seq
        self.active_header = header
        self._tail = HEADER_SIZE
        self._sizes[seq] = HEADER_SIZE
        if summary is not None:
            # Not through _queue_op: without a loop that flushes at once, and the
            # flush's before_flush may append (to the new segment, so only now).
            self._local_ops.append((old, SUMMARY_OP, summary))
        self._queue_op((seq, 0, (header,)), None)

    def _resync(self) -> None:
        """After a failed write, abandon the reserved-but-unwritten tail for a new segment."""
        self._gen = self.committer.generation
        failed = self.committer.failed_from
        if failed is not None:
            seq, off = failed
            for s in [s for s in self._sizes if s > seq]:
                del self._sizes[s]
            if seq in self._sizes:
                if off == 0:
                    del self._sizes[seq]
                else:
                    self._sizes[seq] = off
        self.active = 0  # next reserve rolls to a fresh segment
        self.active_header = None
        if self.on_resync is not None:
            self.on_resync(failed)

    # ---- reading and retiring --------------------------------------------------------

    def read(self, seq: int, offset: int, size: int) -> bytes:
        """Read back `size` bytes, waiting if the committer has not written them yet."""
        self.flush_pending()
        self.committer.wait_written(seq, offset + size)
        # Paged-out bodies are read one by one at delivery time; keep files open.
        fds = self._read_fds
        fd = fds.get(seq)
        if fd is None:
            if len(fds) >= 64:
                os.close(fds.pop(next(iter(fds))))
            fd = fds[seq] = os.open(segment_path(self.directory, seq), os.O_RDONLY)
        return os.pread(fd, size, offset)

    def close_readers(self) -> None:
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()

    def read_segment(self, seq: int) -> bytes:
        """The whole reserved extent of a sealed segment (used by compaction)."""
        size = self._sizes[seq]
        return self.read(seq, 0, size)

    def segment_sizes(self) -> dict[int, int]:
        """seq -> bytes used, for retention and disk accounting."""
        return dict(self._sizes)

    def size_of(self, seq: int) -> int:
        return self._sizes.get(seq, 0)

    def exists(self, seq: int) -> bool:
        return seq in self._sizes

    def retire(self, seq: int) -> None:
        """Forget a segment now and delete its file once everything before it is durable."""
        if seq == self.active:
            raise ValueError("cannot retire the active segment")
        fd = self._read_fds.pop(seq, None)
        if fd is not None:
            os.close(fd)
        if self._sizes.pop(seq, None) is not None:
            self.flush_pending()  # the unlink must come after every queued write
            self.committer.submit_unlink(seq)
