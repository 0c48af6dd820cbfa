"""Delay queues: the segment store's side of delayed exchanges.

A delayed exchange (broker/exchanges/delayed.py) keeps the messages it holds back
in the message store, one *delay queue* per exchange. To the log, recovery,
summaries, the clean-shutdown index and compaction a delay queue is an ordinary
queue: its messages are PUBLISH records under a queue id of their own (key
`(vhost, exchange, DELAYED)` in `queues.idx`), and one leaves with an ACK. Two
things differ:

- The record's header part starts with the due time (ms since the epoch, a
  little-endian i64), so the order is the due time's, not the publish order.
  What follows it is the caller's bytes (routing and content header); the store
  knows nothing of them.
- In RAM the queue is a `DelayIndex` (due time, place, size: 20 bytes a
  message), not a paged tail. Compaction finds a record there by its due time,
  read from the record (`live_at`, `moved`). After a restart the due times are
  read back from the records once (`restore`); the clean-shutdown index and the
  segment summaries hold the positions as for any queue.

A message is taken (`take`) when due: its record is read, the exchange routes
it, and `ack` then appends its ACK. The ACK is noted after the routed copies
are appended, and a loop turn's ACKs are written at the end of the turn, so on
disk a delayed message is never gone before its routed copies are there: a
crash in between delivers it again (at least once). While a batch is routed
the store does not reclaim (`paused`): a compaction started by a routed copy
rolling the log must not delete a segment whose records are taken but not yet
routed.

A taken message may have to wait longer for its ACK: in a broker of workers it
is acked once the worker that owns its queue confirmed it, which may take until
that worker is back from a restart. The exchange then `keep`s it: until its ACK
(or the exchange's deletion) its segment is not compacted (compaction finds
pending records in the index, which no longer holds a taken one, and would drop
it), and a clean stop puts it back among the pending ones (the clean-shutdown
index and side file list it, so the restart routes it again: at least once).

A message that is not persistent, or on a non-durable exchange, is a transient
record: written (so it takes no RAM) but not fsynced, and recovery ignores it.
"""

from __future__ import annotations

import logging
import os
import struct
import sys
import time
import zlib
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from leveret import wallclock
from leveret.store import replica
from leveret.store.delay_index import CHUNK, TRANSIENT_BIT, Chunk, DelayIndex
from leveret.store.errors import StoreError
from leveret.store.files import fsync_dir, write_atomic
from leveret.store.records import ACK, PUB_FIXED, PUB_HEAD, intact
from leveret.store.segments import PREFIX_SIZE

if TYPE_CHECKING:
    from leveret.store.committer import OnDurable
    from leveret.store.message_store import MessageStore
    from leveret.store.paged_index import PagedIndex

log = logging.getLogger("leveret.store")

DELAYED = "delayed"  # the third element of a delay queue's key: (vhost, exchange, DELAYED)
DUE = struct.Struct("<q")  # the first bytes of a delay record's header part
DUE_AT = PUB_HEAD  # where the due time sits in a record
_MID = struct.Struct("<Q")
MID_AT = PREFIX_SIZE + 6  # where a PUBLISH record's message id sits
SPAN = 4 * 1024 * 1024  # most bytes recovery reads at once
BIG_RECORD = 64 * 1024  # past this, recovery reads a record's due time alone
COMPACT_HORIZON_MS = 10_000  # see DelayQueues.soon
HOT_MS = 1_000  # a message due this soon after it is written keeps its bytes in RAM...
HOT_BYTES = 32 * 1024 * 1024  # ...while they add up to less than this
HOT_RECORD = PUB_HEAD + 8  # a record's size beyond the header and body kept in RAM
_OFF_MASK = 0xFFFFFFFF
_SIZE_MASK = ~TRANSIENT_BIT & 0xFFFFFFFF

