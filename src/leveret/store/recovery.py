"""Rebuilding the message store's queues from its log after a crash.

Segments are taken oldest first, in two steps each:

1. What the segment holds, as a Summary (see `summaries`): loaded from the
   segment's summary file when one matches it, else found by walking its records
   (and then written, so that the next crash skips the walk).
2. Applying it: each known queue's PUBLISH columns become that segment's `Build`s,
   and the other records (ACKs, DELIVEREDs, PURGEs) are read at their offsets and
   settle messages in this segment or older ones.

The result must be what applying every record in file order gives, so step 2 is
careful where order inside one segment could matter. A record that settles
messages of its own segment only sees the PUBLISHes before it (`before`), which
bisection finds when a queue's ids rise with file order. A segment where they do
not (compaction copied older messages into it) is replayed record by record, in
file order, as the walk always did.
"""

from __future__ import annotations

import logging
import os
import zlib
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable

from leveret.store import summaries
from leveret.store.committer import segment_path
from leveret.store.paged_index import REDELIVERED, PagedIndex, live_run
from leveret.store.records import (
    ACK,
    BIG_ENDIAN,
    DELIVERED,
    FANOUT,
    FLAG_TRANSIENT,
    IDS_AT,
    PUB_IDS,
    PUBLISH,
    PURGE,
    REF_BODY,
    REF_COUNT,
    REF_IDS,
    REFS,
    REFS_AT,
    REFS_IDS,
    fanout_qids,
    intact,
    purge_fields,
)
from leveret.store.segments import (
    HEADER_SIZE,
    PREFIX_SIZE,
    RECORD_PREFIX,
    SegmentLog,
    list_segments,
)
from leveret.store.summaries import Columns, Summary

log = logging.getLogger("leveret.store")


class RecoveryCancelled(Exception):
    """The broker stopped while `recover` was scanning (a shutdown, not a failure)."""


class Build(Columns):
    """One queue's PUBLISHes in one segment while recovery settles them: ACKs zero
    a size, DELIVEREDs set a flag."""

    __slots__ = ("flags", "dead", "_pos", "_pos_n")

    def __init__(self) -> None:
        super().__init__()
        self.flags: bytearray | None = None
        self.dead = 0
        self._pos: dict[int, int] = {}
        self._pos_n = 0

    def find(self, mid: int, before: int = -1) -> int:
        """Index of message `mid`, or -1; with `before` >= 0, only a copy at a lower
        offset counts (ordered builds only: an unordered one is replayed in order)."""
        mids = self.mids
        if self.ordered:
            i = bisect_left(mids, mid)
            if i < len(mids) and mids[i] == mid and (before < 0 or self.offs[i] < before):
                return i
            return -1
        if self._pos_n != len(mids):
            self._pos = {m: i for i, m in enumerate(mids)}
            self._pos_n = len(mids)
        return self._pos.get(mid, -1)

    def kill_range(self, lo: int, hi: int, before: int = -1) -> int:
        """A PURGE: zero the sizes of records with ids in [lo, hi] (and offsets below
        `before`, if given); the bytes freed."""
        mids = self.mids
        sizes = self.sizes
        if self.ordered:
            stop = bisect_left(mids, hi + 1)
            if before >= 0:
                stop = min(stop, bisect_left(self.offs, before))
            span = range(bisect_left(mids, lo), stop)
        else:
            span = range(len(mids))
        freed = 0
        for i in span:
            size = sizes[i]
            if size and lo <= mids[i] <= hi:
                sizes[i] = 0
                self.dead += 1
                freed += size
        return freed

    def mark(self, i: int, flag: int) -> None:
        flags = self.flags
        if flags is None:
            flags = self.flags = bytearray(len(self.mids))
        elif len(flags) < len(self.mids):
            flags.extend(bytes(len(self.mids) - len(flags)))
        flags[i] |= flag

    def full_flags(self) -> bytearray | None:
        flags = self.flags
        if flags is not None and len(flags) < len(self.mids):
            flags.extend(bytes(len(self.mids) - len(flags)))
        return flags

    def settle(self, kind: int, mids: array | tuple[int, ...], before: int) -> int:
        """ACKs (zero sizes) or DELIVEREDs (set the flag) of these ids; the PUBLISH
        bytes the ACKs freed."""
        freed = 0
        sizes = self.sizes
        for mid in mids:
            i = self.find(mid, before)
            if i < 0:
                continue
            if kind == ACK:
                size = sizes[i]
                if size:
                    sizes[i] = 0
                    self.dead += 1
                    freed += size
            elif kind == DELIVERED:
                self.mark(i, REDELIVERED)
        return freed


