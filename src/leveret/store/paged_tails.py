"""The store's side of paged tails: writing a message as a position, reading positions back.

A mixin of MessageStore, split out because a long queue's tail is its own way
of keeping messages: not a Location per message but positions in a PagedIndex
(store/paged_index.py, which knows nothing of files), so it has its own write
(`publish_paged`), its own read (`take_paged`: stretches of a segment in one
pread each, CRC-checked, turned into Locations), its own purge (`drop_paged`:
one PURGE record for the whole tail) and its own handling of a record that rots
on disk (`_drop_corrupt`). The delay queues read their records through
`_read_positions` too.

`publish_paged` is on the publish path of a queue that pages; as a method of the
store (this mixin) it costs one method call on the store, nothing more per message.
"""

from __future__ import annotations

import logging
import struct
import zlib
from array import array
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from leveret.store.locations import Location, TransientLocation, intern_size, split_publish
from leveret.store.paged_index import REDELIVERED, TRANSIENT, PagedIndex, Run
from leveret.store.records import (
    IDS_AT,
    PUB_HEAD,
    PUB_IDS,
    PUBLISH,
    PURGE,
    PURGE_BODY,
    intact,
    record_extra,
    record_mid,
)
from leveret.store.segments import PREFIX_SIZE, RECORD_PREFIX

if TYPE_CHECKING:
    from leveret.store.committer import OnDurable
    from leveret.store.queue_ids import QueueIds, QueueKey
    from leveret.store.segments import SegmentLog
    from leveret.store.summaries import Summary

log = logging.getLogger("leveret.store")

READ_SPAN = 4 * 1024 * 1024  # most bytes take_paged reads at once
# Most bytes of other records take_paged reads through to reach the next one of the
# queue's; past that each is read on its own. About what one pread call costs in
# copying: many long queues filled in turn put each queue's records a whole round of
# other queues' records apart, and reading the stretches whole would read the log once
# per queue (S9, docs/benchmarks.md#s9, 1,000 queues: hundreds of GB read to drain
# 10,000,000 messages of 16 B).
READ_GAP = 16 * 1024


