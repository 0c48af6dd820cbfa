"""Reclaiming disk: deleting dead segments and compacting mostly-dead ones.

A mixin of MessageStore, split out because it is the one part of the store
that goes back over what was written: it decides when a segment file can go
(no live message in it, and no segment whose PUBLISHes its ACKs cancel still
exists, or a crash would bring acked messages back) and, for a segment that is
mostly dead, copies the few live records into the active segment and updates
whoever holds them (a queue's Location in place, a paged tail's positions, a
delay queue's index). The rest of the store only tells it which segments to
look at (`_candidates`, `_reclaim`) and which depend on which (`_add_dep`).

What runs per message is `_reclaim`'s first test (an ack in an older segment
asks for a reclaim; it returns at once while one is running) and `_add_dep`;
the rest runs once per segment.
"""

from __future__ import annotations

import logging
import struct
import zlib
from typing import TYPE_CHECKING, Any

from leveret.store.paged_index import REDELIVERED, TRANSIENT
from leveret.store.records import (
    DELIVERED,
    FANOUT,
    FLAG_TRANSIENT,
    IDS_AT,
    PUB_HEAD,
    PUB_IDS,
    PUBLISH,
    PURGE,
    REF_IDS,
    REFS,
    REFS_IDS,
    fanout_qids,
    purge_fields,
)
from leveret.store.segments import (
    HEADER_SIZE,
    PREFIX_SIZE,
    RECORD_PREFIX,
    ScanResult,
    iter_records,
)

if TYPE_CHECKING:
    from leveret.store.delay_queue import DelayQueues
    from leveret.store.locations import Location
    from leveret.store.paged_index import PagedIndex
    from leveret.store.segments import SegmentLog
    from leveret.store.summaries import Summary

log = logging.getLogger("leveret.store")

# Recent segments are not compacted: with consumers keeping up, their stragglers are
# acked moments later and the whole file is simply deleted, with nothing copied.
COMPACT_GRACE = 2

_PAGED = 0  # compaction's tag for a PUBLISH kept in a paged tail (not a record type)
_DELAYED = -1  # compaction's tag for a PUBLISH pending in a delay queue


def _live_slots_only(record: memoryview, holders: list[tuple[int, Any]]) -> memoryview | bytes:
    """A FANOUT record as compaction copies it: slots whose queue let go are set to
    queue id 0 (never assigned), because the ACKs or PURGE that cancelled them name
    the old segment, not the copy; a scan would otherwise bring them back."""
    kept = {h.queue_id if kind == PUBLISH else h[0] for kind, h in holders}
    _first, qids = fanout_qids(record)
    if len(kept) == len(qids):
        return record
    out = bytearray(record)
    struct.pack_into(f"<{len(qids)}I", out, PUB_HEAD, *(q if q in kept else 0 for q in qids))
    RECORD_PREFIX.pack_into(out, 0, len(out) - PREFIX_SIZE, zlib.crc32(out[PREFIX_SIZE:]))
    return out