def _place_fanouts(summary: Summary, data: bytes) -> None:
    """Put each FANOUT record the summary names into its queues' columns, in file
    order among their PUBLISHes (the publisher noted only the record's offset)."""
    added: dict[int, list[tuple[int, int, int]]] = {}
    for off in summary.fanouts:
        first, qids = fanout_qids(data, off)
        size = PREFIX_SIZE + RECORD_PREFIX.unpack_from(data, off)[0]
        for k, qid in enumerate(qids):
            added.setdefault(qid, []).append((off, first + k, size))
    summary.fanouts = array("I")
    for qid, rows in added.items():
        cols = summary.queues.get(qid)
        if cols is None:
            cols = summary.queues[qid] = Build()
        if cols.mids:
            rows += zip(cols.offs, cols.mids, cols.sizes, strict=True)
            rows.sort()
        cols.offs = array("I", [r[0] for r in rows])
        cols.mids = array("Q", [r[1] for r in rows])
        cols.sizes = array("I", [r[2] for r in rows])
        cols.uniform = 0
        mids = cols.mids
        cols.ordered = all(mids[i] < mids[i + 1] for i in range(len(mids) - 1))


def summarise(data: bytes, records: Iterable[tuple[int, int, int, int]]) -> Summary:
    """Walk one segment's records (from `iter_records`) into a Summary: per queue its
    PUBLISH copies (transient ones left out, as recovery ignores them), the
    offsets of every other record, and the highest message id seen."""
    summary = Summary()
    queues: dict[int, Columns] = summary.queues  # type: ignore[assignment]
    others = summary.others
    top = 0
    pub_ids = PUB_IDS.unpack_from
    at = IDS_AT
    for off, end, rtype, flags in records:
        if rtype == PUBLISH:
            qid, mid = pub_ids(data, off + at)
            if mid > top:
                top = mid
            if flags & FLAG_TRANSIENT:
                continue
            cols = queues.get(qid)
            if cols is None:
                cols = queues[qid] = Build()
            elif mid <= cols.mids[-1]:
                cols.ordered = False  # a compaction copy among newer records
            cols.mids.append(mid)  # type: ignore[union-attr]  # a walk's ids: an array
            cols.offs.append(off)
            cols.sizes.append(end - off)
        elif rtype == FANOUT:
            first, qids = fanout_qids(data, off)
            if first + len(qids) - 1 > top:
                top = first + len(qids) - 1
            size = end - off
            for k, qid in enumerate(qids):
                cols = queues.get(qid)
                if cols is None:
                    cols = queues[qid] = Build()
                cols.note(first + k, off, size)
        else:
            others.append(off)
    summary.top_mid = top
    return summary