class PagedTails:
    """Paged-tail operations; `self` is a MessageStore (its state is declared
    below; `queue_id`, `_write_publish` and `_forget_counts` are MessageStore's,
    `_rolled`, `_add_dep` and `_reclaim` Compaction's)."""

    _log: SegmentLog | None
    _queues: QueueIds
    _index: dict[int, Location]
    _paged: dict[int, PagedIndex]
    _live: dict[int, int]
    _candidates: list[int]
    _active: int
    _next_mid: int
    _sealing: Summary

    def paged_index(self, key: QueueKey, exact: bool = False) -> PagedIndex:
        """The queue's paged tail, created empty on first use; `exact`: one that
        counts its bodies' bytes exactly (see PagedIndex)."""
        qid = self.queue_id(key)
        paged = self._paged.get(qid)
        if paged is None:
            paged = self._paged[qid] = PagedIndex(qid, PUB_HEAD, exact)
        elif exact and not paged.exact:
            self.make_exact(paged)
        return paged

    def make_exact(self, paged: PagedIndex) -> None:
        """Let a tail count its bodies' bytes exactly: what each record holds beyond
        its body is read from the record's fixed part (reading the tail's records
        once, in stretches; for queues with x-max-length-bytes only)."""
        if paged.exact:
            return

        def extras_of(run: Run) -> array:
            extras = array("I", bytes(4 * run.start))
            a = run.start
            for _k, _off, size, record in self._read_positions(
                run.seq, run.offs[a:], run.sizes[a:]
            ):
                extras.append(record_extra(record, size))
            return extras

        paged.make_exact(extras_of)

    def publish_paged(
        self,
        paged: PagedIndex,
        header: bytes,
        body: bytes,
        on_durable: OnDurable | None = None,
        *,
        transient: bool = False,
        stamp: float = 0.0,
    ) -> None:
        """publish() for a message the queue keeps as its position only: nothing but
        the position (and `stamp`, if not 0) is kept in RAM (no Location, no index
        entry)."""
        seq, off, size, _mid = self._write_publish(paged.qid, header, body, on_durable, transient)
        paged.append(seq, off, size, TRANSIENT if transient else 0, stamp, len(header))

    def take_paged(self, paged: PagedIndex, limit: int, stamped: bool = False) -> list[Any]:
        """Up to `limit` messages from the front of a paged tail: held entries as they
        went in, positions read back as (Location, header, body), CRC-checked, or
        with `stamped` as (Location, header, body, stamp). The Locations are then
        held by the queue, like those publish() returns."""
        out: list[Any] = []
        index = self._index
        for item in paged.popleft(limit):
            if type(item) is not tuple:
                out.append(item)
                continue
            seq, offs, sizes, flags, stamps = item
            for k, off, size, record in self._read_positions(seq, offs, sizes):
                if not intact(record, size):
                    self._drop_corrupt(paged.qid, seq, off, size)
                    continue
                if record[PREFIX_SIZE] == PUBLISH:
                    qid, mid = PUB_IDS.unpack_from(record, IDS_AT)
                else:
                    qid = paged.qid
                    mid = record_mid(record, qid)
                flag = flags[k] if flags is not None else 0
                cls = TransientLocation if flag & TRANSIENT else Location
                loc = cls(seq, off, intern_size(size), qid, mid)
                if flag & REDELIVERED:
                    loc.redelivered = True
                index[mid] = loc
                header, body = split_publish(record, loc, check=False)
                if stamped:
                    out.append((loc, header, body, stamps[k] if stamps is not None else 0.0))
                else:
                    out.append((loc, header, body))
        return out

    def _drop_corrupt(self, qid: int, seq: int, off: int, size: int) -> None:
        """A paged record failed its CRC on the way back (bit rot since it was written):
        it cannot be delivered, so it is dropped with an error in the log, and the
        queue goes on with the next message instead of failing every read."""
        key = next((k for k, v in self._queues.ids.items() if v == qid), None)
        log.error(
            "stored message at segment %d offset %d (%d bytes) of queue %s is corrupt "
            "(CRC mismatch); dropped",
            seq,
            off,
            size,
            f"'{key[1]}' in vhost '{key[0]}'" if key else qid,
        )
        self._live[seq] -= size
        self._candidates.append(seq)

    def drop_paged(self, paged: PagedIndex) -> list[Any]:
        """Free every position of a paged tail (purge); returns its held entries.

        One PURGE record makes it durable: from the first position's id (read from
        its record) to the newest id given out."""
        held, runs = paged.clear()
        if runs:
            lg = self._log
            assert lg is not None
            first = runs[0]
            lo = record_mid(
                lg.read(first.seq, first.offs[first.start], first.sizes[first.start]), paged.qid
            )
            targets = sorted({run.seq for run in runs})
            self._forget_counts(paged.qid, lo, self._next_mid - 1)
            # Their bytes are dead from here: a reclaim that the append below may start
            # (by rolling the log) must see them so, since the tail no longer names them.
            freed = self._free_runs(runs)
            body = PURGE_BODY.pack(PURGE, 0, paged.qid, lo, self._next_mid - 1, len(targets))
            body += struct.pack(f"<{len(targets)}Q", *targets)
            seq, off = lg.reserve(PREFIX_SIZE + len(body))
            self._sealing.others.append(off)  # for the segment's summary
            lg.write_at(seq, off, (RECORD_PREFIX.pack(len(body), zlib.crc32(body)), body))
            if seq != self._active:
                self._rolled(seq)
            for target in targets:
                if target != seq and lg.exists(target):
                    self._add_dep(seq, target)
            self._candidates.extend(freed)
            self._reclaim()
        return held

    def _free_runs(self, runs: list[Run]) -> set[int]:
        live = self._live
        touched = set()
        for run in runs:
            live[run.seq] -= sum(run.sizes[run.start :])
            touched.add(run.seq)
        return touched

    def _read_positions(
        self, seq: int, offs: array, sizes: array
    ) -> Iterator[tuple[int, int, int, memoryview]]:
        """(k, offset, size, record) for positions at rising offsets in one segment;
        each stretch of up to READ_SPAN bytes with gaps of at most READ_GAP between
        its records is read with one pread."""
        lg = self._log
        assert lg is not None
        n = len(offs)
        i = 0
        while i < n:
            start = offs[i]
            end = start + sizes[i]
            j = i + 1
            while j < n:
                at = offs[j]
                stop = at + sizes[j]
                if at - end > READ_GAP or stop - start > READ_SPAN:
                    break
                end = stop
                j += 1
            view = memoryview(lg.read(seq, start, end - start))
            for k in range(i, j):
                o = offs[k] - start
                yield k, offs[k], sizes[k], view[o : o + sizes[k]]
            i = j
