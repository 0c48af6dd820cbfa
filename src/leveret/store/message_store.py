"""Persistent message store: queue messages as records in a SegmentLog.

This module keeps what every message goes through (publish, the shared FANOUT
record and its slots, DELIVERED and delivery counts, ack, the batched REFS
records) and the store's lifecycle (prepare, recover, the clean-shutdown index,
close). Beside it, each its own piece:

- `locations`: what a queue holds of a stored message (`Location`, ...);
- `queue_ids`: `queues.idx`, queue key <-> the small id records carry;
- `paged_tails` (a mixin): a long queue's tail as positions, written and read back;
- `compaction` (a mixin): deleting dead segments, compacting mostly-dead ones;
- `records`: the record formats; `recovery`: the scan that rebuilds queues after a
  crash; `clean_index`, `summaries`: what lets a start skip that scan.

Message ids are assigned here, unique across the store and increasing, so sorting by id
gives publish order even after compaction moved records around. ACK/DELIVERED name the
segment of their PUBLISH so we know which segments they pin: a segment holding ACKs
may only go once the segment whose PUBLISHes they cancel is gone (otherwise a crash
would resurrect acked messages). Queue ids live in a small side file, `queues.idx`
(`queue_ids`); purging a queue gives it a fresh id, which cancels every old record
at once without writing a tombstone per message.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import zlib
from array import array
from collections.abc import Callable, Iterator
from typing import Any

from leveret.store import clean_index, summaries
from leveret.store.committer import GroupCommitter, OnDurable, segment_path
from leveret.store.compaction import Compaction
from leveret.store.delay_queue import DelayQueues, is_delay_key
from leveret.store.locations import (
    Location,
    SharedRecord,
    TransientLocation,
    intern_size,
    split_publish,
)
from leveret.store.paged_index import REDELIVERED, PagedIndex, Run
from leveret.store.paged_tails import PagedTails
from leveret.store.queue_ids import QueueIds, QueueKey
from leveret.store.records import (
    ACK,
    BIG_ENDIAN,
    DELIVERED,
    FANOUT,
    FLAG_TRANSIENT,
    PUB_FIXED,
    PUB_HEAD,
    PUBLISH,
    REF_BODY,
    REF_COUNT,
    REFS,
    REFS_BODY,
    REFS_MAX,
)
from leveret.store.recovery import Build, RecoveryCancelled, Scan, assemble
from leveret.store.segments import (
    DEFAULT_SEGMENT_SIZE,
    PREFIX_SIZE,
    RECORD_PREFIX,
    SegmentLog,
)
from leveret.store.summaries import Columns, Summary

log = logging.getLogger("leveret.store")


def _msg_id(loc: Location) -> int:
    return loc.msg_id


# RecoveryCancelled: the server catches it from here (server/listener.py).
__all__ = ["Location", "MessageStore", "QueueKey", "RecoveryCancelled"]


# ---- the store ---------------------------------------------------------------------------


class MessageStore(PagedTails, Compaction):
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
        # Message id -> Location of live messages the queues hold as objects. A long
        # queue's paged tail is not here: it is a PagedIndex (compact positions).
        self._index: dict[int, Location] = {}
        self._paged: dict[int, PagedIndex] = {}  # queue id -> its paged tail
        self._live: dict[int, int] = {}  # segment -> live PUBLISH bytes
        self._deps: dict[int, set[int]] = {}  # segment -> segments its ACKs/DELIVEREDs refer to
        self._dependents: dict[int, set[int]] = {}  # reverse of _deps
        # Fruitless compactions: seq -> (live bytes, dependencies, bytes over budget)
        self._attempts: dict[int, tuple[int, int, float]] = {}
        self._candidates: list[int] = []
        self._reclaiming = False
        self._reclaim_enabled = True
        self._active = 0
        self._next_mid = 1
        self._clean_path = os.path.join(self.directory, "clean.idx")
        self._delays_path = os.path.join(self.directory, "delays.idx")  # beside clean.idx
        # How the last recovery learnt each segment (for logs, tests and benchmarks).
        self.recovered_from: dict[str, int] = {}
        self._recovered = False
        # (ACK or DELIVERED, queue id, target segment) -> message ids, until the flush
        self._refs: dict[tuple[int, int, int], array] = {}
        # Delivery counts of quorum queues' messages that were returned and redelivered:
        # message id -> (queue id, count). Only those (few) are here; see `note_count`.
        self._counts: dict[int, tuple[int, int]] = {}
        # What the active segment holds, noted as records are appended: written as
        # the segment's summary when it is sealed (see `summaries`). False while it
        # misses records appended before this process (then no summary is written).
        self._sealing = Summary()
        self._sealing_whole = True
        # Delayed exchanges' pending messages, ordered by due time (store.delay_queue).
        self.delays = DelayQueues(self)

    # ---- lifecycle -------------------------------------------------------------------

    def open(self) -> dict[QueueKey, list[Location]]:
        """Replay the log; return every queue's live messages as Locations, in order.

        Meant for tools and tests: it reads every record. The broker uses
        `open_paged`, which keeps a long queue as compact positions.
        """
        return {
            key: [item[0] for item in self.take_paged(paged, len(paged))]
            for key, paged in self.open_paged().items()
            if not is_delay_key(key)
        }

    def open_paged(self) -> dict[QueueKey, PagedIndex]:
        """Replay the log; return every queue's live messages, in publish order, as its
        paged tail (positions only: `take_paged` reads them back)."""
        self.prepare()
        result = self.recover()
        self.finish_recovery()
        return result

    def prepare(self) -> None:
        """The part of opening whose cost does not grow with what is queued: the queue
        ids, the writer thread, and the format check. A data dir that this build cannot
        read is refused here, before the broker listens."""
        os.makedirs(self.directory, exist_ok=True)
        self._queues.load()
        self.committer = GroupCommitter(self.directory, self.fsync, self.loop)
        self._log = SegmentLog(
            self.directory, self.committer, self.segment_size, on_resync=self._on_resync
        )
        self._log.before_flush = self._write_refs
        self._log.on_seal = self._seal
        self._log.check_format()

    def recover(self, cancelled: Callable[[], bool] | None = None) -> dict[QueueKey, PagedIndex]:
        """Rebuild every queue's positions, from the clean-shutdown index or by a scan.
        A delay queue's key gets its DelayIndex (store.delay_queue), not a PagedIndex.

        The broker runs this in a worker thread while it already listens: until
        `finish_recovery`, nothing else may call the store (the server holds every
        client operation back), so it needs no lock. `cancelled` is asked between
        segments; when it says yes, RecoveryCancelled ends the scan, and `close` then
        writes no clean-shutdown index, so the next start scans again.
        """
        lg = self._log
        assert lg is not None, "prepare() first"
        saved = self.delays.take_saved(self._delays_path)
        clean = clean_index.take(self._clean_path)
        if clean is not None:
            if lg.adopt(clean.sizes, clean.last_crc):
                if saved is not None and saved[:2] != (clean.next_mid, clean.last_crc):
                    saved = None  # not written with this index
                return self._open_clean(clean, saved[2] if saved is not None else None)
            log.warning("clean-shutdown index does not match the segment files; scanning")
        scan = Scan(lg, self._queues.keys, self._live)  # type: ignore[arg-type]
        scan.run(cancelled)
        self._next_mid = scan.next_mid
        live = self._live
        for seq in lg.segment_sizes():
            live.setdefault(seq, 0)
        result: dict[QueueKey, PagedIndex] = {}
        count = 0
        per_queue: dict[int, list[tuple[int, Build]]] = {}
        for seq, cur in scan.builds.items():
            for qid, b in cur.items():
                per_queue.setdefault(qid, []).append((seq, b))
        self._counts = scan.live_counts()
        for qid, key in self._queues.keys.items():
            paged = self._paged[qid] = PagedIndex(qid, PUB_HEAD)
            assemble(paged, per_queue.get(qid, []), live)
            count += len(paged)
            result[key] = paged
        del per_queue
        scan.builds.clear()
        for seq, targets in scan.deps.items():
            for t in targets:
                if lg.exists(t):
                    self._add_dep(seq, t)
        self._active = lg.active
        self._seed_summary(scan.last)
        self.recovered_from = {"summaries": scan.summarised, "walked": scan.walked}
        self._candidates.extend(s for s in lg.segment_sizes() if s != lg.active)
        self.delays.restore(result)
        log.info(
            "message store %s: recovered %d messages in %d queues from %d segments "
            "(%d from their summaries, %d walked)",
            self.directory,
            count,
            len(result),
            len(lg.segment_sizes()),
            scan.summarised,
            scan.walked,
        )
        return result

    def _open_clean(
        self, clean: clean_index.CleanIndex, saved_delays: dict[int, Any] | None = None
    ) -> dict[QueueKey, PagedIndex]:
        """open_paged() from a clean-shutdown index: no record is read."""
        lg = self._log
        assert lg is not None
        live = self._live
        for seq in clean.sizes:
            live[seq] = 0
        result: dict[QueueKey, PagedIndex] = {}
        count = 0
        for qid, key in self._queues.keys.items():
            paged = self._paged[qid] = PagedIndex(qid, PUB_HEAD)
            for seq, offs, sizes, flags in clean.queues.get(qid, ()):
                paged.append_run(Run(seq, offs, sizes, flags))
                live[seq] += sum(sizes)
            count += len(paged)
            result[key] = paged
        self._next_mid = clean.next_mid
        self._counts = dict(clean.counts)
        for seq, target in clean.deps:
            if lg.exists(seq) and lg.exists(target):
                self._add_dep(seq, target)
        self._active = lg.active
        found = None
        if lg.active and lg.active_header is not None:
            loaded = summaries.load(
                self.directory,
                lg.active,
                lg.size_of(lg.active),
                zlib.crc32(lg.active_header),
                Columns,
            )
            if loaded is not None:
                found = (lg.active, loaded)
        self._seed_summary(found)
        self._candidates.extend(s for s in lg.segment_sizes() if s != lg.active)
        self.delays.restore(result, saved_delays)
        log.info(
            "message store %s: %d messages in %d queues from the clean-shutdown index",
            self.directory,
            count,
            len(result),
        )
        return result

    def finish_recovery(self) -> None:
        """Back on the loop after `recover`: the store is in use from here on."""
        self._recovered = True
        self._reclaim()

    def _save_clean(self) -> None:
        """Write the clean-shutdown index (after everything is written and synced).

        Per queue, in order: the messages held as Locations (head, unacked), then
        its paged tail; a held entry of the tail keeps its place. Transient records
        are left out, as a scan would.
        """
        lg = self._log
        assert lg is not None
        objects: dict[int, list[Location]] = {}
        for loc in self._index.values():
            if not loc.transient:
                objects.setdefault(loc.queue_id, []).append(loc)
        queues: dict[int, list[clean_index.Run]] = {}
        for qid in self._queues.keys:
            paged = self._paged.get(qid)
            tail = paged.export() if paged is not None else []
            held = {id(item) for item in tail if type(item) is Location}
            front = PagedIndex(qid)
            for loc in sorted(objects.get(qid, ()), key=_msg_id):
                if id(loc) not in held:
                    front.append(loc.segment, loc.offset, loc.size, REDELIVERED * loc.redelivered)
            runs = [(r.seq, r.offs, r.sizes, r.flags) for r in front.runs()]
            for item in tail:
                if type(item) is Location:
                    flags = bytearray((REDELIVERED * item.redelivered,))
                    runs.append(
                        (item.segment, array("I", (item.offset,)), array("I", (item.size,)), flags)
                    )
                else:
                    runs.append(item)
            if runs:
                queues[qid] = runs
        self.delays.put_back()  # messages taken but not acked yet are pending again
        queues.update(self.delays.export())  # positions only: due times are in the records
        deps = [(seq, t) for seq, targets in self._deps.items() for t in targets]
        sizes = lg.segment_sizes()
        if not sizes:
            return
        last_crc = clean_index.file_crc(segment_path(self.directory, max(sizes)))
        if self.delays.by_qid:
            self.delays.save(self._delays_path, self._next_mid, last_crc)
        index = clean_index.CleanIndex(
            self._next_mid, last_crc, sizes, deps, queues, dict(self._counts)
        )
        clean_index.write(self._clean_path, index)

    def flush(self, timeout: float | None = None) -> bool:
        """Block until everything submitted so far is written (and fsynced per mode)."""
        assert self.committer is not None
        if self._log is not None:
            self._log.flush_pending()
        return self.committer.drain(timeout)

    def close(self) -> None:
        """Write out what is pending, stop the writer thread, and save the clean-shutdown
        index (unless a write failed: then the next start scans)."""
        if self._log is not None:
            self._log.flush_pending()
        if self.committer is not None:
            self.committer.close()
            if (
                self._log is not None
                and self._recovered  # a half-done recovery knows only part of the log
                and self._reclaim_enabled
                and self.committer.generation == 0
                and self.committer.failed_from is None
            ):
                try:
                    self._save_clean()
                    self._save_active_summary()
                except OSError as exc:
                    log.error("clean-shutdown index not written (%s); the next start scans", exc)
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

    def queue_keys(self, vhost: str, name: str) -> list[QueueKey]:
        """The keys the store holds for a queue: its own and its priority levels'."""
        return self._queues.keys_of(vhost, name)

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
        self._forget_counts(qid)
        paged = self._paged.pop(qid, None)
        dropped = len(doomed)
        if paged is not None:
            dropped += len(paged)
            touched.update(self._free_runs(paged.clear()[1]))
        delayed = self.delays.by_qid.get(qid)
        if delayed is not None:
            dropped += len(delayed)
            touched.update(self.delays.free(qid))
        self._candidates.extend(touched)
        self._reclaim()
        return dropped

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
        seq, off, size, mid = self._write_publish(qid, header, body, on_durable, transient)
        loc = (TransientLocation if transient else Location)(seq, off, intern_size(size), qid, mid)
        self._index[mid] = loc
        return loc

    def _write_publish(
        self, qid: int, header: bytes, body: bytes, on_durable: OnDurable | None, transient: bool
    ) -> tuple[int, int, int, int]:
        """Append one PUBLISH record (hot path); (segment, offset, size, message id)."""
        mid = self._next_mid
        self._next_mid = mid + 1
        hlen = len(header)
        size = PUB_HEAD + hlen + len(body)
        fixed = PUB_FIXED.pack(PUBLISH, FLAG_TRANSIENT if transient else 0, qid, mid, hlen)
        crc = zlib.crc32(body, zlib.crc32(header, zlib.crc32(fixed)))
        lg = self._log
        assert lg is not None
        seq, off = lg.reserve(size)
        if not transient:
            # For the segment's summary: three appends, so that recovery after a
            # crash can load this segment's positions instead of walking its records.
            # (Between reserve and write_at: the write may flush, and the flush roll.)
            cols = self._sealing.queues.get(qid)
            if cols is None:
                cols = self._sealing.columns(qid)
            cols.mids.append(mid)
            cols.offs.append(off)
            cols.sizes.append(size)
        lg.write_at(
            seq, off, (RECORD_PREFIX.pack(size - PREFIX_SIZE, crc), fixed, header, body), on_durable
        )
        if seq != self._active:
            self._rolled(seq)
        self._live[seq] = self._live.get(seq, 0) + size
        return seq, off, size, mid

    def publish_shared(
        self,
        keys: list[QueueKey],
        header: bytes,
        body: bytes,
        on_durable: OnDurable | None = None,
    ) -> SharedRecord:
        """Append one FANOUT record: a persistent message for several durable queues,
        its body written (and fsynced) once. Every queue then holds a slot of it."""
        ids = self._queues.ids
        qids = [ids.get(key) or self._queues.assign(key) for key in keys]
        n = len(qids)
        first = self._next_mid
        self._next_mid = first + n
        hlen = len(header)
        fixed = PUB_FIXED.pack(FANOUT, 0, n, first, hlen)
        slots = struct.pack(f"<{n}I", *qids)
        size = PUB_HEAD + len(slots) + hlen + len(body)
        crc = zlib.crc32(body, zlib.crc32(header, zlib.crc32(slots, zlib.crc32(fixed))))
        lg = self._log
        assert lg is not None
        seq, off = lg.reserve(size)
        self._sealing.fanouts.append(off)  # for the segment's summary: one note for all
        parts = (RECORD_PREFIX.pack(size - PREFIX_SIZE, crc), fixed, slots, header, body)
        lg.write_at(seq, off, parts, on_durable)
        if seq != self._active:
            self._rolled(seq)
        # Each slot counts the whole record until its queue lets go of it.
        self._live[seq] = self._live.get(seq, 0) + size * n
        return SharedRecord(seq, off, intern_size(size), first, qids, len(slots) + hlen)

    def take_slot(self, shared: SharedRecord, k: int) -> Location:
        """Slot `k` of a FANOUT record, as the Location its queue holds."""
        loc = Location(shared.segment, shared.offset, shared.size, shared.qids[k], shared.first + k)
        self._index[loc.msg_id] = loc
        return loc

    def take_slot_paged(self, shared: SharedRecord, paged: PagedIndex, stamp: float = 0.0) -> None:
        """A slot of a FANOUT record, kept in its queue's paged tail."""
        paged.append(shared.segment, shared.offset, shared.size, 0, stamp, shared.extra)

    def release_slot(self, shared: SharedRecord, k: int) -> None:
        """Slot `k` that its queue did not take: acked at once, so no restart brings
        it back."""
        loc = Location(shared.segment, shared.offset, shared.size, shared.qids[k], shared.first + k)
        self._index[loc.msg_id] = loc
        self.ack(loc)

    def mark_delivered(self, loc: Location) -> None:
        """Record the first delivery so a restart re-sends the message as redelivered."""
        if loc.redelivered or loc.transient or loc.msg_id not in self._index:
            loc.redelivered = True
            return
        loc.redelivered = True
        self._append_ref(DELIVERED, loc.queue_id, loc.msg_id, loc.segment)

    def note_count(self, loc: Location, count: int) -> None:
        """A quorum queue's message goes out again: after a restart it is to count as
        delivered `count` times. One DELIVERED record with the count (not batched:
        this happens only to messages that were returned)."""
        mid = loc.msg_id
        if loc.transient or mid not in self._index:
            return
        known = self._counts.get(mid)
        if known is not None and known[1] >= count:
            return
        self._counts[mid] = (loc.queue_id, count)
        loc.redelivered = True
        self._write_count(loc.queue_id, mid, loc.segment, count)

    def delivery_count(self, loc: Location) -> int:
        """A message's delivery count as recovered (see `note_count`); 1 if it was
        delivered before, else 0."""
        known = self._counts.get(loc.msg_id)
        if known is not None:
            return known[1]
        return 1 if loc.redelivered else 0

    def _write_count(self, qid: int, mid: int, target: int, count: int) -> None:
        lg = self._log
        assert lg is not None
        body = REF_BODY.pack(DELIVERED, 0, qid, mid, target) + REF_COUNT.pack(count)
        seq, off = lg.reserve(PREFIX_SIZE + len(body))
        self._sealing.others.append(off)  # for the segment's summary
        lg.write_at(seq, off, (RECORD_PREFIX.pack(len(body), zlib.crc32(body)), body))
        if seq != self._active:
            self._rolled(seq)
        if seq != target and lg.exists(target):
            self._add_dep(seq, target)

    def _forget_counts(self, qid: int, lo: int = 0, hi: int = 1 << 64) -> None:
        """A queue's messages in [lo, hi] were dropped without a Location each."""
        if self._counts:
            self._counts = {
                mid: c for mid, c in self._counts.items() if c[0] != qid or not lo <= mid <= hi
            }

    def ack(self, loc: Location) -> None:
        """Remove a message (acked, rejected, expired, ...); unknown locations are ignored."""
        if self._index.pop(loc.msg_id, None) is None:
            return
        if self._counts:
            self._counts.pop(loc.msg_id, None)
        seq = loc.segment
        self._live[seq] -= loc.size
        if not loc.transient:
            self._append_ref(ACK, loc.queue_id, loc.msg_id, seq)
        if seq != self._active:
            self._candidates.append(seq)
            self._reclaim()

    remove = ack

    def read_body(self, loc: Location) -> tuple[bytes, bytes]:
        """(header bytes, body) of a stored message, CRC-checked."""
        assert self._log is not None
        data = self._log.read(loc.segment, loc.offset, loc.size)
        return split_publish(memoryview(data), loc, check=True)

    read = read_body

    # ACK and DELIVERED records are batched per loop turn (the hot path of persistent
    # messages writes two of them per message): `_append_ref` only notes the id, and
    # `_write_refs`, which the log runs at the start of every flush, writes one REFS
    # record per (kind, queue, target segment). A flush comes before anything that
    # needs earlier records on disk (a read, a segment's deletion, a drain), so the
    # order that crash safety rests on is kept; the records are no less durable than
    # before, when they also waited for the end of the turn in the log's queue.

    def _append_ref(self, rtype: int, qid: int, mid: int, target: int) -> None:
        refs = self._refs
        key = (rtype, qid, target)
        mids = refs.get(key)
        if mids is None:
            if not refs:
                self._log.schedule_flush()  # type: ignore[union-attr]
            mids = refs[key] = array("Q")
        mids.append(mid)

    def _write_refs(self) -> None:
        refs = self._refs
        if not refs:
            return
        self._refs = {}
        lg = self._log
        assert lg is not None
        # This runs inside the log's flush, which a read or a retire starts: no
        # reclaim from here (a compaction now could delete a segment a caller is in
        # the middle of reading). A segment this rolls past stays a candidate and is
        # looked at by the next reclaim.
        reclaiming, self._reclaiming = self._reclaiming, True
        try:
            self._append_refs(lg, refs)
        finally:
            self._reclaiming = reclaiming

    def _append_refs(self, lg: SegmentLog, refs: dict[tuple[int, int, int], array]) -> None:
        for (rtype, qid, target), mids in refs.items():
            for start in range(0, len(mids), REFS_MAX):
                chunk = mids[start : start + REFS_MAX]
                if len(chunk) == 1:
                    body = REF_BODY.pack(rtype, 0, qid, chunk[0], target)
                else:
                    if BIG_ENDIAN:
                        chunk.byteswap()
                    body = REFS_BODY.pack(REFS, rtype, qid, target, len(chunk)) + chunk.tobytes()
                seq, off = lg.reserve(PREFIX_SIZE + len(body))
                self._sealing.others.append(off)  # for the segment's summary
                lg.write_at(seq, off, (RECORD_PREFIX.pack(len(body), zlib.crc32(body)), body))
                if seq != self._active:
                    self._rolled(seq)
                if seq != target and lg.exists(target):
                    self._add_dep(seq, target)

    # ---- segment summaries -----------------------------------------------------------

    def _seal(self, seq: int, size: int, header: bytes) -> list[Any] | None:
        """The log sealed segment `seq`: its summary, which the writer thread writes
        once the segment is synced (None if this process did not see all of it)."""
        summary, whole = self._sealing, self._sealing_whole
        self._sealing = Summary()
        self._sealing_whole = True
        if not whole:
            return None
        summary.top_mid = self._next_mid - 1
        return summaries.encode(seq, size, zlib.crc32(header), summary)

    def _seed_summary(self, found: tuple[int, Summary] | None) -> None:
        """After recovery: go on noting the active segment into the summary found
        for it, so it is whole when sealed; without one, none is written for it."""
        lg = self._log
        assert lg is not None
        self._sealing = Summary()
        self._sealing_whole = True
        if not lg.active:
            return  # the first append starts a new segment
        if found is not None and found[0] == lg.active:
            self._sealing = found[1]
        else:
            self._sealing_whole = False

    def _save_active_summary(self) -> None:
        """At a clean stop: the active segment's summary as it stands, so the next
        start (from the clean-shutdown index) can go on noting into it."""
        lg = self._log
        assert lg is not None
        if not lg.active or lg.active_header is None or not self._sealing_whole:
            return
        self._sealing.top_mid = self._next_mid - 1
        parts = summaries.encode(
            lg.active, lg.size_of(lg.active), zlib.crc32(lg.active_header), self._sealing
        )
        summaries.write_file(summaries.summary_path(self.directory, lg.active), parts)

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
            for paged in self._paged.values():
                paged.truncate(fseq, foff)
            self.delays.truncate(fseq, foff)
            for s in [s for s in self._live if s > fseq]:
                del self._live[s]
        self._active = 0
        self._sealing = Summary()  # the segment it noted is abandoned, unsealed
        self._sealing_whole = True
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
            "messages": len(self._index)
            + sum(len(p) for p in self._paged.values())
            + self.delays.count(),
            "segments": len(sizes),
            "disk_bytes": sum(sizes.values()),
            "live_bytes": sum(self._live.values()),
        }

    def iter_locations(self) -> Iterator[Location]:
        """The live messages held as Locations (not those of paged tails)."""
        return iter(self._index.values())