class Scan:
    """One recovery: every segment's Builds, which segments pin which, live bytes."""

    def __init__(self, lg: SegmentLog, known: dict[int, object], live: dict[int, int]) -> None:
        self.lg = lg
        self.directory = lg.directory
        self.known = known
        self.live = live
        self.builds: dict[int, dict[int, Build]] = {}  # segment -> queue id -> Build
        self.deps: dict[int, set[int]] = {}
        self.next_mid = 1
        # Quorum delivery counts (DELIVERED records with a count): message id ->
        # (queue id, segment of its PUBLISH, highest count).
        self.counts: dict[int, tuple[int, int, int]] = {}
        self.walked = 0
        self.summarised = 0
        # The newest segment's summary as found (before settling changed it): the
        # store goes on appending to it, so the segment's summary stays whole.
        self.last: tuple[int, Summary] | None = None

    def run(self, cancelled: Callable[[], bool] | None) -> None:
        lg = self.lg
        seqs = list_segments(self.directory)
        _drop_orphans(self.directory, set(seqs))
        newest = seqs[-1] if seqs else 0
        found: dict[int, tuple[Summary, bytes | None]] = {}

        def summarised(seq: int) -> int | None:
            """The segment's size if its summary matches it (and every record the
            summary names beyond PUBLISHes is intact: those are read anyway). The
            newest segment is always walked: a crash tears records there."""
            if seq == newest:
                return None
            peeked = lg.peek(seq)
            if peeked is None:
                return None
            header, size = peeked
            summary = summaries.load(
                self.directory, seq, size, zlib.crc32(header), Build, lazy=True
            )
            if summary is None:
                return None
            data = None
            if summary.others or summary.fanouts:
                data = _read(self.directory, seq)
                if (
                    len(data) != size
                    or not _intact_at(data, summary.others)
                    or not _intact_at(data, summary.fanouts)
                ):
                    log.warning("segment %d: a record its summary names is damaged", seq)
                    return None  # walked, as without a summary
                if summary.fanouts:
                    _place_fanouts(summary, data)
            found[seq] = (summary, data)
            return size

        for seq, data, records, result in lg.scan(summarised):
            if cancelled is not None and cancelled():
                raise RecoveryCancelled(f"recovery of {self.directory} was cancelled")
            if data is None:
                summary, data = found.pop(seq)
                self.summarised += 1
            else:
                summary = summarise(data, records)
                self.walked += 1
                if seq != newest and result.error is None and result.end == len(data):
                    _write_summary(self.directory, seq, data, summary)
            if seq == newest:
                self.last = (seq, summary.copy())
            self.apply(seq, summary, data)

    def apply(self, seq: int, summary: Summary, data: bytes | None) -> None:
        """Step 2 for one segment: its Builds, then its other records in order."""
        known = self.known
        if summary.top_mid >= self.next_mid:
            self.next_mid = summary.top_mid + 1
        cur: dict[int, Build] = {
            qid: cols  # type: ignore[misc]
            for qid, cols in summary.queues.items()
            if qid in known and cols.mids
        }
        if any(not b.ordered for b in cur.values()) and summary.others:
            assert data is not None
            self.live[seq] = self._replay(seq, cur, summary.others, data)
            return
        self.builds[seq] = cur
        # A summary's one size times the count, where it gave one (10M additions less).
        seg_live = sum(b.uniform * len(b.sizes) or sum(b.sizes) for b in cur.values())
        for off in summary.others:
            assert data is not None
            seg_live -= self._settle(seq, data, off, off)
        self.live[seq] = seg_live

    def _replay(self, seq: int, cols: dict[int, Build], others: array, data: bytes) -> int:
        """Apply a segment's records strictly in file order (a segment holding
        compaction copies, whose ids do not rise with offsets)."""
        events: list[tuple[int, int, int, int, int]] = []
        for qid, b in cols.items():
            n = len(b.mids)
            events.extend(zip(b.offs, [0] * n, [qid] * n, b.mids, b.sizes, strict=True))
        events.extend((off, 1, 0, 0, 0) for off in others)
        events.sort()
        cur: dict[int, Build] = {}
        self.builds[seq] = cur
        seg_live = 0
        for off, kind, qid, mid, size in events:
            if kind == 0:
                got = cur.get(qid)
                if got is None:
                    got = cur[qid] = Build()
                got.note(mid, off, size)
                seg_live += size
            else:
                seg_live -= self._settle(seq, data, off, -1)
        return seg_live

    def _settle(self, seq: int, data: bytes, off: int, before: int) -> int:
        """One ACK, DELIVERED, REFS or PURGE record of segment `seq`. Returns the
        bytes it freed in `seq` itself (freed bytes of older segments are taken off
        their live counts here)."""
        rtype = data[off + PREFIX_SIZE]
        at = off + IDS_AT
        if rtype == REFS:
            qid, target, n = REFS_IDS.unpack_from(data, at)
            start = off + REFS_AT
            mids = array("Q", data[start : start + 8 * n])
            if BIG_ENDIAN:
                mids.byteswap()
            top = max(mids, default=0)
            if top >= self.next_mid:
                self.next_mid = top + 1
            b = self._target(seq, qid, target)
            if b is None:
                return 0
            kind = data[off + PREFIX_SIZE + 1]
            return self._freed(seq, target, b.settle(kind, mids, before if target == seq else -1))
        if rtype == PURGE:
            qid, lo, hi, targets = purge_fields(data, off)
            freed = 0
            for target in targets:
                b = self._target(seq, qid, target)
                if b is not None:
                    cut = b.kill_range(lo, hi, before if target == seq else -1)
                    freed += self._freed(seq, target, cut)
            return freed
        qid, mid, target = REF_IDS.unpack_from(data, at)
        if mid >= self.next_mid:
            self.next_mid = mid + 1
        b = self._target(seq, qid, target)
        if b is None:
            return 0
        bound = before if target == seq else -1
        if rtype == DELIVERED and RECORD_PREFIX.unpack_from(data, off)[0] > REF_BODY.size:
            count = REF_COUNT.unpack_from(data, off + PREFIX_SIZE + REF_BODY.size)[0]
            known = self.counts.get(mid)
            if (known is None or known[2] < count) and b.find(mid, bound) >= 0:
                self.counts[mid] = (qid, target, count)
        return self._freed(seq, target, b.settle(rtype, (mid,), bound))

    def live_counts(self) -> dict[int, tuple[int, int]]:
        """The delivery counts of messages still queued (message id -> (queue id, count)):
        a count recorded for a message that was acked since is left out."""
        kept: dict[int, tuple[int, int]] = {}
        for mid, (qid, target, count) in self.counts.items():
            b = self.builds.get(target, {}).get(qid)
            i = b.find(mid) if b is not None else -1
            if i >= 0 and b.sizes[i]:  # type: ignore[union-attr]
                kept[mid] = (qid, count)
        return kept

    def _target(self, seq: int, qid: int, target: int) -> Build | None:
        """A record of segment `seq` settles queue `qid`'s messages in `target`: note
        that `seq` pins `target`, and return the Build it settles, if that segment
        is still there."""
        if target != seq:
            self.deps.setdefault(seq, set()).add(target)
        tb = self.builds.get(target)
        return tb.get(qid) if tb is not None else None

    def _freed(self, seq: int, target: int, freed: int) -> int:
        if target == seq:
            return freed
        self.live[target] -= freed
        return 0


