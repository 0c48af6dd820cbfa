"""Segment summaries: what a sealed segment of the message store holds, as columns.

After a crash the message store learns every queue's positions from the log, and
walking records one by one costs about 0.7 s per million. A summary, written
beside a segment once the segment is sealed and on disk, holds the same facts in
a few arrays: per queue, the message ids, offsets and sizes of its PUBLISH copies
in file order, plus the offsets of every other record (acks, purges: the store's
types; this module does not interpret them). Recovery loads those arrays with
`frombytes` and reads only the other records, so the scan stays O(segments)
in Python calls rather than O(records). A record written once for several queues
(the store's fan-out) is noted by its offset alone, which costs the publisher one
append rather than one per queue; recovery reads such records to place them.

A summary is only a cache of its segment: it is trusted when its CRC holds and
it names the segment's sequence number, its exact size and its header's CRC32
(the header carries the segment's creation time, so a reused number does not
match). Anything else, and the segment is walked record by record. The writer thread
writes a summary only after the segment's records are synced (so a summary never
outlives data it describes), and unlinks it before its segment.

File `<seq:016d>.sum` (little-endian):

    header: b"LVSM", u16 version, u16 reserved, u64 segment seq, u64 segment
            size, u32 CRC32 of the segment's header, u64 highest message id the
            segment may hold, u32 queues, u32 other records, u32 fan-out records
    per queue: u32 queue id, u32 n, u8 form, 3 reserved bytes, then
            ids:   u64 first id if form & CONSECUTIVE, else n x u64
            offs:  n x u32
            sizes: u32 if form & UNIFORM, else n x u32
    others: n x u32 record offsets
    fan-outs: n x u32 record offsets
    trailer: u32 CRC32 of everything before it
"""

from __future__ import annotations

import logging
import os
import struct
import sys
import zlib
from array import array
from collections.abc import Sequence
from typing import TypeVar

log = logging.getLogger("leveret.store")

MAGIC = b"LVSM"
VERSION = 1
_HEAD = struct.Struct("<4sHHQQIQIII")
_QUEUE = struct.Struct("<IIB3x")
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")

ORDERED = 0x01  # ids rise with file order (no compaction copy among them)
CONSECUTIVE = 0x02  # ids are first, first + 1, ...: only the first is stored
UNIFORM = 0x04  # every size is the same: stored once

_BIG_ENDIAN = sys.byteorder == "big"


class Columns:
    """One queue's PUBLISH copies in one segment, in file order. A loaded summary's
    consecutive ids may be a `range` (see `load`); `uniform` is then the one size
    all copies have, if the file said so (0: not known)."""

    __slots__ = ("mids", "offs", "sizes", "ordered", "uniform")

    def __init__(self) -> None:
        self.mids: array | range = array("Q")
        self.offs = array("I")
        self.sizes = array("I")
        self.ordered = True
        self.uniform = 0

    def note(self, mid: int, off: int, size: int) -> None:
        """Add one copy (slow path: the store's publish inlines this)."""
        mids = self.mids
        if mids and mid <= mids[-1]:
            self.ordered = False
        mids.append(mid)  # type: ignore[union-attr]
        self.offs.append(off)
        self.sizes.append(size)


C = TypeVar("C", bound=Columns)


class Summary:
    """What one segment holds: per queue id its Columns, the offsets of other
    records and of fan-out records (the caller reads those), and an upper bound of
    the message ids in it (transient records included)."""

    __slots__ = ("queues", "others", "fanouts", "top_mid")

    def __init__(self) -> None:
        self.queues: dict[int, Columns] = {}
        self.others = array("I")
        self.fanouts = array("I")
        self.top_mid = 0

    def columns(self, qid: int) -> Columns:
        cols = self.queues.get(qid)
        if cols is None:
            cols = self.queues[qid] = Columns()
        return cols

    def copy(self) -> Summary:
        """A copy whose arrays the caller may go on appending to."""
        out = Summary()
        for qid, cols in self.queues.items():
            c = out.queues[qid] = Columns()
            c.mids = array("Q", cols.mids)
            c.offs = array("I", cols.offs)
            c.sizes = array("I", cols.sizes)
            c.ordered = cols.ordered
        out.others = array("I", self.others)
        out.fanouts = array("I", self.fanouts)
        out.top_mid = self.top_mid
        return out


def summary_path(directory: str, seq: int) -> str:
    return os.path.join(directory, f"{seq:016d}.sum")


def encode(seq: int, size: int, head_crc: int, summary: Summary) -> list[bytes | array]:
    """The file's parts, trailer excluded (`write_file` adds it). Arrays are passed
    through, not copied: the caller hands over a summary it no longer appends to."""
    parts: list[bytes | array] = [
        _HEAD.pack(
            MAGIC,
            VERSION,
            0,
            seq,
            size,
            head_crc,
            summary.top_mid,
            len(summary.queues),
            len(summary.others),
            len(summary.fanouts),
        )
    ]
    for qid, cols in summary.queues.items():
        mids, offs, sizes = cols.mids, cols.offs, cols.sizes
        n = len(mids)
        form = ORDERED if cols.ordered else 0
        if cols.ordered and n and mids[-1] - mids[0] == n - 1:
            form |= CONSECUTIVE  # strictly rising and spanning n ids: no gaps
        if n and sizes.count(sizes[0]) == n:
            form |= UNIFORM
        parts.append(_QUEUE.pack(qid, n, form))
        parts.append(_U64.pack(mids[0]) if form & CONSECUTIVE and n else _le(mids))  # type: ignore[arg-type]
        parts.append(_le(offs))
        parts.append(_U32.pack(sizes[0]) if form & UNIFORM else _le(sizes))
    parts.append(_le(summary.others))
    parts.append(_le(summary.fanouts))
    return parts


def _le(a: array) -> bytes | array:
    if not _BIG_ENDIAN:
        return a
    b = array(a.typecode, a)
    b.byteswap()
    return b


def write_file(path: str, parts: Sequence[bytes | array]) -> None:
    """Write a summary (parts, then their CRC32). Not fsynced: a summary torn by a
    power cut fails its CRC, and the segment is walked instead."""
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        chunks = [memoryview(p).cast("B") for p in parts]
        chunks.append(memoryview(_U32.pack(crc)))
        for chunk in chunks:
            while chunk:
                n = os.write(fd, chunk)
                chunk = chunk[n:]
    finally:
        os.close(fd)


def load(
    directory: str,
    seq: int,
    size: int,
    head_crc: int,
    factory: type[C] = Columns,  # type: ignore[assignment]
    lazy: bool = False,
) -> Summary | None:
    """The summary of segment `seq`, its columns made by `factory`, or None when
    there is none that matches the segment as it is (`size` bytes, header CRC
    `head_crc`). With `lazy`, consecutive ids come as a `range` (read-only: for
    recovery, which only looks ids up), not an array of 8 bytes each."""
    path = summary_path(directory, seq)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("segment summary %s unreadable (%s); walking the segment", path, exc)
        return None
    try:
        return _parse(data, seq, size, head_crc, factory, lazy)
    except (ValueError, struct.error) as exc:
        log.warning("segment summary %s not used (%s); walking the segment", path, exc)
        return None


def _parse(
    data: bytes, seq: int, size: int, head_crc: int, factory: type[C], lazy: bool
) -> Summary:
    if len(data) < _HEAD.size + 4:
        raise ValueError("truncated")
    if zlib.crc32(memoryview(data)[:-4]) != _U32.unpack_from(data, len(data) - 4)[0]:
        raise ValueError("CRC mismatch")
    magic, version, _r, s_seq, s_size, s_crc, top, nq, nothers, nfan = _HEAD.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"unknown format {magic!r} v{version}")
    if s_seq != seq or s_size != size or s_crc != head_crc:
        # Not an error: a summary written at a clean stop describes the segment as it
        # was then; appends since make it stale.
        raise ValueError("describes another state of the segment")
    pos = _HEAD.size
    summary = Summary()
    queues = summary.queues
    for _ in range(nq):
        qid, n, form = _QUEUE.unpack_from(data, pos)
        pos += _QUEUE.size
        cols = queues[qid] = factory()
        if form & CONSECUTIVE:
            (first,) = _U64.unpack_from(data, pos)
            pos += 8
            ids = range(first, first + n)
            cols.mids = ids if lazy else array("Q", ids)
        else:
            mids = array("Q")
            pos = _take(mids, data, pos, n)
            cols.mids = mids
        pos = _take(cols.offs, data, pos, n)
        if form & UNIFORM:
            cols.sizes = array("I", _U32.unpack_from(data, pos)) * n
            cols.uniform = cols.sizes[0] if n else 0
            pos += 4
        else:
            pos = _take(cols.sizes, data, pos, n)
        cols.ordered = bool(form & ORDERED)
    pos = _take(summary.others, data, pos, nothers)
    pos = _take(summary.fanouts, data, pos, nfan)
    if pos != len(data) - 4:
        raise ValueError("length does not add up")
    summary.top_mid = top
    return summary


def _take(a: array, data: bytes, pos: int, n: int) -> int:
    end = pos + n * a.itemsize
    if end > len(data) - 4:
        raise ValueError("truncated")
    a.frombytes(data[pos:end])
    if _BIG_ENDIAN:
        a.byteswap()
    return end