# The clean-shutdown side file (msgs/delays.idx): each delay queue's index as it was,
# so a clean restart reads no record. Layout (little-endian, arrays native as
# array.tobytes writes them on this machine's byte order, named in the header), then a
# CRC32 of all before it:
#     b"LVDI", u16 version, u8 big-endian, u64 next message id, u32 newest segment CRC
#     u32 queues, each: u32 queue id, u64 n, n x i64 due, n x u64 position, n x u32 size
# It is trusted only beside the clean-shutdown index it was written with (the same
# next message id and newest segment CRC), and deleted at start like that index.
SAVED_MAGIC = b"LVDI"
SAVED_VERSION = 1
_SAVED_HEAD = struct.Struct("<4sHBQI")
_SAVED_QUEUE = struct.Struct("<IQ")

# A taken message's token for `ack` and `keep`: (position, size, message id, due time)
Token = tuple[int, int, int, int]
# (due time, header bytes after the due time, body, token)
DueRecord = tuple[int, bytes, bytes, Token]


def is_delay_key(key: tuple) -> bool:
    return len(key) == 3 and key[2] == DELAYED


class DelayQueues:
    """Every delay queue of one MessageStore, by queue id."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.by_qid: dict[int, DelayIndex] = {}
        self._held: dict[int, float] = {}  # segment -> compaction not before (monotonic s)
        # Messages due within HOT_MS of being written: position -> (header, body, message
        # id) until taken, so that routing them does not read back a record the writer
        # thread may not have written yet (the loop would wait for its fsync batch).
        self._hot: dict[int, dict[int, tuple[bytes, bytes, int]]] = {}  # by queue id
        self._hot_bytes = 0
        # Taken messages waiting for their ACK beyond the loop turn (`keep`): queue id
        # -> position -> (due time, size); and how many each segment holds.
        self._kept: dict[int, dict[int, tuple[int, int]]] = {}
        self._pinned: dict[int, int] = {}

    def count(self) -> int:
        return sum(len(index) for index in self.by_qid.values())

    # ---- the exchange's side ---------------------------------------------------------

    def index(self, vhost: str, exchange: str) -> DelayIndex:
        """The exchange's delay queue (recovered, or new and empty)."""
        qid = self.store.queue_id((vhost, exchange, DELAYED))
        index = self.by_qid.get(qid)
        if index is None:
            index = self.by_qid[qid] = DelayIndex(qid)
        return index

    def find(self, vhost: str, exchange: str) -> DelayIndex | None:
        """The exchange's delay queue if the store has one (assigns nothing)."""
        qid = self.store._queues.ids.get((vhost, exchange, DELAYED))
        return self.by_qid.get(qid) if qid is not None else None

    def add(
        self,
        index: DelayIndex,
        due: int,
        blob: bytes,
        body: bytes,
        on_durable: OnDurable | None,
        transient: bool,
    ) -> None:
        """Write one delayed message; `on_durable` fires when it is fsynced."""
        seq, off, size, mid = self.store._write_publish(
            index.qid, DUE.pack(due) + blob, body, on_durable, transient
        )
        pos = seq << 32 | off
        index.insert(due, pos, size | TRANSIENT_BIT if transient else size)
        if due - wallclock.time_ns() // 1_000_000 <= HOT_MS and self._hot_bytes < HOT_BYTES:
            hot = self._hot.get(index.qid)
            if hot is None:
                hot = self._hot[index.qid] = {}
            hot[pos] = (blob, body, mid)
            self._hot_bytes += size

    def take(self, index: DelayIndex, now: int, limit: int) -> list[DueRecord]:
        """Up to `limit` messages due at `now`, earliest first, read back (CRC-checked).
        Each must then be `ack`ed (inside the same `paused` block)."""
        dues, poss, sizes = index.pop_due(now, limit)
        n = len(dues)
        if not n:
            return []
        out: list[DueRecord | None] = [None] * n
        cold: Any = range(n)
        hot = self._hot.get(index.qid)
        if hot:
            cold = []
            for k in range(n):
                item = hot.pop(poss[k], None)
                if item is None:
                    cold.append(k)
                    continue
                self._hot_bytes -= sizes[k] & _SIZE_MASK
                out[k] = (dues[k], item[0], item[1], (poss[k], sizes[k], item[2], dues[k]))
        order = sorted(cold, key=poss.__getitem__)  # one read per stretch of a segment
        n = len(order)
        i = 0
        while i < n:
            seq = poss[order[i]] >> 32
            j = i + 1
            while j < n and poss[order[j]] >> 32 == seq:
                j += 1
            group = order[i:j]
            offs = array("I", [poss[k] & _OFF_MASK for k in group])
            lens = array("I", [sizes[k] & _SIZE_MASK for k in group])
            for g, off, size, record in self.store._read_positions(seq, offs, lens):
                k = group[g]
                if not intact(record, size):
                    self._corrupt(index, seq, off, size)
                    continue
                _t, _f, _qid, mid, hlen = PUB_FIXED.unpack_from(record, PREFIX_SIZE)
                start = PUB_HEAD + hlen
                header = bytes(record[DUE_AT + DUE.size : start])
                out[k] = (dues[k], header, bytes(record[start:]), (poss[k], sizes[k], mid, dues[k]))
            i = j
        return [item for item in out if item is not None]

    def read_all(self, index: DelayIndex) -> Iterator[tuple[int, bytes, bytes, bool]]:
        """(due, blob, body, transient) of every pending message, earliest first, read
        back (CRC-checked) without taking them: the delay queue stays as it is. For
        tools that copy a store offline (`workers/reshard.py`); a corrupt record is
        an error here, never skipped."""
        for due, pos, size in list(index.entries()):
            seq, off, length = pos >> 32, pos & _OFF_MASK, size & _SIZE_MASK
            offs, lens = array("I", [off]), array("I", [length])
            for _g, _off, _size, record in self.store._read_positions(seq, offs, lens):
                if not intact(record, length):
                    raise StoreError(f"delayed message at segment {seq} offset {off} is corrupt")
                hlen = PUB_FIXED.unpack_from(record, PREFIX_SIZE)[4]
                start = PUB_HEAD + hlen
                yield (
                    due,
                    bytes(record[DUE_AT + DUE.size : start]),
                    bytes(record[start:]),
                    bool(size & TRANSIENT_BIT),
                )

    def ack(self, index: DelayIndex, token: Token) -> None:
        """A taken message was routed: its record is no longer needed."""
        pos, size, mid, _due = token
        store = self.store
        seq = pos >> 32
        if self._kept:
            kept = self._kept.get(index.qid)
            if kept is not None and kept.pop(pos, None) is not None:
                self._unpin(seq)
        if seq not in store._live:
            return  # its segment is gone (never while `paused`)
        store._live[seq] -= size & _SIZE_MASK
        if not size & TRANSIENT_BIT:
            store._append_ref(ACK, index.qid, mid, seq)
        if seq != store._active:
            store._candidates.append(seq)
            store._reclaim()

    def keep(self, index: DelayIndex, token: Token) -> None:
        """A taken message waits for its `ack` beyond this `paused` block: its
        record must stay (see the module doc). Keeping it again changes nothing."""
        pos, size, _mid, due = token
        kept = self._kept.get(index.qid)
        if kept is None:
            kept = self._kept[index.qid] = {}
        if pos in kept:
            return
        kept[pos] = (due, size)
        seq = pos >> 32
        self._pinned[seq] = self._pinned.get(seq, 0) + 1

    def _unpin(self, seq: int) -> None:
        left = self._pinned[seq] - 1
        if left:
            self._pinned[seq] = left
        else:
            del self._pinned[seq]

    def put_back(self) -> None:
        """A clean stop: every kept message is pending again (in its index), so that
        the clean-shutdown index and side file list it."""
        for qid, kept in self._kept.items():
            index = self.by_qid.get(qid)
            if index is not None:
                for pos, (due, size) in kept.items():
                    index.insert(due, pos, size)
        self._kept.clear()
        self._pinned.clear()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No disk reclaim inside (see the module doc); what it would have done runs
        at the end."""
        store = self.store
        before = store._reclaiming
        store._reclaiming = True
        try:
            yield
        finally:
            store._reclaiming = before
            if not before:
                store._reclaim()

    def drop(self, vhost: str, exchange: str) -> int:
        """The exchange is gone: forget its delay queue and every pending message."""
        return self.store.delete_queue((vhost, exchange, DELAYED))

    def _forget_hot(self, qid: int) -> None:
        hot = self._hot.pop(qid, None)
        if hot:
            self._hot_bytes -= sum(HOT_RECORD + len(h) + len(b) for h, b, _m in hot.values())

    def _corrupt(self, index: DelayIndex, seq: int, off: int, size: int) -> None:
        log.error(
            "delayed message at segment %d offset %d (%d bytes) of delay queue %d is "
            "corrupt (CRC mismatch); dropped",
            seq,
            off,
            size,
            index.qid,
        )
        self.store._live[seq] -= size
        self.store._candidates.append(seq)

    # ---- the store's side: compaction, recovery, shutdown ----------------------------

    def soon(self) -> int:
        """Compaction leaves a segment alone while most of what it would copy are
        delayed messages due before this (ms since the epoch): they are routed and
        acked within seconds anyway, the segment then goes without a copy, and a
        copy read back before the writer thread has written it would stall the loop."""
        return wallclock.time_ns() // 1_000_000 + COMPACT_HORIZON_MS if self.by_qid else 0

    def hold(self, seq: int) -> None:
        """Compaction found `seq` mostly due soon: do not look again for a while."""
        now = time.monotonic()
        if len(self._held) > 64:  # forget segments since retired
            self._held = {s: t for s, t in self._held.items() if t > now}
        self._held[seq] = now + COMPACT_HORIZON_MS / 1000

    def held(self, seq: int) -> bool:
        """Whether compaction leaves `seq` alone for now: it holds a kept message,
        or most of it is due soon (`hold`)."""
        if seq in self._pinned:
            return True
        until = self._held.get(seq)
        if until is None:
            return False
        if time.monotonic() < until:
            return True
        del self._held[seq]
        return False

    def live_at(self, qid: int, seq: int, off: int, data: bytes) -> int | None:
        """Compaction: the due time of delay queue `qid`'s record at (seq, off) (read
        from `data`, the segment) if it is still pending, else None."""
        due = DUE.unpack_from(data, off + DUE_AT)[0]
        return due if self.by_qid[qid].find(due, seq << 32 | off) >= 0 else None

    def moved(self, qid: int, due: int, seq: int, off: int, new_seq: int, new_off: int) -> None:
        """Compaction copied a pending record."""
        old, new = seq << 32 | off, new_seq << 32 | new_off
        self.by_qid[qid].relocate(due, old, new)
        hot = self._hot.get(qid)
        if hot is not None and old in hot:
            hot[new] = hot.pop(old)

    def free(self, qid: int) -> set[int]:
        """Drop a delay queue's index (the queue id was dropped); the segments touched."""
        self._forget_hot(qid)
        index = self.by_qid.pop(qid, None)
        freed = index.bytes_by_segment() if index is not None else {}
        for pos, (_due, size) in self._kept.pop(qid, {}).items():  # never to be acked now
            seq = pos >> 32
            self._unpin(seq)
            freed[seq] = freed.get(seq, 0) + (size & _SIZE_MASK)
        live = self.store._live
        for seq, nbytes in freed.items():
            if seq in live:
                live[seq] -= nbytes
        if index is not None:
            index.clear()
        return set(freed)

    def truncate(self, fseq: int, foff: int) -> None:
        """A write failed from (fseq, foff) on: forget messages whose records were
        never written (the store fixes its live bytes itself)."""
        cut = fseq << 32 | foff
        for qid, index in self.by_qid.items():
            index.truncate(cut)
            self._forget_hot(qid)  # the positions they were read from are gone too
            kept = self._kept.get(qid)
            if kept:
                for pos in [p for p in kept if p >= cut]:
                    del kept[pos]
                    self._unpin(pos >> 32)

    def restore(self, result: dict[Any, Any], saved: dict[int, Any] | None = None) -> None:
        """After recovery: turn each delay queue's recovered positions (a PagedIndex)
        into its DelayIndex: from the clean-shutdown side file (`saved`) when it names
        exactly these positions, else by reading every record's due time."""
        store = self.store
        for key in [k for k in result if is_delay_key(k)]:
            paged: PagedIndex = result[key]
            store._paged.pop(paged.qid, None)
            columns = saved.get(paged.qid) if saved is not None else None
            if columns is not None and _same_positions(paged, columns[1], columns[2]):
                index = self._from_saved(paged.qid, *columns)
                paged.clear()
            else:
                index = self._read_dues(paged)
            self.by_qid[paged.qid] = index
            result[key] = index

    def _read_dues(self, paged: PagedIndex) -> DelayIndex:
        """Each record's due time and message id, read in stretches of a segment (big
        records alone: only their first bytes). No CRC check here: `take` checks."""
        store = self.store
        lg = store._log
        assert lg is not None
        dues, poss, sizes, mids = array("q"), array("Q"), array("I"), array("Q")
        due_at = DUE.unpack_from
        mid_at = _MID.unpack_from
        for run in paged.runs():
            a = run.start
            seq = run.seq
            offs, lens = run.offs[a:], run.sizes[a:]
            n = len(offs)
            i = 0
            while i < n:
                start = offs[i]
                j = i + 1
                if lens[i] > BIG_RECORD:
                    buf = lg.read(seq, start, DUE_AT + DUE.size)
                else:
                    end = start + lens[i]
                    while j < n and lens[j] <= BIG_RECORD and offs[j] + lens[j] - start <= SPAN:
                        end = offs[j] + lens[j]
                        j += 1
                    buf = lg.read(seq, start, end - start)
                part = offs[i:j]
                try:
                    got_dues = [due_at(buf, o - start + DUE_AT)[0] for o in part]
                    got_mids = [mid_at(buf, o - start + MID_AT)[0] for o in part]
                except struct.error:  # records past the end of their file
                    log.error("delayed messages in segment %d from %d are cut short", seq, start)
                    for k in range(i, j):
                        store._live[seq] -= lens[k]
                    i = j
                    continue
                dues.extend(got_dues)
                mids.extend(got_mids)
                poss.extend([seq << 32 | o for o in part])
                sizes.extend(lens[i:j])
                i = j
        paged.clear()
        return DelayIndex.build(paged.qid, dues, poss, sizes, mids)

    def export(self) -> dict[int, list[tuple[int, array, array, None]]]:
        """For the clean-shutdown index: each delay queue's durable records as runs
        (segment, offsets, sizes), by segment and offset."""
        out: dict[int, list[tuple[int, array, array, None]]] = {}
        for qid, index in self.by_qid.items():
            by_seq: dict[int, tuple[array, array]] = {}
            for chunk in index.chunks():
                for pos, size in zip(chunk.poss, chunk.sizes, strict=True):
                    if size & TRANSIENT_BIT:
                        continue
                    cols = by_seq.get(pos >> 32)
                    if cols is None:
                        cols = by_seq[pos >> 32] = (array("I"), array("I"))
                    cols[0].append(pos & _OFF_MASK)
                    cols[1].append(size)
            runs: list[tuple[int, array, array, None]] = []
            for seq in sorted(by_seq):
                offs, lens = by_seq[seq]
                order = sorted(range(len(offs)), key=offs.__getitem__)
                runs.append(
                    (
                        seq,
                        array("I", [offs[k] for k in order]),
                        array("I", [lens[k] for k in order]),
                        None,
                    )
                )
            if runs:
                out[qid] = runs
        return out

    # ---- the clean-shutdown side file --------------------------------------------------

    def save(self, path: str, next_mid: int, last_crc: int) -> None:
        """Write every delay queue's durable entries, in order (before the clean index)."""
        parts = [
            _SAVED_HEAD.pack(
                SAVED_MAGIC, SAVED_VERSION, sys.byteorder == "big", next_mid, last_crc
            ),
            struct.pack("<I", len(self.by_qid)),
        ]
        for qid, index in self.by_qid.items():
            dues, poss, sizes = array("q"), array("Q"), array("I")
            for chunk in index.chunks():
                if any(size & TRANSIENT_BIT for size in chunk.sizes):
                    for due, pos, size in zip(chunk.dues, chunk.poss, chunk.sizes, strict=True):
                        if not size & TRANSIENT_BIT:
                            dues.append(due)
                            poss.append(pos)
                            sizes.append(size)
                else:
                    dues.extend(chunk.dues)
                    poss.extend(chunk.poss)
                    sizes.extend(chunk.sizes)
            parts += [
                _SAVED_QUEUE.pack(qid, len(dues)),
                dues.tobytes(),
                poss.tobytes(),
                sizes.tobytes(),
            ]
        data = b"".join(parts)
        write_atomic(path, data + struct.pack("<I", zlib.crc32(data)))

    @staticmethod
    def take_saved(path: str) -> tuple[int, int, dict[int, tuple[array, array, array]]] | None:
        """Read and delete the side file: (next message id, newest segment CRC, queue id
        -> (dues, positions, sizes)), or None if there is none or it is damaged."""
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        os.unlink(path)
        fsync_dir(os.path.dirname(path))
        replica.unlinked(path)  # a cluster's followers drop theirs too, as with clean.idx
        try:
            if len(data) < _SAVED_HEAD.size + 8:
                raise ValueError("short")
            if zlib.crc32(data[:-4]) != struct.unpack_from("<I", data, len(data) - 4)[0]:
                raise ValueError("CRC mismatch")
            magic, version, big, next_mid, last_crc = _SAVED_HEAD.unpack_from(data)
            if magic != SAVED_MAGIC or version != SAVED_VERSION:
                raise ValueError(f"magic {magic!r}, version {version}")
            p = _SAVED_HEAD.size
            (count,) = struct.unpack_from("<I", data, p)
            p += 4
            queues = {}
            for _ in range(count):
                qid, n = _SAVED_QUEUE.unpack_from(data, p)
                p += _SAVED_QUEUE.size
                cols = []
                for code, width in (("q", 8), ("Q", 8), ("I", 4)):
                    col = array(code)
                    col.frombytes(data[p : p + n * width])
                    if bool(big) != (sys.byteorder == "big"):
                        col.byteswap()
                    p += n * width
                    cols.append(col)
                queues[qid] = (cols[0], cols[1], cols[2])
            return next_mid, last_crc, queues
        except (ValueError, struct.error) as exc:
            log.warning("delay queue side file %s is damaged (%s); reading due times", path, exc)
            return None

    @staticmethod
    def _from_saved(qid: int, dues: array, poss: array, sizes: array) -> DelayIndex:
        index = DelayIndex(qid)
        for start in range(0, len(dues), CHUNK):
            chunk = Chunk(
                dues[start : start + CHUNK],
                poss[start : start + CHUNK],
                sizes[start : start + CHUNK],
            )
            index._chunks.append(chunk)
            index._lasts.append(chunk.dues[-1])
        index.n = len(dues)
        return index


def _same_positions(paged: PagedIndex, poss: array, sizes: array) -> bool:
    """The side file's entries are the clean index's positions (count and sums)."""
    if len(poss) != len(paged):
        return False
    total_pos = total_size = 0
    for run in paged.runs():
        a = run.start
        total_pos += sum(run.offs[a:]) + (run.seq << 32) * (len(run.offs) - a)
        total_size += sum(run.sizes[a:])
    return total_pos == sum(poss) and total_size == sum(sizes)
