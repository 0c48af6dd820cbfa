"""The clean-shutdown index: what the message store knows, saved so a restart skips the scan.

A clean stop writes every queue's live messages as runs of positions (the same
columns as a paged tail), the segments' sizes, the ACK dependencies between
segments and the next message id. The next start reads it with a few
`array.frombytes` calls instead of parsing every record, so the time to listen
does not grow with the queue (RabbitMQ's classic queues do the same with their
clean-shutdown recovery terms).

The file is trusted only if every segment on disk has exactly the size it names,
the newest segment (where a torn or damaged record would be) still has its CRC,
and it is deleted before anything new is written: after a crash there is none,
and the full scan runs. Layout (little-endian), then a CRC32 of all before it:

    b"LVCI", u16 version, u64 next message id, u32 CRC32 of the newest segment file
    u32 n, n x (u64 segment, u64 size)
    u32 n, n x (u64 segment, u64 segment its records depend on)
    u32 queues, each: u32 queue id, u32 runs, each run:
        u64 segment, u32 n, u8 has flags, n x u32 offset, n x u32 size, [n x u8 flags]
    version 2 only: u32 n, n x (u64 message id, u32 queue id, u32 delivery count)

Version 2 adds quorum queues' delivery counts (store.records); an index without
any is written as version 1, which builds that predate the counts still read.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from array import array
from dataclasses import dataclass, field

from leveret.store import replica
from leveret.store.files import fsync_dir, write_atomic

log = logging.getLogger("leveret.store")

MAGIC = b"LVCI"
VERSION = 2
VERSIONS = (1, 2)
_HEAD = struct.Struct("<4sHQI")
_COUNT = struct.Struct("<I")
_PAIR = struct.Struct("<QQ")
_QUEUE = struct.Struct("<II")
_RUN = struct.Struct("<QIB")
_DELIVERY_COUNT = struct.Struct("<QII")

Run = tuple[int, array, array, bytearray | None]  # segment, offsets, sizes, flags


@dataclass
class CleanIndex:
    next_mid: int
    last_crc: int  # of the newest segment's whole file
    sizes: dict[int, int]
    deps: list[tuple[int, int]]
    queues: dict[int, list[Run]] = field(default_factory=dict)
    counts: dict[int, tuple[int, int]] = field(default_factory=dict)  # mid -> (qid, count)


def write(path: str, index: CleanIndex) -> None:
    """Write `index` to `path` crash-atomically."""
    head = _HEAD.pack(MAGIC, VERSION if index.counts else 1, index.next_mid, index.last_crc)
    parts = [head, _COUNT.pack(len(index.sizes))]
    parts += [_PAIR.pack(seq, size) for seq, size in index.sizes.items()]
    parts.append(_COUNT.pack(len(index.deps)))
    parts += [_PAIR.pack(seq, target) for seq, target in index.deps]
    parts.append(_COUNT.pack(len(index.queues)))
    for qid, runs in index.queues.items():
        parts.append(_QUEUE.pack(qid, len(runs)))
        for seq, offs, sizes, flags in runs:
            parts.append(_RUN.pack(seq, len(offs), flags is not None))
            parts.append(offs.tobytes())
            parts.append(sizes.tobytes())
            if flags is not None:
                parts.append(bytes(flags))
    if index.counts:
        parts.append(_COUNT.pack(len(index.counts)))
        parts += [_DELIVERY_COUNT.pack(mid, qid, n) for mid, (qid, n) in index.counts.items()]
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    parts.append(_COUNT.pack(crc))
    write_atomic(path, b"".join(parts))


def take(path: str) -> CleanIndex | None:
    """Read and delete the index; None if there is none or it is damaged (logged)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    os.unlink(path)
    fsync_dir(os.path.dirname(path))
    replica.unlinked(path)
    try:
        return _parse(data)
    except (ValueError, struct.error) as exc:
        log.warning("clean-shutdown index %s unusable (%s); scanning the log", path, exc)
        return None


def _parse(data: bytes) -> CleanIndex:
    if (
        len(data) < _HEAD.size + 4
        or zlib.crc32(data[:-4]) != _COUNT.unpack_from(data, len(data) - 4)[0]
    ):
        raise ValueError("bad checksum")
    magic, version, next_mid, last_crc = _HEAD.unpack_from(data)
    if magic != MAGIC or version not in VERSIONS:
        raise ValueError(f"unknown format {magic!r} v{version}")
    at = _HEAD.size
    (n,) = _COUNT.unpack_from(data, at)
    at += 4
    sizes = {}
    for _ in range(n):
        seq, size = _PAIR.unpack_from(data, at)
        sizes[seq] = size
        at += _PAIR.size
    (n,) = _COUNT.unpack_from(data, at)
    at += 4
    deps = []
    for _ in range(n):
        deps.append(_PAIR.unpack_from(data, at))
        at += _PAIR.size
    (nq,) = _COUNT.unpack_from(data, at)
    at += 4
    index = CleanIndex(next_mid, last_crc, sizes, deps)
    for _ in range(nq):
        qid, nruns = _QUEUE.unpack_from(data, at)
        at += _QUEUE.size
        runs: list[Run] = []
        for _ in range(nruns):
            seq, n, has_flags = _RUN.unpack_from(data, at)
            at += _RUN.size
            offs = array("I")
            offs.frombytes(data[at : at + 4 * n])
            at += 4 * n
            sizes_ = array("I")
            sizes_.frombytes(data[at : at + 4 * n])
            at += 4 * n
            flags = None
            if has_flags:
                flags = bytearray(data[at : at + n])
                at += n
            if len(offs) != n or len(sizes_) != n or (flags is not None and len(flags) != n):
                raise ValueError("truncated run")
            runs.append((seq, offs, sizes_, flags))
        index.queues[qid] = runs
    if version >= 2:
        (n,) = _COUNT.unpack_from(data, at)
        at += 4
        for _ in range(n):
            mid, qid, count = _DELIVERY_COUNT.unpack_from(data, at)
            index.counts[mid] = (qid, count)
            at += _DELIVERY_COUNT.size
    if at != len(data) - 4:
        raise ValueError("trailing bytes")
    return index


def file_crc(path: str) -> int:
    with open(path, "rb") as f:
        return zlib.crc32(f.read())