class Compaction:
    """Segment deletion and compaction; `self` is a MessageStore (its state is
    declared below; `_append_ref` and `_write_count` are MessageStore's)."""

    compact_ratio: float
    delays: DelayQueues
    _log: SegmentLog | None
    _active: int
    _index: dict[int, Location]
    _paged: dict[int, PagedIndex]
    _live: dict[int, int]
    _deps: dict[int, set[int]]
    _dependents: dict[int, set[int]]
    _attempts: dict[int, tuple[int, int, float]]
    _candidates: list[int]
    _reclaiming: bool
    _reclaim_enabled: bool
    _counts: dict[int, tuple[int, int]]
    _sealing: Summary

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

        Live PUBLISHes move: a Location a queue holds is updated in place, and a
        paged tail's positions are relocated. ACK/DELIVERED records whose target
        segment still exists move too. Gives up if that would copy more than
        compact_ratio of the segment, and then does not read the segment again
        until it could fit: until its live bytes have fallen by what was over the
        budget, or a segment it refers to was deleted (which frees its ACK records).
        Batched ACK records (REFS) are not live bytes, so a segment can hold few live
        messages and still too much to copy; retrying at every ack would re-read it
        each time (16 MB per ack, most of the time of S9's drain,
        docs/benchmarks.md#s9).
        """
        lg = self._log
        assert lg is not None
        size = lg.size_of(seq)
        live_now, deps_now = self._live.get(seq, 0), len(self._deps.get(seq, ()))
        tried = self._attempts.get(seq)
        if tried is not None and tried[1] == deps_now and tried[0] - live_now < tried[2]:
            return
        if self.delays.held(seq):
            return
        data = lg.read_segment(seq)
        budget = self.compact_ratio * size
        over = False  # past the budget: only the total is counted from here on
        index = self._index
        paged = self._paged
        exists = lg.exists
        # (record type, offset, end, Location | (queue id, message id, flags) | target)
        moves: list[tuple[int, int, int, Any]] = []
        total = 0
        soon = self.delays.soon()  # delay records due before this are about to go anyway
        near = 0
        result = ScanResult()
        for off, end, rtype, _flags in iter_records(data, HEADER_SIZE, result):
            if rtype == PUBLISH:
                qid, mid = PUB_IDS.unpack_from(data, off + IDS_AT)
                if qid in self.delays.by_qid:
                    due = self.delays.live_at(qid, seq, off, data)
                    if due is None:
                        continue
                    total += end - off
                    if due < soon:
                        near += end - off
                    if not over:
                        moves.append((_DELAYED, off, end, (qid, due)))
                        over = total > budget
                    continue
                holder = self._holder(seq, off, qid, mid)
                if holder is None:
                    continue
                moves.append((holder[0], off, end, holder[1]))
            elif rtype == FANOUT:
                first, qids = fanout_qids(data, off)
                holders = [
                    h
                    for k, qid in enumerate(qids)
                    if qid and (h := self._holder(seq, off, qid, first + k)) is not None
                ]
                if not holders:
                    continue
                moves.append((FANOUT, off, end, holders))
            elif rtype == REFS:
                target = REFS_IDS.unpack_from(data, off + IDS_AT)[1]
                if target == seq or not exists(target):
                    continue
                moves.append((REFS, off, end, target))
            elif rtype == PURGE:
                targets = [t for t in purge_fields(data, off)[3] if t != seq and exists(t)]
                if not targets:
                    continue
                moves.append((PURGE, off, end, targets))
            else:
                _qid, mid, target = REF_IDS.unpack_from(data, off + IDS_AT)
                if target == seq or not exists(target):
                    continue
                if rtype == DELIVERED:
                    loc = index.get(mid)
                    # A message no Location names may be in a paged tail: keep its record.
                    if loc is not None and loc.segment != target:
                        continue
                moves.append((rtype, off, end, target))
            total += end - off
            if over or total > budget:
                over = True
                moves.clear()  # not needed past the budget: the scan only counts on
        if result.error is not None:
            log.error(
                "segment %d: %s at %d during compaction; left as is", seq, result.error, result.end
            )
            self._attempts[seq] = (live_now, deps_now, float("inf"))
            return
        if over:
            self._attempts[seq] = (live_now, deps_now, total - budget)
            return
        if near * 2 > total:
            # Mostly delayed messages due in seconds: they will free the segment
            # themselves, and a copy read back before it is written stalls the loop.
            self.delays.hold(seq)
            return
        view = memoryview(data)
        live = self._live
        relocated: dict[int, dict[int, tuple[int, int]]] = {}
        for rtype, off, end, what in moves:
            n = end - off
            record = view[off:end] if rtype != FANOUT else _live_slots_only(view[off:end], what)
            new_seq, new_off = lg.reserve(n)
            self._note_copy(record, new_off, n)  # for the segment's summary
            lg.write_at(new_seq, new_off, (record,))  # type: ignore[arg-type]
            if new_seq != self._active:
                self._rolled(new_seq)
            if rtype == _DELAYED:
                live[seq] -= n
                live[new_seq] = live.get(new_seq, 0) + n
                self.delays.moved(what[0], what[1], seq, off, new_seq, new_off)
            elif rtype == PUBLISH or rtype == _PAGED or rtype == FANOUT:
                # One copy of the record; every queue holding it follows it there.
                for kind, holder in what if rtype == FANOUT else ((rtype, what),):
                    live[seq] -= n
                    live[new_seq] = live.get(new_seq, 0) + n
                    if kind == PUBLISH:
                        holder.segment = new_seq
                        holder.offset = new_off
                        qid, mid = holder.queue_id, holder.msg_id
                        if holder.redelivered:
                            self._append_ref(DELIVERED, qid, mid, new_seq)
                    else:
                        qid, mid, flag = holder
                        relocated.setdefault(qid, {})[off] = (new_seq, new_off)
                        if flag & REDELIVERED and not flag & TRANSIENT:
                            self._append_ref(DELIVERED, qid, mid, new_seq)
                    if self._counts and mid in self._counts:
                        self._write_count(qid, mid, new_seq, self._counts[mid][1])
            elif rtype == PURGE:
                for target in what:
                    if target != new_seq:
                        self._add_dep(new_seq, target)
            elif new_seq != what:
                self._add_dep(new_seq, what)
        for qid, moved in relocated.items():
            paged[qid].relocate(seq, moved)
        self._retire(seq)
        log.debug("compacted segment %d: moved %d records (%d bytes)", seq, len(moves), total)

    def _note_copy(self, record: memoryview | bytes, off: int, size: int) -> None:
        """A record compaction copied into the active segment, for its summary (the
        same facts a walk would find in it)."""
        sealing = self._sealing
        rtype = record[PREFIX_SIZE]
        if rtype == PUBLISH:
            if not record[PREFIX_SIZE + 1] & FLAG_TRANSIENT:
                qid, mid = PUB_IDS.unpack_from(record, IDS_AT)
                sealing.columns(qid).note(mid, off, size)
        elif rtype == FANOUT:
            sealing.fanouts.append(off)
        else:
            sealing.others.append(off)

    def _holder(self, seq: int, off: int, qid: int, mid: int) -> tuple[int, Any] | None:
        """Who still holds queue `qid`'s copy (message `mid`) of the record at (seq,
        off): (PUBLISH, its Location), (_PAGED, (qid, mid, flags)) for a paged
        tail, or None when the copy is gone."""
        loc = self._index.get(mid)
        if loc is not None and loc.segment == seq and loc.offset == off:
            return PUBLISH, loc
        tail = self._paged.get(qid)
        found = tail.find(seq, off) if tail is not None else -1
        if found < 0:
            return None
        return _PAGED, (qid, mid, found & 0xFF)