def assemble(paged: PagedIndex, parts: list[tuple[int, Build]], live: dict[int, int]) -> None:
    """Fill a queue's paged tail from its recovered columns, in publish order.

    Segments hold a queue's records in id order unless compaction copied some
    (then a copy and, after a crash, its original may both be on disk): only
    then are the ids sorted, keeping the newest copy of each message.
    """
    parts.sort(key=lambda p: p[0])
    last = 0
    ordered = True
    for _seq, b in parts:
        if not b.ordered or (b.mids and b.mids[0] <= last):
            ordered = False
            break
        if b.mids:
            last = b.mids[-1]
    if ordered:
        for seq, b in parts:
            paged.append_run(live_run(seq, b.offs, b.sizes, b.full_flags(), b.dead))
        return
    rows = []
    for seq, b in parts:
        flags = b.full_flags()
        for i, mid in enumerate(b.mids):
            rows.append((mid, seq, b.offs[i], b.sizes[i], flags[i] if flags is not None else 0))
    rows.sort()
    n = len(rows)
    for k, (mid, seq, off, size, flag) in enumerate(rows):
        if k + 1 < n and rows[k + 1][0] == mid:
            # An older copy: the newer one decides; this record is no longer live.
            if size:
                live[seq] -= size
            nxt = rows[k + 1]
            rows[k + 1] = (mid, nxt[1], nxt[2], nxt[3], nxt[4] | flag)
            continue
        if size:
            paged.append(seq, off, size, flag)


# ---- files ------------------------------------------------------------------------------


def _read(directory: str, seq: int) -> bytes:
    with open(segment_path(directory, seq), "rb") as f:
        return f.read()


def _intact_at(data: bytes, offsets: array) -> bool:
    """Every record at these offsets is whole and matches its CRC."""
    view = memoryview(data)
    try:
        for off in offsets:
            if off + PREFIX_SIZE > len(data):
                return False
            size = PREFIX_SIZE + RECORD_PREFIX.unpack_from(data, off)[0]
            if not intact(view[off : off + size], size):
                return False
        return True
    finally:
        view.release()


def _write_summary(directory: str, seq: int, data: bytes, summary: Summary) -> None:
    """After walking a sealed segment, save its summary so the next recovery need
    not walk it. The segment is synced first: a summary never outlives its data."""
    path = segment_path(directory, seq)
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        parts = summaries.encode(seq, len(data), zlib.crc32(data[:HEADER_SIZE]), summary)
        summaries.write_file(summaries.summary_path(directory, seq), parts)
    except OSError as exc:
        log.warning("summary of segment %d not written (%s)", seq, exc)


def _drop_orphans(directory: str, seqs: set[int]) -> None:
    """Summaries whose segment is gone (a crash between the two unlinks)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    for name in names:
        if name.endswith(".sum") and name[:-4].isdigit() and int(name[:-4]) not in seqs:
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass
